"""The message bus: boot requests per scheduling class, deletes per host, dead letters.

:mod:`qsched.bus.base` holds the contract; :mod:`qsched.bus.kombu` implements it on
kombu's memory, RabbitMQ and Redis transports. :func:`open_bus` picks one from the
configuration.
"""

from __future__ import annotations

from qsched import exception
from qsched.bus.base import (
    Bus,
    BusUnavailable,
    Consumer,
    DeadLetter,
    Delivery,
    MessageSettled,
    Names,
    OnMessage,
    QueueStats,
)
from qsched.conf import BusOptions

__all__ = [
    "Bus",
    "BusUnavailable",
    "Consumer",
    "DeadLetter",
    "Delivery",
    "MessageSettled",
    "Names",
    "OnMessage",
    "QueueStats",
    "open_bus",
]


def open_bus(options: BusOptions) -> Bus:
    """The bus for ``transport_url`` and the ``[bus]`` options.

    :raises Invalid: a URL scheme no bus here speaks.
    """
    from qsched.bus import kombu  # the only family so far

    scheme = options.transport_url.partition("://")[0].lower()
    if scheme in kombu.SCHEMES:
        return kombu.KombuBus.from_options(options)
    raise exception.Invalid(
        reason=f"transport_url scheme {scheme!r} is not supported: use one of "
        f"{', '.join(sorted(kombu.SCHEMES))}"
    )
