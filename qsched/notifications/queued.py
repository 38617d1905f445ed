"""Sending off the caller's thread: a bounded queue and one sender thread per notifier.

:meth:`QueuedNotifier.notify` appends the event to a queue and returns; one sender
thread hands what is queued to the backend in order, in batches. A placement
therefore never waits on the notification bus: with ``[oslo_messaging_notifications]
retry = -1`` (oslo.messaging's default) a send to a broker that is down retries
without end, and done inline that would stall the agent's claims for as long as the
outage lasts. When the queue is full (the bus has been away for a while) new events
are dropped, counted and logged once a minute; delivery was at most once already
(docs/notifications.rst).

With a gather pause (``gather_s``, qsched's own RabbitMQ sender) the sender wakes
on a clock: every ``gather_s`` it lets the backend settle the last batch (read the
broker's confirms, which came in meanwhile), then takes every event queued (up to
:data:`MAX_BATCH`) and sends them. A busy agent pays the backend's fixed cost of a
send (a wake-up, a write, the confirms' reading) once per pause rather than once
per event, and :meth:`~QueuedNotifier.notify` costs one append: it takes no lock
and wakes no thread (a lock and a condition's wake-up per event were about a third
of what notifications cost an agent, docs/notifications.rst, "Cost"). Without a
pause (oslo.messaging's Notifier, which waits for each send anyway) each event
wakes the sender.
"""

from __future__ import annotations

import abc
import atexit
import collections
import logging
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
    payload: Mapping[str, Any]
    context: Mapping[str, Any]


class _Mark:
    """A place in the queue (:meth:`QueuedNotifier.flush`): ``done`` is set once every
    event queued before it was handed to the backend and settled."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class QueuedNotifier(Notifier):
    """A :class:`Notifier` whose backend sends from a thread of its own, in batches.

    A backend implements :meth:`send` (one batch, in order), :meth:`release`, and
    :meth:`settle` if it has receipts to wait for. ``max_pending``: events queued at
    most; ``gather_s``: how often the sender wakes to send what gathered meanwhile (0:
    at each event).

    The notifier keeps the payload and the context it is given as they are, until
    they are sent: a caller does not change them afterwards (copying them cost as much
    as queueing them).
    """

    def __init__(self, max_pending: int = MAX_PENDING, gather_s: float = 0.0) -> None:
        self.gather_s = gather_s
        self.max_pending = max_pending
        # appended by any thread, taken by the sender: a deque's append and popleft
        # need no lock of ours
        self._pending: collections.deque[Event | _Mark] = collections.deque()
        self._wake = threading.Event()  # a flush, the close, or (no pause) an event
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
        """Before the sender next sends, or waits on a flush: wait for the receipts of
        what :meth:`send` sent, on the sender's thread. Never raises, as :meth:`send`."""

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
        pending = self._pending
        if len(pending) >= self.max_pending:
            self._drop(event_type)
            return
        pending.append(Event(priority, event_type, payload, context or {}))
        if not self.gather_s:
            self._wake.set()

    def flush(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until every event queued so far was handed to the backend and settled;
        False if that took longer than ``timeout_s``, or the sender has stopped with
        events still queued."""
        if not self._sender.is_alive():
            return self.queued() == 0
        mark = _Mark()
        self._pending.append(mark)
        self._wake.set()  # rather than at the end of the pause
        return mark.done.wait(timeout_s)

    def queued(self) -> int:
        """Events queued and not taken by the sender yet."""
        return sum(isinstance(item, Event) for item in list(self._pending))

    def close(self) -> None:
        """Send what is queued (for up to :data:`CLOSE_TIMEOUT_S`), then release the
        backend. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self.flush(CLOSE_TIMEOUT_S):
            LOG.warning("%d notifications not sent at close: the notification bus is slow "
                        "or away", self.queued())  # fmt: skip
        self._stopping = True  # the sender hands the rest over, which the backend loses
        self._wake.set()
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
                         len(self._pending), self.dropped)  # fmt: skip

    def _send_all(self) -> None:
        """The sender: at each wake-up, settle the batch sent at the last one (its
        receipts came in meanwhile), then send what is queued. A flush's mark is set
        once the batch before it is settled, at once rather than at the next wake-up."""
        unsettled, backlog = False, False  # unsettled: a batch sent since the last settle
        while True:
            if not backlog:  # a full batch taken: the rest goes at once
                self._wake.wait(self.gather_s or None)
                self._wake.clear()
            if unsettled:
                self._settle_sent()
                unsettled = False
            batch, marks, backlog = self._take()
            if batch:
                self._send_batch(batch)
                unsettled = True
            if unsettled and (marks or not self.gather_s or self._stopping):
                self._settle_sent()
                unsettled = False
            for mark in marks:
                mark.done.set()
            if self._stopping and not self._pending:
                return

    def _send_batch(self, batch: list[Event]) -> None:
        """:meth:`send`, a backend's bug logged."""
        try:
            self.send(batch)
        except Exception:  # a backend bug: the steps told of happened; go on
            LOG.exception("could not send %d notifications", len(batch))

    def _settle_sent(self) -> None:
        """:meth:`settle`, a backend's bug logged."""
        try:
            self.settle()
        except Exception:  # a backend bug, as in _send_batch
            LOG.exception("could not settle the notifications sent")

    def _take(self) -> tuple[list[Event], list[_Mark], bool]:
        """The events queued now, in order (:data:`MAX_BATCH` at most); the marks
        among them; whether more events than that were queued."""
        pending = self._pending
        batch: list[Event] = []
        marks: list[_Mark] = []
        while pending:
            if len(batch) == MAX_BATCH:
                return batch, marks, True
            item = pending.popleft()
            if isinstance(item, _Mark):
                marks.append(item)
            else:
                batch.append(item)
        return batch, marks, False
