"""The wire under the oslo.messaging bus: its names, transports, envelope and publishes.

:class:`OsloWire` is what both halves of :mod:`qsched.bus.oslo` stand on: the bus
publishes through it and its consumers (:mod:`qsched.bus.oslo.consumer`) listen on
its transports and publish their requeues and dead letters through it.

Two oslo.messaging notification transports on one broker, because the rabbit
driver's queue options hold for every queue a transport declares: one for boot
requests (quorum queues with ``x-delivery-limit``), one for host queues (durable
classic queues: thousands of hosts, one Raft group each would cost too much; quorum
queues without a delivery limit under ``[bus] host_queue_type = quorum``). Both
set ``rabbit_qos_prefetch_count`` 1 and durable queues. The dead letters, queue
counts, purges and the health probe need what oslo.messaging does not have; they
go through a :class:`~qsched.bus.kombu.wire.KombuWire` on the same broker, and the
dead letters are the kombu bus's own ``<prefix>.dead`` (see :mod:`qsched.bus.oslo`).

The envelope: an oslo.messaging notification (priority ``info``, message format
2.0) whose payload is ``{"body": BASE64}``, the body the kombu bus sends as it is
(msgpack of a :mod:`qsched.scheduling.message` request). :func:`body_of` reads it back
without trusting it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import oslo_messaging

from qsched.bus import base
from qsched.bus.kombu.wire import KombuOptions, KombuWire
from qsched.conf.transport import oslo_notification_transport, oslo_rabbit_url

PRIORITY = "info"  # oslo.messaging names the queue <topic>.<priority>
PUBLISHER = "qsched"
BODY = "body"
ENVELOPE_VERSION = 2.0  # oslo.messaging's "messagingv2" format
EVENT_TYPES = {"boot": "qsched.boot", "host": "qsched.host"}


class OsloNames(base.Names):
    """qsched's names as the oslo.messaging bus uses them (pure, no I/O).

    A topic is ``<prefix>.boot.<class>`` or ``<prefix>.host.<host>`` on the topic
    exchange ``<prefix>``; oslo.messaging declares its queue as the topic plus the
    priority, so the queues are ``<prefix>.boot.<class>.info`` and
    ``<prefix>.host.<host>.info``. Routing keys stay qsched's (``boot.<class>``),
    as every bus reports them; the dead letters are the kombu bus's.
    """

    def boot_topic(self, scheduling_class: str) -> str:
        return super().boot_queue(scheduling_class)

    def host_topic(self, host: str) -> str:
        return super().host_queue(host)

    def boot_queue(self, scheduling_class: str) -> str:
        return f"{self.boot_topic(scheduling_class)}.{PRIORITY}"

    def host_queue(self, host: str) -> str:
        return f"{self.host_topic(host)}.{PRIORITY}"


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a message goes: the oslo topic, its queue and qsched's routing key."""

    topic: str
    queue: str
    routing_key: str
    kind: str  # "boot" or "host": which transport


class Undecodable(Exception):
    """A notification that is not a qsched envelope; ``args[0]`` says why."""


def envelope(body: bytes, event_type: str) -> dict[str, Any]:
    """The notification oslo.messaging's Notifier would build around ``body``."""
    return {
        "message_id": str(uuid.uuid4()),
        "publisher_id": PUBLISHER,
        "event_type": event_type,
        "priority": PRIORITY.upper(),
        "payload": {BODY: base64.b64encode(body).decode("ascii")},
        "timestamp": str(datetime.datetime.now(datetime.UTC).replace(tzinfo=None)),
    }


