"""One oslo.messaging notification listener on one queue, which stops without giving
anything back to the broker.

:class:`OsloListener` is what :class:`~qsched.bus.oslo.consumer.OsloConsumer` runs per
queue: prefetch 1, one worker thread, ``allow_requeue`` set, no pool.

Why it does more than ``start()``, ``stop()`` and ``wait()``: on a quorum queue every
message the broker gets back without an ack counts as a delivery, and at ``[bus]
delivery_limit`` of them the broker dead-letters it as if it had crashed that many
agents. oslo.messaging's listener, stopped as it is, gives messages back that no agent
ever saw (measured on RabbitMQ 3.10, ``tests/bus/test_bus.py``):

* ``stop()`` only tells the poll thread to end; the consumer stays registered on the
  broker until the connection closes. Once the delivery in hand is acknowledged, the
  broker sends the next message of the queue to the stopped listener, which never
  reads it, and the close gives it back: one delivery counted per stop for the
  message at the head of the queue. A class unsubscribed often (the one that fits
  least, as capacity moves) took a valid request to its delivery limit.
* ``wait()`` acknowledges what was settled after ``stop()`` from a background
  thread, and ends that thread before closing the connection without running what
  it still has queued: a last ack may be lost, and the message comes back as well.

A cancel has its own trap: a message the broker sends after an ack and that its
channel gets after the ``basic.cancel`` never reaches the client, and the close
returns it, counted (RabbitMQ 3.10). So the cancel must go before the last ack.

So leaving is two steps. :meth:`OsloListener.begin_leaving` (the consumer calls it
when a class is removed, at once and in the caller's thread, so before the callback
settles the delivery it holds) queues a ``basic.cancel`` of the listener's consumers
to the poll thread, whose queue runs first in, first out: the cancel goes out before
that ack, or :data:`~OsloListener.ACK_GRACE_S` after an ack already sent. What the
broker sent before its ``cancel-ok`` is dispatched as usual, with ``leaving`` set,
once the cancel is done, and the consumer passes it on as a fresh copy (see
:meth:`OsloDelivery.give_back_copy
<qsched.bus.oslo.consumer.OsloDelivery.give_back_copy>`). :meth:`OsloListener.leave`
then stops it, and the close runs every queued ack before the connection goes.
What is given back afterwards is only what a crash or a lost connection gives back:
those deliveries count, and a message that keeps crashing agents still ends in the
dead letters.

This needs five things oslo.messaging does not publish, all read when the listener
starts, so that an oslo.messaging without them fails there with
:class:`RuntimeError` instead of stalling or looping later: the adapter's
``_poll_style_listener``, its ``msg_id_cache`` (see :func:`_take_redeliveries`), its
``conn`` (whose ``reset()`` cancels the consumers, as the driver's own pool does
before reusing a connection) and its ``_message_operations_handler`` (the queue of
work the poll thread runs: kombu is not thread-safe, so the cancel must run there),
and the adapter's ``cleanup``, which :meth:`OsloListener.close` has run that queue
before (it is public, replaced on the instance).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import oslo_messaging

from qsched.bus.oslo.wire import OsloWire, Route

LOG = logging.getLogger(__name__)

#: ``deliver(route, payload, leaving)``: what the endpoint returns to oslo.messaging.
Deliver = Callable[[Route, Any, bool], Any]


class OsloListener:
    """A notification listener on ``route``'s queue that hands its payloads to ``deliver``.

    ``deliver`` runs in the listener's worker thread; ``leaving`` is True for what
    the broker sent before it acknowledged the cancel of :meth:`begin_leaving`, and
    ``deliver`` gets it only once that cancel is done, so that nothing it settles
    makes the broker send more. ``should_leave`` is asked on every delivery: True
    (its consumer stops) begins leaving.
    """

    #: After an ack the broker sends the next message within a millisecond on a local
    #: node; a cancel that overtakes it inside the broker makes it return that message
    #: (counted) when the connection closes. A cancel waits this long after the last ack.
    ACK_GRACE_S = 0.25
    CANCEL_TIMEOUT_S = 30.0  # the poll thread runs its queue at least every 5 s

    def __init__(
        self, wire: OsloWire, route: Route, deliver: Deliver, should_leave: Callable[[], bool]
    ) -> None:
        self.route = route
        self._deliver = deliver
        self._should_leave = should_leave
        self._lock = threading.Lock()
        self._leaving = threading.Event()
        self._cancelled = threading.Event()
        self._settled_at = 0.0  # when a delivery last went back to oslo.messaging to ack
        self._server = oslo_messaging.get_notification_listener(
            wire.transport(route.kind), [wire.target(route)], [self],
            executor="threading", allow_requeue=True,
        )  # fmt: skip
        self._hooks: _Hooks | None = None

    def info(
        self, ctxt: Any, publisher_id: Any, event_type: Any, payload: Any, metadata: Any
    ) -> Any:
        """oslo.messaging's endpoint method for priority ``info``."""
        if self._should_leave():
            self.begin_leaving()
        leaving = self._leaving.is_set()
        if leaving and not self._cancelled.wait(self.CANCEL_TIMEOUT_S):
            LOG.warning("listener on %s: no cancel in %.0f s", self.route.queue,
                        self.CANCEL_TIMEOUT_S)  # fmt: skip
        try:
            return self._deliver(self.route, payload, leaving)
        finally:
            with self._lock:
                self._settled_at = time.monotonic()

    def start(self) -> None:
        """Connect, declare the queue and consume it, prefetch 1; oslo.messaging keeps
        trying while the broker is down.

        :raises RuntimeError: oslo.messaging lacks what :mod:`this module
            <qsched.bus.oslo.listener>` needs; the listener is stopped again.
        """
        self._server.start(override_pool_size=1)  # prefetch 1: one delivery in hand
        try:
            self._hooks = _Hooks(self._server, self._cancelled)
        except RuntimeError:
            self._server.stop()
            self._server.wait()
            raise
        _take_redeliveries(self._hooks.listener)

    def begin_leaving(self) -> None:
        """Take nothing more: have the poll thread cancel the consumers on the broker
        (after a delivery settled before this call, :data:`ACK_GRACE_S` after it).
        Returns at once; thread-safe, idempotent. Call it before settling the
        delivery in hand, if any, and that ack follows the cancel."""
        with self._lock:
            if self._leaving.is_set():
                return
            self._leaving.set()
            not_before = self._settled_at + self.ACK_GRACE_S
        if self._hooks is not None:
            self._hooks.cancel_consumers(not_before)

    def leave(self) -> None:
        """:meth:`begin_leaving`, then stop; returns once the poll thread has ended,
        having dispatched what the broker sent. A delivery in hand can still be
        settled. Idempotent."""
        self.begin_leaving()
        self._server.stop()

    def close(self) -> None:
        """After :meth:`leave`: wait until every delivery is settled (however long
        its holder takes), send their acks, close the connection."""
        self._server.wait()


