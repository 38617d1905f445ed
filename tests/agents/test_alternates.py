"""Alternates: a rescheduled request does not go back to a host that already failed it.

The one-bad-host case of issue 13 runs on every bus (the embedded memory://, and
RabbitMQ and kombu's Redis transport when reachable, required under CI) and on every
ledger (fakeredis, a real Redis): one agent whose spawns always fail, one healthy
agent with room for every boot.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
import redis

from agents.consuming import ClassGate
from agents.service import ComputeAgent
from agents.virt.base import SpawnFailed
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.conf import AgentOptions
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.recovery import janitor
from qsched.scheduling.message import BootRequest
from tests.cloud import BUS_REDIS_URL, transport_url
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

USER = RequestContext.for_project("u1", "p1")
BOOTS = 30
HOSTS = ("cn-bad", "cn-good", "cn-dying", "cn-live")
FAST = KombuOptions(connect_timeout_s=2.0, poll_interval_s=0.05, reconnect_max_delay_s=0.5)


# -- the bus, on every transport ----------------------------------------------------------


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("rabbitmq", id="amqp", marks=pytest.mark.real),
        pytest.param("redis", id="redis", marks=pytest.mark.real),
    ]
)
def bus(request: pytest.FixtureRequest) -> Iterator[KombuBus]:
    """This module's bus (the ``api`` fixture publishes on it), under a prefix of its own."""
    url = "memory://" if request.param == "memory" else transport_url(request.param)
    bus = KombuBus(url, prefix=f"alt{uuid.uuid4().hex[:10]}", options=FAST)
    yield bus
    forget(bus)


def forget(bus: KombuBus, hosts: tuple[str, ...] = HOSTS) -> None:
    """Delete what the test declared on a shared broker (the queues of ``hosts``)."""
    bus.close()
    wire, names = bus.wire, bus.names
    queues = [names.dead_queue, *map(names.boot_queue, bus.boot_classes()),
              *map(names.host_queue, hosts)]  # fmt: skip
    with wire.channel() as channel:
        for name in queues:
            if not wire.amqp:
                channel.queue_purge(name)  # virtual transports delete only bound queues
            channel.queue_delete(name)
        if wire.amqp:
            channel.exchange_delete(names.exchange)
            channel.exchange_delete(names.dead_exchange)
    if wire.driver == "redis":
        client = redis.Redis.from_url(BUS_REDIS_URL)
        for key in client.scan_iter(match=f"{names.prefix}*"):
            client.delete(key)


def start_agent(conf, stores: Stores, bus: KombuBus, host: str, **driver) -> ComputeAgent:
    conf.set_override("host", host, group="agent")
    conf.set_override("heartbeat_interval_s", 0.2, group="agent")
    conf.set_override("class_poll_interval_s", 0.05, group="agent")
    conf.set_override("handback_pause_s", 0.2, group="agent")
    spec = FakeNodeSpec(vcpus=16, ram_mb=16 * 1024, disk_gb=0)  # 2 nodes: room for 32
    agent = ComputeAgent(
        AgentOptions.from_conf(conf), stores, bus, FakeDriver(2, spec, host=host, **driver)
    )
    agent.start(ready_timeout_s=10)
    return agent


def settled(stores: Stores, uuids: list[str]) -> bool:
    return all(stores.instances.get(u).state != State.BUILD for u in uuids)


def claims_on_tried_hosts(stores: Stores, uuid_: str) -> int:
    """Claims of the instance by a host whose claim of it had been given back before."""
    tried: set[str] = set()
    again = 0
    for event in stores.instances.events(uuid_):
        if event.event == "claimed" and event.host in tried:
            again += 1
        elif event.event == "requeued" and event.host:
            tried.add(event.host)
    return again


# -- the one-bad-host case ----------------------------------------------------------------


