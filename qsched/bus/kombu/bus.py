"""The kombu bus itself: :class:`KombuBus`, the :class:`~qsched.bus.base.Bus` contract.

It publishes through its :class:`~qsched.bus.kombu.wire.KombuWire` and builds
consumers (:mod:`qsched.bus.kombu.consumer`), and does nothing more. What each
transport does, and the connection strings: :mod:`qsched.bus.kombu`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import kombu
from amqp import exceptions as amqp_exceptions

from qsched import exception
from qsched.bus import base, health
from qsched.bus.kombu import message as kombu_message
from qsched.bus.kombu.consumer import KombuConsumer
from qsched.bus.kombu.loop import ConsumerLoop
from qsched.bus.kombu.wire import KombuOptions, KombuWire, kombu_options
from qsched.conf import BusOptions
from qsched.scheduling.message import BootRequest, DeleteRequest, HostAction

__all__ = ["KombuBus"]


class KombuBus(base.Bus):
    """The bus on one transport URL, kombu's or oslo.messaging's ``rabbit://``. Thread-safe.

    Only the :class:`~qsched.bus.base.Bus` contract is public, and ``wire``: the
    :class:`~qsched.bus.kombu.wire.KombuWire` it publishes through and hands to
    its consumers, for tools that must send what qsched never would (chaos runs,
    tests).

    :raises Invalid: as :class:`~qsched.bus.kombu.wire.KombuWire`.
    """

    def __init__(
        self,
        url: str = "memory://",
        prefix: str = base.DEFAULT_PREFIX,
        options: KombuOptions | None = None,
    ) -> None:
        self._attach(KombuWire(url, prefix, options))

    @classmethod
    def on_wire(cls, wire: KombuWire) -> KombuBus:
        """A bus on a wire of someone else's (the oslo.messaging bus's AMQP side)."""
        bus = cls.__new__(cls)
        bus._attach(wire)
        return bus

    def _attach(self, wire: KombuWire) -> None:
        self.wire = wire
        self.names = wire.names
        self._history = health.PublishHistory()
        self._probe_cache = health.ProbeCache(wire.probe)
        self._loop: ConsumerLoop | None = None  # the consumers' shared one, if they share

    def sharing_consumers(self) -> KombuBus:
        """A bus on the same wire whose consumers share one connection and one thread.

        For a process that consumes for several hosts (a benchmark's agents, a
        compute service per hypervisor node in one process): each host keeps its
        own channel, prefetch, queues and acks, and so every promise of
        :class:`~qsched.bus.base.Consumer`, but they hold one broker connection
        instead of one each, and their callbacks take turns in one thread
        (:mod:`qsched.bus.kombu.loop`). :meth:`close` closes that connection.
        """
        bus = KombuBus.on_wire(self.wire)
        bus._loop = ConsumerLoop(self.wire, f"{self.names.prefix}-shared", shared=True)
        return bus

    @classmethod
    def from_options(cls, options: BusOptions) -> KombuBus:
        """Build from ``transport_url`` and the ``[bus]`` options."""
        return cls(options.transport_url, options.prefix, kombu_options(options))

    # -- the Bus interface --

    def publish_boot(self, message: BootRequest) -> None:
        self.wire.note_class(message.scheduling_class)
        entity = self.wire.boot_entity(message.scheduling_class)
        try:
            self.wire.publish(entity, message.encode(), message_id=message.request_id)
        except base.BusUnavailable as exc:
            self._history.failed(message.scheduling_class, exc.category)
            raise
        self._history.succeeded()

    def publish_delete(self, host: str, message: DeleteRequest) -> None:
        entity = self.wire.host_entity(host)
        self.wire.publish(entity, message.encode(), message_id=message.request_id)

    def publish_action(self, host: str, message: HostAction) -> None:
        entity = self.wire.host_entity(host)
        self.wire.publish(entity, message.encode(), message_id=message.request_id)

    def publish_to_host(self, host: str, message: BootRequest) -> None:
        entity = self.wire.host_entity(host)
        self.wire.publish(entity, message.encode(), message_id=message.request_id)

    def consumer(
        self, host: str, on_message: base.OnMessage, classes: Iterable[str] = ()
    ) -> KombuConsumer:
        return KombuConsumer(self.wire, host, on_message, classes, self._loop)

    def boot_classes(self) -> frozenset[str]:
        return self.wire.classes

    def queue_stats(self, scheduling_class: str) -> base.QueueStats:
        return self._stats(self.wire.boot_entity(scheduling_class))

    def dead_letter_stats(self) -> base.QueueStats:
        return self._stats(self.wire.dead_entity())

    def take_dead_letters(self, limit: int = 100) -> list[base.DeadLetter]:
        letters = []
        with self.wire.channel() as channel:
            self.wire.declare(channel, self.wire.dead_entity())
            for _ in range(limit):
                message = kombu_message.get_message(channel, self.names.dead_queue)
                if message is None:
                    break
                letters.append(kombu_message.dead_letter(message))
                message.ack()
        return letters

    def review_dead_letters(
        self, keep: Callable[[base.DeadLetter], bool], limit: int = 100
    ) -> list[base.DeadLetter]:
        reviewed = []
        with self.wire.channel() as channel:
            self.wire.declare(channel, self.wire.dead_entity())
            held = _hold(channel, self.names.dead_queue, limit)
            try:
                while held:
                    reviewed.append(self._review(held, keep))
            finally:
                self._give_back(held)
        return reviewed

    def purge_queue(self, scheduling_class: str) -> int:
        stats = self.queue_stats(scheduling_class)  # NotFound before anything is dropped
        with self.wire.channel() as channel:
            purged = channel.queue_purge(stats.queue)
        return int(purged or 0)

    def check_health(self) -> None:
        verdict = self._history.verdict()
        if verdict is not None:  # seen by boots; a probe may not see it (see PublishHistory)
            reason = f"boot publishes failed lately and none succeeded: {verdict}"
            raise base.BusUnavailable(self.wire.safe_url, reason, verdict)
        self._probe_cache.check()

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
        self.wire.close()

    # -- admin --

    def _stats(self, entity: kombu.Queue) -> base.QueueStats:
        with self.wire.channel() as channel:
            if not self.wire.amqp:  # declaring is free there, and a queue never missing
                ok = channel.queue_declare(queue=entity.name)
                return base.QueueStats(entity.name, ok.message_count, None, None)
            try:
                ok = entity.queue_declare(passive=True, channel=channel)
            except amqp_exceptions.NotFound:
                raise exception.NotFound(what=f"queue {entity.name}") from None
            return base.QueueStats(entity.name, ok.message_count, None, ok.consumer_count)

    def _review(self, held: list[Any], keep: Callable[[base.DeadLetter], bool]) -> base.DeadLetter:
        """Settle the first message held: a copy back to the dead letters if kept, then the ack."""
        letter = kombu_message.dead_letter(held[0])
        if keep(letter):
            headers = kombu_message.kept_headers(letter.headers)
            self.wire.publish(self.wire.dead_entity(), letter.body, headers=headers)
        held[0].ack()
        held.pop(0)
        return letter

    def _give_back(self, held: list[Any]) -> None:
        for message in held:
            with contextlib.suppress(*self.wire.errors):
                message.reject(requeue=True)


def _hold(channel: Any, queue: str, limit: int) -> list[Any]:
    """Up to ``limit`` messages of ``queue``, taken unacked."""
    held = []
    for _ in range(limit):
        message = kombu_message.get_message(channel, queue)
        if message is None:
            break
        held.append(message)
    return held
