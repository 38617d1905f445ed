"""Faults on the embedded stack: dead agents, restarts, leaks, redelivery.

The same tests run with a real Redis ledger under CI (the ``stores`` fixture);
tests/chaos/test_faults_real.py kills real processes and restarts real servers.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched.conf import AgentOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, State
from qsched.recovery import janitor
from qsched.recovery.reaper import reap_expired
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import BootRequest
from tests.helpers import before_claim, wait_until

USER = RequestContext.for_project("u1", "p1")


class SimulatedCrash(BaseException):
    """Raised in a spawn worker of an agent we pretend has died: nothing else runs."""


def start_agent(conf, stores, bus, host: str, hook=None) -> ComputeAgent:
    conf.set_override("host", host, group="agent")
    conf.set_override("class_poll_interval_s", 0.05, group="agent")
    conf.set_override("heartbeat_ttl_s", 60, group="agent")
    spec = FakeNodeSpec(vcpus=4, ram_mb=8192, disk_gb=0)
    agent = ComputeAgent(
        AgentOptions.from_conf(conf), stores, bus, FakeDriver(2, spec, host=host, spawn_hook=hook)
    )
    agent.start(ready_timeout_s=5)
    return agent


def crash_in_spawn(release: threading.Event):
    """A spawn hook that blocks until ``release``, then dies like its process did."""

    def hang(instance: str, node: str) -> None:
        release.wait(10)
        raise SimulatedCrash

    return hang


def crash(agent: ComputeAgent) -> None:
    """Stop consuming without finishing anything, like a SIGKILL would."""
    assert agent.consumer is not None
    agent.consumer.stop(timeout_s=5)
    for task in agent._periodic:
        task.stop()
    agent.stores.agents.forget(agent.host)  # its heartbeat expires


def claimed_then_crashed(conf, stores, bus, api, host: str):
    """An agent that claimed one boot and died mid-spawn: (agent, instance, its spawn's release)."""
    release = threading.Event()
    agent = start_agent(conf, stores, bus, host, hook=crash_in_spawn(release))
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.building(host) == {inst}, 10)
    crash(agent)
    return agent, inst, release


def test_the_janitor_requeues_what_a_dead_agent_claimed(conf, stores, bus, api, agents) -> None:
    _, inst, release = claimed_then_crashed(conf, stores, bus, api, "cn-dying")
    dry = janitor.run(stores, bus, dry_run=True)
    assert (dry.dead_agents, dry.requeued) == (["cn-dying"], [inst])
    assert stores.instances.get(inst).host == "cn-dying"  # a dry run changes nothing
    agents.append(start_agent(conf, stores, bus, "cn-live"))
    report = janitor.run(stores, bus)
    assert report.requeued == [inst]
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    record = stores.instances.get(inst)
    assert (record.host, record.attempts) == ("cn-live", 1)
    assert stores.instances.building("cn-dying") == set()
    # silent is not gone: its claim stays held on its node until its agent says so
    assert list(stores.ledger.held_claims("cn-dying")) == [inst]
    release.set()
    assert audit(stores).ok, audit(stores).to_dict()


def test_two_janitors_requeue_an_orphan_once(conf, stores, bus, api, agents) -> None:
    """Every API worker runs a janitor: the slower one must find nothing left to do."""
    _, inst, release = claimed_then_crashed(conf, stores, bus, api, "cn-dying")
    published = []
    real = bus.publish_boot
    bus.publish_boot = lambda msg: published.append(msg) or real(msg)
    assert janitor.requeue_orphan(stores, bus, inst, "cn-dying", "agent cn-dying is down")
    assert not janitor.requeue_orphan(stores, bus, inst, "cn-dying", "agent cn-dying is down")
    assert [m.instance_uuid for m in published] == [inst]
    events = [e.event for e in stores.instances.events(inst)]
    assert events.count("requeued") == 1 and stores.instances.get(inst).attempts == 1
    release.set()
    assert audit(stores).ok, audit(stores).to_dict()


