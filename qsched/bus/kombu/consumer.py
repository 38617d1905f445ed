"""The consuming half of the kombu bus: a host's consumer on its channel, and its deliveries.

:class:`KombuConsumer` is what :meth:`qsched.bus.kombu.KombuBus.consumer` returns.
It stands on the :class:`~qsched.bus.kombu.wire.KombuWire` it is handed: it
declares its queues and publishes its requeues and dead letters through it, and
knows nothing of the producing half. Its channel lives on the connection of a
:class:`~qsched.bus.kombu.loop.ConsumerLoop`, its own or one it shares with the
consumers of other hosts. The transports' features (prefetch, redelivery, dead
letters) are described in :mod:`qsched.bus.kombu`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

import kombu

from qsched import exception
from qsched.bus import base
from qsched.bus.kombu import message as kombu_message
from qsched.bus.kombu.loop import ConsumerLoop
from qsched.bus.kombu.wire import KombuWire

LOG = logging.getLogger(__name__)

GIVEN_BACK = base.GIVEN_BACK


class KombuDelivery(base.SettledOnce, base.Delivery):
    """A message in the hands of a consumer callback (or of a thread it passed it to)."""

    def __init__(
        self, consumer: KombuConsumer, message: Any, entity: kombu.Queue, epoch: int
    ) -> None:
        self._consumer = consumer
        self._message = message
        self._entity = entity
        self._epoch = epoch
        super().__init__()
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
        reason = "it was given back to the broker when its consumer disconnected"
        tag = self._message.delivery_tag
        self._claim(state, self._consumer.wire.safe_url, reason, tag, self.queue)
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


class KombuConsumer(base.WantingConsumer):
    """One host's consumer: its channel, its host queue and classes, its deliveries.

    It consumes on the connection of ``loop`` (a :class:`ConsumerLoop` shared
    with other hosts), or of a loop of its own when none is given. All channel
    work happens in the loop's thread: settles from other threads and class
    changes are queued to it and applied between ``drain_events`` calls.
    Callbacks should be short (decode, claim, settle) and hand long work such as
    a spawn to another thread: while a callback runs, no heartbeat goes out (and
    on a shared loop, no other host gets a message), and RabbitMQ drops a
    connection silent for about two heartbeats.
    """

    def __init__(
        self,
        wire: KombuWire,
        host: str,
        on_message: base.OnMessage,
        classes: Iterable[str],
        loop: ConsumerLoop | None = None,
    ) -> None:
        super().__init__(host, on_message, classes)
        self.wire = wire
        self._loop = loop or ConsumerLoop(wire, self._host)
        self._epoch = 0  # bumped whenever its channel goes: older deliveries cannot be settled
        self._channel: Any = None
        self._subscriptions: dict[str, kombu.Consumer] = {}
        self._unsettled: dict[int, KombuDelivery] = {}
        self._attached = False

    @property
    def _connection(self) -> kombu.Connection | None:
        """The connection its channel is on, for tests that cut it."""
        return self._loop.connection_of(self._host)

    # -- the Consumer interface --

    def start(self) -> None:
        if self._stop.is_set() or self._attached:
            return
        self._attached = True
        self._loop.attach(self)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._loop.detach(self, timeout_s)

    # -- for deliveries --

    def call_in_loop(self, epoch: int, work: Callable[[], None]) -> None:
        """Run ``work`` in the loop's thread if the channel of ``epoch`` still lives.

        :raises BusUnavailable: that channel is gone, or the thread is stuck.
        """
        self._loop.call(functools.partial(self._check_epoch, epoch), work, self._lock)

    def settled(self, delivery: KombuDelivery) -> None:
        self._unsettled.pop(id(delivery), None)

    def _check_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            reason = "the connection that delivered it is gone; the broker delivers it again"
            raise base.BusUnavailable(self.wire.safe_url, reason)

    # -- its channel, in the loop's thread --

    def opened(self, connection: kombu.Connection) -> None:
        if self._channel is not None or self._stop.is_set():
            return
        self._channel = connection.channel()
        self._channel.basic_qos(0, 1, False)  # per consumer: quorum queues refuse global
        self._consume_queue(self.wire.host_entity(self._host))
        for name in sorted(self.classes):
            self._subscribe(name)
        self._ready.set()
        LOG.info("bus consumer %s: consuming %s", self._host, sorted(self._subscriptions))

    def lost(self) -> None:
        self._ready.clear()
        for delivery in list(self._unsettled.values()):
            try:
                delivery.give_back()
            except Exception:  # the connection is gone: the broker takes it back itself
                LOG.debug("bus consumer %s: give back failed", self._host, exc_info=True)
        self._unsettled.clear()
        self._subscriptions.clear()
        self._channel = None
        with self._lock:
            self._epoch += 1

    def closed(self) -> None:
        channel = self._channel
        self.lost()  # gives back what is unsettled on the channel, still open
        if channel is not None:
            channel.close()

    def _subscribe(self, name: str) -> None:
        if self._channel is None or name in self._subscriptions or name not in self.classes:
            return  # not open yet: opening subscribes to every class wanted then
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

    def _later(self, change: Callable[[], None]) -> Future[None]:
        return self._loop.later(change)
