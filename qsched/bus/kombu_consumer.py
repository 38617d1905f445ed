"""The consuming half of the kombu bus: a reconnecting consumer thread and its deliveries.

:class:`KombuConsumer` is what :meth:`qsched.bus.kombu.KombuBus.consumer` returns.
It stands on the :class:`~qsched.bus.kombu_wire.KombuWire` it is handed: it
connects, declares its queues and publishes its requeues and dead letters
through it, and knows nothing of the producing half. The transports' features
(prefetch, redelivery, dead letters) are described in :mod:`qsched.bus.kombu`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import kombu

from qsched import exception
from qsched.bus import base, kombu_message
from qsched.bus.kombu_wire import KombuWire, drop, release

LOG = logging.getLogger(__name__)

GIVEN_BACK = "given back"


class KombuDelivery(base.Delivery):
    """A message in the hands of a consumer callback (or of a thread it passed it to)."""

    def __init__(
        self, consumer: KombuConsumer, message: Any, entity: kombu.Queue, epoch: int
    ) -> None:
        self._consumer = consumer
        self._message = message
        self._entity = entity
        self._epoch = epoch
        self._lock = threading.Lock()
        self.state: str | None = None  # "acked", "requeued", "rejected"
        self.body = kombu_message.body_bytes(message)  # bytes, whatever kombu handed over

    @property
    def queue(self) -> str:
        return str(self._entity.name)

    @property
    def routing_key(self) -> str:
        return self._consumer.wire.routing_key(self._entity)

    @property
    def redelivered(self) -> bool:
        return bool(self._message.delivery_info.get("redelivered"))

    @property
    def headers(self) -> Mapping[str, Any]:
        return self._message.headers or {}

    def ack(self) -> None:
        self._settle("acked", None)

    def requeue(self, new_body: bytes) -> None:
        wire = self._consumer.wire
        self._settle("requeued", lambda: wire.publish(self._entity, new_body))

    def reject(self, reason: str) -> None:
        wire = self._consumer.wire
        why = reason if isinstance(reason, str) else kombu_message.text(reason)
        self._settle("rejected", lambda: wire.publish_dead(self.body, why, self._entity))

    def give_back(self) -> None:
        """Return it to the broker as it came, unless acked (consumer thread only)."""
        self.state = self.state or GIVEN_BACK
        if not self._message.acknowledged:  # only this thread acks: no race
            self._message.reject(requeue=True)
        self._consumer.settled(self)

    def _settle(self, state: str, publish: Callable[[], None] | None) -> None:
        with self._lock:  # claim it: whatever follows fails or not, it is settled once
            if self.state == GIVEN_BACK:
                reason = "it was given back to the broker when its consumer disconnected"
                raise base.BusUnavailable(self._consumer.wire.safe_url, reason)
            if self.state is not None:
                raise base.MessageSettled(
                    delivery=self._message.delivery_tag, queue=self.queue, state=self.state
                )
            self.state = state
        if publish is not None:
            self._publish_or_give_back(publish)  # confirmed before the ack: never zero copies
        self._consumer.call_in_loop(self._epoch, self._ack)

    def _publish_or_give_back(self, publish: Callable[[], None]) -> None:
        try:
            publish()
        except base.BusUnavailable:
            # Held unacked it would block this queue for this consumer (prefetch 1).
            with contextlib.suppress(base.BusUnavailable):
                self._consumer.call_in_loop(self._epoch, self.give_back)
            raise

    def _ack(self) -> None:
        self._message.ack()
        self._consumer.settled(self)


@dataclasses.dataclass
class _Command:
    """Work for the consumer thread: a settle (``epoch`` set) or a class change."""

    run: Callable[[], None]
    future: Future[None]
    epoch: int | None = None


class KombuConsumer(base.ThreadedConsumer):
    """A reconnecting consumer loop in its own thread (kombu ConsumerMixin style).

    All channel work happens in that thread: settles from other threads and
    class changes are queued to it and applied between ``drain_events`` calls.
    Callbacks should be short (decode, claim, settle) and hand long work such as
    a spawn to another thread: while a callback runs, no heartbeat goes out, and
    RabbitMQ drops a connection silent for about two heartbeats.
    """

    def __init__(
        self, wire: KombuWire, host: str, on_message: base.OnMessage, classes: Iterable[str]
    ) -> None:
        super().__init__(host, on_message, classes)
        self.wire = wire
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._epoch = 0  # bumped on every disconnect: older deliveries cannot be settled
        self._connection: kombu.Connection | None = None
        self._channel: Any = None
        self._subscriptions: dict[str, kombu.Consumer] = {}
        self._unsettled: dict[int, KombuDelivery] = {}

    # -- the Consumer interface --

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout_s)
        if thread.is_alive():
            LOG.warning(
                "bus consumer %s: a callback still runs after %.1f s", self._host, timeout_s
            )

    # -- for deliveries --

    def call_in_loop(self, epoch: int, work: Callable[[], None]) -> None:
        """Run ``work`` in the consumer thread if the connection ``epoch`` still lives.

        :raises BusUnavailable: that connection is gone, or the thread is stuck.
        """
        if threading.current_thread() is self._thread:
            self._check_epoch(epoch)
            return work()
        command = _Command(work, Future(), epoch)
        with self._lock:
            self._check_epoch(epoch)
            self._commands.put(command)
        try:
            return command.future.result(self.wire.options.settle_timeout_s)
        except FutureTimeout:
            if command.future.cancel():
                raise base.BusUnavailable(
                    self.wire.safe_url, "the consumer thread is busy"
                ) from None
            return command.future.result()

    def settled(self, delivery: KombuDelivery) -> None:
        self._unsettled.pop(id(delivery), None)

    def _check_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            reason = "the connection that delivered it is gone; the broker delivers it again"
            raise base.BusUnavailable(self.wire.safe_url, reason)

    # -- the loop --

    def _run(self) -> None:
        delay_s = 0.0
        while not self._stop.is_set():
            broken = False
            try:
                self._consume()
                delay_s = 0.0
            except Exception as exc:  # whatever broke, the answer is: reconnect
                broken = True
                delay_s = min(max(2 * delay_s, 0.1), self.wire.options.reconnect_max_delay_s)
                LOG.warning(
                    "bus consumer %s: %s; reconnecting in %.1f s",
                    self._host,
                    base.describe(exc),
                    delay_s,
                )
            finally:
                self._disconnect(broken)
            self._stop.wait(delay_s)
        self._fail_commands(keep_changes=False)

    def _consume(self) -> None:
        self._connection = connection = self.wire.connect(self.wire.options.heartbeat_s)
        self._channel = connection.channel()
        self._channel.basic_qos(0, 1, False)  # per consumer: quorum queues refuse global
        self._consume_queue(self.wire.host_entity(self._host))
        for name in sorted(self.classes):
            self._subscribe(name)
        self._ready.set()
        LOG.info("bus consumer %s: consuming %s", self._host, sorted(self._subscriptions))
        while not self._stop.is_set():
            self._run_commands()
            with contextlib.suppress(TimeoutError):  # nothing came: a chance to run commands
                connection.drain_events(timeout=self.wire.options.poll_interval_s)
            connection.heartbeat_check(rate=self.wire.transport.heartbeat_rate)
        self._run_commands()  # settles already asked for are finished work: do them

    def _subscribe(self, name: str) -> None:
        if name in self._subscriptions or name not in self.classes:
            return
        try:
            self._consume_queue(self.wire.boot_entity(name), key=name)
        except self.wire.channel_errors:
            with self._lock:  # e.g. declared elsewhere with other arguments: do not loop on it
                self._wanted.discard(name)
            LOG.error("bus consumer %s: cannot consume class %s", self._host, name, exc_info=True)
            raise
        self.wire.note_class(name)

    def _consume_queue(self, entity: kombu.Queue, key: str = "") -> None:
        self.wire.redeclare(self._channel, entity)
        subscription = kombu.Consumer(
            self._channel,
            [entity],
            no_ack=False,
            auto_declare=False,
            on_message=functools.partial(self._deliver, entity),
            # Without it kombu raises what it could not decode out of drain_events:
            # the consumer would reconnect, get the message again, and loop on it.
            on_decode_error=functools.partial(self._undecodable, entity),
            tag_prefix=f"{self._host}.",
        )
        subscription.consume()
        self._subscriptions[key or entity.name] = subscription

    def _unsubscribe(self, name: str) -> None:
        subscription = self._subscriptions.pop(name, None)
        if subscription is not None:
            subscription.cancel()

    def _deliver(self, entity: kombu.Queue, message: Any, problem: str | None = None) -> None:
        delivery = KombuDelivery(self, message, entity, self._epoch)
        self._unsettled[id(delivery)] = delivery
        problem = problem or kombu_message.problem(message)
        if problem is not None:  # kombu could not build it: nothing for the callback
            LOG.warning("bus consumer %s: dead-lettering a message from %s: %s",
                        self._host, entity.name, problem)  # fmt: skip
            return self._reject(delivery, problem)
        try:
            self._on_message(delivery.body, delivery)
        except exception.BackendUnavailable as exc:  # not the message's fault: give it back
            LOG.warning("bus consumer %s: %s; message given back", self._host, base.describe(exc))
            if delivery.state is None:
                delivery.give_back()
        except Exception as exc:
            LOG.exception("bus consumer %s: callback failed on a message", self._host)
            self._reject(delivery, f"the consumer failed on it: {base.describe(exc)}")

    def _undecodable(self, entity: kombu.Queue, message: Any, exc: Exception) -> None:
        """kombu's ``on_decode_error``: it recorded errors while building the message."""
        if not hasattr(message, "ack"):
            # kombu failed before it had a message object (not something a kombu
            # publish can cause): nothing to settle, so reconnect as for any error.
            raise exc
        why = kombu_message.problem(message) or f"kombu could not decode it: {base.describe(exc)}"
        self._deliver(entity, message, why)

    @staticmethod
    def _reject(delivery: KombuDelivery, reason: str) -> None:
        """Dead-letter it unless settled already; a failed publish gave it back."""
        if delivery.state is None:
            with contextlib.suppress(base.BusUnavailable):
                delivery.reject(reason)

    # -- commands and shutdown --

    def _later(self, change: Callable[[], None]) -> Future[None]:
        command = _Command(change, Future())
        self._commands.put(command)
        return command.future

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if not command.future.set_running_or_notify_cancel():
                continue
            try:
                if command.epoch is not None:
                    self._check_epoch(command.epoch)
                command.run()
            except Exception as exc:
                command.future.set_exception(exc)
                if isinstance(exc, self.wire.errors):
                    raise
            else:
                command.future.set_result(None)

    def _disconnect(self, broken: bool = False) -> None:
        """Give back what is unsettled and close the connection (``broken``: drop it)."""
        self._ready.clear()
        for delivery in list(self._unsettled.values()):
            try:
                delivery.give_back()
            except Exception:  # the connection is gone: the broker takes it back itself
                LOG.debug("bus consumer %s: give back failed", self._host, exc_info=True)
        self._unsettled.clear()
        self._subscriptions.clear()
        connection, self._connection, self._channel = self._connection, None, None
        with self._lock:
            self._epoch += 1
        if connection is not None:
            (drop if broken else release)(connection)
        self._fail_commands(keep_changes=True)

    def _fail_commands(self, keep_changes: bool) -> None:
        kept = []
        with self._lock:
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if keep_changes and command.epoch is None:
                    kept.append(command)
                elif command.future.set_running_or_notify_cancel():
                    reason = "the consumer disconnected or stopped"
                    command.future.set_exception(base.BusUnavailable(self.wire.safe_url, reason))
            for command in kept:
                self._commands.put(command)