def test_a_restarted_agent_finishes_its_builds_and_drops_leaks(
    conf, stores, bus, api, agents
) -> None:
    first, inst, release = claimed_then_crashed(conf, stores, bus, api, "cn0")
    node = first.index.node("cn0-0")
    ghost = str(uuid.uuid4())  # allocations no instance explains
    stores.ledger.put_allocations(ghost, {node.root.uuid: {"VCPU": 1}}, None, "p1", "u1")
    again = start_agent(conf, stores, bus, "cn0")
    agents.append(again)
    assert again.reconciled.requeued == [inst]
    assert again.reconciled.released == [ghost]
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    assert stores.instances.get(inst).host == "cn0"
    release.set()
    report = audit(stores)
    assert report.ok, report.to_dict()


def test_a_build_the_driver_finished_is_made_active_on_restart(
    conf, stores, bus, api, agents
) -> None:
    release = threading.Event()
    driver_seen: list[tuple[str, str]] = []

    def hang(instance: str, node: str) -> None:
        driver_seen.append((instance, node))
        release.wait(10)
        raise SimulatedCrash

    first = start_agent(conf, stores, bus, "cn0", hook=hang)
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: bool(driver_seen), 10)
    crash(first)
    conf.set_override("host", "cn0", group="agent")
    spec = FakeNodeSpec(vcpus=4, ram_mb=8192, disk_gb=0)
    driver = FakeDriver(2, spec, host="cn0")
    driver.spawn(inst, driver_seen[0][1], Flavor("small", 1, 1024, 0))  # the VM did start
    again = ComputeAgent(AgentOptions.from_conf(conf), stores, bus, driver)
    again.start(ready_timeout_s=5)
    agents.append(again)
    assert again.reconciled.activated == [inst]
    assert stores.instances.get(inst).state == State.ACTIVE
    release.set()
    assert audit(stores).ok


def test_a_redelivered_request_is_not_spawned_twice(conf, stores, bus, api, agents) -> None:
    spawns: list[str] = []
    hold = threading.Event()
    agents += [
        start_agent(conf, stores, bus, f"cn{i}", hook=lambda i_, n: spawns.append(i_))
        for i in range(2)
    ]
    slow = agents[0]
    entered = threading.Event()

    def held(msg: BootRequest) -> None:  # holds the request, unacked, past its claim check
        entered.set()
        hold.wait(10)

    before_claim(slow, held)
    inst = str(uuid.uuid4())
    flavor = Flavor("small", 1, 1024, 0)
    stores.instances.create(Instance(inst, "p1", "u1", "vm", flavor.to_dict(), State.BUILD), 1e12)
    stores.agents.add_class("small", SchedulingClass(flavor).definition())  # as a boot does
    msg = BootRequest.create(inst, "p1", "u1", flavor)
    first = _AckOnly()
    threading.Thread(target=slow.on_message, args=(msg.encode(), first)).start()
    assert entered.wait(10)
    agents[1].on_message(msg.encode(), _AckOnly())  # the broker's redelivery, elsewhere
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    hold.set()
    assert wait_until(lambda: first.acked, 10)
    assert spawns == [inst] and slow.counters["dropped"] == 1
    assert stores.instances.get(inst).host == "cn1"
    assert audit(stores).ok


class _AckOnly:
    queue = "q"
    routing_key = "boot.small"
    redelivered = True
    headers: dict = {}
    acked = False

    def ack(self) -> None:
        self.acked = True

    def requeue(self, new_body: bytes) -> None:
        raise AssertionError("a placed request must not be requeued")

    def reject(self, reason: str) -> None:
        raise AssertionError(reason)


