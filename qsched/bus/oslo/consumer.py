"""The consuming half of the oslo.messaging bus: notification listeners and their deliveries.

:class:`OsloConsumer` is what :meth:`qsched.bus.oslo.OsloBus.consumer` returns. It
runs one oslo.messaging notification listener per queue (its host's, and one per
boot class it consumes), each on its own connection with prefetch 1 and one worker
thread, ``allow_requeue`` set and no pool, so the agents of a class compete on one
queue. oslo.messaging reconnects them on its own.

Why one listener per class rather than one listener on every class: a listener's
targets are fixed when it starts, so a change would mean stopping it, which drops its
consumers on every queue, then connecting and declaring them all again. One listener
per class touches only that class: adding it costs one connection and a declare (a few
milliseconds on a local broker), removing it a cancel and a stop
(:meth:`~qsched.bus.oslo.listener.OsloListener.leave`), in a thread of its own, since
its close waits as long as a delivery of that class is still in hand, which can still
be settled.

A listener calls :meth:`OsloConsumer.deliver` in its worker thread. The callback runs
under one lock per consumer (one placement at a time per agent, as the kombu
consumer's single thread does); the endpoint then waits until the delivery is
settled (from the callback or any other thread) or given back, and returns
``HANDLED`` (oslo.messaging acknowledges it) or ``REQUEUE`` (it gives it back to
the broker as it came, at the head of its queue).

What a consumer did not process is passed on, never returned: a delivery that comes
while its listener leaves or its consumer stops, or that is still unsettled when the
consumer stops, is published again as a fresh copy at the tail of its queue,
confirmed, and then acknowledged (:meth:`OsloDelivery.give_back_copy`), as the kombu
bus requeues. A return to the broker counts as a delivery on a quorum queue, and
``[bus] delivery_limit`` of them dead-letter the message; only an outage (a ledger or
bus error in the callback, a copy that cannot be published) or a crash returns one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

import oslo_messaging

from qsched import exception
from qsched.bus import base
from qsched.bus.oslo.listener import OsloListener
from qsched.bus.oslo.wire import OsloWire, Route, Undecodable, body_of

LOG = logging.getLogger(__name__)

GIVEN_BACK = base.GIVEN_BACK
HANDLED = oslo_messaging.NotificationResult.HANDLED
REQUEUE = oslo_messaging.NotificationResult.REQUEUE
HOST_KEY = ""  # the host queue's listener, among the classes' (keyed by class)


class OsloDelivery(base.SettledOnce, base.Delivery):
    """A notification in the hands of a consumer callback (or of a thread it passed it to).

    ``redelivered`` is always False and ``headers`` empty: oslo.messaging's endpoint
    is handed neither (see :mod:`qsched.bus.oslo`).
    """

    def __init__(self, consumer: OsloConsumer, route: Route, body: bytes) -> None:
        self._consumer = consumer
        self._route = route
        self.body = body
        super().__init__()
        self._outcome: Any = None
        self._done = threading.Event()

    @property
    def queue(self) -> str:
        return self._route.queue

    @property
    def routing_key(self) -> str:
        return self._route.routing_key

    @property
    def redelivered(self) -> bool:
        return False

    @property
    def headers(self) -> Mapping[str, Any]:
        return {}

    def ack(self) -> None:
        self._settle("acked", None)

    def requeue(self, new_body: bytes) -> None:
        wire = self._consumer.wire
        self._settle("requeued", lambda: wire.publish(self._route, new_body))

    def reject(self, reason: str) -> None:
        wire = self._consumer.wire
        why = reason if isinstance(reason, str) else repr(reason)
        self._settle("rejected", lambda: wire.publish_dead(self.body, why, self._route))

    def give_back(self) -> None:
        """Return it to the broker as it came (at the head of its queue), unless settled
        already. The broker counts it as a delivery: for outages only."""
        if self._take(GIVEN_BACK):
            self._finish(REQUEUE)

    def give_back_copy(self) -> None:
        """Pass it on unprocessed, unless settled already: a fresh copy (confirmed) at the
        tail of its queue, then the ack, so that the broker counts no delivery. Given
        back as it came if the copy is not confirmed. Settling it later raises
        :class:`~qsched.bus.base.BusUnavailable`."""
        if not self._take(GIVEN_BACK):
            return
        try:
            self._consumer.wire.publish(self._route, self.body)
        except base.BusUnavailable as exc:
            LOG.warning("bus consumer %s: %s; message given back as it came",
                        self._consumer.host, base.describe(exc))  # fmt: skip
            self._finish(REQUEUE)
            return
        self._finish(HANDLED)

    def _take(self, state: str) -> bool:
        """Mark it ``state`` unless settled or given back already."""
        with self._lock:
            if self.state is not None:
                return False
            self.state = state
            return True

    def outcome(self) -> Any:
        """Wait until settled or given back; what the endpoint returns to oslo.messaging."""
        self._done.wait()
        return self._outcome

    def _settle(self, state: str, publish: Callable[[], None] | None) -> None:
        reason = "it was given back to the broker when its consumer stopped"
        self._claim(state, self._consumer.wire.safe_url, reason, id(self), self.queue)
        if publish is not None:
            try:
                publish()  # confirmed before the ack: never zero copies
            except base.BusUnavailable:
                self._finish(REQUEUE)  # given back as it came, never acked
                raise
        self._finish(HANDLED)

    def _finish(self, outcome: Any) -> None:
        self._outcome = outcome
        self._done.set()
        self._consumer.settled(self)


class OsloConsumer(base.ThreadedConsumer):
    """An agent's listeners (its host queue, one per boot class) and the thread that
    starts and stops them.

    Listeners start in that thread: oslo.messaging connects in ``start()`` and keeps
    trying while the broker is down, so :meth:`wait_ready` is False until every
    listener wanted has started. A listener removed leaves and closes in a thread of
    its own; :meth:`stop` waits for those too, so that a process may end right after.
    """

    def __init__(
        self, wire: OsloWire, host: str, on_message: base.OnMessage, classes: Iterable[str]
    ) -> None:
        super().__init__(host, on_message, classes)
        self.wire = wire
        self._callback_lock = threading.Lock()  # one callback at a time
        self._in_callback = threading.local()
        self._changes: queue.SimpleQueue[tuple[Callable[[], None], Future[None]]] = (
            queue.SimpleQueue()
        )
        self._listeners: dict[str, OsloListener] = {}  # class (HOST_KEY: the host)
        self._unsettled: dict[int, OsloDelivery] = {}
        self._leaving: set[threading.Thread] = set()  # listeners leaving, closing

    # -- the Consumer interface --

    def remove_class(self, scheduling_class: str) -> Future[None]:
        future = super().remove_class(scheduling_class)
        with self._lock:  # the cancel now, before the caller settles what it holds
            listener = self._listeners.get(scheduling_class)
        if listener is not None:
            listener.begin_leaving()
        return future

    def stop(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._stop.set()
            started = list(self._listeners.values())
        for listener in started:  # the cancels first: a callback may settle meanwhile
            listener.begin_leaving()
        in_callback = getattr(self._in_callback, "active", False)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        with self._lock:
            listeners, self._listeners = list(self._listeners.values()), {}
        leaving = [self._leave(listener, close=False) for listener in listeners]
        if not in_callback and self._callback_lock.acquire(timeout=timeout_s):
            self._callback_lock.release()  # a callback running has finished
        elif not in_callback:
            LOG.warning("bus consumer %s: a callback still runs after %.1f s",
                        self._host, timeout_s)  # fmt: skip
        _join(leaving, deadline)  # every listener stopped: nothing more comes
        with self._lock:
            unsettled = list(self._unsettled.values())
        for delivery in unsettled:
            delivery.give_back_copy()
        for listener in listeners:
            self._close_later(listener)
        if not in_callback:  # its own listener's close waits for the callback to return
            with self._lock:
                closing = list(self._leaving)
            _join(closing, deadline)

    # -- for deliveries --

    def settled(self, delivery: OsloDelivery) -> None:
        with self._lock:
            self._unsettled.pop(id(delivery), None)

    def deliver(self, route: Route, payload: Any, leaving: bool = False) -> Any:
        """Hand a notification to the callback, or pass it on when its listener
        leaves or the consumer stops; what the endpoint returns."""
        problem: str | None = None
        try:
            body = body_of(payload)
        except Undecodable as exc:
            LOG.warning("bus consumer %s: dead-lettering a message from %s: %s",
                        self._host, route.queue, exc)  # fmt: skip
            body, problem = repr(payload).encode("utf-8", "replace"), str(exc)
        delivery = OsloDelivery(self, route, body)
        with self._lock:
            leaving = leaving or self._stop.is_set()
            self._unsettled[id(delivery)] = delivery
        if problem is not None:
            _reject(delivery, problem)
        elif leaving:
            delivery.give_back_copy()
        else:
            with self._callback_lock:
                self._call(delivery)
        return delivery.outcome()

    def _call(self, delivery: OsloDelivery) -> None:
        self._in_callback.active = True
        try:
            self._on_message(delivery.body, delivery)
        except exception.BackendUnavailable as exc:  # not the message's fault: give it back
            LOG.warning("bus consumer %s: %s; message given back", self._host, base.describe(exc))
            delivery.give_back()
        except Exception as exc:
            LOG.exception("bus consumer %s: callback failed on a message", self._host)
            _reject(delivery, f"the consumer failed on it: {base.describe(exc)}")
        finally:
            self._in_callback.active = False

    # -- the thread that starts and stops listeners --

    def _run(self) -> None:
        try:
            self._listen(HOST_KEY, self.wire.host_route(self._host))
            for name in sorted(self.classes):
                self._subscribe(name)
        except Exception:
            LOG.exception("bus consumer %s: cannot start listening", self._host)
            return
        self._ready.set()
        LOG.info("bus consumer %s: listening on %s", self._host, sorted(self._listeners))
        while not self._stop.is_set():
            try:
                change, future = self._changes.get(timeout=0.1)
            except queue.Empty:
                continue
            self._apply(change, future)
        self._fail_changes()

    def _apply(self, change: Callable[[], None], future: Future[None]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            change()
        except Exception as exc:
            LOG.error("bus consumer %s: %s", self._host, base.describe(exc))
            future.set_exception(exc)
        else:
            future.set_result(None)

    def _later(self, change: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self._changes.put((change, future))
        return future

    def _subscribe(self, name: str) -> None:
        if name in self.classes:
            self._listen(name, self.wire.boot_route(name))

    def _listen(self, key: str, route: Route) -> None:
        with self._lock:
            if key in self._listeners or self._stop.is_set():
                return
        listener = OsloListener(self.wire, route, self.deliver, self._stop.is_set)
        listener.start()
        with self._lock:
            self._listeners[key] = listener

    def _unsubscribe(self, name: str) -> None:
        with self._lock:
            listener = self._listeners.pop(name, None)
        if listener is not None:
            self._leave(listener, close=True)  # a delivery in hand can still be settled

    def _leave(self, listener: OsloListener, close: bool) -> threading.Thread:
        """Have ``listener`` leave (and close, if ``close``) in a thread of its own."""

        def leave() -> None:
            _quietly(listener.leave)
            if close:
                _quietly(listener.close)

        return self._in_thread(leave, f"leave {listener.route.queue}")

    def _close_later(self, listener: OsloListener) -> None:
        self._in_thread(functools.partial(_quietly, listener.close), "close")

    def _in_thread(self, work: Callable[[], None], what: str) -> threading.Thread:
        def run() -> None:
            try:
                work()
            finally:
                with self._lock:
                    self._leaving.discard(thread)

        thread = threading.Thread(target=run, name=f"qsched-bus-{self._host}-{what}", daemon=True)
        with self._lock:
            self._leaving.add(thread)
        thread.start()
        return thread

    def _fail_changes(self) -> None:
        while True:
            try:
                _change, future = self._changes.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                reason = "the consumer stopped"
                future.set_exception(base.BusUnavailable(self.wire.safe_url, reason))


def _reject(delivery: OsloDelivery, reason: str) -> None:
    """Dead-letter it unless settled already; a failed publish gave it back."""
    if delivery.state is None:
        with contextlib.suppress(base.BusUnavailable, base.MessageSettled):
            delivery.reject(reason)


def _join(threads: Iterable[threading.Thread], deadline: float) -> None:
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _quietly(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception:
        LOG.debug("stopping a listener failed", exc_info=True)
