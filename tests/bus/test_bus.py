"""The bus contract, run against memory:// always and RabbitMQ and Redis when reachable.

``oslo`` is the oslo.messaging bus (:mod:`qsched.bus.oslo`) on the same RabbitMQ.
Where it cannot keep a promise of the contract, the test says so and
docs/pipeline.rst says why. Each test gets its own queue and exchange prefix, and
removes what it declared before and after, so runs do not see each other.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import os
import queue
import shutil
import socket
import subprocess
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from qsched import exception
from qsched.bus import Delivery, MessageSettled, Names, open_bus
from qsched.bus.base import BusUnavailable, check_class
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.bus.kombu.wire import KombuWire
from qsched.bus.oslo import OsloBus
from qsched.conf import BusOptions
from qsched.flavors import Flavor
from qsched.scheduling.message import BootRequest, DeleteRequest, PoisonMessage, decode
from tests.cloud import rabbit_failover_url
from tests.conftest import BUS_REDIS_URL
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(30)

AMQP_URL = os.environ.get("QSCHED_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
IN_CI = os.environ.get("CI") == "true"
HOW_TO_START = {
    "amqp": ("RabbitMQ", "start it with: rabbitmq-server (or docker run -p 5672:5672 rabbitmq:3)"),
    "redis": ("Redis", "start it with: redis-server --port 6379"),
}
FAST = KombuOptions(
    connect_timeout_s=2.0,
    confirm_timeout_s=5.0,
    poll_interval_s=0.05,
    settle_timeout_s=5.0,
    reconnect_max_delay_s=0.5,
)
SHARED = "shared+"  # a harness URL whose consumers share one connection
WAIT_S = 10.0  # for what must come
QUIET_S = 0.7  # for what must not


# -- fixtures --


def reachable(url: str) -> None:
    """Fail under CI, skip elsewhere, when the server of ``url`` does not answer."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=2).close()
    except OSError as exc:
        name, how = HOW_TO_START["amqp" if parts.scheme.startswith("amqp") else "redis"]
        message = f"{name} not reachable at {parts.hostname}:{parts.port} ({exc}): {how}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(
    params=[
        pytest.param("memory://", id="memory"),
        pytest.param(AMQP_URL, id="amqp", marks=pytest.mark.real),
        pytest.param("rabbit-failover", id="rabbit-failover", marks=pytest.mark.real),
        pytest.param(BUS_REDIS_URL, id="redis", marks=pytest.mark.real),
        pytest.param("oslo", id="oslo", marks=pytest.mark.real),
        pytest.param(f"{SHARED}memory://", id="memory-shared"),
        pytest.param(f"{SHARED}{AMQP_URL}", id="amqp-shared", marks=pytest.mark.real),
        pytest.param(f"{SHARED}{BUS_REDIS_URL}", id="redis-shared", marks=pytest.mark.real),
    ]
)
def url(request: pytest.FixtureRequest) -> str:
    """Every transport; ``rabbit-failover``: RabbitMQ through a URL whose first host is down;
    ``oslo``: the oslo.messaging bus on RabbitMQ (``oslo+`` and its URL); ``*-shared``: the
    consumers of the test share one connection (``shared+`` and the URL)."""
    if request.param.startswith(SHARED):
        if not request.param.startswith(f"{SHARED}memory"):
            reachable(request.param.removeprefix(SHARED))
        return str(request.param)
    if request.param == "rabbit-failover":
        reachable(AMQP_URL)
        return rabbit_failover_url()
    if request.param == "oslo":
        reachable(AMQP_URL)
        return f"oslo+{AMQP_URL}"
    if not request.param.startswith("memory"):
        reachable(request.param)
    return str(request.param)