def test_the_janitor_waits_out_its_grace(conf, stores, bus, api, agents) -> None:
    _, inst, release = claimed_then_crashed(conf, stores, bus, api, "cn-dying")
    suspects: dict[str, float] = {}
    assert janitor.run(stores, bus, now=100.0, grace_s=10, suspects=suspects).requeued == []
    assert janitor.run(stores, bus, now=105.0, grace_s=10, suspects=suspects).requeued == []
    stores.agents.heartbeat("cn-dying", ttl_s=60)  # it was only a ledger outage: it beats again
    assert janitor.run(stores, bus, now=111.0, grace_s=10, suspects=suspects).requeued == []
    assert suspects == {}
    stores.agents.forget("cn-dying")
    assert janitor.run(stores, bus, now=200.0, grace_s=10, suspects=suspects).requeued == []
    assert janitor.run(stores, bus, now=210.0, grace_s=10, suspects=suspects).requeued == [inst]
    release.set()


def test_a_lost_delete_request_is_finished_anyway(conf, stores, bus, api, agents) -> None:
    agent = start_agent(conf, stores, bus, "cn0")
    agents.append(agent)
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    # ACTIVE is recorded before the spawn's thread lets go of it, and the sweep leaves
    # a delete whose spawn is in flight to that spawn
    assert wait_until(lambda: inst not in agent.builds, 5)
    stores.instances.mark_deleting(inst)  # as the API does, but its request never arrives
    assert stores.instances.deleting("cn0") == [inst]
    assert agent.deletes.finish(marked_before=0.0) == 0  # not stuck yet
    assert agent.deletes.finish() == 1
    assert stores.instances.get(inst).state == State.DELETED
    assert stores.instances.deleting("cn0") == []
    assert agent.index.totals()["VCPU"][0] == 0
    assert audit(stores).ok


def test_the_janitor_finishes_a_dead_agents_deletes(conf, stores, bus, api, agents) -> None:
    agent = start_agent(conf, stores, bus, "cn0")
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    crash(agent)
    stores.instances.mark_deleting(inst)
    report = janitor.run(stores, bus)
    assert (report.dead_agents, report.deleted) == (["cn0"], [inst])
    assert stores.instances.get(inst).state == State.DELETED
    assert list(stores.ledger.held_claims("cn0")) == [inst]  # its VM may still run there
    assert audit(stores).ok
    # back, on the same hypervisor: it reaps the VM, then lets its claim go
    again = ComputeAgent(AgentOptions.from_conf(conf), stores, bus, agent.driver)
    again.start(ready_timeout_s=5)
    agents.append(again)
    assert again.reconciled.reaped == [inst] and again.reconciled.unheld == [inst]
    assert stores.ledger.held_claims("cn0") == {}
    assert again.index.totals()["VCPU"][0] == 0


def test_the_janitor_leaves_an_agent_that_beats_again_its_work(
    conf, stores, bus, api, agents
) -> None:
    """It read the agent silent, the agent beat before the take-over: nothing is taken."""
    agent = start_agent(conf, stores, bus, "cn0", hook=lambda i, n: time.sleep(0.5))
    agents.append(agent)
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.building("cn0") == {inst}, 10)
    seen = stores.agents.list()
    stores.agents.list = lambda: [dataclasses.replace(a, alive=False) for a in seen]  # type: ignore[method-assign]
    report = janitor.run(stores, bus)
    assert report.dead_agents == ["cn0"] and report.requeued == []
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    assert stores.instances.get(inst).host == "cn0" and stores.ledger.held_claims("cn0") == {}


def test_a_request_released_under_a_running_spawn_is_not_dropped(
    conf, stores, bus, api, agents
) -> None:
    release = threading.Event()

    def slow(instance: str, node: str) -> None:
        release.wait(10)

    agent = start_agent(conf, stores, bus, "cn0", hook=slow)
    agents.append(agent)
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.building("cn0") == {inst}, 10)
    record = stores.instances.requeue(inst, "cn0", "taken back by a janitor")
    msg = BootRequest.create(inst, "p1", "u1", Flavor("small", 1, 1024, 0))
    delivery = _Recording()
    agent.on_message(msg.encode(), delivery)
    assert delivery.settled == ["requeue"] and record.host is None  # due again, not dropped
    release.set()  # the old spawn finds its claim gone, destroys its VM and lets go
    assert wait_until(lambda: not agent.builds, 10)
    agent.on_message(msg.encode(), _Recording())  # the requeued copy comes back
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 15)
    assert audit(stores).ok


