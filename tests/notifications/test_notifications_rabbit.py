"""qsched's ``messagingv2`` sender: oslo.messaging's message, in batches, counted when lost.

The flow through a real oslo.messaging listener is in tests/notifications/test_notifications.py
(``messagingv2`` on ``rabbit://`` is this sender); here its message is compared
with the one oslo.messaging's own Notifier writes, on a real RabbitMQ, and its
batching, reconnect and losses are checked.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import pytest

from qsched.conf import NotificationOptions
from qsched.conf.notifications import build_oslo_notifiers
from qsched.conf.transport import parse_transport_url
from qsched.notifications import open_notifier, payloads, rabbit
from qsched.notifications.oslo import OsloNotifier, RequestContext
from qsched.notifications.queued import MAX_BATCH, Event, QueuedNotifier
from tests.cloud import AMQP_URL, free_port, rabbit_failover_url, require_rabbitmq
from tests.helpers import wait_until
from tests.notifications.test_notifications import request
from tests.tls_proxy import TLSProxy, make_ca

pytestmark = pytest.mark.timeout(60)

RABBIT_URL = "rabbit://guest:guest@127.0.0.1:5672/"
ON = NotificationOptions.defaults().replace(driver=("messagingv2",), transport_url=RABBIT_URL)
#: The fields oslo.messaging draws anew for each message.
DRAWN = {"message_id", "_unique_id", "timestamp"}


# -- which sender, for which options ------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "url", "ours"),
    [
        (("messagingv2",), RABBIT_URL, True),
        (("messagingv2",), None, True),  # oslo.messaging's default: rabbit:// on localhost
        (("messagingv2",), RABBIT_URL + "?kombu_failover_strategy=shuffle", True),
        (("messagingv2",), RABBIT_URL + "?heartbeat_timeout_threshold=10", False),
        (("messagingv2",), RABBIT_URL + "?amqp_durable_queues=true", False),
        (("messagingv2", "log"), RABBIT_URL, False),
        (("messagingv2", "noop"), RABBIT_URL, True),
        (("messaging",), RABBIT_URL, False),
        (("log",), RABBIT_URL, False),
    ],
)
def test_messagingv2_alone_on_rabbit_is_qsched_s_sender(
    driver: tuple[str, ...], url: str | None, ours: bool
) -> None:
    options = ON.replace(driver=driver, transport_url=url)
    assert rabbit.serves(options) is ours
    notifier = open_notifier(options, "qsched-agent:test")
    try:
        assert isinstance(notifier, rabbit.RabbitNotifier if ours else OsloNotifier)
    finally:
        notifier.close()


# -- the same message as oslo.messaging's --------------------------------------------------


@pytest.fixture
def exchange() -> Iterator[str]:
    """An exchange of its own, with its queues, deleted after."""
    require_rabbitmq()
    import kombu

    name = f"qsched-test-{uuid.uuid4().hex[:8]}"
    yield name
    with kombu.Connection(AMQP_URL) as connection:
        channel = connection.channel()
        for queue in (f"{name}-a.info", f"{name}-a.error", f"{name}-b.info"):
            channel.queue_delete(queue)
        channel.exchange_delete(name)


def tell(notifier: Any, prefix: str, count: int) -> None:
    """``count`` events named ``<prefix><n>``, empty payloads."""
    for i in range(count):
        notifier.notify(f"{prefix}{i}", {})


def event_types(queue: str, count: int) -> list[str]:
    """The event types of ``count`` messages taken from ``queue``, in order."""
    return [json.loads(json.loads(m.body)["oslo.message"])["event_type"]
            for m in take(queue, count)]  # fmt: skip


def take(queue: str, count: int) -> list[Any]:
    """``count`` messages from ``queue`` (acknowledged), in order."""
    import kombu

    found: list[Any] = []
    with kombu.Connection(AMQP_URL) as connection:
        channel = connection.default_channel
        deadline = time.monotonic() + 10
        while len(found) < count and time.monotonic() < deadline:
            message = channel.basic_get(queue, no_ack=True)
            if message is None:
                time.sleep(0.05)
            else:
                found.append(message)
        assert channel.basic_get(queue, no_ack=True) is None, "more than sent"
    assert len(found) == count
    return found


def drain(queue: str) -> list[str]:
    """The event types of every message on ``queue`` (taken), in order: however many
    came, once none came for a while."""
    import kombu

    found: list[str] = []
    with kombu.Connection(AMQP_URL) as connection:
        channel = connection.default_channel
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 1.0:
            message = channel.basic_get(queue, no_ack=True)
            if message is None:
                time.sleep(0.05)
            else:
                found.append(json.loads(json.loads(message.body)["oslo.message"])["event_type"])
                quiet_since = time.monotonic()
    return found


def decoded(message: Any) -> tuple[list[str], dict[str, Any]]:
    outer = json.loads(message.body)
    assert list(outer) == ["oslo.version", "oslo.message"] and outer["oslo.version"] == "2.0"
    inner = json.loads(outer["oslo.message"])
    return list(inner), {k: v for k, v in inner.items() if k not in DRAWN}


@pytest.mark.real
def test_the_message_is_oslo_messaging_s_own(exchange: str) -> None:
    """One event sent by oslo.messaging's Notifier and by qsched's sender, on two topics,
    INFO and ERROR: same exchange, routing keys, properties, fields in the same order,
    same values but those drawn anew (ids, time); the context as ``_context_*``; the
    body oslo.messaging's, byte for byte, once written compact."""
    topics = (f"{exchange}-a", f"{exchange}-b")
    options = ON.replace(control_exchange=exchange, versioned_notifications_topics=topics)
    msg = request()
    payload = payloads.create_from_request(msg, "cn1", "cn1", "building", "spawning", "pending")
    payload["nova_object.data"]["display_name"] = "vm-é"  # not ASCII: escaped alike
    context = payloads.context(msg)
    oslo_notifier = build_oslo_notifiers(options, "qsched-agent:cn1")[0]
    ours = rabbit.open_rabbit_notifier(options, "qsched-agent:cn1")
    try:
        oslo_notifier.info(RequestContext(context), "instance.create.start", payload)
        ours.notify("instance.create.start", payload, context=context)
        assert ours.flush(10)
        oslo_notifier.error(RequestContext(context), "instance.create.error", payload)
        ours.notify("instance.create.error", payload, "ERROR", context)
        assert ours.flush(10)
    finally:
        ours.close()
        oslo_notifier.transport.cleanup()
    assert ours.lost == 0
    for queue, count in ((f"{exchange}-a.info", 2), (f"{exchange}-b.info", 2),
                         (f"{exchange}-a.error", 2)):  # fmt: skip
        theirs, mine = take(queue, count)
        assert mine.delivery_info["exchange"] == theirs.delivery_info["exchange"] == exchange
        assert mine.delivery_info["routing_key"] == theirs.delivery_info["routing_key"] == queue
        assert mine.properties == theirs.properties
        assert decoded(mine) == decoded(theirs)
        fields = decoded(mine)[1]
        assert fields["payload"] == payload and fields["_context_request_id"] == msg.request_id
        inner = json.loads(json.loads(mine.body)["oslo.message"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{6})?", inner["timestamp"])
        assert uuid.UUID(inner["message_id"]) and len(inner["_unique_id"]) == 32
        assert text(mine) == compact(same_draws(text(theirs), inner))  # byte for byte
        assert "\\\\u00e9" in text(theirs) and "vm-é" in text(mine)  # UTF-8, not escaped


def text(message: Any) -> str:
    body = message.body
    return body if isinstance(body, str) else body.decode("utf-8")


def compact(body: str) -> str:
    """oslo.messaging's ``body`` as qsched's sender writes it: the same JSON, envelope and
    message, in the same order, without spaces after separators, and UTF-8 rather than
    ``\\u`` escapes (docs/notifications.rst, "Who writes the messages")."""
    outer = json.loads(body)
    inner = json.dumps(json.loads(outer["oslo.message"]), separators=(",", ":"), ensure_ascii=False)
    outer["oslo.message"] = inner
    return json.dumps(outer, separators=(",", ":"), ensure_ascii=False)


def same_draws(body: str, like: dict[str, Any]) -> str:
    """``body`` with its drawn fields (ids, time) set to those of ``like``."""
    inner = json.loads(json.loads(body)["oslo.message"])
    for key in DRAWN:
        body = body.replace(inner[key], like[key])
    return body


@pytest.mark.parametrize(
    "payload",
    [
        # orjson would write 2024-01-02T03:04:05, jsonutils writes .000000 after it
        {"at": datetime.datetime(2024, 1, 2, 3, 4, 5), "id": uuid.UUID(int=7)},
        {1: "a key not a string", None: "another"},  # orjson refuses: jsonutils writes it
        {"big": 2**70},  # over 64 bits: the same
        {"lone": "\ud800", "text": 'é\u2028\x7f\x00"\\/'},  # a lone surrogate: the same
    ],
)
def test_what_orjson_cannot_write_is_written_as_oslo_s_jsonutils_would(payload: Any) -> None:
    """The body is oslo.messaging's message for any payload jsonutils can write: a
    datetime, a key not a string, a big int, a lone surrogate included."""
    from oslo_serialization import jsonutils

    event = Event("INFO", "e", payload, {"request_id": "req-1"})
    outer = json.loads(rabbit.encode("p", event, "m", "u", "t"))
    assert outer["oslo.version"] == "2.0"
    message = json.loads(outer["oslo.message"])
    assert message["payload"] == json.loads(jsonutils.dumps(payload))
    assert list(message) == ["message_id", "publisher_id", "event_type", "priority", "payload",
                             "timestamp", "_unique_id", "_context_request_id"]  # fmt: skip


def test_the_ids_drawn_for_a_batch_are_uuid4s() -> None:
    drawn = rabbit.uuid4_hexes(500)
    assert len(set(drawn)) == 500 and rabbit.uuid4_hexes(0) == []
    for hexes in drawn:
        value = uuid.UUID(hexes)
        assert (value.hex, value.version, value.variant) == (hexes, 4, uuid.RFC_4122)
        assert rabbit.dashed(hexes) == str(value)


# -- batches, reconnects, losses ---------------------------------------------------------


class Batches(QueuedNotifier):
    """Keeps the batches the sender hands it."""

    def __init__(self, gather_s: float) -> None:
        super().__init__(gather_s=gather_s)
        self.batches: list[list[str]] = []
        self.start()

    def send(self, batch: list[Event]) -> None:
        self.batches.append([event.event_type for event in batch])
        time.sleep(0.01)  # a send takes a while: events queue behind it

    def release(self) -> None:
        pass


def test_events_queued_during_a_send_go_in_one_batch_in_order() -> None:
    notifier = Batches(gather_s=0.05)
    try:
        for i in range(300):
            notifier.notify(f"e{i}", {})
        assert notifier.flush(5)
    finally:
        notifier.close()
    assert [t for batch in notifier.batches for t in batch] == [f"e{i}" for i in range(300)]
    assert len(notifier.batches) <= 3, [len(b) for b in notifier.batches]


def test_a_notify_wakes_no_one_the_sender_takes_what_gathered_at_its_pause() -> None:
    notifier = Batches(gather_s=30.0)
    try:
        time.sleep(0.05)  # the sender in its pause
        for i in range(5):
            notifier.notify(f"e{i}", {})
        time.sleep(0.2)
        assert notifier.batches == []  # queued, nobody woken
        assert notifier.flush(5)  # a flush does not wait for the pause's end
        assert notifier.batches == [[f"e{i}" for i in range(5)]]
    finally:
        notifier.close()


def test_a_backlog_over_a_batch_goes_out_in_full_batches_without_a_pause_each() -> None:
    notifier = Batches(gather_s=30.0)
    try:
        time.sleep(0.05)
        for i in range(2 * MAX_BATCH + 1):
            notifier.notify(f"e{i}", {})
        assert notifier.flush(5)
    finally:
        notifier.close()
    assert [len(batch) for batch in notifier.batches] == [MAX_BATCH, MAX_BATCH, 1]
    assert [t for b in notifier.batches for t in b] == [f"e{i}" for i in range(2 * MAX_BATCH + 1)]


def test_a_full_queue_drops_new_events_counted_and_a_flush_after_close_is_true() -> None:
    notifier = Batches(gather_s=30.0)
    notifier.max_pending = 4
    try:
        time.sleep(0.05)
        for i in range(10):
            notifier.notify(f"e{i}", {})
        assert notifier.dropped == 6
    finally:
        notifier.close()
    assert notifier.batches == [[f"e{i}" for i in range(4)]]  # sent at close
    assert notifier.flush(0.1)  # nothing left: true at once


@pytest.mark.real
def test_a_lost_connection_is_replaced_and_nothing_is_sent_twice(exchange: str) -> None:
    options = ON.replace(control_exchange=exchange,
                         versioned_notifications_topics=(f"{exchange}-a",))  # fmt: skip
    notifier = rabbit.open_rabbit_notifier(options, "qsched-agent:test")
    try:
        tell(notifier, "first", 5)
        assert notifier.flush(10)
        notifier._connection.connection.sock.close()  # the broker went, between batches
        tell(notifier, "second", 5)
        assert notifier.flush(10)
    finally:
        notifier.close()
    assert event_types(f"{exchange}-a.info", 10) == [f"first{i}" for i in range(5)] + [
        f"second{i}" for i in range(5)
    ]
    assert notifier.lost == 0


@pytest.mark.real
def test_a_refused_publish_loses_its_batch_counted_and_the_next_goes_on_a_new_channel(
    exchange: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker closes the channel of a publish to an exchange it no longer has: the
    sender reads that close among the confirms, loses the batch (counted, logged) and
    sends the next one on a new connection, the exchange declared again."""
    refused_publish(exchange, RABBIT_URL, caplog)


def refused_publish(exchange: str, url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Five sent, the exchange deleted under the sender, three refused (lost, counted,
    logged), two sent after on a new channel: the queue holds the seven but three."""
    import kombu

    options = ON.replace(transport_url=url, control_exchange=exchange,
                         versioned_notifications_topics=(f"{exchange}-a",))  # fmt: skip
    notifier = rabbit.open_rabbit_notifier(options, "qsched-agent:test")
    caplog.set_level(logging.ERROR)
    try:
        tell(notifier, "first", 5)
        assert notifier.flush(10) and notifier.lost == 0
        with kombu.Connection(AMQP_URL) as connection:
            connection.default_channel.exchange_delete(exchange)
        tell(notifier, "refused", 3)
        assert notifier.flush(10) and notifier.lost == 3
        tell(notifier, "after", 2)
        assert notifier.flush(10)
    finally:
        notifier.close()
    expected = [f"first{i}" for i in range(5)] + ["after0", "after1"]
    assert event_types(f"{exchange}-a.info", 7) == expected
    assert notifier.lost == 3 and "the broker refused a publish" in caplog.text


def test_the_confirms_are_read_from_the_frames_the_broker_sends() -> None:
    """Acks and nacks at the head of what was read, written as py-amqp writes them; a
    frame of another kind, or one not whole yet, is left for py-amqp."""
    from amqp import spec
    from amqp.method_framing import frame_writer
    from amqp.serialization import dumps

    written: list[bytes] = []
    connection = type("Connection", (), {"frame_max": 4096, "bytes_sent": 0})()
    transport = type("Transport", (), {"write": staticmethod(lambda b: written.append(bytes(b)))})
    write = frame_writer(connection, transport())

    def frame(channel: int, method: tuple[int, int], argsig: str, *args: Any) -> bytes:
        written.clear()
        write(1, channel, method, dumps(argsig, args), None)
        return b"".join(written)

    ack = frame(3, spec.Basic.Ack, "Lb", 7, False)
    acks = frame(3, spec.Basic.Ack, "Lb", 2**40, True)
    nack = frame(3, spec.Basic.Nack, "Lbb", 9, True, False)
    close = frame(3, spec.Channel.Close, "BsBB", 404, "NOT_FOUND", 60, 40)
    other_channel = frame(4, spec.Basic.Ack, "Lb", 8, False)
    found = [(False, 7, False), (False, 2**40, True), (True, 9, True)]
    assert rabbit.read_confirms(ack + acks + nack, 3) == (found, len(ack + acks + nack))
    assert rabbit.read_confirms(ack + close + nack, 3) == (found[:1], len(ack))
    assert rabbit.read_confirms(ack + nack[:-1], 3) == (found[:1], len(ack))
    assert rabbit.read_confirms(other_channel + ack, 3) == ([], 0)
    assert rabbit.read_confirms(b"", 3) == ([], 0)


@pytest.mark.parametrize(
    ("sizes", "pieces"),
    [
        ([], []),
        ([10], [10]),
        ([16384, 1], [16384, 16385]),  # a record's worth, then the rest
        ([6000, 6000, 6000, 6000], [12000, 24000]),
        ([100, 40000, 100, 100], [100, 40100, 40300]),  # a long message alone
        ([40000, 40000], [40000, 80000]),
    ],
)
def test_a_tls_write_is_cut_at_messages_a_record_s_worth_at_most(
    sizes: list[int], pieces: list[int]
) -> None:
    """Over TLS the sender hands the socket whole messages, a TLS record's worth at a
    time (a long message alone), so that a write that fails says which messages left."""
    ends = list(itertools.accumulate(sizes))
    assert rabbit.tls_pieces(ends) == pieces
    assert rabbit.tls_pieces(ends, 1) == ends  # each message alone


@pytest.mark.real
def test_failover_to_the_next_host_of_the_url(exchange: str) -> None:
    url = rabbit_failover_url()  # a closed port first, then the broker
    options = ON.replace(transport_url=url, control_exchange=exchange,
                         versioned_notifications_topics=(f"{exchange}-a",))  # fmt: skip
    assert rabbit.serves(options) and len(parse_transport_url(url).urls) == 2
    notifier = rabbit.open_rabbit_notifier(options, "qsched-agent:test")
    try:
        notifier.notify("e", {})
        assert notifier.flush(20)
    finally:
        notifier.close()
    assert len(take(f"{exchange}-a.info", 1)) == 1 and notifier.lost == 0


def test_with_retry_0_a_bus_that_is_away_loses_them_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"rabbit://guest:guest@127.0.0.1:{free_port()}/"
    notifier = rabbit.open_rabbit_notifier(ON.replace(transport_url=url, retry=0), "x")
    caplog.set_level(logging.ERROR)
    try:
        for i in range(5):
            notifier.notify(f"e{i}", {})
        assert notifier.flush(10)
    finally:
        notifier.close()
    assert notifier.lost == 5
    assert "not sent to rabbit://guest:**@127.0.0.1" in caplog.text and "retry = 0" in caplog.text


def test_a_bus_away_for_good_fills_the_queue_then_drops_and_close_gives_up() -> None:
    url = f"rabbit://guest:guest@127.0.0.1:{free_port()}/"
    transport = parse_transport_url(url)
    notifier = rabbit.RabbitNotifier(transport, "nova", ["versioned_notifications"], "x",
                                     retry=-1, max_pending=3)  # fmt: skip
    notifier.notify("e0", {})
    assert wait_until(lambda: notifier.queued() == 0, 5)  # the sender has it, retrying
    for i in range(1, 10):
        notifier.notify(f"e{i}", {})
    assert notifier.dropped == 6
    closing = threading.Thread(target=notifier.close)
    started = time.monotonic()
    closing.start()
    closing.join(20)
    assert not closing.is_alive() and time.monotonic() - started < 15
    assert notifier.lost >= 1  # e0's batch, given up at close


@pytest.mark.parametrize("size", [0, 10, 4096 - 8, 4096 - 7, 3 * 4096 + 5])
def test_the_frames_are_the_ones_py_amqp_writes(size: int) -> None:
    """The sender writes a batch's frames itself, in one buffer (docs/notifications.rst):
    byte for byte what py-amqp writes for kombu's publish of the same message, with the
    properties oslo.messaging's driver gives it; a body over ``frame_max`` split alike."""
    from amqp import Message, spec
    from amqp.method_framing import frame_writer
    from amqp.serialization import dumps

    written: list[bytes] = []
    connection = type("Connection", (), {"frame_max": 4096, "bytes_sent": 0})()
    transport = type("Transport", (), {"write": staticmethod(lambda b: written.append(bytes(b)))})
    body = ("é" * size).encode()[:size]
    message = Message(body, priority=0, content_type="application/json",
                      content_encoding="utf-8", application_headers={},
                      delivery_mode=2)  # fmt: skip
    args = dumps("Bssbb", (0, "nova", "versioned_notifications.info", False, False))
    frame_writer(connection, transport())(1, 7, spec.Basic.Publish, args, message)
    ours = rabbit.publish_frames(7, "nova", "versioned_notifications.info", body, 4096)
    assert ours == b"".join(written)


# -- over TLS ------------------------------------------------------------------------------


class TLSBroker(NamedTuple):
    """The local RabbitMQ behind a TLS proxy (tests/tls_proxy.py), and the CA that signed
    the proxy's certificate."""

    proxy: TLSProxy
    ca_file: Path

    def url(self, ca_file: Path | None = None) -> str:
        """The ``transport_url`` asking for TLS, trusting ``ca_file`` (the proxy's CA)."""
        ca = quote(str(ca_file or self.ca_file), safe="/")
        return f"rabbit://guest:guest@127.0.0.1:{self.proxy.port}/?ssl=1&ssl_ca_file={ca}"


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[TLSBroker]:
    """TLS in front of the local RabbitMQ, without reconfiguring it: a proxy on a free
    loopback port, its certificate (for 127.0.0.1) from a CA made here; stopped after."""
    require_rabbitmq()
    ca = make_ca(tmp_path)
    with TLSProxy(*ca.issue(tmp_path)) as proxy:
        yield TLSBroker(proxy, ca.ca_file)
    assert not proxy.running


@pytest.mark.real
def test_over_tls_every_batch_arrives_once_and_is_confirmed_in_time(
    exchange: str, tls_broker: TLSBroker
) -> None:
    """py-amqp's TLS transport: the sender writes on an ``ssl.SSLSocket`` and reads the
    confirms from it. Batches of one, many (their confirms in several reads) and more
    than one batch holds, and a message over ``frame_max`` (several TLS records): each
    arrives once, in order, none lost, each flush within the pause and a little."""
    options = ON.replace(transport_url=tls_broker.url(), control_exchange=exchange,
                         versioned_notifications_topics=(f"{exchange}-a",))  # fmt: skip
    notifier = rabbit.open_rabbit_notifier(options, "qsched-agent:test")
    sent: list[str] = []
    try:
        for prefix, count in (("one", 1), ("many", 120), ("more", MAX_BATCH + 30)):
            tell(notifier, prefix, count)
            sent += [f"{prefix}{i}" for i in range(count)]
            started = time.monotonic()
            assert notifier.flush(10)
            assert time.monotonic() - started < 4 * rabbit.GATHER_S + 1
        assert notifier._connection.connection.transport.sock.__class__.__name__ == "SSLSocket"
        notifier.notify("big", {"blob": "x" * 300_000})  # over frame_max, 131072
        sent.append("big")
        assert notifier.flush(10)
    finally:
        notifier.close()
    assert notifier.lost == 0 and notifier.dropped == 0
    assert tls_broker.proxy.connections == 1  # no reconnect
    assert event_types(f"{exchange}-a.info", len(sent)) == sent


@pytest.mark.real
def test_over_tls_a_refused_publish_loses_its_batch_and_the_next_goes_through(
    exchange: str, tls_broker: TLSBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """As :func:`test_a_refused_publish_loses_its_batch_counted_and_the_next_goes_on_a_new_channel`,
    over TLS: the channel's close is read among the confirms from the TLS socket."""
    refused_publish(exchange, tls_broker.url(), caplog)


@pytest.mark.real
def test_over_tls_a_certificate_not_trusted_loses_them_counted_and_logged(
    tls_broker: TLSBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CA file of another CA: the handshake fails, and with ``retry = 0`` the batch is
    lost, counted and logged with the reason, as for a bus that is away; nothing hangs."""
    other_ca = make_ca(tmp_path, "another-ca")
    options = ON.replace(transport_url=tls_broker.url(other_ca.ca_file), retry=0)
    notifier = rabbit.open_rabbit_notifier(options, "qsched-agent:test")
    caplog.set_level(logging.ERROR)
    started = time.monotonic()
    try:
        tell(notifier, "e", 5)
        assert notifier.flush(10)
    finally:
        notifier.close()
    assert time.monotonic() - started < rabbit.CONNECT_TIMEOUT_S
    assert notifier.lost == 5 and notifier.dropped == 0
    assert "not sent to rabbit://guest:**@127.0.0.1" in caplog.text and "retry = 0" in caplog.text
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert tls_broker.proxy.connections == 0  # the client refused the proxy's certificate


@pytest.mark.real
def test_over_tls_a_broker_gone_silent_is_given_up_at_the_confirm_timeout(
    exchange: str, tls_broker: TLSBroker, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A broker that stops answering (its host died: no FIN, no TLS close): the batch
    whose confirms never come is lost at the confirm timeout, counted, and the sender
    gives the connection up at once, without waiting for a TLS close the peer will
    never send; the next batch goes on a new connection."""
    monkeypatch.setattr(rabbit, "CONFIRM_TIMEOUT_S", 1.0)
    options = ON.replace(transport_url=tls_broker.url(), control_exchange=exchange,
                         versioned_notifications_topics=(f"{exchange}-a",))  # fmt: skip
    notifier = rabbit.open_rabbit_notifier(options, "qsched-agent:test")
    caplog.set_level(logging.ERROR)
    try:
        tell(notifier, "first", 5)
        assert notifier.flush(10) and notifier.lost == 0
        tls_broker.proxy.freeze()
        tell(notifier, "unconfirmed", 3)
        started = time.monotonic()
        assert notifier.flush(20)
        given_up_s = time.monotonic() - started
        assert notifier.lost == 3
        tell(notifier, "after", 2)
        assert notifier.flush(10)
    finally:
        notifier.close()
    assert given_up_s < rabbit.GATHER_S + 1.0 + 1.5, given_up_s  # the pause, the timeout
    expected = [f"first{i}" for i in range(5)] + ["after0", "after1"]
    assert event_types(f"{exchange}-a.info", 7) == expected
    assert notifier.lost == 3 and "before the broker confirmed them" in caplog.text
    assert tls_broker.proxy.connections == 2


@pytest.mark.real
def test_over_tls_a_write_cut_short_sends_nothing_twice(
    exchange: str, tls_broker: TLSBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker that stops reading in the middle of a batch (its host gone, or a
    resource alarm blocking publishers) for longer than py-amqp's ``TCP_USER_TIMEOUT``
    (1 s): the write fails midway. The messages that left are counted lost (they may
    arrive: that connection's bytes are relayed after), the others go on the next
    connection, and none arrives twice."""
    options = ON.replace(transport_url=tls_broker.url(), control_exchange=exchange,
                         versioned_notifications_topics=(f"{exchange}-a",))  # fmt: skip
    notifier = rabbit.open_rabbit_notifier(options, "qsched-agent:test")
    caplog.set_level(logging.WARNING)
    count = 150  # 3 MB: more than the buffers between the sender and the stalled reader
    try:
        tell(notifier, "first", 1)
        assert notifier.flush(10)
        sock = notifier._connection.connection.sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)  # the same on any machine
        tls_broker.proxy.freeze()
        for i in range(count):
            notifier.notify(f"big{i}", {"blob": "x" * 20_000})
        # the write fails (about 2 s), the rest goes on a new connection
        wait_until(lambda: tls_broker.proxy.connections == 2, 15)
        tls_broker.proxy.thaw()  # what the first connection wrote reaches the broker
        assert notifier.flush(20)
    finally:
        notifier.close()
    arrived = drain(f"{exchange}-a.info")
    assert tls_broker.proxy.connections == 2, caplog.text  # the write did fail
    twice = sorted(t for t, n in collections.Counter(arrived).items() if n > 1)
    assert not twice, f"{len(twice)} sent twice: {twice[:5]}..."
    assert arrived[0] == "first0" and len(arrived) >= 1 + count - notifier.lost