class Harness:
    """A bus under a fresh prefix, the consumers started on it, and cleanup."""

    def __init__(self, url: str, options: KombuOptions = FAST) -> None:
        self.prefix = f"qtest-{uuid.uuid4().hex[:12]}"
        self.oslo = url.startswith("oslo+")
        self.shared = url.startswith(SHARED)
        self.bus: Any = (
            OsloBus(url.removeprefix("oslo+"), prefix=self.prefix, options=options)
            if self.oslo
            else KombuBus(url.removeprefix(SHARED), prefix=self.prefix, options=options)
        )
        if self.shared:
            self.bus = self.bus.sharing_consumers()
        #: the kombu wire: the bus's own, or the oslo bus's AMQP side
        self.wire: KombuWire = self.bus.wire.kombu if self.oslo else self.bus.wire
        self.hosts: set[str] = set()
        self.consumers: list[Any] = []

    def consumer(self, inbox: Inbox, classes: tuple[str, ...] = (), host: str = "") -> Any:
        host = host or f"host{len(self.consumers)}"
        self.hosts.add(host)
        consumer = self.bus.consumer(host, inbox, classes)
        self.consumers.append(consumer)
        consumer.start()
        assert consumer.wait_ready(WAIT_S)
        return consumer

    def queue_names(self) -> set[str]:
        names = self.bus.names
        return {
            names.dead_queue,
            *(names.boot_queue(name) for name in self.bus.boot_classes()),
            *(names.host_queue(host) for host in self.hosts),
        }

    def cleanup(self) -> None:
        for consumer in self.consumers:
            consumer.stop(5.0)
        self.bus.close()
        wire = self.wire
        with wire.channel() as channel:
            for name in self.queue_names():
                forget_queue(wire, channel, name)
            if wire.amqp:
                channel.exchange_delete(self.bus.names.exchange)
                channel.exchange_delete(self.bus.names.dead_exchange)
        if wire.driver == "redis":
            client = redis.Redis.from_url(BUS_REDIS_URL)
            for key in client.scan_iter(match=f"{self.prefix}*"):
                client.delete(key)


def forget_queue(wire: KombuWire, channel: Any, name: str) -> None:
    if not wire.amqp:
        channel.queue_purge(name)  # virtual transports delete only queues with bindings
    channel.queue_delete(name)


@pytest.fixture
def harness(url: str) -> Iterator[Harness]:
    harness = Harness(url)
    harness.cleanup()  # nothing can exist under a fresh prefix, but be sure
    yield harness
    harness.cleanup()


class Inbox:
    """A consumer callback that records deliveries, then runs ``action`` on them."""

    def __init__(self, action: Callable[[bytes, Delivery], None] | None = None) -> None:
        self.items: queue.Queue[tuple[bytes, Delivery]] = queue.Queue()
        self.action = action

    def __call__(self, body: bytes, delivery: Delivery) -> None:
        self.items.put((body, delivery))
        if self.action is not None:
            self.action(body, delivery)

    def get(self, timeout_s: float = WAIT_S) -> tuple[Any, Delivery]:
        body, delivery = self.items.get(timeout=timeout_s)
        try:
            return decode(body), delivery
        except PoisonMessage:
            return body, delivery

    def expect_nothing(self, wait_s: float = QUIET_S) -> None:
        with pytest.raises(queue.Empty):
            self.items.get(timeout=wait_s)


def ack(body: bytes, delivery: Delivery) -> None:
    delivery.ack()


def request(scheduling_class: str = "m1.small", project_id: str = "project") -> BootRequest:
    """A first attempt; the class is set directly (it is only a routing key here)."""
    flavor = Flavor("m1.small", 1, 512)
    message = BootRequest.create(str(uuid.uuid4()), project_id, "user", flavor)
    return dataclasses.replace(message, scheduling_class=scheduling_class)


def ready(harness: Harness, scheduling_class: str, expected: int) -> None:
    """Wait until the class queue holds ``expected`` ready messages."""
    wait_for(lambda: harness.bus.queue_stats(scheduling_class).ready == expected)


def wait_dead_letters(harness: Harness, count: int) -> list[Any]:
    letters: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(letters) < count:
        assert time.monotonic() < deadline, f"{len(letters)} dead letters, not {count}"
        letters += harness.bus.take_dead_letters()
        time.sleep(0.05)
    return letters


def delete_queue(harness: Harness, scheduling_class: str) -> None:
    with harness.wire.channel() as channel:
        forget_queue(harness.wire, channel, harness.bus.names.boot_queue(scheduling_class))


def publish_raw(harness: Harness, scheduling_class: str, body: bytes) -> None:
    """Publish a body as qsched never would, on the bus's own wire."""
    if harness.oslo:
        harness.bus.note_class(scheduling_class)
        harness.bus.wire.publish(harness.bus.wire.boot_route(scheduling_class), body)
        return
    harness.wire.note_class(scheduling_class)
    harness.wire.publish(harness.wire.boot_entity(scheduling_class), body)


