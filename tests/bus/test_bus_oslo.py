"""The oslo.messaging bus on RabbitMQ: what an agent did not process never counts toward
the quorum queue's delivery limit, and what crashes agents still ends in the dead letters.

RabbitMQ counts every message it gets back without an ack (``x-delivery-count``), and at
``[bus] delivery_limit`` of them dead-letters it (docs/pipeline.rst, the oslo.messaging
bus; :mod:`qsched.bus.oslo.listener`). A count is read with ``basic.get``, which shows it
before its own return.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from qsched.bus import Delivery
from qsched.bus.base import BusUnavailable
from qsched.scheduling.message import decode
from tests.bus.test_bus import (
    AMQP_URL,
    FAST,
    WAIT_S,
    Harness,
    Inbox,
    drop_connections,
    reachable,
    request,
    wait_dead_letters,
    wait_for,
)
from tests.helpers import ROOT

pytestmark = [pytest.mark.real, pytest.mark.timeout(60)]

CLASS = "m1.small"


@pytest.fixture
def harness() -> Iterator[Harness]:
    """The oslo bus under a fresh prefix, delivery limit 1."""
    reachable(AMQP_URL)
    harness = Harness(f"oslo+{AMQP_URL}", options=dataclasses.replace(FAST, delivery_limit=1))
    try:
        yield harness
    finally:
        harness.cleanup()


@pytest.fixture
def policed(harness: Harness) -> Iterator[Harness]:
    """The same with deploy/rabbitmq-policies.sh applied to its prefix, which gives
    its queues the dead-letter exchange: a second return dead-letters a message."""
    if shutil.which("rabbitmqctl") is None:
        pytest.fail("rabbitmqctl is not on PATH: it sets the broker policies")
    env = {**os.environ, "PREFIX": harness.prefix, "DELIVERY_LIMIT": "1"}
    script = ROOT / "deploy" / "rabbitmq-policies.sh"
    try:
        subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True, timeout=60)
        yield harness
    finally:
        for name in ("boot", "idle-classes", "host"):
            subprocess.run(["rabbitmqctl", "clear_policy", f"{harness.prefix}-{name}"],
                           capture_output=True, timeout=60)  # fmt: skip


def delivery_counts(harness: Harness) -> list[tuple[Any, int]]:
    """Every message of the class queue, in order, with its ``x-delivery-count``."""
    found = []
    with harness.wire.channel() as channel:
        name = harness.bus.names.boot_queue(CLASS)
        while (message := channel.basic_get(name, no_ack=False)) is not None:
            body = _qsched_body(message.body)
            found.append((body, (message.headers or {}).get("x-delivery-count", 0)))
    return found


def _qsched_body(raw: bytes) -> Any:
    from qsched.bus.base import DeadLetter
    from qsched.bus.oslo.bus import unwrapped

    return decode(unwrapped(DeadLetter(raw, "", None, None, None)).body)


def gone(harness: Harness, holder: dict[str, Any], waiting: int) -> None:
    """Wait until the class the callback removed is consumed no more and its queue
    holds ``waiting`` messages ready: none is still held by the listener that left.
    The inbox records a delivery before its callback runs: wait for the callback too."""
    wait_for(lambda: "removed" in holder)
    holder.pop("removed").result(WAIT_S)
    wait_for(lambda: harness.bus.queue_stats(CLASS).ready == waiting)


def test_a_class_removed_after_an_ack_counts_nothing_against_the_next_request(
    harness: Harness,
) -> None:
    """An agent claims one request, and the claim leaves no room for the class: the
    next request, at the head of the queue, never reached it and counts no delivery."""
    first, second = request(CLASS), request(CLASS)
    for message in (first, second):
        harness.bus.publish_boot(message)
    holder: dict[str, Any] = {}
    made: Future[Any] = Future()  # the consumer, once made: it may deliver before that

    def claim_then_full(body: bytes, delivery: Delivery) -> None:
        delivery.ack()
        holder["removed"] = made.result(WAIT_S).remove_class(CLASS)

    inbox = Inbox(claim_then_full)
    made.set_result(harness.consumer(inbox, (CLASS,)))
    assert inbox.get()[0] == first
    gone(harness, holder, 1)
    inbox.expect_nothing()
    assert delivery_counts(harness) == [(second, 0)]


def test_a_refusal_that_removes_its_class_leaves_one_uncounted_copy(harness: Harness) -> None:
    """The agent's refusal: the class goes (nothing fits it now), then the request is
    requeued at the tail. Neither the copy nor anything behind it counts a delivery."""
    sent = request(CLASS)
    harness.bus.publish_boot(sent)
    holder: dict[str, Any] = {}
    made: Future[Any] = Future()  # the consumer, once made: it may deliver before that

    def refuse(body: bytes, delivery: Delivery) -> None:
        holder["removed"] = made.result(WAIT_S).remove_class(CLASS)
        delivery.requeue(body)

    inbox = Inbox(refuse)
    made.set_result(harness.consumer(inbox, (CLASS,)))
    assert inbox.get()[0] == sent
    gone(harness, holder, 1)
    assert delivery_counts(harness) == [(sent, 0)]


def test_class_churn_never_takes_a_valid_request_to_the_limit(harness: Harness) -> None:
    """Five times the class comes and goes with a request claimed or refused each time;
    nothing is counted (with a delivery limit of 1, a count of 2 would dead-letter)."""
    sent = [request(CLASS) for _ in range(4)]
    for message in sent:
        harness.bus.publish_boot(message)
    holder: dict[str, Any] = {}
    claimed: list[Any] = []

    def claim_or_refuse(body: bytes, delivery: Delivery) -> None:
        refused = len(claimed) % 2
        claimed.append(decode(body))  # before "removed": gone() waits for that one
        if refused:
            removed = holder["consumer"].remove_class(CLASS)
            delivery.requeue(body)
        else:
            delivery.ack()
            removed = holder["consumer"].remove_class(CLASS)
        holder["removed"] = removed

    inbox = Inbox(claim_or_refuse)
    holder["consumer"] = consumer = harness.consumer(inbox, ())
    for _ in range(5):
        consumer.add_class(CLASS).result(WAIT_S)
        inbox.get()
        wait_for(lambda: "removed" in holder)
        gone(harness, holder, len(sent) - len(claimed[0::2]))
    acked = claimed[0::2]
    left = delivery_counts(harness)
    assert sorted(str(m.instance_uuid) for m, _ in left) == sorted(
        str(m.instance_uuid) for m in sent if m not in acked
    )
    assert {count for _, count in left} == {0}


def test_stop_passes_on_what_it_holds_without_a_count(harness: Harness) -> None:
    """An agent stops (a restart) with a request in hand and one behind it: both stay
    in the queue uncounted, and settling the one in hand afterwards fails."""
    first, second = request(CLASS), request(CLASS)
    for message in (first, second):
        harness.bus.publish_boot(message)
    holder = Inbox()
    consumer = harness.consumer(holder, (CLASS,))
    _, delivery = holder.get()
    consumer.stop(WAIT_S)
    with pytest.raises(BusUnavailable, match="given back"):
        delivery.ack()
    assert sorted(delivery_counts(harness), key=lambda found: found[0] != second) == [
        (second, 0),
        (first, 0),
    ]


def test_stop_from_another_thread_while_the_callback_settles(harness: Harness) -> None:
    """The callback acks while its consumer stops: the ack holds, and the request behind
    it counts no delivery."""
    first, second = request(CLASS), request(CLASS)
    for message in (first, second):
        harness.bus.publish_boot(message)
    release = threading.Event()

    def slow_ack(body: bytes, delivery: Delivery) -> None:
        release.wait(WAIT_S)
        delivery.ack()

    inbox = Inbox(slow_ack)
    consumer = harness.consumer(inbox, (CLASS,))
    assert inbox.get()[0] == first
    stopping = threading.Thread(target=consumer.stop, args=(WAIT_S,))
    stopping.start()
    time.sleep(0.2)
    release.set()
    stopping.join(WAIT_S)
    assert delivery_counts(harness) == [(second, 0)]


def test_a_request_that_crashes_agents_still_ends_in_the_dead_letters(
    policed: Harness,
) -> None:
    """Twice an agent loses its connection holding it, as when it dies in the middle of
    its callback (limit 1): the broker dead-letters it, with the qsched body and the
    broker's reason. A return that is no agent's choice still counts."""
    harness = policed
    sent = request(CLASS)
    harness.bus.publish_boot(sent)
    holder = Inbox()
    consumer = harness.consumer(holder, (CLASS,))
    for _ in range(2):
        got, delivery = holder.get()
        assert got == sent
        drop_connections(harness, consumer)  # the broker takes it back, counted
        delivery.ack()  # lost with its connection: oslo.messaging only logs it
    letters = wait_dead_letters(harness, 1)
    assert "delivery_limit" in letters[0].reason
    assert decode(letters[0].body) == sent
    holder.expect_nothing()
