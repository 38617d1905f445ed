"""The qsched bus on oslo.messaging's notification layer (``[bus] driver = oslo.messaging``).

For deployments that run everything through oslo.messaging: the same per-class
topics and pulling agents as the kombu bus, on oslo.messaging's rabbit driver.

Features
========
* Why the notification listener and not the RPC server: oslo.messaging's RPC
  server acknowledges a message when it receives it, before the endpoint runs, so
  an agent that dies holding a request would lose it. Its notification listener
  with ``allow_requeue`` acknowledges after the endpoint returns ``HANDLED`` and
  gives the message back on ``REQUEUE``: an agent acknowledges a request only once
  its claim is in the ledger, or its copy is confirmed at the tail (requeue) or in
  the dead letters (reject), as on the kombu bus.
* Topics ``<prefix>.boot.<class>`` and ``<prefix>.host.<host>`` on the topic
  exchange ``<prefix>``, priority ``info``: the queues are
  ``<prefix>.boot.<class>.info`` and ``<prefix>.host.<host>.info``
  (:class:`~qsched.bus.oslo_wire.OsloNames`, which admin views use too). Boot
  queues are durable quorum queues with ``x-delivery-limit`` ``[bus]
  delivery_limit``; host queues durable classic queues, or quorum queues without a
  delivery limit under ``[bus] host_queue_type = quorum`` (for a RabbitMQ cluster).
* No pool: the agents of a class compete on its one queue; prefetch 1 per queue.
* Publishes are confirmed (the rabbit driver publishes with confirms, after
  declaring the queue), and a failure raises :class:`~qsched.bus.base.BusUnavailable`
  (oslo.messaging's Notifier would only log it: see
  :meth:`~qsched.bus.oslo_wire.OsloWire.publish`).
* Dead letters: oslo.messaging declares its queues with a delivery limit but no
  dead-letter exchange, and RabbitMQ drops a message over the limit. The policies
  of ``deploy/rabbitmq-policies.sh`` give ``<prefix>.boot.*`` and ``<prefix>.host.*``
  the dead-letter exchange ``<prefix>.dead``; they are required, not optional,
  with this bus. The dead-letter queue is the kombu bus's ``<prefix>.dead``
  (quorum, no delivery limit: reviewing letters is no delivery that may drop them),
  written and read over AMQP through :mod:`qsched.bus.kombu_wire`, so ``qsched-admin``
  sees one place for both. A letter the broker dead-lettered carries the
  oslo.messaging envelope; :meth:`OsloBus.take_dead_letters` shows its qsched body.
* What the contract cannot have here: ``Delivery.redelivered`` is always False and
  ``Delivery.headers`` empty (oslo.messaging hands its endpoint neither), and a
  message oslo.messaging cannot decode (not JSON, not an envelope) never reaches
  the agent: the rabbit driver rejects it, and the broker dead-letters it through
  the policy with the reason ``rejected``.
* Counts, purges, dead letters and the health probe go through kombu on the same
  broker (oslo.messaging has none of them); the probe is the kombu bus's.

Connection String
=================
.. code-block::

    rabbit://USER:PASSWORD@HOST1[:5672][,USER:PASSWORD@HOST2[:5672]...]/[VHOST][?OPTIONS]
    amqp://USER:PASSWORD@HOST[:5672]/[VHOST]     (rewritten as rabbit://)

Query options as for the kombu bus (:mod:`qsched.conf.transport`). The ``[bus]``
options used: ``prefix``, ``delivery_limit``, ``heartbeat_s`` (the rabbit driver's
``heartbeat_timeout_threshold``, which also bounds how long a publish waits for its
confirm), ``reconnect_max_delay_s`` (``rabbit_interval_max``), ``publisher_pool_size``
(``rpc_conn_pool_size``), and for the AMQP side ``connect_timeout_s`` and
``confirm_timeout_s``.

Modules: this one (:class:`OsloBus`), :mod:`qsched.bus.oslo_wire` (names,
transports, envelope, publishes), :mod:`qsched.bus.oslo_consumer` (the listeners).
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
from qsched.bus.kombu_wire import KombuOptions, kombu_options
from qsched.bus.oslo_consumer import OsloConsumer
from qsched.bus.oslo_wire import OsloNames, OsloWire, Undecodable, body_of
from qsched.conf import BusOptions
from qsched.scheduling.message import ActionRequest, BootRequest, DeleteRequest

__all__ = ["OsloBus", "OsloNames"]

SCHEMES = frozenset({"rabbit", "amqp", "pyamqp"})


class OsloBus(base.Bus):
    """The bus on oslo.messaging's notification layer, RabbitMQ only. Thread-safe.

    ``wire`` is its :class:`~qsched.bus.oslo_wire.OsloWire`, for tools that must
    send what qsched never would (chaos runs, tests).

    :raises Invalid: as :class:`~qsched.bus.oslo_wire.OsloWire`.
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

    def publish_action(self, host: str, message: ActionRequest) -> None:
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
