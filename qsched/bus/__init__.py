"""The message bus: boot requests per scheduling class, deletes per host, dead letters.

:mod:`qsched.bus.base` holds the contract (:class:`Bus`, and the narrower
``Publisher`` and ``BootPublisher`` that the front door and the janitor name);
:mod:`qsched.bus.health` what both buses' ``check_health`` share. One package per
technology implements it: :mod:`qsched.bus.kombu` on kombu's memory, RabbitMQ and
Redis transports, :mod:`qsched.bus.oslo` on oslo.messaging's notification layer
(RabbitMQ). :func:`open_bus` picks one from the configuration (``[bus] driver``);
oslo.messaging is imported only for its bus.

What it may import: :mod:`qsched.scheduling.message`, :mod:`qsched.conf` (options as values),
:mod:`qsched.exception` and the transport libraries, nothing above the backends.
The contract imports no transport library.
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
from qsched.conf.bus import KOMBU, OSLO_MESSAGING

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
    """The bus for ``transport_url`` and the ``[bus]`` options (``driver`` picks the library).

    :raises Invalid: a URL scheme the driver does not speak.
    """
    scheme = options.transport_url.partition("://")[0].lower()
    if options.driver == OSLO_MESSAGING:
        from qsched.bus import oslo  # imports oslo.messaging: only when asked for

        if scheme not in oslo.SCHEMES:
            raise exception.Invalid(
                reason=f"[bus] driver {OSLO_MESSAGING} runs on RabbitMQ only, not on "
                f"{scheme}://: set transport_url to rabbit://USER:PASS@HOST:5672/, or "
                f"[bus] driver to {KOMBU} for {scheme}://"
            )
        return oslo.OsloBus.from_options(options)
    from qsched.bus import kombu

    if scheme in kombu.SCHEMES:
        return kombu.KombuBus.from_options(options)
    raise exception.Invalid(
        reason=f"transport_url scheme {scheme!r} is not supported: use one of "
        f"{', '.join(sorted(kombu.SCHEMES))}"
    )