class _Hooks:
    """The parts of a started oslo.messaging listener that :class:`OsloListener` uses.

    :raises RuntimeError: one is missing (oslo.messaging changed).
    """

    FLUSH_TIMEOUT_S = 10.0  # the background thread runs its queue every millisecond

    def __init__(self, server: Any, cancelled: threading.Event) -> None:
        self._cancelled = cancelled
        adapter: Any = getattr(server, "listener", None)
        listener: Any = getattr(adapter, "_poll_style_listener", None)
        handler: Any = getattr(listener, "_message_operations_handler", None)
        missing = [
            name
            for name, present in (
                ("listener._poll_style_listener", listener is not None),
                ("msg_id_cache", hasattr(listener, "msg_id_cache")),
                ("conn.reset", callable(getattr(getattr(listener, "conn", None), "reset", None))),
                ("_message_operations_handler.do", callable(getattr(handler, "do", None))),
                ("cleanup", callable(getattr(adapter, "cleanup", None))),
            )
            if not present
        ]
        if missing:
            raise RuntimeError(f"oslo.messaging's notification listener has no {missing}")
        self.listener: Any = listener
        self._handler: Any = handler
        self._cleanup = adapter.cleanup
        adapter.cleanup = self._flushed_cleanup  # what server.wait() calls last

    def cancel_consumers(self, not_before: float) -> None:
        """Have the poll thread cancel the listener's consumers on the broker, not
        before ``not_before`` (monotonic); ``cancelled`` is set once done."""
        self._handler.do(functools.partial(self._cancel, not_before))

    def _cancel(self, not_before: float) -> None:
        time.sleep(max(0.0, not_before - time.monotonic()))
        try:
            self.listener.conn.reset()
        except Exception:  # the connection is gone: the broker takes back what it sent
            LOG.debug("cancelling a listener's consumers failed", exc_info=True)
        finally:
            self._cancelled.set()

    def _flushed_cleanup(self) -> None:
        """Run every ack and requeue queued so far, then oslo.messaging's cleanup."""
        flushed = threading.Event()
        self._handler.do(flushed.set)  # its queue is first in, first out
        if not flushed.wait(self.FLUSH_TIMEOUT_S):
            LOG.warning("a listener's acks were not sent in %.0f s; the broker gives "
                        "their messages back", self.FLUSH_TIMEOUT_S)  # fmt: skip
        self._cleanup()


class _Forgetful:
    """A message id cache that remembers nothing (see :func:`_take_redeliveries`)."""

    UNIQUE_ID = "_unique_id"  # what oslo.messaging's amqp driver adds to every message

    def check_duplicate_message(self, message_data: dict[str, Any]) -> Any:
        return message_data.pop(self.UNIQUE_ID, None)

    def add(self, msg_id: Any) -> None:
        pass


def _take_redeliveries(listener: Any) -> None:
    """Make a started listener take every redelivery.

    oslo.messaging's amqp listener skips a message whose id it acknowledged lately,
    and neither acknowledges nor requeues it. An ack lost with its connection (a
    broker restart right after a claim) then leaves the redelivery unacked on the
    new connection for good, and with prefetch 1 this listener's queue stalls. A
    claim is idempotent per instance, so the agent takes the redelivery and drops
    it (it finds the build in flight or done): the cache is replaced by one that
    remembers nothing.
    """
    listener.msg_id_cache = _Forgetful()
