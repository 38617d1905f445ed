"""Sending off the caller's thread: a bounded queue and one sender thread per notifier.

:meth:`QueuedNotifier.notify` puts the event on a bounded queue and returns; one
sender thread hands what is queued to the backend in order, in batches: it takes
every event queued when it wakes (up to :data:`MAX_BATCH`), sends them, waits
:attr:`QueuedNotifier.gather_s`, then lets the backend settle them (read the
broker's confirms, which came in meanwhile) before it looks again, so that a busy
agent pays the backend's fixed cost of a send (a write, a wake-up, the confirms'
reading) once per batch rather than once per event. A placement therefore never
waits on the notification bus: with ``[oslo_messaging_notifications] retry = -1``
(oslo.messaging's default) a send to a broker that is down retries without end,
and done inline that would stall the agent's claims for as long as the outage
lasts. When the queue is full (the bus has been away for a while) new events are
dropped, counted and logged once a minute; delivery was at most once already
(docs/notifications.rst).
"""

from __future__ import annotations

import abc
import atexit
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from qsched.notifications.base import INFO, Notifier

LOG = logging.getLogger(__name__)

#: Events held for the sender at most; beyond it new ones are dropped.
MAX_PENDING = 10_000
#: Events the sender hands to the backend at once at most.
MAX_BATCH = 500
#: How long :meth:`QueuedNotifier.close` waits for the events already queued.
CLOSE_TIMEOUT_S = 5.0
DROP_LOG_INTERVAL_S = 60.0


class Event(NamedTuple):
    """One notification to send, as :meth:`Notifier.notify` was given it."""

    priority: str
    event_type: str
    payload: dict[str, Any]
    context: dict[str, Any]


class QueuedNotifier(Notifier):
    """A :class:`Notifier` whose backend sends from a thread of its own, in batches.

    A backend implements :meth:`send` (one batch, in order), :meth:`release`, and
    :meth:`settle` if it has receipts to wait for. ``max_pending``: events queued at
    most; ``gather_s``: the sender's pause after each batch, in which the next one
    gathers (0: none).
    """

    def __init__(self, max_pending: int = MAX_PENDING, gather_s: float = 0.0) -> None:
        self.gather_s = gather_s
        self._pending: queue.Queue[Event | None] = queue.Queue(max_pending)
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = False
        self.dropped = 0  # events refused because the queue was full
        self._logged_at: dict[str, float] = {}
        self._sender = threading.Thread(target=self._send_all, name="qsched-notifier", daemon=True)

    def start(self) -> None:
        """Start the sender; a process that exits sends what is queued first."""
        self._sender.start()
        atexit.register(self.close)

    @abc.abstractmethod
    def send(self, batch: list[Event]) -> None:
        """Send ``batch``, in order, on the sender's thread. Never raises: what cannot
        be sent is logged (and counted by the backend)."""

    def settle(self) -> None:
        """After :meth:`send` and the pause: wait for the receipts of what it sent, on
        the sender's thread. Never raises, as :meth:`send`."""

    @abc.abstractmethod
    def release(self) -> None:
        """Release the backend's connection, once the sender has stopped."""

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
        event = Event(priority, event_type, dict(payload), dict(context or {}))
        try:
            self._pending.put_nowait(event)
        except queue.Full:
            self._drop(event_type)

    def flush(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until every event queued so far was handed to the backend and settled;
        False if that took longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._pending.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        """Send what is queued (for up to :data:`CLOSE_TIMEOUT_S`), then release the
        backend. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self.flush(CLOSE_TIMEOUT_S):
            LOG.warning("%d notifications not sent at close: the notification bus is slow "
                        "or away", self._pending.qsize())  # fmt: skip
        self._stopping = True
        self._pending.put(None)  # the sender's stop; after the events already queued
        if self._sender.is_alive():
            self._sender.join(CLOSE_TIMEOUT_S)
        if not self._sender.is_alive():
            self.release()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`close` no longer waits for what is queued: a backend waiting
        for the bus gives up."""
        return self._stopping

    def log_limited(self, kind: str, message: str, *args: Any) -> None:
        """Log ``message`` at ERROR, at most once a minute per ``kind``."""
        with self._lock:
            now = time.monotonic()
            if now - self._logged_at.get(kind, -DROP_LOG_INTERVAL_S) < DROP_LOG_INTERVAL_S:
                return
            self._logged_at[kind] = now
        LOG.error(message, *args)

    def _drop(self, event_type: str) -> None:
        with self._lock:
            self.dropped += 1
        self.log_limited("dropped", "notification %s dropped: %d queued, none sent lately (is "
                         "the notification bus up?); %d dropped so far", event_type,
                         self._pending.qsize(), self.dropped)  # fmt: skip

    def _send_all(self) -> None:
        while True:
            batch, stop = self._take()
            try:
                if batch:
                    self.send(batch)
                    if self.gather_s and not stop:
                        time.sleep(self.gather_s)
                    self.settle()
            except Exception:  # a backend bug: the steps told of happened; go on
                LOG.exception("could not send %d notifications", len(batch))
            finally:
                for _ in range(len(batch) + stop):
                    self._pending.task_done()
            if stop:
                return

    def _take(self) -> tuple[list[Event], bool]:
        """The events queued now (waiting for the first), and whether the stop came."""
        first = self._pending.get()
        if first is None:
            return [], True
        batch = [first]
        while len(batch) < MAX_BATCH:
            try:
                event = self._pending.get_nowait()
            except queue.Empty:
                break
            if event is None:
                return batch, True
            batch.append(event)
        return batch, False
