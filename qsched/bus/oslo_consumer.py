"""The consuming half of the oslo.messaging bus: notification listeners and their deliveries.

:class:`OsloConsumer` is what :meth:`qsched.bus.oslo.OsloBus.consumer` returns. It
runs one oslo.messaging notification listener per queue (its host's, and one per
boot class it consumes), each on its own connection with prefetch 1 and one worker
thread, ``allow_requeue`` set and no pool, so the agents of a class compete on one
queue. oslo.messaging reconnects them on its own.

Why one listener per class rather than one listener on every class: a listener's
targets are fixed when it starts, so a change would mean stopping it, which gives
back whatever it holds and drops its consumers on every queue, then connecting and
declaring them all again. One listener per class touches only that class: adding it
costs one connection and a declare (a few milliseconds on a local broker), removing
it a ``stop()``; its ``wait()`` runs in a thread of its own, since it lasts as long
as a delivery of that class is still in hand, which can still be settled: the
listener acknowledges it from a background thread after it stopped.

A listener calls :meth:`_Endpoint.info` in its worker thread. The callback runs
under one lock per consumer (one placement at a time per agent, as the kombu
consumer's single thread does); the endpoint then waits until the delivery is
settled (from the callback or any other thread) or given back, and returns
``HANDLED`` (oslo.messaging acknowledges it) or ``REQUEUE`` (it gives it back to
the broker as it came, at the head of its queue).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

import oslo_messaging

from qsched import exception
from qsched.bus import base
from qsched.bus.oslo_wire import OsloWire, Route, Undecodable, body_of

LOG = logging.getLogger(__name__)

GIVEN_BACK = "given back"
HANDLED = oslo_messaging.NotificationResult.HANDLED
REQUEUE = oslo_messaging.NotificationResult.REQUEUE
HOST_KEY = ""  # the host queue's listener, among the classes' (keyed by class)


class OsloDelivery(base.Delivery):
    """A notification in the hands of a consumer callback (or of a thread it passed it to).

    ``redelivered`` is always False and ``headers`` empty: oslo.messaging's endpoint
    is handed neither (see :mod:`qsched.bus.oslo`).
    """

    def __init__(self, consumer: OsloConsumer, route: Route, body: bytes) -> None:
        self._consumer = consumer
        self._route = route
        self.body = body
        self._lock = threading.Lock()
        self.state: str | None = None  # "acked", "requeued", "rejected", GIVEN_BACK
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
        """Return it to the broker as it came, unless settled already."""
        with self._lock:
            if self.state is not None:
                return
            self.state = GIVEN_BACK
        self._finish(REQUEUE)

    def outcome(self) -> Any:
        """Wait until settled or given back; what the endpoint returns to oslo.messaging."""
        self._done.wait()
        return self._outcome

    def _settle(self, state: str, publish: Callable[[], None] | None) -> None:
        with self._lock:  # claim it: whatever follows fails or not, it is settled once
            if self.state == GIVEN_BACK:
                reason = "it was given back to the broker when its consumer stopped"
                raise base.BusUnavailable(self._consumer.wire.safe_url, reason)
            if self.state is not None:
                raise base.MessageSettled(delivery=id(self), queue=self.queue, state=self.state)
            self.state = state
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


class _Endpoint:
    """What a listener dispatches to: its ``info`` method, one per queue."""

    def __init__(self, consumer: OsloConsumer, route: Route) -> None:
        self._consumer = consumer
        self._route = route

    def info(
        self, ctxt: Any, publisher_id: Any, event_type: Any, payload: Any, metadata: Any
    ) -> Any:
        return self._consumer.deliver(self._route, payload)


class OsloConsumer(base.ThreadedConsumer):
    """An agent's listeners (its host queue, one per boot class) and the thread that
    starts and stops them.

    Listeners start in that thread: oslo.messaging connects in ``start()`` and keeps
    trying while the broker is down, so :meth:`wait_ready` is False until every
    listener wanted has started.
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
        self._listeners: dict[str, Any] = {}  # class (HOST_KEY: the host) -> oslo server
        self._unsettled: dict[int, OsloDelivery] = {}

    # -- the Consumer interface --

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        in_callback = getattr(self._in_callback, "active", False)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        with self._lock:
            listeners, self._listeners = list(self._listeners.values()), {}
        for server in listeners:
            _quietly(server.stop)
        if not in_callback and self._callback_lock.acquire(timeout=timeout_s):
            self._callback_lock.release()  # a callback running has finished
        elif not in_callback:
            LOG.warning("bus consumer %s: a callback still runs after %.1f s",
                        self._host, timeout_s)  # fmt: skip
        for delivery in list(self._unsettled.values()):
            delivery.give_back()
        for server in listeners:
            _wait_in_background(server)

    # -- for deliveries --

    def settled(self, delivery: OsloDelivery) -> None:
        with self._lock:
            self._unsettled.pop(id(delivery), None)

    def deliver(self, route: Route, payload: Any) -> Any:
        """Hand a notification to the callback; what the endpoint returns."""
        problem: str | None = None
        try:
            body = body_of(payload)
        except Undecodable as exc:
            LOG.warning("bus consumer %s: dead-lettering a message from %s: %s",
                        self._host, route.queue, exc)  # fmt: skip
            body, problem = repr(payload).encode("utf-8", "replace"), str(exc)
        delivery = OsloDelivery(self, route, body)
        with self._lock:
            if self._stop.is_set():
                return REQUEUE
            self._unsettled[id(delivery)] = delivery
        if problem is not None:
            _reject(delivery, problem)
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
        server = oslo_messaging.get_notification_listener(
            self.wire.transport(route.kind), [self.wire.target(route)],
            [_Endpoint(self, route)], executor="threading", allow_requeue=True,
        )  # fmt: skip
        server.start(override_pool_size=1)  # prefetch 1: one delivery in hand per queue
        _take_redeliveries(server)
        with self._lock:
            self._listeners[key] = server

    def _unsubscribe(self, name: str) -> None:
        with self._lock:
            server = self._listeners.pop(name, None)
        if server is not None:
            server.stop()  # nothing new comes; a delivery in hand can still be settled
            _wait_in_background(server)

    def _fail_changes(self) -> None:
        while True:
            try:
                _change, future = self._changes.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                reason = "the consumer stopped"
                future.set_exception(base.BusUnavailable(self.wire.safe_url, reason))