class _Recording(_AckOnly):
    def __init__(self) -> None:
        self.settled: list[str] = []

    def ack(self) -> None:
        self.settled.append("ack")

    def requeue(self, new_body: bytes) -> None:
        self.settled.append("requeue")


def test_a_request_nothing_here_fits_is_requeued_only_while_it_waits(
    conf, stores, bus, api, agents
) -> None:
    agent = start_agent(conf, stores, bus, "cn0")
    agents.append(agent)
    huge = Flavor("huge", 64, 32768, 0)  # more than any node of cn0 has
    api.cell.flavors.create(huge)
    gone = api.boot(USER, "gone", "huge").uuid
    api.delete(USER, gone)
    kept = api.boot(USER, "kept", "huge").uuid
    for uuid_, expected in ((gone, ["ack"]), (kept, ["requeue"])):
        delivery = _Recording()
        agent.on_message(BootRequest.create(uuid_, "p1", "u1", huge).encode(), delivery)
        assert delivery.settled == expected, uuid_
    assert agent.counters["dropped"] == 1 and agent.counters["refused"] == 1
    assert stores.instances.get(kept).state == State.BUILD


def blocking(uuids: set[str], release: threading.Event):
    """A spawn hook that holds the spawns of ``uuids`` until ``release``."""

    def hook(instance: str, node: str) -> None:
        if instance in uuids:
            release.wait(10)

    return hook


def test_a_spawn_that_outlives_its_deadline_gives_its_room_back(
    conf, stores, bus, api, agents
) -> None:
    release, slow = threading.Event(), set()
    agent = start_agent(conf, stores, bus, "cn0", hook=blocking(slow, release))
    agents.append(agent)
    slow.add(api.boot(USER, "slow", "small").uuid)
    (inst,) = slow
    assert wait_until(lambda: stores.instances.building("cn0") == {inst}, 10)
    # the index counts the claim once the claim has returned, after the ledger shows it
    assert wait_until(lambda: agent.index.totals()["VCPU"][0] == 1, 10)
    assert reap_expired(stores, now=time.time() + 3600) == 1  # the reaper ends it in ERROR
    release.set()
    assert wait_until(lambda: not agent.builds, 10)
    assert stores.instances.get(inst).state == State.ERROR
    assert agent.index.totals()["VCPU"][0] == 0  # the ledger freed it: so does the index
    assert audit(stores).ok


def test_a_delete_during_a_spawn_frees_its_room_once(conf, stores, bus, api, agents) -> None:
    release, slow = threading.Event(), set()
    agent = start_agent(conf, stores, bus, "cn0", hook=blocking(slow, release))
    agents.append(agent)
    kept = api.boot(USER, "kept", "small").uuid
    assert wait_until(lambda: stores.instances.get(kept).state == State.ACTIVE, 10)
    slow.add(api.boot(USER, "doomed", "small").uuid)
    (doomed,) = slow
    assert wait_until(lambda: stores.instances.building("cn0") == {doomed}, 10)
    api.delete(USER, doomed)  # its agent destroys it and frees its room
    assert wait_until(lambda: stores.instances.get(doomed).state == State.DELETED, 10)
    release.set()  # then the spawn ends and finds it gone
    # the delete's record ends before its step releases the index: both settle first
    assert wait_until(lambda: not agent.builds and doomed not in agent.deletes.in_flight, 10)
    assert agent.index.totals()["VCPU"][0] == 1  # only kept's: freed once, not twice
    assert audit(stores).ok
