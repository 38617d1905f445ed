"""The wire under the kombu bus: connections, queues and exchanges, declares, confirmed publishes.

:class:`KombuWire` is what both halves of the bus stand on: the producer
(:class:`qsched.bus.kombu.KombuBus`) publishes through it, and the consumer
(:class:`qsched.bus.kombu.consumer.KombuConsumer`) connects, declares and
publishes its requeues and dead letters through it. Neither half knows the
other. What each transport does is described in :mod:`qsched.bus.kombu`.

Thread-safe. Publishing connections are pooled (one thread at a time uses one);
every other connection is made on demand and belongs to its caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import kombu
import kombu.exceptions
from amqp import exceptions as amqp_exceptions

from qsched import exception
from qsched.bus import base
from qsched.conf.bus import BusOptions
from qsched.conf.transport import SHUFFLE, Transport, parse_transport_url

LOG = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-msgpack"
SCHEMES = frozenset({"memory", "amqp", "pyamqp", "redis", "rediss", "rabbit"})
PROBE_KEY = "health"  # the probe's routing key: no queue binds it (boot.*, host.* do)
# The steps of a publish, which say what a failure means (see failure_category).
CONNECT, DECLARE, PUBLISH = "connect", "declare", "publish"


@dataclasses.dataclass(frozen=True)
class KombuOptions:
    """Tunables; the names match the ``[bus]`` options."""

    connect_timeout_s: float = 5.0
    confirm_timeout_s: float = 5.0  # also the socket timeout of Redis commands
    heartbeat_s: int = 30  # consumers only; 0 turns AMQP heartbeats off
    delivery_limit: int = 20  # RabbitMQ boot queues: deliveries without an ack
    host_queue_type: str = "classic"  # RabbitMQ host queues: "classic" or "quorum"
    visibility_timeout_s: float = 3600.0  # Redis: unacked past this is delivered again
    poll_interval_s: float = 0.1  # how often a consumer applies requests between events
    settle_timeout_s: float = 30.0  # how long a settle from another thread waits
    reconnect_max_delay_s: float = 5.0
    publisher_pool_size: int = 32  # idle publishing connections kept


def kombu_options(options: BusOptions) -> KombuOptions:
    """The tunables of the ``[bus]`` options."""
    names = (field.name for field in dataclasses.fields(KombuOptions))
    return KombuOptions(**{name: getattr(options, name) for name in names})


class _Unroutable(Exception):
    """RabbitMQ returned a mandatory message: no queue is bound for its key."""


#: Failures of one queue, not of the broker: it refused that queue (declared
#: elsewhere with other arguments, full and rejecting publishes) or had no route to it.
_QUEUE_ERRORS = (amqp_exceptions.ChannelError, amqp_exceptions.MessageNacked, _Unroutable)


def failure_category(step: str, exc: BaseException) -> str:
    """The :mod:`~qsched.bus.base` category of a publish that failed at ``step`` with ``exc``.

    A connection-level error while declaring (RabbitMQ's INTERNAL_ERROR 541) is the
    broker's, a channel-level one (PRECONDITION_FAILED 406) one queue's.
    """
    if step == CONNECT:
        return base.UNREACHABLE
    if isinstance(exc, _QUEUE_ERRORS):
        return base.REFUSED
    return base.DECLARE_FAILED if step == DECLARE else base.PUBLISH_FAILED


class _Publisher:
    """One connection, channel and producer, used by one thread at a time."""

    def __init__(self, connection: kombu.Connection, amqp: bool) -> None:
        self.connection = connection
        self.channel = connection.channel()
        self._returned: list[str] = []
        on_return = self._on_return if amqp else None  # memory channels share one event set
        self.producer = kombu.Producer(self.channel, on_return=on_return)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self._returned.append(f"{exc} (exchange {exchange!r}, key {routing_key!r})")

    def send(self, route: tuple[str, str], body: bytes, timeout_s: float, **props: Any) -> None:
        self._returned.clear()
        self.producer.publish(
            body,
            exchange=route[0],
            routing_key=route[1],
            mandatory=bool(route[0]),
            content_type=CONTENT_TYPE,
            content_encoding="binary",
            delivery_mode=2,
            timeout=timeout_s,
            confirm_timeout=timeout_s,
            **props,
        )
        if self._returned:  # the basic.return arrives before the confirm
            raise _Unroutable(self._returned[0])

    def close(self, broken: bool = False) -> None:
        """Close the connection; ``broken``: drop it without AMQP's close handshake."""
        (drop if broken else release)(self.connection)


class KombuWire:
    """Connections, entities and confirmed publishes on one transport URL.

    The URL is kombu's, or oslo.messaging's ``rabbit://`` naming several hosts
    (:mod:`qsched.conf.transport`, whose :class:`~qsched.conf.transport.Transport`
    is ``transport``): a connection fails over across the hosts (:meth:`connect`).
    ``names`` and ``options`` are what it was built with (``heartbeat_s`` the
    URL's if it sets one); ``driver`` is kombu's (``amqp``, ``redis`` or
    ``memory``), ``amqp`` whether it is RabbitMQ; ``safe_url`` the URL with its
    passwords masked. ``exchange_type`` is the type of the ``<prefix>`` exchange
    (``topic`` under the oslo.messaging bus, which shares this wire). ``errors`` are
    what the transport raises when the broker
    fails (``channel_errors`` those of one channel only).

    :raises Invalid: a URL scheme not in :data:`SCHEMES`, a URL oslo.messaging
        cannot parse or whose options cannot be honoured, or a bad prefix.
    """

    def __init__(
        self,
        url: str = "memory://",
        prefix: str = base.DEFAULT_PREFIX,
        options: KombuOptions | None = None,
        exchange_type: str = "direct",
    ) -> None:
        self.names = base.Names(prefix)
        self.exchange_type = exchange_type
        self.transport: Transport = parse_transport_url(_check_scheme(url))
        self.options = _with_heartbeat(options or KombuOptions(), self.transport)
        self._urls = [_check_scheme(part) for part in self.transport.urls]
        probes = [kombu.Connection(part) for part in self._urls]
        probe = probes[0]
        self.driver: str = probe.transport.driver_type
        if any(each.transport.driver_type != self.driver for each in probes):
            raise exception.Invalid(reason="the hosts of a bus URL must share one transport")
        self._safe_hosts = [each.as_uri() for each in probes]
        self.safe_url: str = self.transport.safe_url or ";".join(self._safe_hosts)
        self.amqp = self.driver == "amqp"
        if self.driver == "memory" and not probe.hostname:
            self._urls = ["memory://localhost/"]  # same broker state; kombu warns without a host
        # The host the last connection reached, where the next one starts.
        self._reached = random.randrange(len(self._urls)) if self._shuffled else 0
        self.channel_errors: tuple[type[BaseException], ...] = tuple(probe.channel_errors)
        self.errors: tuple[type[BaseException], ...] = (
            *probe.connection_errors,
            *probe.channel_errors,
            OSError,
            kombu.exceptions.OperationalError,
            amqp_exceptions.MessageNacked,
            _Unroutable,
        )
        self._lock = threading.Lock()
        self._declared: set[str] = set()  # queue names declared by this process
        self._classes: set[str] = set()
        self._idle: list[_Publisher] = []
        self._closed = False
        self._boot_entities: dict[str, kombu.Queue] = {}  # few classes; publishing is hot
        self._dead_entity = self._new_dead_entity()

    # -- connections --

    def connect(self, heartbeat_s: int = 0) -> kombu.Connection:
        """A new connection, connected now; the caller releases it.

        Each host of the URL is tried once, without a pause, until one answers:
        first the one the last connection reached, then the others, in the order
        listed (``kombu_failover_strategy=round-robin``, the default) or at
        random (``shuffle``). One host: it fails at once, no retries.

        :raises: one of :attr:`errors`, the last host's.
        """
        *others, last = self._failover_order()
        for index in others:
            try:
                return self._connect_to(index, heartbeat_s)
            except self.errors as exc:
                LOG.warning("bus: %s is unreachable (%s); trying the next host",
                            self._safe_hosts[index], base.describe(exc))  # fmt: skip
        return self._connect_to(last, heartbeat_s)

    @contextlib.contextmanager
    def channel(self) -> Iterator[Any]:
        """A channel on a short-lived connection of its own, released on exit.

        :raises BusUnavailable: connecting failed, or the block raised one of
            :attr:`errors`.
        """
        try:
            connection = self.connect()
        except self.errors as exc:
            raise base.BusUnavailable(self.safe_url, base.describe(exc)) from None
        try:
            yield connection.channel()
        except self.errors as exc:
            drop(connection)
            raise base.BusUnavailable(self.safe_url, base.describe(exc)) from None
        finally:
            release(connection)  # after a drop, nothing is left to close

    def close(self) -> None:
        """Close the idle publishing connections; later publishes open and close their own."""
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for publisher in idle:
            publisher.close()

    @property
    def _shuffled(self) -> bool:
        return self.transport.failover_strategy == SHUFFLE

    def _failover_order(self) -> list[int]:
        """The hosts to try, by index: the last one reached, then the others."""
        start, count = self._reached, len(self._urls)  # read once: other threads move it
        others = [(start + step) % count for step in range(1, count)]
        if self._shuffled:
            random.shuffle(others)
        return [start, *others]

    def _connect_to(self, index: int, heartbeat_s: int) -> kombu.Connection:
        """A connection to host ``index``, connected now, or released.

        :raises: as :meth:`connect`.
        """
        connection = self._connection(self._urls[index], heartbeat_s)
        try:
            connection.ensure_connection(max_retries=0)
        except BaseException:
            connection.release()
            raise
        self._reached = index
        return connection

    def _connection(self, url: str, heartbeat_s: int) -> kombu.Connection:
        """A kombu connection to one host, not connected yet."""
        extra: dict[str, Any] = {}
        if self.transport.ssl is not None:  # a copy: kombu writes the host connected to in it
            ssl = self.transport.ssl
            extra["ssl"] = dict(ssl) if isinstance(ssl, Mapping) else ssl
        if self.transport.login_method is not None:
            extra["login_method"] = self.transport.login_method
        return kombu.Connection(
            url,
            connect_timeout=self.options.connect_timeout_s,
            heartbeat=heartbeat_s,
            transport_options=self._transport_options(),
            **extra,
        )

    def _transport_options(self) -> dict[str, Any]:
        options = self.options
        if self.amqp:
            return {"confirm_publish": True}
        if self.driver == "memory":
            return {"polling_interval": min(options.poll_interval_s, 0.02)}
        prefix = self.names.prefix
        return {
            "visibility_timeout": options.visibility_timeout_s,
            "socket_connect_timeout": options.connect_timeout_s,
            "socket_timeout": max(options.confirm_timeout_s, 2.0),  # above BRPOP's 1 s
            "socket_keepalive": True,
            "unacked_key": f"{prefix}.unacked",
            "unacked_index_key": f"{prefix}.unacked_index",
            "unacked_mutex_key": f"{prefix}.unacked_mutex",
            "client_name": f"{prefix}-bus",  # CLIENT LIST shows who is who
        }

    # -- names to kombu entities --

    def boot_entity(self, scheduling_class: str) -> kombu.Queue:
        """The queue of one class (RabbitMQ: quorum, with a delivery limit and dead letters).

        :raises Invalid: the class cannot be a queue name.
        """
        entity = self._boot_entities.get(scheduling_class)
        if entity is None:
            entity = self._new_boot_entity(scheduling_class)
            with self._lock:
                self._boot_entities[scheduling_class] = entity
        return entity

    def host_entity(self, host: str) -> kombu.Queue:
        """The queue of one host's deletes. :raises Invalid: as :meth:`boot_entity`."""
        name = self.names.host_queue(host)
        if not self.amqp:
            return _by_name(name)
        args = self._dead_letter_args()
        if self.options.host_queue_type == "quorum":  # replicated: it outlives a node's loss
            args["x-queue-type"] = "quorum"
        return self._amqp_queue(name, self.names.host_routing_key(host), args)

    def dead_entity(self) -> kombu.Queue:
        """The dead-letter queue."""
        return self._dead_entity

    def route(self, entity: kombu.Queue) -> tuple[str, str]:
        """(exchange, routing key) to publish to: straight to the queue on virtual transports."""
        if self.amqp:
            return entity.exchange.name, entity.routing_key
        return "", entity.name

    def routing_key(self, entity: kombu.Queue) -> str:
        """The qsched routing key of a queue, whatever the transport: its name less the prefix."""
        return str(entity.name[len(self.names.prefix) + 1 :])

    def _new_boot_entity(self, scheduling_class: str) -> kombu.Queue:
        name = self.names.boot_queue(scheduling_class)
        if not self.amqp:
            return _by_name(name)
        args = {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.options.delivery_limit,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",  # at-least-once dead lettering needs it
            **self._dead_letter_args(),
        }
        key = self.names.boot_routing_key(scheduling_class)
        return self._amqp_queue(name, key, args)

    def _new_dead_entity(self) -> kombu.Queue:
        name = self.names.dead_queue
        if not self.amqp:
            return _by_name(name)
        exchange = kombu.Exchange(self.names.dead_exchange, "direct", durable=True)
        args = {"x-queue-type": "quorum"}
        return kombu.Queue(
            name, exchange, base.DEAD_ROUTING_KEY, durable=True, queue_arguments=args
        )

    def _amqp_queue(self, name: str, key: str, args: Mapping[str, Any]) -> kombu.Queue:
        exchange = kombu.Exchange(self.names.exchange, self.exchange_type, durable=True)
        return kombu.Queue(name, exchange, key, durable=True, queue_arguments=dict(args))

    def _dead_letter_args(self) -> dict[str, Any]:
        return {
            "x-dead-letter-exchange": self.names.dead_exchange,
            "x-dead-letter-routing-key": base.DEAD_ROUTING_KEY,
        }

    # -- declares, and the classes this process uses --

    def declare(self, channel: Any, entity: kombu.Queue) -> None:
        """Declare a queue (and the dead letters first) unless this process already did.

        :raises: one of :attr:`errors`.
        """
        dead = self.dead_entity()
        for item in (dead, entity) if entity.name != dead.name else (dead,):
            if item.name not in self._declared:
                item.declare(channel=channel)
                with self._lock:
                    self._declared.add(item.name)

    def redeclare(self, channel: Any, entity: kombu.Queue) -> None:
        """Declare again (a consumer after it connects: the broker may have lost it).

        :raises: one of :attr:`errors`.
        """
        self._forget(entity.name)
        self.declare(channel, entity)

    def note_class(self, scheduling_class: str) -> None:
        """Record a boot class this process publishes to or consumes (see :attr:`classes`).

        :raises Invalid: the class cannot be a queue name.
        """
        with self._lock:
            self._classes.add(base.check_class(scheduling_class))

    @property
    def classes(self) -> frozenset[str]:
        """The boot classes noted so far."""
        with self._lock:
            return frozenset(self._classes)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._declared.discard(name)

    # -- confirmed publishes --

    def publish(self, entity: kombu.Queue, body: bytes, **props: Any) -> None:
        """Publish ``body`` to ``entity``, confirmed; declare it first if this process has not.

        One retry on a fresh connection (a pooled one may predate a broker restart).
        ``props`` go to kombu's ``Producer.publish`` (``headers``, ``message_id``).

        :raises BusUnavailable: its ``category`` says at which step it failed.
        """
        failure = base.BusUnavailable(self.safe_url, "not tried")
        for _attempt in range(2):
            publisher, step = None, CONNECT
            try:
                publisher = self._acquire()
                step = DECLARE
                self.declare(publisher.channel, entity)
                step = PUBLISH
                publisher.send(self.route(entity), body, self.options.confirm_timeout_s, **props)
            except _Unroutable as exc:
                failure = self._failure(step, exc, f"unroutable: {exc}")
                self._forget(entity.name)
                self._release(publisher)
            except self.errors as exc:
                failure = self._failure(step, exc)
                self._discard_all(publisher)
            else:
                self._release(publisher)
                return
        raise failure

    def publish_dead(self, body: bytes, reason: str, entity: kombu.Queue) -> None:
        """Publish ``body`` to the dead letters with ``reason`` and ``entity``, where it was.

        :raises BusUnavailable: as :meth:`publish`.
        """
        headers = {
            base.REASON_HEADER: reason[: base.MAX_REASON_CHARS],
            base.ORIGIN_QUEUE_HEADER: entity.name,
            base.ORIGIN_KEY_HEADER: self.routing_key(entity),
            base.DEAD_AT_HEADER: time.time(),
        }
        self.publish(self.dead_entity(), body, headers=headers)

    def probe(self) -> None:
        """One round trip that a broker taking boots answers: the health probe.

        A new connection, opened within ``connect_timeout_s``. On RabbitMQ, then a
        declare of the exchange (idempotent) and a confirmed publish of an empty,
        transient message with a routing key no queue binds, which the broker
        confirms and drops. On Redis and memory, a declare of the dead-letter
        queue (on Redis: a PING when connecting, then its length).

        It catches a broker down or unreachable, refused credentials or vhost, one
        that cannot open a channel or declare an exchange, and on RabbitMQ one that
        blocks publishers on a memory or disk alarm (no confirm within
        ``confirm_timeout_s``). It does not catch what only a boot queue shows:
        queues the broker fails to declare (INTERNAL_ERROR 541), one queue refused
        or full (the publish history sees both), or no agent consuming a class.

        :raises BusUnavailable:
        """
        step, connection = CONNECT, None
        try:
            connection = self.connect()
            channel = connection.channel()
            step = DECLARE
            if not self.amqp:
                channel.queue_declare(queue=self.names.dead_queue)
                return
            exchange = kombu.Exchange(self.names.exchange, self.exchange_type, durable=True)
            exchange.declare(channel=channel)
            step = PUBLISH
            timeout_s = self.options.confirm_timeout_s
            kombu.Producer(channel).publish(
                b"", exchange=exchange.name, routing_key=PROBE_KEY, delivery_mode=1,
                content_type=CONTENT_TYPE, content_encoding="binary", timeout=timeout_s,
                confirm_timeout=timeout_s,
            )  # fmt: skip
        except self.errors as exc:
            if connection is not None:
                drop(connection)
                connection = None
            raise self._failure(step, exc) from None
        finally:
            if connection is not None:
                release(connection)

    def _failure(self, step: str, exc: BaseException, reason: str = "") -> base.BusUnavailable:
        category = failure_category(step, exc)
        return base.BusUnavailable(self.safe_url, reason or base.describe(exc), category)

    # -- the publisher pool --

    def _acquire(self) -> _Publisher:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        connection = self.connect()
        try:
            return _Publisher(connection, self.amqp)
        except BaseException:
            connection.release()
            raise

    def _release(self, publisher: _Publisher | None) -> None:
        if publisher is None:
            return
        with self._lock:
            if not self._closed and len(self._idle) < self.options.publisher_pool_size:
                self._idle.append(publisher)
                return
        publisher.close()

    def _discard_all(self, publisher: _Publisher | None) -> None:
        # One broken connection usually means all of them (broker restart).
        with self._lock:
            idle, self._idle = self._idle, []
        for each in [publisher, *idle]:
            if each is not None:
                each.close(broken=True)


def release(connection: kombu.Connection) -> None:
    """Close ``connection`` with AMQP's close handshake; a failure is only logged."""
    try:
        connection.release()
    except Exception:  # closing a broken connection; nothing more to do
        LOG.debug("closing a bus connection failed", exc_info=True)


def drop(connection: kombu.Connection) -> None:
    """Close ``connection``'s socket at once, without AMQP's close handshake.

    For a connection that failed: the handshake waits for the broker's ``close-ok``
    without a timeout, so on a node that hangs (it stopped answering but its socket
    stays open) a graceful close blocks until the node answers again, which froze
    a publisher for the whole of a 20 s hang in a test on a RabbitMQ cluster.
    """
    try:
        connection.collect()
    except Exception:
        LOG.debug("dropping a bus connection failed", exc_info=True)


def _with_heartbeat(options: KombuOptions, transport: Transport) -> KombuOptions:
    """``options`` with the URL's heartbeat, if it sets one (as oslo.messaging's query does)."""
    if transport.heartbeat_s is None:
        return options
    return dataclasses.replace(options, heartbeat_s=transport.heartbeat_s)


def _check_scheme(url: str) -> str:
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        schemes = ", ".join(sorted(SCHEMES))
        raise exception.Invalid(reason=f"bus URL scheme {scheme!r} is not one of {schemes}")
    return url


def _by_name(name: str) -> kombu.Queue:
    """A queue on a virtual transport, published to by its name (no exchange to scan)."""
    return kombu.Queue(name, kombu.Exchange(""), routing_key=name)
