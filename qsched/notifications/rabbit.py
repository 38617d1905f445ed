"""Notifications on RabbitMQ in oslo.messaging's ``messagingv2`` form, written by qsched.

Features: the message oslo.messaging's Notifier and rabbit driver write for
``driver = messagingv2``, on the same exchange (``[DEFAULT] control_exchange``, a
topic exchange, not durable), routing key ``<topic>.<priority>``, with the same
queue declared and bound by that name, the same properties (JSON, UTF-8,
persistent, priority 0, no headers) and the same body: oslo.messaging's 2.0
envelope (``oslo.version``, ``oslo.message``) around ``message_id``,
``publisher_id``, ``event_type``, ``priority``, ``payload``, ``timestamp``,
``_unique_id`` and the request's context as ``_context_*`` keys, written by orjson:
compact, and UTF-8 where json writes ``\\u`` escapes. A real oslo.messaging
notification listener reads it as its own (tests/notifications/test_notifications_rabbit.py
compares the two messages byte for byte, oslo.messaging's once written compact).

Why not oslo.messaging's own: its Notifier, driver, connection pool and kombu
producer spend about 480 Python calls and one round trip to the broker per
message (the publisher confirm, which the rabbit driver always waits for). Here
one connection is kept, the sender writes a whole batch (:mod:`qsched.notifications.queued`)
in one buffer, its AMQP frames built here (:func:`publish_frames`, the bytes py-amqp
would write, at a third of its CPU), and reads the broker's confirms once per batch,
after the pause in which the next batch gathers (:meth:`RabbitNotifier.settle`).

Connection String: ``[oslo_messaging_notifications] transport_url``,
``rabbit://USER:PASS@HOST:5672[,USER:PASS@HOST2:5672]/VHOST``, read by
:func:`qsched.conf.transport.parse_transport_url` (oslo.messaging's parser); the
hosts are tried in turn (``kombu_failover_strategy``). Query options: ``ssl``
and its files, ``kombu_failover_strategy``, ``rabbit_login_method``
(:data:`OPTIONS`); a URL with any other option is sent through oslo.messaging's
Notifier (:func:`serves`), which reads them all.

Delivery: at most once. A connection lost before the sender read the broker's
confirm of a message loses that message (it may have arrived: sending it again
could send it twice), counted in :attr:`RabbitNotifier.lost` and logged; the
messages not yet written are sent on the next connection. ``retry`` is oslo.messaging's: -1
reconnects without end, N at most N times for a batch, then its messages are lost.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import os
import struct
import time
import urllib.parse
from collections.abc import Sequence
from ssl import SSLSocket
from typing import Any

import kombu
import kombu.exceptions
import orjson
from oslo_serialization import jsonutils
from oslo_utils import timeutils

from qsched.conf.notifications import NotificationOptions
from qsched.conf.transport import Transport, parse_transport_url
from qsched.notifications.queued import MAX_PENDING, Event, QueuedNotifier

LOG = logging.getLogger(__name__)

DRIVER = "messagingv2"
#: oslo.messaging's ``transport_url`` when none is set.
DEFAULT_URL = "rabbit://"
#: The query options of ``transport_url`` this sender honours.
OPTIONS = frozenset({"ssl", "ssl_ca_file", "ssl_cert_file", "ssl_key_file",
                     "kombu_failover_strategy", "rabbit_login_method"})  # fmt: skip
#: The sender's pause after a batch, in which the next one gathers and the broker's
#: confirms of this one come in: an agent placing 50 instances a second sends some 75
#: messages a batch. A batch costs the sender about 0.45 ms of CPU beyond its messages:
#: 0.2 s cost it half as much again per placement; 1 s saves it a sixth more, not the
#: process (two runs), and doubles the latency (docs/notifications.rst, "Cost").
GATHER_S = 0.5
#: How long a batch waits for its confirms before the connection is given up.
CONFIRM_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
#: oslo.messaging's reconnect backoff (``rabbit_retry_interval``, ``_backoff``,
#: ``rabbit_interval_max``), at its defaults.
RETRY_START_S, RETRY_STEP_S, RETRY_MAX_S = 1.0, 2.0, 30.0
ENVELOPE_VERSION = "2.0"
_ENVELOPE_HEAD = b'{"oslo.version":"' + ENVELOPE_VERSION.encode() + b'","oslo.message":'
#: What orjson cannot write goes to oslo's jsonutils, as the Notifier would: datetimes
#: as jsonutils writes them, other types through ``to_primitive``.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME
#: AMQP 0-9-1 frames of ``basic.publish`` (class 60, method 40) and its content.
_FRAME_END = b"\xce"
_FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
_CONTENT_HEAD = struct.Struct(">HHQH")  # class, weight, body size, property flags
#: The properties oslo.messaging's rabbit driver sends (through kombu), in the order
#: of their flags: content-type, content-encoding, headers (an empty table),
#: delivery-mode (2, persistent: kombu's default), priority (0).
_PROPERTY_FLAGS = 0x8000 | 0x4000 | 0x2000 | 0x1000 | 0x0800
_PROPERTIES = b"\x10application/json\x05utf-8\x00\x00\x00\x00\x02\x00"
#: A publisher confirm from the broker, a ``basic.ack`` (class 60, method 80) or
#: ``basic.nack`` (method 120) method frame: head, class, method, delivery tag, bits
#: (``multiple`` first); then the frame end.
_CONFIRM = struct.Struct(">BHIHHQB")
_ACK, _NACK = 80, 120
_FRAME_SIZE = struct.Struct(">I")
#: Bytes read from the socket at once at most.
_READ_SIZE = 65536
#: The most of a batch handed to a TLS socket at once: a TLS record's plaintext at most.
TLS_RECORD_SIZE = 16384


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"{text[:40]!r}...: longer than an AMQP short string (255 bytes)")
    return bytes((len(raw),)) + raw


@functools.lru_cache(maxsize=64)
def _method_frame(channel: int, exchange: str, routing_key: str) -> bytes:
    """The ``basic.publish`` method frame: the same for every message of one topic."""
    method = b"\x00\x3c\x00\x28\x00\x00" + _shortstr(exchange) + _shortstr(routing_key) + b"\x00"
    return _FRAME_HEAD.pack(1, channel, len(method)) + method + _FRAME_END


def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes,
                   frame_max: int) -> bytes:  # fmt: skip
    """The frames py-amqp writes for ``basic_publish`` of ``body`` with oslo.messaging's
    properties, not mandatory, not immediate: a method frame, a content header frame,
    and the body in frames of at most ``frame_max`` bytes."""
    header = _CONTENT_HEAD.pack(60, 0, len(body), _PROPERTY_FLAGS) + _PROPERTIES
    parts = [_method_frame(channel, exchange, routing_key),
             _FRAME_HEAD.pack(2, channel, len(header)), header, _FRAME_END]  # fmt: skip
    chunk = frame_max - 8  # a frame's head and end
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        parts += [_FRAME_HEAD.pack(3, channel, len(piece)), piece, _FRAME_END]
    return b"".join(parts)


def read_confirms(data: bytes, channel: int) -> tuple[list[tuple[bool, int, bool]], int]:
    """The publisher confirms on ``channel`` at the head of ``data`` (frames as the
    broker sent them): (nack, delivery tag, multiple) each, and the bytes they take.
    Stops at the first other frame, or one not whole yet."""
    confirms, used, end = [], 0, len(data) - _CONFIRM.size - 1
    while used <= end:
        kind, on, size, class_id, method, tag, bits = _CONFIRM.unpack_from(data, used)
        if (kind, on, size, class_id) != (1, channel, _CONFIRM.size - 7, 60) or (
            method not in (_ACK, _NACK) or data[used + _CONFIRM.size] != _FRAME_END[0]
        ):
            break
        confirms.append((method == _NACK, tag, bool(bits & 1)))
        used += _CONFIRM.size + 1
    return confirms, used


def tls_pieces(ends: Sequence[int], size: int = TLS_RECORD_SIZE) -> list[int]:
    """Where to cut a buffer of messages ending at ``ends`` (ascending offsets) into
    pieces of whole messages, each at most ``size`` bytes or one longer message: the
    pieces' ends, the last the buffer's."""
    pieces, start = [], 0
    while ends and start < ends[-1]:
        fit = bisect.bisect_right(ends, start + size)  # the messages ending in the piece
        start = ends[fit - 1] if fit and ends[fit - 1] > start else ends[fit]
        pieces.append(start)
    return pieces


def _receive(sock: Any, deadline: float) -> bytes:
    """What the broker sent, waiting for it until ``deadline``.

    :raises socket.timeout: nothing came by ``deadline``.
    :raises ConnectionError: the broker closed the connection.
    """
    previous = sock.gettimeout()
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        data = sock.recv(_READ_SIZE)
    finally:
        sock.settimeout(previous)
    if not data:
        raise ConnectionError("the broker closed the connection")
    return data


def _holds_frame(data: bytes) -> bool:
    """Whether ``data`` starts with a whole frame."""
    return len(data) >= 7 and len(data) >= 8 + _FRAME_SIZE.unpack_from(data, 3)[0]


class _Closed(Exception):
    """The notifier was closed while the sender waited for the bus."""


def serves(options: NotificationOptions) -> bool:
    """Whether this sender serves ``options``: ``driver`` is ``messagingv2`` alone and
    ``transport_url`` a ``rabbit://`` URL (or unset) with no query option beyond
    :data:`OPTIONS`. Otherwise oslo.messaging's Notifier sends."""
    drivers = [name for name in options.driver if name != "noop"]
    scheme, _, rest = (options.transport_url or DEFAULT_URL).partition("://")
    query = urllib.parse.parse_qs(rest.partition("?")[2], keep_blank_values=True)
    return drivers == [DRIVER] and scheme.lower() == "rabbit" and set(query) <= OPTIONS


