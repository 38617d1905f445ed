"""Consumers of several hosts on one connection (``KombuBus.sharing_consumers``).

The whole bus contract also runs on this form (``*-shared`` in tests/bus/test_bus.py);
these tests check what only several hosts on one connection can show: one
connection, each host its own queue and prefetch, one host leaving or the
connection breaking without the others losing or double-settling anything.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from qsched import exception
from qsched.bus import Delivery
from qsched.bus.base import BusUnavailable
from qsched.bus.kombu import KombuBus
from qsched.scheduling.message import DeleteRequest
from tests.bus.test_bus import (
    AMQP_URL,
    FAST,
    SHARED,
    WAIT_S,
    Harness,
    Inbox,
    ack,
    drop_connections,
    reachable,
    ready,
    request,
    wait_for,
)
from tests.conftest import BUS_REDIS_URL

pytestmark = pytest.mark.timeout(60)

HOSTS = 6


@pytest.fixture(
    params=[
        pytest.param("memory://", id="memory"),
        pytest.param(AMQP_URL, id="amqp", marks=pytest.mark.real),
        pytest.param(BUS_REDIS_URL, id="redis", marks=pytest.mark.real),
    ]
)
def shared(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if not request.param.startswith("memory"):
        reachable(request.param)
    harness = Harness(f"{SHARED}{request.param}")
    harness.cleanup()
    yield harness
    harness.cleanup()


def test_hosts_share_one_connection_each_keeps_its_queue_and_prefetch(shared: Harness) -> None:
    inboxes = [Inbox() for _ in range(HOSTS)]  # they hold what they get
    consumers = [
        shared.consumer(box, ("m1.small",), host=f"cn-{j}") for j, box in enumerate(inboxes)
    ]
    assert len({consumer._loop._thread for consumer in consumers}) == 1  # one thread drains
    connections = {id(consumer._connection) for consumer in consumers}
    assert None not in connections
    assert len(connections) == (1 if shared.wire.amqp else HOSTS)  # see qsched.bus.kombu.loop
    sent = [request() for _ in range(HOSTS + 1)]
    for message in sent:
        shared.bus.publish_boot(message)
    held = [box.get() for box in inboxes]  # one each: prefetch 1 per host, not per connection
    ready(shared, "m1.small", 1)
    for box in inboxes:
        box.expect_nothing(0.2)
    held[2][1].ack()  # from this thread, through the one consumer thread
    last, delivery = inboxes[2].get()
    assert {m.instance_uuid for m, _ in held} | {last.instance_uuid} == {
        m.instance_uuid for m in sent
    }
    delivery.ack()
    for j, (_, held_delivery) in enumerate(held):  # virtual transports: prefetch 1 per host
        if j != 2:  # over all its queues, so the deletes wait for these acks there
            held_delivery.ack()
    for j, box in enumerate(inboxes):  # a host's queue reaches that host only
        uuid = sent[j].instance_uuid
        shared.bus.publish_delete(f"cn-{j}", DeleteRequest(f"req-{j}", uuid, f"cn-{j}", "n"))
        got, deletion = box.get()
        assert isinstance(got, DeleteRequest) and got.instance_uuid == uuid
        deletion.ack()
    ready(shared, "m1.small", 0)


def test_a_host_that_stops_gives_back_its_own_the_others_go_on(shared: Harness) -> None:
    leaving, staying = Inbox(), Inbox()
    gone = shared.consumer(leaving, ("m1.small",), host="cn-a")
    shared.consumer(staying, ("m1.small",), host="cn-b")
    first, second = request(), request()
    shared.bus.publish_boot(first)
    shared.bus.publish_boot(second)
    _, its_own = leaving.get()
    _, theirs = staying.get()
    connection = shared.consumers[1]._connection
    gone.stop(WAIT_S)
    with pytest.raises(BusUnavailable, match="given back"):
        its_own.ack()
    assert gone.classes == {"m1.small"} and not gone.wait_ready(0)
    theirs.ack()  # the other host settles as before, then gets what the first gave back
    again, delivery = staying.get()
    assert again.instance_uuid in {first.instance_uuid, second.instance_uuid}
    delivery.ack()
    ready(shared, "m1.small", 0)
    assert shared.consumers[1]._connection is connection  # no reconnect for the others


def test_a_broken_connection_gives_back_every_host_and_each_consumes_again(
    shared: Harness,
) -> None:
    if not shared.wire.amqp:  # kombu's Redis transport may still ack through its pool
        pytest.skip("only an AMQP channel dies with its connection")
    inboxes = [Inbox() for _ in range(3)]
    consumers = [
        shared.consumer(box, ("m1.small",), host=f"cn-{j}") for j, box in enumerate(inboxes)
    ]
    for _ in range(3):
        shared.bus.publish_boot(request())
    held = [box.get()[1] for box in inboxes]
    drop_connections(shared, consumers[0])
    for delivery in held:
        with pytest.raises(BusUnavailable):
            delivery.ack()
    redelivered = [box.get()[1] for box in inboxes]  # each host gets one again, redelivered
    assert all(d.redelivered for d in redelivered)
    for delivery in redelivered:
        delivery.ack()
    ready(shared, "m1.small", 0)
    assert all(consumer.wait_ready(WAIT_S) for consumer in consumers)


def test_settles_inside_callbacks_of_many_hosts(shared: Harness) -> None:
    """Every host acks in its callback, in the one thread: all messages once."""
    seen: list[str] = []

    def record(body: bytes, delivery: Delivery) -> None:
        seen.append(body.hex())
        delivery.ack()

    for j in range(HOSTS):
        shared.consumer(Inbox(record), ("m1.small",), host=f"cn-{j}")
    for _ in range(30):
        shared.bus.publish_boot(request())
    ready(shared, "m1.small", 0)
    deadline_checks = 0
    while len(seen) < 30 and deadline_checks < 100:
        deadline_checks += 1
        Inbox().expect_nothing(0.05)
    assert len(seen) == 30 and len(set(seen)) == 30


def test_one_host_consumes_once_on_a_loop() -> None:
    bus = KombuBus("memory://", prefix="qtest-shared-one").sharing_consumers()
    try:
        bus.consumer("cn-1", ack).start()
        with pytest.raises(exception.Invalid, match="cn-1 consumes on this loop already"):
            bus.consumer("cn-1", ack).start()
    finally:
        bus.close()


def test_the_reconnect_backoff_starts_over_after_a_connection_that_lasted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Breaks right after connecting double the pause; a break after a connection that
    lasted the longest pause is a new outage, and its pause is the first one again."""
    options = dataclasses.replace(FAST, reconnect_max_delay_s=1.0)
    bus = KombuBus("memory://", prefix="qtest-shared-backoff", options=options)
    bus = bus.sharing_consumers()
    caplog.set_level(logging.WARNING, logger="qsched.bus.kombu.loop")
    try:
        consumer = bus.consumer("cn-1", ack)
        consumer.start()
        assert consumer.wait_ready(WAIT_S)
        pauses = [break_the_loop(consumer, caplog) for _ in range(3)]
        time.sleep(options.reconnect_max_delay_s + 0.1)
        pauses.append(break_the_loop(consumer, caplog))
        assert pauses == ["0.1", "0.2", "0.4", "0.1"]
    finally:
        bus.close()


def break_the_loop(consumer: Any, caplog: pytest.LogCaptureFixture) -> str:
    """Have the consumer's loop fail as on a broken connection; its pause once it is back."""

    def fail() -> None:
        raise ConnectionError("broken for the test")

    old, seen = consumer._connection, len(caplog.records)
    consumer._loop.later(fail)
    wait_for(lambda: consumer._connection not in (None, old))
    assert consumer.wait_ready(WAIT_S)
    message = caplog.records[seen].getMessage()
    assert message.startswith("bus consumer qtest-shared-backoff-shared: ConnectionError")
    return str(message.rsplit(" ", 2)[1])  # "... reconnecting in 0.1 s"
