"""The oslo.messaging bus itself: :class:`OsloBus`, the :class:`~qsched.bus.base.Bus` contract.

It publishes through its :class:`~qsched.bus.oslo.wire.OsloWire`, builds consumers
(:mod:`qsched.bus.oslo.consumer`), and reads counts and dead letters through the kombu
bus on the same broker. What it does and does not do, and the connection strings:
:mod:`qsched.bus.oslo`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any

from amqp import exceptions as amqp_exceptions

from qsched import exception
from qsched.bus import base, health
from qsched.bus.kombu import KombuBus
from qsched.bus.kombu.wire import KombuOptions, kombu_options
from qsched.bus.oslo.consumer import OsloConsumer
from qsched.bus.oslo.wire import OsloNames, OsloWire, Undecodable, body_of
from qsched.conf import BusOptions
from qsched.scheduling.message import BootRequest, DeleteRequest, HostAction

__all__ = ["SCHEMES", "OsloBus", "unwrapped"]

SCHEMES = frozenset({"rabbit", "amqp", "pyamqp"})


class OsloBus(base.Bus):
    """The bus on oslo.messaging's notification layer, RabbitMQ only. Thread-safe.

    ``wire`` is its :class:`~qsched.bus.oslo.wire.OsloWire`, for tools that must
    send what qsched never would (chaos runs, tests).

    :raises Invalid: as :class:`~qsched.bus.oslo.wire.OsloWire`.
    """

    def __init__(
        self, url: str, prefix: str = base.DEFAULT_PREFIX, options: KombuOptions | None = None
    ) -> None:
        self.wire = OsloWire(url, prefix, options)
        self.names: OsloNames = self.wire.names
        self._dead = KombuBus.on_wire(self.wire.kombu)  # the kombu bus's dead letters
        self._classes: set[str] = set()
        self._history = health.PublishHistory()
        self._probe_cache = health.ProbeCache(self.wire.kombu.probe)

    @classmethod
    def from_options(cls, options: BusOptions) -> OsloBus:
        """Build from ``transport_url`` and the ``[bus]`` options."""
        return cls(options.transport_url, options.prefix, kombu_options(options))

    # -- publishing --

    def publish_boot(self, message: BootRequest) -> None:
        route = self.wire.boot_route(message.scheduling_class)
        self.note_class(message.scheduling_class)
        try:
            self.wire.publish(route, message.encode())
        except base.BusUnavailable as exc:
            self._history.failed(message.scheduling_class, exc.category)
            raise
        self._history.succeeded()

    def publish_delete(self, host: str, message: DeleteRequest) -> None:
        self.wire.publish(self.wire.host_route(host), message.encode())

    def publish_action(self, host: str, message: HostAction) -> None:
        self.wire.publish(self.wire.host_route(host), message.encode())

    def publish_to_host(self, host: str, message: BootRequest) -> None:
        self.wire.publish(self.wire.host_route(host), message.encode())

    def consumer(
        self, host: str, on_message: base.OnMessage, classes: Iterable[str] = ()
    ) -> OsloConsumer:
        classes = list(classes)
        for name in classes:
            self.note_class(name)
        return _NotingConsumer(self, host, on_message, classes)

    def note_class(self, scheduling_class: str) -> None:
        """Record a class this process publishes to or consumes. :raises Invalid:"""
        self._classes.add(base.check_class(scheduling_class))

    def boot_classes(self) -> frozenset[str]:
        return frozenset(self._classes)

    # -- admin, over AMQP --

    def queue_stats(self, scheduling_class: str) -> base.QueueStats:
        return self._stats(self.names.boot_queue(scheduling_class))

    def dead_letter_stats(self) -> base.QueueStats:
        return self._dead.dead_letter_stats()

    def take_dead_letters(self, limit: int = 100) -> list[base.DeadLetter]:
        return [unwrapped(letter) for letter in self._dead.take_dead_letters(limit)]

    def review_dead_letters(
        self, keep: Callable[[base.DeadLetter], bool], limit: int = 100
    ) -> list[base.DeadLetter]:
        shown = self._dead.review_dead_letters(lambda letter: keep(unwrapped(letter)), limit)
        return [unwrapped(letter) for letter in shown]

    def purge_queue(self, scheduling_class: str) -> int:
        stats = self.queue_stats(scheduling_class)  # NotFound before anything is dropped
        with self.wire.kombu.channel() as channel:
            return int(channel.queue_purge(stats.queue) or 0)

    def check_health(self) -> None:
        verdict = self._history.verdict()
        if verdict is not None:
            reason = f"boot publishes failed lately and none succeeded: {verdict}"
            raise base.BusUnavailable(self.wire.safe_url, reason, verdict)
        self._probe_cache.check()

    def close(self) -> None:
        self.wire.close()

    def _stats(self, name: str) -> base.QueueStats:
        with self.wire.kombu.channel() as channel:
            try:
                ok = channel.queue_declare(queue=name, passive=True)
            except amqp_exceptions.NotFound:
                raise exception.NotFound(what=f"queue {name}") from None
            return base.QueueStats(name, ok.message_count, None, ok.consumer_count)


class _NotingConsumer(OsloConsumer):
    """A consumer that tells its bus of the classes it adds (:meth:`Bus.boot_classes`)."""

    def __init__(self, bus: OsloBus, host: str, on_message: base.OnMessage, classes: list[str]):
        super().__init__(bus.wire, host, on_message, classes)
        self._bus = bus

    def add_class(self, scheduling_class: str) -> Any:
        self._bus.note_class(scheduling_class)
        return super().add_class(scheduling_class)


def unwrapped(letter: base.DeadLetter) -> base.DeadLetter:
    """A letter with its qsched body, if the broker dead-lettered an oslo.messaging envelope.

    qsched's own dead letters carry the body as it is; one the broker dead-lettered
    (over the delivery limit, or rejected by the rabbit driver) is the JSON the
    rabbit driver sent. Anything else is left as it is.
    """
    try:
        outer = json.loads(letter.body)
        inner = json.loads(outer["oslo.message"])
        body = body_of(inner["payload"])
    except (ValueError, TypeError, KeyError, Undecodable):
        return letter
    return dataclasses.replace(letter, body=body)
