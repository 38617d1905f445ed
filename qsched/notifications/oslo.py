"""Notifications sent through oslo.messaging's Notifier (``log``, ``messaging``, ...).

Features: any of oslo.messaging's notification drivers, with oslo.messaging's own
code; ``messagingv2`` alone on a ``rabbit://`` bus is sent by
:mod:`qsched.notifications.rabbit` instead, on the same wire, a batch at a time
(docs/notifications.rst). ``publisher_id`` is ``qsched-agent:HOST``, as
Nova's ``nova-compute:HOST``.

Connection String: ``[oslo_messaging_notifications] transport_url``, in
oslo.messaging's syntax (``rabbit://user:pass@host:5672/vhost``). The entry point
builds oslo.messaging's Notifier (:func:`qsched.conf.notifications.build_oslo_notifiers`)
and hands it here: this module never imports oslo.messaging itself.

Sending is off the caller's thread (:mod:`qsched.notifications.queued`); the
sender hands each event of a batch to each Notifier in turn.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from qsched.notifications.queued import MAX_PENDING, Event, QueuedNotifier

LOG = logging.getLogger(__name__)


class RequestContext(dict[str, Any]):
    """A request's context as oslo.messaging's Notifier keeps it: it drops a plain
    ``dict`` (it cannot redact one) and sends what ``redacted_copy().to_dict()``
    gives, as the ``_context_*`` keys of the message. qsched's holds no secret."""

    def redacted_copy(self) -> RequestContext:
        return self

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


class OsloNotifier(QueuedNotifier):
    """A :class:`Notifier` over ``oslo_messaging.Notifier`` objects, one a driver (their
    ``info``/``error``); they share one transport. Sends from a thread of its own."""

    def __init__(self, notifiers: Sequence[Any], max_pending: int = MAX_PENDING) -> None:
        super().__init__(max_pending)
        self._notifiers = list(notifiers)
        self.start()

    def send(self, batch: list[Event]) -> None:
        for event in batch:
            context = RequestContext(event.context)
            for notifier in self._notifiers:
                try:
                    getattr(notifier, event.priority.lower())(
                        context, event.event_type, event.payload
                    )
                except Exception:  # the step it tells of happened: log, go on
                    LOG.exception("could not send notification %s", event.event_type)

    def release(self) -> None:
        if self._notifiers:
            self._notifiers[0].transport.cleanup()