def open_rabbit_notifier(options: NotificationOptions, publisher_id: str) -> RabbitNotifier:
    """The sender ``options`` describe (:func:`serves` them), as ``publisher_id``.

    :raises Invalid: a ``transport_url`` oslo.messaging cannot parse, or a bad port.
    """
    transport = parse_transport_url(options.transport_url or DEFAULT_URL)
    return RabbitNotifier(transport, options.control_exchange,
                          options.versioned_notifications_topics, publisher_id,
                          retry=options.retry)  # fmt: skip


def uuid4_hexes(count: int) -> list[str]:
    """``count`` random version-4 UUIDs as ``uuid.uuid4().hex`` writes them, from one
    read of the system's randomness (a tenth of the CPU of ``uuid4`` each)."""
    raw = bytearray(os.urandom(16 * count))
    raw[6::16] = bytes(byte & 0x0F | 0x40 for byte in raw[6::16])  # the version, 4
    raw[8::16] = bytes(byte & 0x3F | 0x80 for byte in raw[8::16])  # the variant, RFC 4122
    text = raw.hex()
    return [text[start : start + 32] for start in range(0, 32 * count, 32)]


def dashed(hex_uuid: str) -> str:
    """A UUID's 32 hex digits as ``str(uuid)`` writes them."""
    h = hex_uuid
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def encode(publisher_id: str, event: Event, message_id: str, unique_id: str,
           timestamp: str) -> bytes:  # fmt: skip
    """The body oslo.messaging's ``messagingv2`` driver writes for ``event`` (one topic),
    with the ids and the time it draws given: the same fields, order and values, in
    compact UTF-8 JSON (no space after a separator, text outside ASCII as UTF-8 rather
    than ``\\u`` escapes). A JSON reader, oslo.messaging's listener among them, reads
    the same message."""
    message = {
        "message_id": message_id,
        "publisher_id": publisher_id,
        "event_type": event.event_type,
        "priority": event.priority.upper(),
        "payload": event.payload,
        "timestamp": timestamp,
        "_unique_id": unique_id,
    }
    for key, value in event.context.items():
        message[f"_context_{key}"] = value
    # json (the message through jsonutils, then the envelope) took three quarters of
    # this function's CPU; orjson takes a seventh of that
    try:
        text = orjson.dumps(message, default=jsonutils.to_primitive, option=_ORJSON_OPTIONS)
    except TypeError:  # keys not str, an int over 64 bits, a lone surrogate
        text = jsonutils.dumps(message).encode()
    return _ENVELOPE_HEAD + orjson.dumps(text.decode()) + b"}"