def test_one_bad_host_every_boot_ends_active_elsewhere(conf, stores, bus, api, agents) -> None:
    """A cloud that runs (its class known to every agent), then 30 boots while one
    host fails every spawn. Before alternates 2-6 of them ended ERROR and 8-13 claims
    landed again on cn-bad."""
    agents.append(start_agent(conf, stores, bus, "cn-good"))
    warm = api.boot(USER, "warm", "small").uuid  # the class exists once a boot made it
    assert wait_until(lambda: settled(stores, [warm]), timeout_s=20)
    agents.append(start_agent(conf, stores, bus, "cn-bad", failure_rate=1.0))
    bad = agents[-1]
    assert wait_until(lambda: stores.agents.class_consumers("small") == {"cn-good", "cn-bad"}, 5)
    uuids = [api.boot(USER, f"vm{i}", "small").uuid for i in range(BOOTS)]
    assert wait_until(lambda: settled(stores, uuids), timeout_s=60)
    records = [stores.instances.get(u) for u in uuids]
    assert [(r.state, r.host) for r in records] == [(State.ACTIVE, "cn-good")] * BOOTS
    assert sum(claims_on_tried_hosts(stores, u) for u in uuids) == 0
    rescheduled = [r for r in records if r.attempts]
    assert rescheduled, "cn-bad failed none: the test proves nothing"
    assert {(r.attempts, r.tried_hosts) for r in rescheduled} == {(1, ("cn-bad",))}
    assert bad.counters["spawn_failed"] == len(rescheduled)
    report = audit(stores)
    assert report.ok, report.to_dict()


def test_a_lone_host_that_failed_a_request_still_retries_it(conf, stores, bus, api, agents):
    """Nobody else has room: the failed host claims again, up to max_attempts."""
    agents.append(start_agent(conf, stores, bus, "cn-bad", failure_rate=1.0))
    doomed = api.boot(USER, "doomed", "small").uuid
    assert wait_until(lambda: settled(stores, [doomed]), timeout_s=20)
    record = stores.instances.get(doomed)
    assert (record.state, record.attempts, record.handbacks) == (State.ERROR, 3, 0)
    assert record.fault["details"]["reason"] == "max_attempts"


# -- the janitor's requeue ----------------------------------------------------------------


def test_the_janitor_requeue_keeps_tried_hosts_and_constraints(
    conf, stores, bus, api, agents
) -> None:
    """A dead agent's claim comes back with its host tried and every constraint."""
    held = threading.Event()
    dying = start_agent(conf, stores, bus, "cn-dying", spawn_hook=lambda i, n: held.wait(30))
    agents.append(dying)
    published: list[BootRequest] = []
    real = bus.publish_boot
    bus.publish_boot = lambda msg: published.append(msg) or real(msg)  # type: ignore[method-assign]
    inst = api.boot(USER, "vm", "small", availability_zone="nova").uuid
    assert wait_until(lambda: stores.instances.building("cn-dying") == {inst}, 10)
    assert dying.consumer is not None
    dying.consumer.stop(5)  # it died: it takes nothing more, its spawn hangs
    assert janitor.requeue_orphan(stores, bus, inst, "cn-dying", "agent cn-dying is down")
    first, again = published
    assert first.availability_zone == "nova" and first.tried_hosts == ()
    assert (again.attempt, again.tried_hosts) == (2, ("cn-dying",))
    same = dataclasses.replace(again, attempt=1, tried_hosts=(), published_at=first.published_at)
    assert same == first  # every constraint, the deadline, the ids
    held.set()


def fail_first_spawn(instance: str, node: str) -> None:
    """A spawn hook: every instance's first spawn on this driver fails."""
    if instance not in FAILED:
        FAILED.add(instance)
        raise SpawnFailed(instance=instance, node=node, reason="injected: first spawn fails")


FAILED: set[str] = set()