def consumers(harness: Harness, scheduling_class: str) -> int | None:
    try:
        return harness.bus.queue_stats(scheduling_class).consumers
    except exception.NotFound:
        return None


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def drop_connections(harness: Harness, consumer: Any) -> None:
    """Cut the consumer's connection under it, as a broker restart would."""
    if harness.oslo:  # every listener's: oslo.messaging's connection, kombu's, py-amqp's
        for listener in consumer._listeners.values():
            rabbit = listener._hooks.listener.conn
            rabbit.channel.connection.sock.shutdown(socket.SHUT_RDWR)
        return
    if harness.wire.amqp:
        sock = consumer._connection.connection.sock  # type: ignore[union-attr]
        sock.shutdown(socket.SHUT_RDWR)
        return
    client = redis.Redis.from_url(BUS_REDIS_URL)
    for info in client.client_list():
        if info.get("name") == f"{harness.prefix}-bus":
            client.client_kill_filter(_id=info["id"])


# -- pure parts --


class TestNames:
    def test_layout(self) -> None:
        names = Names("qsched")
        assert names.boot_queue("m1.small+ab12") == "qsched.boot.m1.small+ab12"
        assert names.boot_routing_key("m1.small") == "boot.m1.small"
        assert names.host_queue("cn-1.example") == "qsched.host.cn-1.example"
        assert names.host_routing_key("cn-1") == "host.cn-1"
        assert (names.exchange, names.dead_exchange, names.dead_queue) == (
            "qsched",
            "qsched.dead",
            "qsched.dead",
        )

    @pytest.mark.parametrize("name", ["", "a b", "a#", "*", ".x", "x" * 201, None, 3])
    def test_bad_class(self, name: Any) -> None:
        with pytest.raises(exception.Invalid):
            check_class(name)

    @pytest.mark.parametrize("prefix", ["", "a b", "x" * 65])
    def test_bad_prefix(self, prefix: str) -> None:
        with pytest.raises(exception.Invalid):
            Names(prefix)

    def test_unknown_transport(self) -> None:
        with pytest.raises(exception.Invalid):
            KombuBus("sqs://")