class RabbitNotifier(QueuedNotifier):
    """A :class:`Notifier` writing ``messagingv2`` messages on one kept RabbitMQ
    connection, a batch at a time, from a thread of its own.

    ``transport``: where (:class:`~qsched.conf.transport.Transport`); ``exchange``,
    ``topics``: oslo.messaging's ``control_exchange`` and topics; ``retry``: as
    oslo.messaging's (-1: reconnect without end).
    """

    def __init__(
        self,
        transport: Transport,
        exchange: str,
        topics: Sequence[str],
        publisher_id: str,
        retry: int = -1,
        max_pending: int = MAX_PENDING,
        gather_s: float = GATHER_S,
    ) -> None:
        super().__init__(max_pending, gather_s)
        self.transport = transport
        self.exchange = kombu.Exchange(exchange, "topic", durable=False, auto_delete=False)
        self.topics = tuple(topics)
        self.publisher_id = publisher_id
        self.retry = retry
        self.lost = 0  # messages not sent, or not confirmed by the broker
        self._connection = self._new_connection()
        self._channel: Any = None
        self._declared: set[str] = set()  # routing keys whose queue this channel declared
        self._unsettled: set[int] = set()  # delivery tags the broker has not confirmed yet
        self._tag = 0
        self._written = 0  # messages of the batch being written so far
        self._nacked = 0
        self.start()

    # -- the sender's side --

    def send(self, batch: list[Event]) -> None:
        todo = self._messages(batch)
        failures = 0
        while todo:
            try:
                channel = self._open()
            except _Closed:
                self._lose(len(todo), "the notifier was closed while the bus was away")
                return
            except self._errors as exc:  # ``retry`` is spent
                self._reset()
                self._lose(len(todo), f"{exc!r}, and retry = {self.retry} is spent")
                return
            try:
                todo = todo[self._publish(channel, todo) :]
            except self._connection.channel_errors as exc:  # the broker refused: no retry
                unwritten = len(todo) - self._reset()
                self._lose(unwritten, f"the broker refused a declaration or a publish: {exc}")
                return
            except self._errors as exc:
                todo = todo[self._reset() :]
                failures += 1
                if 0 <= self.retry < failures:
                    self._lose(len(todo), f"{exc!r}, and retry = {self.retry} is spent")
                    return
                LOG.warning("notification bus %s: %r; reconnecting", self._where, exc)

    def settle(self) -> None:
        """Read the broker's confirms of the batch written (they came in during the
        pause, so most of them are read at once). A nack, a refusal, a lost connection or
        :data:`CONFIRM_TIMEOUT_S` without them lose those not confirmed, counted."""
        if not self._unsettled:
            return
        try:
            self._await_confirms(time.monotonic() + CONFIRM_TIMEOUT_S)
        except self._connection.channel_errors as exc:
            self._reset(f"the broker refused a publish: {exc}")
        except self._errors as exc:
            self._reset(f"{exc!r} before the broker confirmed them")
        if self._nacked:
            self._lose(self._nacked, "the broker nacked them")
            self._nacked = 0

    def release(self) -> None:
        if self._channel is not None:
            self._channel = None
            with contextlib.suppress(Exception):
                self._connection.release()

    def _messages(self, batch: list[Event]) -> list[tuple[str, bytes]]:
        """(routing key, body) per event and topic, as oslo.messaging sends an event: one
        ``message_id``, a ``_unique_id`` per topic; one time for the whole batch (its
        messages are written within a millisecond or so)."""
        topics = self.topics
        ids = uuid4_hexes(len(batch) * (1 + len(topics)))
        timestamp = str(timeutils.utcnow())
        messages = []
        for event in batch:
            message_id = dashed(ids.pop())
            priority = event.priority.lower()
            for topic in topics:
                body = encode(self.publisher_id, event, message_id, ids.pop(), timestamp)
                messages.append((f"{topic}.{priority}", body))
        return messages

    def _publish(self, channel: Any, messages: list[tuple[str, bytes]]) -> int:
        """Write ``messages`` in one go (:meth:`settle` reads their confirms); how many
        were written.

        :raises: one of :attr:`_errors` (``_written`` says how far it got), or a channel
            error (the broker refused a declaration).
        """
        self._written = 0
        first = self._tag + 1
        for routing_key in dict.fromkeys(key for key, _body in messages):
            self._declare(channel, routing_key)
        channel_id, exchange, frame_max = (channel.channel_id, self.exchange.name,
                                           self._connection.connection.frame_max)  # fmt: skip
        frames = [publish_frames(channel_id, exchange, key, body, frame_max)
                  for key, body in messages]  # fmt: skip
        self._tag += len(frames)
        self._unsettled.update(range(first, self._tag + 1))
        self._send(frames, first)
        return self._written

    def _await_confirms(self, deadline: float) -> None:
        """Read the broker's frames until it confirmed every message written: all it
        sent in one read, into py-amqp's read buffer (``_read_buffer``, as both its
        transports name it), the confirms at its head parsed here
        (:func:`read_confirms`), any other frame read from there by py-amqp, which
        raises for a channel's close. py-amqp reads a frame in three reads and sets the
        socket's timeout twice, then dispatches it in some 40 calls.

        :raises: one of :attr:`_errors` (``socket.timeout`` past ``deadline``), or a
            channel error (the broker refused a publish).
        """
        connection = self._connection.connection
        transport, channel_id = connection.transport, self._channel.channel_id
        while self._unsettled:
            data = transport._read_buffer
            confirms, used = read_confirms(data, channel_id)
            if used:
                transport._read_buffer = data[used:]
                for nack, tag, multiple in confirms:
                    (self._on_nack if nack else self._on_ack)(tag, multiple)
            elif _holds_frame(data):
                connection.blocking_read(None)  # not a confirm: py-amqp's, from the buffer
            else:
                transport._read_buffer = data + _receive(transport.sock, deadline)

    def _declare(self, channel: Any, routing_key: str) -> None:
        """The queue oslo.messaging's notifier declares for a routing key, once per channel
        (``_publish_and_creates_default_queue``): messages sent before any listener came
        wait in it."""
        if routing_key in self._declared:
            return
        kombu.Queue(routing_key, self.exchange, routing_key, channel=channel,
                    durable=False, auto_delete=False).declare()  # fmt: skip
        self._declared.add(routing_key)

    def _send(self, frames: list[bytes], first: int) -> None:
        """Write every message's frames in one buffer; ``_written`` counts the messages
        whose every byte the kernel took (a message cut short never reaches a queue),
        and the tags of the others are no longer awaited."""
        sock = self._connection.connection.transport.sock
        ends = list(itertools.accumulate(len(f) for f in frames))
        data = memoryview(b"".join(frames))
        # An ``ssl.SSLSocket`` writes all it is given or raises, not saying how much
        # left: given the whole batch, a write failed midway would count none of it
        # written, and the next connection would send again messages already out
        # (a test saw them arrive twice). Given whole messages a TLS record's worth
        # at a time, a failed write's messages are cut short (a record cut short is
        # never read) and those before it were written. A plain socket says how much.
        pieces = tls_pieces(ends) if isinstance(sock, SSLSocket) else (len(data),)
        sent = 0
        try:
            for end in pieces:
                while sent < end:
                    sent += sock.send(data[sent:end])
        finally:
            self._written = bisect.bisect_right(ends, sent)
            self._unsettled -= set(range(first + self._written, first + len(frames)))

    # -- the connection --

    def _new_connection(self) -> kombu.Connection:
        extra: dict[str, Any] = {}
        if self.transport.ssl is not None:
            ssl = self.transport.ssl
            extra["ssl"] = dict(ssl) if isinstance(ssl, dict) else ssl
        if self.transport.login_method is not None:
            extra["login_method"] = self.transport.login_method
        return kombu.Connection(
            ";".join(self.transport.urls),
            failover_strategy=self.transport.failover_strategy,
            connect_timeout=CONNECT_TIMEOUT_S,
            heartbeat=0,  # the sender has no thread to beat; a dead peer fails the confirm
            **extra,
        )

    @property
    def _errors(self) -> tuple[type[BaseException], ...]:
        return (*self._connection.connection_errors, OSError, kombu.exceptions.OperationalError)

    @property
    def _where(self) -> str:
        return self.transport.safe_url or self._connection.as_uri()

    def _open(self) -> Any:
        """The kept channel, in confirm mode; connected first if need be (retrying as
        ``retry`` says, until :meth:`close`).

        :raises _Closed: the notifier was closed meanwhile.
        :raises: one of :attr:`_errors`, once ``retry`` is spent.
        """
        if self._channel is not None:
            return self._channel
        self._connection.ensure_connection(
            errback=self._connect_failed,
            max_retries=None if self.retry < 0 else self.retry,
            interval_start=RETRY_START_S,
            interval_step=RETRY_STEP_S,
            interval_max=RETRY_MAX_S,
            callback=self._check_open,
        )
        channel = self._connection.channel()
        channel.confirm_select()
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        self.exchange(channel).declare()
        self._channel = channel
        return channel

    def _check_open(self) -> None:
        if self.stopping:
            raise _Closed()

    def _connect_failed(self, exc: BaseException, interval: float) -> None:
        LOG.warning("notification bus %s unreachable (%r); retrying in %.0f s",
                    self._where, exc, interval)  # fmt: skip

    def _reset(self, reason: str = "the connection was lost before the broker confirmed "
               "them") -> int:  # fmt: skip
        """Give up the connection; how many messages of the batch being written were
        written. Those written but not confirmed are lost (they may have arrived), for
        ``reason``."""
        written = self._written
        if self._unsettled:
            self._lose(len(self._unsettled), reason)
        self._unsettled.clear()
        self._channel, self._declared, self._tag, self._written = None, set(), 0, 0
        with contextlib.suppress(Exception):
            if self._connection.connected:
                # py-amqp closes a TLS socket with ``unwrap()``, which waits for the
                # broker's TLS close as long as the socket's timeout (``connect_timeout``,
                # which its TLS transport keeps): 5 s more for a broker gone silent.
                # Non-blocking, it sends ours if it can and returns, as a plain close.
                self._connection.connection.sock.settimeout(0)
        with contextlib.suppress(Exception):
            self._connection.collect()  # drops the broken socket without a round trip
        self._connection = self._new_connection()
        return written

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._nacked += self._settle(tag, multiple)

    def _settle(self, tag: int, multiple: bool) -> int:
        settled = {t for t in self._unsettled if t <= tag} if multiple else {tag}
        settled &= self._unsettled
        self._unsettled -= settled
        return len(settled)

    def _lose(self, count: int, reason: str) -> None:
        self.lost += count
        self.log_limited("lost", "%d notifications not sent to %s: %s; %d lost so far",
                         count, self._where, reason, self.lost)  # fmt: skip