def test_an_alternate_that_never_takes_it_gets_max_handbacks_chances(
    conf, stores, bus, api, agents
) -> None:
    """A host alive and registered for the class whose consumer never takes anything
    (cut off from the broker): after max_handbacks hand-backs the tried host claims."""
    conf.set_override("max_handbacks", 3, group="agent")
    flaky = start_agent(conf, stores, bus, "cn-bad", spawn_hook=fail_first_spawn)
    agents.append(flaky)
    stores.agents.heartbeat("cn-good", 60)  # alive, with room, never consuming
    stores.agents.set_classes("cn-good", ["small"])
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: settled(stores, [inst]), timeout_s=20)
    record = stores.instances.get(inst)
    assert (record.state, record.host, record.handbacks) == (State.ACTIVE, "cn-bad", 3)
    backs = [e for e in stores.instances.events(inst) if e.event == "handed_back"]
    assert [(e.host, e.detail["alternate"], e.detail["handbacks"]) for e in backs] == [
        ("cn-bad", "cn-good", n) for n in (1, 2, 3)
    ]
    assert flaky.counters["handed_back"] == 3


# -- the class gate -----------------------------------------------------------------------


class RecordingConsumer:
    """The part of a Consumer the gate uses: what it was told, in order."""

    def __init__(self, classes: frozenset[str]) -> None:
        self.classes = set(classes)
        self.told: list[tuple[str, str]] = []

    def add_class(self, name: str) -> Future[None]:
        self.classes.add(name)
        self.told.append(("add", name))
        return Future()

    def remove_class(self, name: str) -> Future[None]:
        self.classes.discard(name)
        self.told.append(("remove", name))
        return Future()


def open_gate(*fittable: str) -> tuple[ClassGate, RecordingConsumer]:
    gate = ClassGate()
    for name in fittable:
        gate.changed(name, True)
    consumer = gate.open(RecordingConsumer)  # type: ignore[arg-type]
    return gate, consumer  # type: ignore[return-value]


def test_the_gate_consumes_what_fits() -> None:
    gate, consumer = open_gate("small")
    assert consumer.classes == {"small"}
    gate.changed("big", True)
    gate.changed("small", False)
    assert consumer.told == [("add", "big"), ("remove", "small")]
    assert gate.wanted() == {"big"}


def test_a_pause_cancels_the_class_then_resumes_it() -> None:
    gate, consumer = open_gate("small", "big")
    gate.pause("small", 0.2)
    assert consumer.classes == {"big"} and gate.paused() == {"small"}
    assert wait_until(lambda: consumer.classes == {"small", "big"}, timeout_s=2)
    assert consumer.told == [("remove", "small"), ("add", "small")]


def test_a_class_that_stops_fitting_while_paused_stays_cancelled() -> None:
    gate, consumer = open_gate("small")
    gate.pause("small", 0.1)
    gate.changed("small", False)
    gate.changed("small", True)  # fits again, but still paused: not told
    gate.changed("small", False)
    assert wait_until(lambda: not gate.paused(), timeout_s=2)
    assert consumer.told == [("remove", "small")] and consumer.classes == set()


def test_a_class_that_fits_only_once_paused_is_consumed_after_the_pause() -> None:
    gate, consumer = open_gate()
    gate.pause("small", 0.1)
    gate.changed("small", True)
    assert consumer.classes == set()
    assert wait_until(lambda: consumer.classes == {"small"}, timeout_s=2)


def test_a_closed_gate_tells_nothing() -> None:
    gate, consumer = open_gate("small")
    gate.pause("small", 0.05)
    gate.close()
    gate.pause("small", 0.05)
    gate.changed("big", True)
    assert not wait_until(lambda: len(consumer.told) > 1, timeout_s=0.3)
    assert consumer.told == [("remove", "small")]


def test_no_pause_of_zero_seconds() -> None:
    gate, consumer = open_gate("small")
    gate.pause("small", 0)
    assert consumer.told == [] and gate.paused() == set()


def test_a_disabled_gate_consumes_nothing_and_comes_back_as_it_was() -> None:
    gate, consumer = open_gate("small", "big")
    gate.pause("big", 0.1)
    gate.enable(False)
    assert consumer.classes == set() and gate.wanted() == set()
    gate.changed("tiny", True)  # learned while disabled: not consumed yet
    assert wait_until(lambda: not gate.paused(), timeout_s=2)
    assert consumer.classes == set()
    gate.enable(True)
    assert consumer.classes == {"small", "big", "tiny"}