def imported(module: str) -> set[str]:
    """The modules ``module`` imports, at run time or for type checks only (from its source)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    found = set()
    for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("qsched.bus.kombu.consumer", {"qsched.bus.kombu.bus", "qsched.bus.kombu.KombuBus"}),
        (
            "qsched.bus.kombu.wire",
            {"qsched.bus.kombu.bus", "qsched.bus.kombu.KombuBus", "qsched.bus.kombu.consumer"},
        ),
    ],
)
def test_the_kombu_modules_import_no_circle(module: str, absent: set[str]) -> None:
    """The consumer stands on the wire, not on the bus that builds it; the wire on neither."""
    assert "qsched.bus.base" in imported(module)
    assert not imported(module) & absent


def test_open_bus_from_options() -> None:
    options = BusOptions.defaults().replace(prefix="qconf")
    bus = open_bus(options)
    assert isinstance(bus, KombuBus)
    assert bus.names.prefix == "qconf"
    assert bus.wire.options == KombuOptions()
    with pytest.raises(exception.Invalid, match="not supported"):
        open_bus(options.replace(transport_url="sqs://key:secret@"))


# -- the contract, on every transport --


class TestPublishConsume:
    def test_boot_and_delete_reach_the_agent(self, harness: Harness) -> None:
        inbox = Inbox(ack)
        harness.consumer(inbox, ("m1.small",), host="cn-1")
        sent = request()
        harness.bus.publish_boot(sent)
        got, delivery = inbox.get()
        assert got == sent
        assert delivery.queue == harness.bus.names.boot_queue("m1.small")
        assert delivery.routing_key == "boot.m1.small"
        assert not delivery.redelivered
        deletion = DeleteRequest("req-2", sent.instance_uuid, "cn-1", "node-1")
        harness.bus.publish_delete("cn-1", deletion)
        got, delivery = inbox.get()
        assert got == deletion
        assert delivery.routing_key == "host.cn-1"
        ready(harness, "m1.small", 0)

    def test_prefetch_one(self, harness: Harness) -> None:
        inbox = Inbox()  # holds what it gets
        harness.consumer(inbox, ("m1.small",))
        first, second = request(), request()
        harness.bus.publish_boot(first)
        harness.bus.publish_boot(second)
        got, delivery = inbox.get()
        assert got == first
        inbox.expect_nothing()
        ready(harness, "m1.small", 1)
        delivery.ack()  # from this thread: queued to the consumer's thread
        got, delivery = inbox.get()
        assert got == second
        delivery.ack()

    def test_add_and_remove_class_at_run_time(self, harness: Harness) -> None:
        inbox = Inbox(ack)
        consumer = harness.consumer(inbox, ("small",))
        harness.bus.publish_boot(request("large"))
        inbox.expect_nothing()
        consumer.add_class("large").result(WAIT_S)
        assert inbox.get()[0].scheduling_class == "large"
        consumer.remove_class("small").result(WAIT_S)
        assert consumer.classes == {"large"}
        harness.bus.publish_boot(request("small"))
        inbox.expect_nothing()
        ready(harness, "small", 1)
        assert harness.bus.boot_classes() == {"small", "large"}

    def test_requeue_goes_to_the_tail_with_attempt_plus_one(self, harness: Harness) -> None:
        def requeue_first_try(body: bytes, delivery: Delivery) -> None:
            message = decode(body)
            assert isinstance(message, BootRequest)
            if message.instance_uuid == first.instance_uuid and message.attempt == 1:
                return delivery.requeue(message.next_attempt("host0").encode())
            delivery.ack()

        first, second = request(), request()
        harness.bus.publish_boot(first)
        harness.bus.publish_boot(second)
        inbox = Inbox(requeue_first_try)
        harness.consumer(inbox, ("m1.small",))
        order = [inbox.get()[0] for _ in range(3)]
        assert [(m.instance_uuid, m.attempt) for m in order] == [
            (first.instance_uuid, 1),
            (second.instance_uuid, 1),
            (first.instance_uuid, 2),
        ]
        assert order[2].tried_hosts == ("host0",)
        ready(harness, "m1.small", 0)

    def test_lone_consumer_requeuing_does_not_starve_the_next(self, harness: Harness) -> None:
        def never_fits(body: bytes, delivery: Delivery) -> None:
            message = decode(body)
            assert isinstance(message, BootRequest)
            if message.instance_uuid == stuck.instance_uuid:
                delivery.requeue(message.next_attempt("host0").encode())
            else:
                delivery.ack()

        stuck, behind = request(), request()
        harness.bus.publish_boot(stuck)
        harness.bus.publish_boot(behind)
        inbox = Inbox(never_fits)
        consumer = harness.consumer(inbox, ("m1.small",))
        attempts = []
        while (message := inbox.get()[0]).instance_uuid == stuck.instance_uuid:
            attempts.append(message.attempt)
        assert attempts == [1], "the second message came right after one requeue"
        consumer.stop()

    def test_settle_once(self, harness: Harness) -> None:
        inbox = Inbox()
        harness.consumer(inbox, ("m1.small",))
        harness.bus.publish_boot(request())
        got, delivery = inbox.get()
        harness.bus.requeue(delivery, got.next_attempt("host0").encode())
        again, delivery = inbox.get()
        assert again.attempt == 2
        delivery.ack()
        with pytest.raises(MessageSettled):
            delivery.ack()
        with pytest.raises(MessageSettled):
            delivery.requeue(b"x")
        ready(harness, "m1.small", 0)


class TestDeadLetters:
    def test_poison_dead_lettered_and_next_message_delivered(self, harness: Harness) -> None:
        def agent(body: bytes, delivery: Delivery) -> None:
            try:
                decode(body)
            except PoisonMessage as exc:
                return delivery.reject(exc.reason)
            delivery.ack()

        publish_raw(harness, "m1.small", b"\xc1 not msgpack")
        good = request()
        harness.bus.publish_boot(good)
        inbox = Inbox(agent)
        harness.consumer(inbox, ("m1.small",))
        assert inbox.get()[0] == b"\xc1 not msgpack"
        assert inbox.get()[0] == good
        letters = wait_dead_letters(harness, 1)
        assert letters[0].body == b"\xc1 not msgpack"
        assert letters[0].reason.startswith("not msgpack")
        assert letters[0].queue == harness.bus.names.boot_queue("m1.small")
        assert letters[0].routing_key == "boot.m1.small"
        assert letters[0].dead_at is not None
        assert harness.bus.dead_letter_stats().ready == 0

    def test_callback_exception_dead_letters_and_consumer_survives(self, harness: Harness) -> None:
        def buggy(body: bytes, delivery: Delivery) -> None:
            if decode(body).project_id == "explode":  # type: ignore[union-attr]
                raise RuntimeError("boom")
            delivery.ack()

        bad = request(project_id="explode")
        harness.bus.publish_boot(bad)
        harness.bus.publish_boot(request())
        inbox = Inbox(buggy)
        consumer = harness.consumer(inbox, ("m1.small",))
        inbox.get()
        assert inbox.get()[0].project_id == "project"
        letters = wait_dead_letters(harness, 1)
        assert "RuntimeError: boom" in letters[0].reason
        assert consumer.wait_ready(0)

    def test_backend_error_in_callback_gives_the_message_back(self, harness: Harness) -> None:
        failures = [exception.BackendUnavailable(backend="Ledger", url="redis://x", reason="down")]

        def flaky(body: bytes, delivery: Delivery) -> None:
            if failures:
                raise failures.pop()
            delivery.ack()

        sent = request()
        harness.bus.publish_boot(sent)
        inbox = Inbox(flaky)
        harness.consumer(inbox, ("m1.small",))
        assert inbox.get()[0] == sent
        assert inbox.get()[0] == sent, "given back, not dead-lettered"
        ready(harness, "m1.small", 0)
        assert harness.bus.take_dead_letters() == []

    def test_review_keeps_what_it_is_told_and_drops_the_rest(self, harness: Harness) -> None:
        def reject(body: bytes, delivery: Delivery) -> None:
            message = decode(body)
            assert isinstance(message, BootRequest)
            delivery.reject(f"reason {message.project_id}")

        harness.consumer(Inbox(reject), ("m1.small",))
        for project_id in ("keep-1", "drop", "keep-2"):
            harness.bus.publish_boot(request(project_id=project_id))
        wait_for(lambda: harness.bus.dead_letter_stats().ready == 3)
        shown = harness.bus.review_dead_letters(lambda letter: "keep" in letter.reason)
        assert [d.reason for d in shown] == ["reason keep-1", "reason drop", "reason keep-2"]
        kept = harness.bus.review_dead_letters(lambda letter: True)
        assert [d.reason for d in kept] == ["reason keep-1", "reason keep-2"]
        assert [d.dead_at for d in kept] == [shown[0].dead_at, shown[2].dead_at]
        assert kept[0].queue == harness.bus.names.boot_queue("m1.small")
        assert [d.reason for d in harness.bus.take_dead_letters()] == [
            "reason keep-1",
            "reason keep-2",
        ]

    def test_review_gives_back_what_it_did_not_decide(self, harness: Harness) -> None:
        harness.consumer(Inbox(lambda body, d: d.reject("poison")), ("m1.small",))
        for _ in range(3):
            harness.bus.publish_boot(request())
        wait_for(lambda: harness.bus.dead_letter_stats().ready == 3)
        seen: list[str] = []

        def drop_one_then_fail(letter: Any) -> bool:
            if seen:
                raise RuntimeError("the admin gave up")
            seen.append(letter.reason)
            return False

        with pytest.raises(RuntimeError):
            harness.bus.review_dead_letters(drop_one_then_fail)
        assert len(harness.bus.take_dead_letters()) == 2


class TestStopAndReconnect:
    def test_stop_gives_back_what_is_not_settled(self, harness: Harness) -> None:
        holder = Inbox()
        consumer = harness.consumer(holder, ("m1.small",))
        sent = request()
        harness.bus.publish_boot(sent)
        _, delivery = holder.get()
        consumer.stop()
        with pytest.raises(BusUnavailable, match="given back"):
            delivery.ack()
        successor = Inbox(ack)
        harness.consumer(successor, ("m1.small",))
        got, again = successor.get()
        assert got == sent
        if harness.wire.driver != "memory" and not harness.oslo:  # neither can tell
            assert again.redelivered
        ready(harness, "m1.small", 0)

    def test_worker_thread_settles_then_stop_keeps_the_ack(self, harness: Harness) -> None:
        holder = Inbox()
        consumer = harness.consumer(holder, ("m1.small",))
        harness.bus.publish_boot(request())
        _, delivery = holder.get()
        worker = threading.Thread(target=delivery.ack)  # finished work, settled elsewhere
        worker.start()
        worker.join(WAIT_S)
        consumer.stop()
        successor = Inbox(ack)
        harness.consumer(successor, ("m1.small",))
        successor.expect_nothing()
        ready(harness, "m1.small", 0)

    def test_reconnects_after_the_connection_drops(self, harness: Harness) -> None:
        if harness.wire.driver == "memory":
            pytest.skip("memory:// has no connection to lose")
        inbox = Inbox(ack)
        consumer = harness.consumer(inbox, ("m1.small",))
        first = request()
        harness.bus.publish_boot(first)
        inbox.get()
        drop_connections(harness, consumer)
        sent = request()
        harness.bus.publish_boot(sent)
        got = inbox.get()[0]
        if got == first:  # its ack, sent from the consumer's thread, may go with the drop
            got = inbox.get()[0]
        assert got == sent
        assert consumer.wait_ready(WAIT_S)

    def test_reconnects_when_a_callback_meets_the_drop_first(self, harness: Harness) -> None:
        """The ack in a callback is the first to meet the cut, and the callback swallows
        its error, as a callback may: the consumer must still reconnect. (Left to itself,
        kombu opens a bare connection under the loop at its next drain: no channel, no
        consumer, nothing ever delivered, and the consumer still says it is ready.)"""
        if harness.wire.driver == "memory":
            pytest.skip("memory:// has no connection to lose")
        cut = threading.Event()

        def ack_after_the_cut(body: bytes, delivery: Delivery) -> None:
            cut.wait(WAIT_S)
            with contextlib.suppress(BusUnavailable, OSError):
                delivery.ack()

        inbox = Inbox(ack_after_the_cut)
        consumer = harness.consumer(inbox, ("m1.small",))
        first = request()
        harness.bus.publish_boot(first)
        inbox.get()
        drop_connections(harness, consumer)
        cut.set()
        sent = request()
        harness.bus.publish_boot(sent)
        got = inbox.get()[0]
        if got == first:  # its ack failed: the broker delivers it again
            got = inbox.get()[0]
        assert got == sent
        assert consumer.wait_ready(WAIT_S)

    def test_publisher_declares_a_deleted_queue_again(self, harness: Harness) -> None:
        if not harness.wire.amqp:
            pytest.skip("memory:// and redis:// publish to the queue by name: nothing to declare")
        if harness.oslo:
            pytest.skip(
                "oslo.messaging declares a queue once per connection and publishes a "
                "notification without mandatory: a boot queue deleted under a running "
                "publisher loses what is published until it reconnects (docs/pipeline.rst)"
            )
        harness.bus.publish_boot(request())
        delete_queue(harness, "m1.small")
        harness.bus.publish_boot(request())  # its declared-cache is stale: it must notice
        ready(harness, "m1.small", 1)

    def test_consumer_declares_a_deleted_queue_again(self, harness: Harness) -> None:
        inbox = Inbox(ack)
        harness.consumer(inbox, ("m1.small",))
        delete_queue(harness, "m1.small")
        if harness.wire.amqp:
            # The broker cancels the consumer; it reconnects and declares the queue.
            # (Publishing before that races RabbitMQ's own cleanup of the old queue.)
            wait_for(lambda: consumers(harness, "m1.small") == 1)
        sent = request()
        harness.bus.publish_boot(sent)
        assert inbox.get()[0] == sent


class TestStats:
    def test_counts(self, harness: Harness) -> None:
        harness.bus.publish_boot(request())
        harness.bus.publish_boot(request())
        stats = harness.bus.queue_stats("m1.small")
        assert stats.queue == harness.bus.names.boot_queue("m1.small")
        assert stats.ready == 2
        assert stats.consumers == (0 if harness.wire.amqp else None)

    def test_purge_drops_what_waits(self, harness: Harness) -> None:
        harness.bus.publish_boot(request())
        harness.bus.publish_boot(request())
        ready(harness, "m1.small", 2)
        assert harness.bus.purge_queue("m1.small") == 2
        assert harness.bus.queue_stats("m1.small").ready == 0
        if harness.wire.amqp:
            with pytest.raises(exception.NotFound):
                harness.bus.purge_queue("never-published")

    def test_unknown_class(self, harness: Harness) -> None:
        if harness.wire.amqp:
            with pytest.raises(exception.NotFound):
                harness.bus.queue_stats("never-published")
        else:
            assert harness.bus.queue_stats("never-published").ready == 0


class TestThreads:
    def test_concurrent_publishers_each_message_once(self, harness: Harness) -> None:
        sent = [request() for _ in range(120)]
        inbox = Inbox(ack)
        harness.consumer(inbox, ("m1.small",))

        def publish(part: list[BootRequest]) -> None:
            for message in part:
                harness.bus.publish_boot(message)

        threads = [threading.Thread(target=publish, args=(sent[i::6],)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        got = [inbox.get()[0].request_id for _ in sent]
        assert sorted(got) == sorted(m.request_id for m in sent)
        inbox.expect_nothing(0.3)


class TestHealth:
    def test_a_healthy_bus_answers_the_probe(self, harness: Harness) -> None:
        harness.bus.check_health()
        harness.bus.check_health()  # from the cache
        harness.bus.publish_boot(request())
        harness.bus.check_health()

    def test_publishes_failing_mark_it_down_until_one_succeeds(
        self, harness: Harness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise OSError("the broker failed to declare it")

        if harness.oslo:  # what the rabbit driver raises when its declare fails
            monkeypatch.setattr(harness.bus.wire.transport("boot"), "_send_notification",
                                refuse)  # fmt: skip
        else:
            monkeypatch.setattr(harness.bus.wire, "declare", refuse)
        category = "unreachable" if harness.oslo else "declares failing"
        with pytest.raises(BusUnavailable) as failed:
            harness.bus.publish_boot(request())
        assert failed.value.category == category
        harness.wire.probe()  # the probe does not see it
        with pytest.raises(BusUnavailable) as down:
            harness.bus.check_health()
        assert down.value.category == category
        monkeypatch.undo()
        harness.bus.publish_boot(request())
        harness.bus.check_health()


# -- broker specifics --


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("scheme", ["amqp", "redis"])
def test_unreachable_broker_raises_promptly(scheme: str) -> None:
    port = closed_port()
    url = (
        f"amqp://guest:secret@127.0.0.1:{port}//"
        if scheme == "amqp"
        else f"redis://127.0.0.1:{port}/5"
    )
    bus = KombuBus(url, options=KombuOptions(connect_timeout_s=1.0))
    started = time.monotonic()
    with pytest.raises(BusUnavailable) as info:
        bus.publish_boot(request())
    assert time.monotonic() - started < 3.0
    assert "secret" not in str(info.value), "the password never shows"
    assert info.value.category == "unreachable"
    with pytest.raises(BusUnavailable):
        bus.queue_stats("m1.small")
    with pytest.raises(BusUnavailable) as probed:
        bus.check_health()
    assert probed.value.category == "unreachable"
    assert time.monotonic() - started < 5.0


def test_blackholed_broker_times_out() -> None:
    bus = KombuBus(
        "amqp://guest:guest@10.255.255.1:5672//", options=KombuOptions(connect_timeout_s=0.5)
    )
    started = time.monotonic()
    with pytest.raises(BusUnavailable):
        bus.publish_boot(request())
    assert time.monotonic() - started < 3.0


@pytest.mark.real
def test_rabbitmq_dead_letters_what_keeps_coming_back() -> None:
    reachable(AMQP_URL)
    harness = Harness(AMQP_URL, options=dataclasses.replace(FAST, delivery_limit=1))
    try:
        harness.bus.publish_boot(request())
        entity = harness.bus.wire.boot_entity("m1.small")
        connection = harness.bus.wire.connect()
        channel = connection.channel()
        for _ in range(2):  # as if two agents crashed holding it
            message = entity(channel).get(no_ack=False)
            assert message is not None
            message.reject(requeue=True)
        connection.release()
        letters = wait_dead_letters(harness, 1)
        assert "delivery_limit" in letters[0].reason
        assert letters[0].queue == harness.bus.names.boot_queue("m1.small")
    finally:
        harness.cleanup()


@pytest.mark.real
def test_rabbitmq_boot_queues_are_quorum_with_a_dead_letter_exchange() -> None:
    reachable(AMQP_URL)
    harness = Harness(AMQP_URL)
    try:
        harness.bus.publish_boot(request())
        arguments = harness.bus.wire.boot_entity("m1.small").queue_arguments
        assert arguments["x-queue-type"] == "quorum"
        assert arguments["x-dead-letter-exchange"] == harness.bus.names.dead_exchange
        assert arguments["x-delivery-limit"] == FAST.delivery_limit
    finally:
        harness.cleanup()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_host_queues_are_of_the_type_bus_options_ask_for(queue_type: str) -> None:
    options = BusOptions.defaults().replace(
        transport_url="amqp://guest:guest@127.0.0.1:5672//", host_queue_type=queue_type
    )
    bus = open_bus(options)  # connects to nothing yet
    assert isinstance(bus, KombuBus)
    arguments = bus.wire.host_entity("cn-1").queue_arguments
    assert arguments.get("x-queue-type", "classic") == queue_type
    assert arguments["x-dead-letter-exchange"] == bus.names.dead_exchange
    assert "x-delivery-limit" not in arguments
    bus.close()  # the oslo.messaging bus's: tests/bus/test_bus_cluster_real.py lists them


def test_open_bus_builds_the_oslo_bus_for_its_driver() -> None:
    options = BusOptions.defaults().replace(
        driver="oslo.messaging", transport_url="amqp://guest:guest@127.0.0.1:5672//"
    )
    bus = open_bus(options)  # connects to nothing yet
    assert isinstance(bus, OsloBus)
    assert bus.wire.rabbit_url == "rabbit://guest:guest@127.0.0.1:5672//"
    assert bus.names.boot_queue("m1.small") == "qsched.boot.m1.small.info"
    assert bus.names.host_queue("cn-1") == "qsched.host.cn-1.info"
    assert bus.names.dead_queue == "qsched.dead"
    bus.close()
    for url in ("memory://", "redis://127.0.0.1:6379/0"):
        with pytest.raises(exception.Invalid, match=r"RabbitMQ only.*rabbit://"):
            open_bus(options.replace(transport_url=url))


def test_the_oslo_bus_refuses_an_oslo_messaging_without_what_it_relies_on() -> None:
    """It uses private parts of oslo.messaging; without them it fails at once, saying
    which, rather than publishing into a void or stopping listeners that give back."""
    from qsched.bus.oslo import listener
    from qsched.bus.oslo.wire import OsloWire

    wire = OsloWire(AMQP_URL)
    wire._transport = lambda quorum, limit: types.SimpleNamespace(cleanup=lambda: None)  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="_send_notification"):
        wire.transport("boot")
    server = types.SimpleNamespace(listener=types.SimpleNamespace(cleanup=lambda: None))
    with pytest.raises(RuntimeError, match="_poll_style_listener"):
        listener._Hooks(server, threading.Event())


@pytest.mark.real
def test_oslo_bus_dead_letters_what_keeps_coming_back_under_the_policies() -> None:
    """oslo.messaging's queues have a delivery limit and no dead-letter exchange: the
    policies of deploy/rabbitmq-policies.sh give them one, or RabbitMQ drops the message."""
    reachable(AMQP_URL)
    if shutil.which("rabbitmqctl") is None:
        pytest.fail("rabbitmqctl is not on PATH: it sets the broker policies")
    harness = Harness(f"oslo+{AMQP_URL}", options=dataclasses.replace(FAST, delivery_limit=1))
    env = {**os.environ, "PREFIX": harness.prefix, "DELIVERY_LIMIT": "1"}
    policies = [f"{harness.prefix}-{name}" for name in ("boot", "idle-classes", "host")]
    script = ROOT / "deploy" / "rabbitmq-policies.sh"
    try:
        subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True, timeout=60)
        sent = request()
        harness.bus.publish_boot(sent)
        with harness.wire.channel() as channel:
            for _ in range(2):  # as if two agents crashed holding it
                message = channel.basic_get(harness.bus.names.boot_queue("m1.small"))
                assert message is not None
                channel.basic_reject(message.delivery_tag, requeue=True)
        letters = wait_dead_letters(harness, 1)
        assert "delivery_limit" in letters[0].reason
        assert letters[0].queue == harness.bus.names.boot_queue("m1.small")
        assert decode(letters[0].body) == sent, "the qsched body, out of oslo's envelope"
    finally:
        for name in policies:
            subprocess.run(["rabbitmqctl", "clear_policy", name], capture_output=True, timeout=60)
        harness.cleanup()
