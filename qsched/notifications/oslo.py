"""Notifications sent through oslo.messaging's Notifier (``messagingv2``, ``log``, ...).

Features: Nova's wire form (oslo.messaging's ``messagingv2`` envelope around the
``nova_object.*`` payload) on the ``[notifications] versioned_notifications_topics``,
``publisher_id`` ``qsched-agent:HOST`` as Nova's ``nova-compute:HOST``.

Connection String: ``[oslo_messaging_notifications] transport_url``, in
oslo.messaging's syntax (``rabbit://user:pass@host:5672/vhost``). The entry point
builds oslo.messaging's Notifier (:func:`qsched.conf.notifications.build_oslo_notifiers`)
and hands it here: this module never imports oslo.messaging itself.

Sending is off the caller's thread. :meth:`OsloNotifier.notify` puts the event on a
bounded queue and returns; one sender thread per process hands the events to
oslo.messaging in order. A placement therefore never waits on the notification bus:
with ``[oslo_messaging_notifications] retry = -1`` (oslo.messaging's default) a send
to a broker that is down retries without end, and done inline that would stall the
agent's claims for as long as the outage lasts. When the queue is full (the bus has
been away for a while) new events are dropped, counted and logged once a minute;
delivery was at most once already (docs/notifications.rst).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from qsched.notifications.base import INFO, Notifier

LOG = logging.getLogger(__name__)

#: Events held for the sender at most; beyond it new ones are dropped.
MAX_PENDING = 10_000
#: How long :meth:`OsloNotifier.close` waits for the events already queued.
CLOSE_TIMEOUT_S = 5.0
DROP_LOG_INTERVAL_S = 60.0

_Event = tuple[str, str, dict[str, Any], dict[str, Any]]  # priority, type, payload, ctxt


class OsloNotifier(Notifier):
    """A :class:`Notifier` over ``oslo_messaging.Notifier`` objects, one a driver (their
    ``info``/``error``); they share one transport. Sends from a thread of its own."""

    def __init__(self, notifiers: Sequence[Any], max_pending: int = MAX_PENDING) -> None:
        self._notifiers = list(notifiers)
        self._pending: queue.Queue[_Event | None] = queue.Queue(max_pending)
        self._lock = threading.Lock()
        self._closed = False
        self.dropped = 0  # events refused because the queue was full
        self._dropped_logged_at = 0.0
        self._sender = threading.Thread(target=self._send_all, name="qsched-notifier", daemon=True)
        self._sender.start()
        atexit.register(self.close)  # a process that exits sends what is queued first

    def notify(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        priority: str = INFO,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        if self._closed:
            LOG.warning("notification %s after close: not sent", event_type)
            return
        try:
            self._pending.put_nowait((priority, event_type, dict(payload), dict(context or {})))
        except queue.Full:
            self._drop(event_type)

    def flush(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until every event queued so far was handed to oslo.messaging; False if
        that took longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._pending.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        """Send what is queued (for up to :data:`CLOSE_TIMEOUT_S`), then release the
        transport. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self.flush(CLOSE_TIMEOUT_S):
            LOG.warning("%d notifications not sent at close: the notification bus is slow "
                        "or away", self._pending.qsize())  # fmt: skip
        self._pending.put(None)  # the sender's stop; after the events already queued
        self._sender.join(CLOSE_TIMEOUT_S)
        if self._notifiers and not self._sender.is_alive():
            self._notifiers[0].transport.cleanup()

    def _drop(self, event_type: str) -> None:
        with self._lock:
            self.dropped += 1
            now = time.monotonic()
            if now - self._dropped_logged_at < DROP_LOG_INTERVAL_S:
                return
            self._dropped_logged_at = now
        LOG.error("notification %s dropped: %d queued, none sent lately (is the notification "
                  "bus up?); %d dropped so far", event_type, self._pending.qsize(),
                  self.dropped)  # fmt: skip

    def _send_all(self) -> None:
        while True:
            event = self._pending.get()
            try:
                if event is None:
                    return
                priority, event_type, payload, context = event
                for notifier in self._notifiers:
                    try:
                        getattr(notifier, priority.lower())(context, event_type, payload)
                    except Exception:  # the step it tells of happened: log, go on
                        LOG.exception("could not send notification %s", event_type)
            finally:
                self._pending.task_done()