def body_of(payload: Any) -> bytes:
    """The qsched body a notification's payload carries.

    :raises Undecodable: the payload is not ``{"body": BASE64}``.
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get(BODY), str):
        raise Undecodable(f"not a qsched payload: {_shape(payload)}")
    try:
        return base64.b64decode(payload[BODY].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise Undecodable(f"its body is not base64: {exc}") from None


def _shape(payload: Any) -> str:
    if isinstance(payload, Mapping):
        return f"a mapping with keys {sorted(map(str, payload))[:10]}"
    return f"a {type(payload).__name__}"


def failure_category(exc: BaseException) -> str:
    """The :mod:`~qsched.bus.base` category of a failed oslo.messaging publish."""
    text = str(exc)
    if "PRECONDITION_FAILED" in text or "NOT_FOUND" in text:
        return base.REFUSED
    if "Unable to connect" in text or isinstance(exc, OSError):
        return base.UNREACHABLE
    return base.PUBLISH_FAILED


class OsloWire:
    """oslo.messaging's transports and a kombu wire on one RabbitMQ. Thread-safe.

    ``rabbit_url`` is oslo.messaging's form of ``url``; ``kombu`` is the wire for
    what oslo.messaging lacks; ``names`` are :class:`OsloNames`. ``heartbeat_s`` is
    the rabbit driver's ``heartbeat_timeout_threshold`` (the URL's, if it sets
    one), which also bounds how long a publish waits for its confirm.

    :raises Invalid: not a rabbit:// or amqp:// URL, or one the bus cannot honour.
    """

    def __init__(
        self, url: str, prefix: str = base.DEFAULT_PREFIX, options: KombuOptions | None = None
    ) -> None:
        self.rabbit_url = oslo_rabbit_url(url)
        self.kombu = KombuWire(self.rabbit_url, prefix, options, exchange_type="topic")
        self.options = self.kombu.options
        self.names = OsloNames(prefix)
        self.safe_url = self.kombu.safe_url
        self._lock = threading.Lock()
        self._transports: dict[str, Any] = {}
        self._dead_declared = False

    def transport(self, kind: str) -> Any:
        """The notification transport of ``boot`` or ``host`` queues, made on first use
        (again after :meth:`close`).

        :raises RuntimeError: it has no ``_send_notification`` (oslo.messaging changed):
            :meth:`publish` needs it, and a publish failing for that would look like a
            broker outage.
        """
        with self._lock:
            if kind not in self._transports:
                quorum = kind == "boot" or self.options.host_queue_type == "quorum"
                transport = self._transport(quorum, limit=kind == "boot")
                if not callable(getattr(transport, "_send_notification", None)):
                    transport.cleanup()
                    raise RuntimeError("oslo.messaging's transport has no _send_notification")
                self._transports[kind] = transport
            return self._transports[kind]

    def _transport(self, quorum: bool, limit: bool) -> Any:
        """A transport declaring quorum or classic queues, with the delivery limit or none."""
        options = self.options
        rabbit: dict[str, Any] = {
            "amqp_durable_queues": True,
            "amqp_auto_delete": False,
            "rabbit_qos_prefetch_count": 1,
            "rabbit_quorum_queue": quorum,
            "heartbeat_timeout_threshold": options.heartbeat_s,
            "rabbit_interval_max": max(1, round(options.reconnect_max_delay_s)),
            "rpc_conn_pool_size": max(1, options.publisher_pool_size),
        }
        if limit:
            rabbit["rabbit_quorum_delivery_limit"] = options.delivery_limit
        return oslo_notification_transport(self.rabbit_url, rabbit)

    # -- routes --

    def boot_route(self, scheduling_class: str) -> Route:
        """:raises Invalid: the class cannot be a queue name."""
        names = self.names
        return Route(names.boot_topic(scheduling_class), names.boot_queue(scheduling_class),
                     names.boot_routing_key(scheduling_class), "boot")  # fmt: skip

    def host_route(self, host: str) -> Route:
        """:raises Invalid: the host cannot be a queue name."""
        names = self.names
        return Route(names.host_topic(host), names.host_queue(host),
                     names.host_routing_key(host), "host")  # fmt: skip

    def target(self, route: Route) -> Any:
        """The oslo.messaging target a listener of ``route`` listens on."""
        return oslo_messaging.Target(exchange=self.names.exchange, topic=route.topic)

    # -- confirmed publishes --

    def publish(self, route: Route, body: bytes) -> None:
        """Publish ``body`` on ``route``'s topic through oslo.messaging, confirmed.

        oslo.messaging's ``Notifier`` logs a failed send and returns as if it had
        worked; the bus must know, so it calls what the Notifier's driver calls, the
        transport's ``_send_notification`` (private, checked by :meth:`transport`),
        with one retry on a fresh connection. The rabbit driver declares the queue
        first (once per connection) and publishes with publisher confirms, so a
        publish that returns is in a durable queue.

        :raises BusUnavailable: not confirmed.
        """
        self.publish_notification(route, envelope(body, EVENT_TYPES[route.kind]))

    def publish_notification(self, route: Route, message: Mapping[str, Any]) -> None:
        """Publish a notification as it is (:meth:`publish` builds qsched's); for tools
        that must send what qsched never would. :raises BusUnavailable: not confirmed."""
        target = oslo_messaging.Target(exchange=self.names.exchange,
                                       topic=f"{route.topic}.{PRIORITY}")  # fmt: skip
        transport = self.transport(route.kind)
        self.declare_dead_letters()
        try:
            transport._send_notification(target, {}, dict(message), ENVELOPE_VERSION, retry=1)
        except Exception as exc:  # oslo.messaging raises its own types and kombu's
            raise base.BusUnavailable(self.safe_url, base.describe(exc),
                                      failure_category(exc)) from None  # fmt: skip

    def declare_dead_letters(self) -> None:
        """Declare the dead-letter queue (once per process), which the broker's
        dead-letter exchange needs before the first message goes over its delivery limit.

        :raises BusUnavailable:
        """
        if self._dead_declared:
            return
        with self.kombu.channel() as channel:
            self.kombu.declare(channel, self.kombu.dead_entity())
        self._dead_declared = True

    def publish_dead(self, body: bytes, reason: str, route: Route) -> None:
        """Publish ``body`` to the dead letters (the kombu bus's) with ``reason``.

        :raises BusUnavailable: not confirmed.
        """
        headers = {
            base.REASON_HEADER: reason[: base.MAX_REASON_CHARS],
            base.ORIGIN_QUEUE_HEADER: route.queue,
            base.ORIGIN_KEY_HEADER: route.routing_key,
            base.DEAD_AT_HEADER: time.time(),
        }
        self.kombu.publish(self.kombu.dead_entity(), body, headers=headers)

    def close(self) -> None:
        """Close the publishing connections of both transports and the kombu wire; a
        later publish makes new ones. Listeners have connections of their own."""
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for transport in transports:
            transport.cleanup()
        self.kombu.close()