class _Forgetful:
    """A message id cache that remembers nothing (see :func:`_take_redeliveries`)."""

    UNIQUE_ID = "_unique_id"  # what oslo.messaging's amqp driver adds to every message

    def check_duplicate_message(self, message_data: dict[str, Any]) -> Any:
        return message_data.pop(self.UNIQUE_ID, None)

    def add(self, msg_id: Any) -> None:
        pass


def _take_redeliveries(server: Any) -> None:
    """Make a started listener take every redelivery.

    oslo.messaging's amqp listener skips a message whose id it acknowledged lately,
    and neither acknowledges nor requeues it. An ack lost with its connection (a
    broker restart right after a claim) then leaves the redelivery unacked on the
    new connection for good, and with prefetch 1 this listener's queue stalls. A
    claim is idempotent per instance, so the agent takes the redelivery and drops
    it (it finds the build in flight or done): the cache is replaced by one that
    remembers nothing. It is a private attribute of oslo.messaging's listener, so
    its absence is an error here, not a silent stall later.

    :raises RuntimeError: the listener has no ``msg_id_cache`` (oslo.messaging changed).
    """
    listener: Any = getattr(getattr(server, "listener", None), "_poll_style_listener", None)
    if not hasattr(listener, "msg_id_cache"):
        raise RuntimeError("oslo.messaging's listener has no msg_id_cache any more")
    listener.msg_id_cache = _Forgetful()


def _reject(delivery: OsloDelivery, reason: str) -> None:
    """Dead-letter it unless settled already; a failed publish gave it back."""
    if delivery.state is None:
        with contextlib.suppress(base.BusUnavailable, base.MessageSettled):
            delivery.reject(reason)


def _wait_in_background(server: Any) -> None:
    """``wait()`` for a stopped listener (it lasts while a delivery is in hand), then
    its connection closes."""
    threading.Thread(target=_quietly, args=(server.wait,), daemon=True).start()


def _quietly(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception:
        LOG.debug("stopping a listener failed", exc_info=True)
