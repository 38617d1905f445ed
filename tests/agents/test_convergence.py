"""An agent's index and driver converge on the ledger after faults, without a restart.

Each test makes the ledger change under an agent the way a fault does (a delete
while the agent is down, the API deleting the instances of an agent it thinks
dead, a claim taken back) and checks that the agent's index, compared with the
ledger by its usage digest, and what its driver runs, agree with the ledger
again within the reconcile's bound. The same tests run on a real Redis in CI.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import pytest

from agents.reconcile import LOST_MESSAGE
from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec, read_state
from qsched.conf import AgentOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.recovery import janitor
from qsched.scheduling.message import BootRequest
from qsched.scheduling.views import ProviderView, usage_digest
from tests.helpers import wait_until
from tests.raw import redis_store

USER = RequestContext.for_project("u1", "p1")
SPEC = FakeNodeSpec(vcpus=4, ram_mb=8192, disk_gb=0)


def start(conf, stores, bus, host, driver=None, interval_s=0.2, **agent) -> ComputeAgent:
    """An agent of one node with 4 VCPUs (a long heartbeat TTL: it stays alive)."""
    options = {"host": host, "class_poll_interval_s": 0.05, "heartbeat_interval_s": 0.1,
               "heartbeat_ttl_s": 60, "reconcile_interval_s": interval_s, **agent}  # fmt: skip
    for name, value in options.items():
        conf.set_override(name, value, group="agent")
    running = ComputeAgent(
        AgentOptions.from_conf(conf), stores, bus, driver or FakeDriver(1, SPEC, host=host)
    )
    running.start(ready_timeout_s=5)
    return running


def ledger_digest(stores: Stores, agent: ComputeAgent) -> str:
    names, _ = agent.index.names(0)
    uuids = [p.uuid for n in names for p in agent.index.node(n).providers]
    return usage_digest(
        ProviderView.from_provider(p) for p in stores.ledger.get_providers(uuids).values()
    )


def converged(stores: Stores, agent: ComputeAgent) -> bool:
    return agent.index.digest() == ledger_digest(stores, agent)


def freeze(agent: ComputeAgent) -> None:
    """Stop consuming and every periodic task, as a SIGSTOP or a SIGKILL would."""
    assert agent.consumer is not None
    agent.consumer.stop(timeout_s=5)
    for task in agent._periodic:
        task.stop()


@pytest.fixture
def medium(api) -> Flavor:
    flavor = Flavor("medium", 2, 2048, 0)
    api.cell.flavors.create(flavor)
    api.cell.flavors.create(Flavor("whole", 4, 4096, 0))  # only an empty node fits it
    return flavor


def test_a_build_deleted_while_its_agent_was_down_frees_its_room(
    conf, stores, bus, api, agents, medium
) -> None:
    """Killed mid-build, the build deleted meanwhile: the restarted agent has the room."""
    release = threading.Event()
    hung = start(conf, stores, bus, "cn0", FakeDriver(1, SPEC, host="cn0",
                 spawn_hook=lambda i, n: release.wait(10)))  # fmt: skip
    doomed = api.boot(USER, "doomed", "medium").uuid
    assert wait_until(lambda: stores.instances.building("cn0") == {doomed}, 10)
    freeze(hung)  # killed; its heartbeat has not expired yet
    api.delete(USER, doomed)  # marked deleting, its delete request queued for cn0
    again = start(conf, stores, bus, "cn0", interval_s=60)  # no periodic pass in time
    agents.append(again)
    release.set()
    assert again.index.totals()["VCPU"][0] == 0, again.reconciled
    assert converged(stores, again)
    whole = api.boot(USER, "whole", "whole").uuid
    assert wait_until(lambda: stores.instances.get(whole).state == State.ACTIVE, 10)
    assert audit(stores).ok


def test_an_agent_comes_back_to_find_its_instances_deleted(
    conf, stores, bus, api, agents, medium, tmp_path
) -> None:
    """The API deleted the instances of an agent it thought down: reaped, room back."""
    state = tmp_path / "cn0.vms"
    driver = FakeDriver(1, SPEC, host="cn0", state_path=state)
    agent = start(conf, stores, bus, "cn0", driver)
    agents.append(agent)
    kept, gone = (api.boot(USER, name, "medium").uuid for name in ("kept", "gone"))
    assert wait_until(lambda: all(stores.instances.get(u).state == State.ACTIVE
                                  for u in (kept, gone)), 10)  # fmt: skip
    stores.agents.forget("cn0")  # silent past its TTL, as a frozen agent is
    assert api.delete(USER, gone).state == State.DELETED  # deleted locally, as Nova does
    # the agent was not told: only its reconcile (every 0.2 s) finds it out; until it
    # reaps the VM, the claim stays held for it, not released under its VM
    assert list(stores.ledger.held_claims("cn0")) == [gone] or gone not in read_state(state)
    assert wait_until(lambda: sorted(read_state(state)) == [kept], 5), read_state(state)
    # the pass reaps the VM, then lets the held claim go, then reads the node again: the
    # index and the ledger agree at 4 VCPUs used in between, at 2 once it is done
    assert wait_until(lambda: converged(stores, agent) and agent.index.totals()["VCPU"][0] == 2,
                      5), agent.index.totals()  # fmt: skip
    # the pass counts what it did once it returns, which may be after the above
    assert wait_until(lambda: agent.counters["reconcile_reaped"] == 1, 5)
    assert agent.counters["reconcile_unheld"] == 1 and stores.ledger.held_claims("cn0") == {}
    assert audit(stores).ok


def test_a_silence_past_the_ttl_reconciles_every_node_at_once(
    conf, stores, bus, api, agents, medium
) -> None:
    agent = start(conf, stores, bus, "cn0", interval_s=3600)  # only the wake-up can run it
    agents.append(agent)
    inst = api.boot(USER, "vm", "medium").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    stores.agents.forget("cn0")
    api.delete(USER, inst)
    assert agent._last_beat is not None
    agent._last_beat -= 120  # its last heartbeat, as the clock sees it after a freeze
    agent.heartbeat()
    assert agent.counters["came_back"] == 1
    assert wait_until(lambda: agent.driver.list_instances("cn0-0") == [], 5)
    assert wait_until(lambda: converged(stores, agent), 5)


@pytest.mark.parametrize("action", ["log", "noop"])
def test_running_deleted_instances_can_be_left_running(
    conf, stores, bus, api, agents, medium, action
) -> None:
    agent = start(conf, stores, bus, "cn0", running_deleted_instance_action=action)
    agents.append(agent)
    inst = api.boot(USER, "vm", "medium").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    stores.agents.forget("cn0")
    api.delete(USER, inst)
    assert wait_until(lambda: agent.counters["reconcile_running_deleted"] >= 1, 5)
    assert agent.driver.list_instances("cn0-0") == [inst]  # left as the operator asked
    assert agent.counters["reconcile_reaped"] == 0
    assert wait_until(lambda: converged(stores, agent), 5)  # the index follows the ledger


def test_a_claim_taken_back_under_a_spawn_is_given_back_to_the_index(
    conf, stores, bus, api, agents, medium
) -> None:
    release = threading.Event()
    driver = FakeDriver(1, SPEC, host="cn0", spawn_hook=lambda i, n: release.wait(10))
    agent = start(conf, stores, bus, "cn0", driver, interval_s=3600)
    agents.append(agent)
    inst = api.boot(USER, "vm", "medium").uuid
    assert wait_until(lambda: stores.instances.building("cn0") == {inst}, 10)
    stores.instances.requeue(inst, "cn0", "taken back by a janitor")  # the ledger lets go
    api.delete(USER, inst)
    release.set()
    assert wait_until(lambda: not agent.builds, 10)
    assert agent.index.totals()["VCPU"][0] == 0 and converged(stores, agent)


class _Interleaved(FakeDriver):
    """A driver that runs ``between`` once, right after its next destroy or listing
    (``when``), as another thread of a starved agent would get the interpreter there."""

    when = ""
    between: object = None

    def _then(self, what: str) -> None:
        if self.when == what:
            self.when = ""
            self.between()  # type: ignore[operator]

    def destroy(self, instance_uuid: str, node: str) -> bool:
        done = super().destroy(instance_uuid, node)
        self._then("destroy")
        return done

    def list_instances(self, node: str) -> list[str]:
        found = super().list_instances(node)
        self._then("list")
        return found


def _active(conf, stores, bus, api, agents) -> tuple[ComputeAgent, str]:
    """An agent with no periodic pass in time, and one instance ACTIVE on it."""
    agent = start(conf, stores, bus, "cn0", _Interleaved(1, SPEC, host="cn0"), interval_s=3600)
    agents.append(agent)
    inst = api.boot(USER, "vm", "medium").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    assert wait_until(lambda: not agent.builds, 5)
    return agent, inst


def test_a_delete_in_flight_is_not_an_instance_the_driver_lost(
    conf, stores, bus, api, agents, medium
) -> None:
    """A pass between the driver's destroy and the ledger's end of a delete (issue 31:
    "1 ACTIVE instances the driver does not run" on starved agents) finds nothing."""
    agent, inst = _active(conf, stores, bus, api, agents)
    found = []
    driver = agent.driver
    assert isinstance(driver, _Interleaved)
    driver.between = lambda: found.append(agent.reconciler.reconcile_nodes(["cn0-0"]))
    driver.when = "destroy"
    api.delete(USER, inst)
    assert wait_until(lambda: stores.instances.get(inst).state == State.DELETED, 10)
    assert len(found) == 1 and not found[0].found_anything(), found[0]


def test_a_vm_deleted_after_the_listing_is_not_running_while_deleted(
    conf, stores, bus, api, agents, medium
) -> None:
    """A delete that runs whole between the listing and the records read (issue 31:
    "1 instances running while deleted (1 reaped)") is no finding either."""
    agent, inst = _active(conf, stores, bus, api, agents)
    driver = agent.driver
    assert isinstance(driver, _Interleaved)
    driver.between = lambda: agent.deletes.destroy(inst, "cn0-0")  # its delete request, handled
    stores.instances.mark_deleting(inst)
    driver.when = "list"
    report = agent.reconciler.reconcile_nodes(["cn0-0"])
    assert stores.instances.get(inst).state == State.DELETED
    assert not report.running_deleted and not report.missing, report


def test_a_claim_held_for_an_instance_that_runs_here_as_its_own_again_is_released(
    conf, stores, bus, api, agents, medium
) -> None:
    """Taken while the agent was silent, then claimed and made ACTIVE by that agent
    again on the VM it still ran: the held claim only counts that VM twice."""
    agent, inst = _active(conf, stores, bus, api, agents)
    freeze(agent)
    stores.agents.forget("cn0")
    allocations = stores.ledger.get_allocations(inst).allocations
    _roll_back_to_claimed(stores, inst, "cn0")
    stores.instances.requeue(inst, "cn0", "cn0 is down", True, take_over=True)
    stores.ledger.claim(inst, allocations, "cn0", "cn0-0")
    stores.instances.set_active(inst, "cn0", "cn0-0")
    assert agent.index.node("cn0-0").root.uuid in allocations
    report = agent.reconciler.reconcile_nodes(["cn0-0"])
    assert report.unheld == [inst] and stores.ledger.held_claims("cn0") == {}
    assert converged(stores, agent) and agent.index.totals()["VCPU"][0] == 2


def test_leaked_allocations_are_released_without_a_restart(conf, stores, bus, api, agents) -> None:
    agent = start(conf, stores, bus, "cn0")
    agents.append(agent)
    node = agent.index.node("cn0-0")
    ghost = str(uuid.uuid4())  # allocations whose consumer is gone (a ledger rollback)
    stores.ledger.put_allocations(ghost, {node.root.uuid: {"VCPU": 3}}, None, "p1", "u1")
    assert wait_until(lambda: stores.ledger.get_allocations(ghost).generation is None, 5)
    assert wait_until(lambda: converged(stores, agent), 5)
    assert agent.index.totals()["VCPU"][0] == 0
    assert audit(stores).ok


def test_the_index_refresh_never_undoes_a_write_in_flight(conf, stores, bus, agents) -> None:
    """A refresh read before a claim lands must not erase that claim from the index."""
    agent = start(conf, stores, bus, "cn0", interval_s=3600)
    agents.append(agent)
    view = agent.index.node("cn0-0")
    token = agent.index.sync_token("cn0-0")
    stale = [ProviderView.from_provider(stores.ledger.get_provider(view.root.uuid))]
    with agent.index.writing("cn0-0"):  # the agent claims meanwhile
        assert agent.index.sync_token("cn0-0") is None
        agent.index.claim("cn0-0", {view.root.uuid: {"VCPU": 1}})
    assert agent.index.refresh_if("cn0-0", stale, token) is None
    assert agent.index.totals()["VCPU"][0] == 1


def test_agents_consume_only_classes_the_ledger_lists(conf, stores, bus, api, agents) -> None:
    """A boot naming a class nobody published is dead-lettered, never consumed."""
    agent = start(conf, stores, bus, "cn0")
    agents.append(agent)
    flavor = Flavor("small", 1, 1024, 0)
    msg = BootRequest.create(str(uuid.uuid4()), "p1", "u1", flavor)
    hostile = dataclasses.replace(msg, scheduling_class="rel.hostile-class")
    delivery = _Recording()
    agent.on_message(hostile.encode(), delivery)
    assert delivery.settled == [
        (
            "reject",
            "scheduling class rel.hostile-class is not published "
            "in the ledger: no front door made it, so no agent consumes it",
        )
    ]
    time.sleep(0.2)
    assert "rel.hostile-class" not in agent.index.classes()
    assert agent.consumer is not None and "rel.hostile-class" not in agent.consumer.classes
    assert "rel.hostile-class" not in bus.boot_classes()


class _Recording:
    queue = "q"
    routing_key = "boot.small"
    redelivered = False
    headers: dict = {}

    def __init__(self) -> None:
        self.settled: list[tuple[str, str]] = []

    def ack(self) -> None:
        self.settled.append(("ack", ""))

    def requeue(self, new_body: bytes) -> None:
        self.settled.append(("requeue", ""))

    def reject(self, reason: str) -> None:
        self.settled.append(("reject", reason))


def _roll_back_to_claimed(stores: Stores, inst: str, host: str) -> None:
    """What a ledger rollback does to an instance whose ACTIVE it lost: BUILD, claimed."""
    keys = redis_store(stores).keys
    client = redis_store(stores).client
    client.hset(keys.instance(inst), mapping={"state": "BUILD", "task_state": "spawning"})
    client.sadd(keys.host_building(host), inst)
    client.zadd(keys.deadlines, {inst: time.time() + 60})


@pytest.mark.parametrize("still_running", [True, False])
def test_a_claim_the_agent_no_longer_holds_is_finished(
    conf, stores, bus, api, agents, medium, still_running
) -> None:
    """After a ledger rollback: ACTIVE again if the VM runs, else placed again."""
    agent = start(conf, stores, bus, "cn0")
    agents.append(agent)
    inst = api.boot(USER, "vm", "medium").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    node = stores.instances.get(inst).node or ""
    if not still_running:
        agent.driver.destroy(inst, node)  # its delete was lost with the rollback, not its VM's
    _roll_back_to_claimed(stores, inst, "cn0")
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    events = [e.event for e in stores.instances.events(inst)]
    assert ("requeued" in events) != still_running, events
    assert agent.driver.list_instances(node) == [inst] and converged(stores, agent)


def _roll_back_to_waiting(stores: Stores, inst: str, host: str) -> None:
    """What a ledger rollback does to an instance whose claim it lost: BUILD with no host,
    holding nothing, its request nowhere (the agent acked it once its claim held)."""
    consumer = stores.ledger.get_allocations(inst)
    stores.ledger.put_allocations(inst, {}, consumer.generation, "p1", "u1")
    keys, client = redis_store(stores).keys, redis_store(stores).client
    client.hset(keys.instance(inst), mapping={"state": "BUILD", "host": "", "node": "",
                                              "task_state": "scheduling"})  # fmt: skip
    client.srem(keys.host_building(host), inst)
    client.zadd(keys.deadlines, {inst: time.time() + 60})


def test_a_claim_the_ledger_lost_under_a_running_vm_is_placed_again(
    conf, stores, bus, api, agents, medium
) -> None:
    """A crash under durability = async rolled back a claim after its agent acked the
    request and spawned: the record waited until its deadline with nothing on the bus
    for it. Now the reconcile reaps the VM and the request goes out again."""
    agent = start(conf, stores, bus, "cn0")
    agents.append(agent)
    inst = api.boot(USER, "vm", "medium").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    _roll_back_to_waiting(stores, inst, "cn0")
    assert wait_until(lambda: agent.counters["reconcile_republished"] == 1, 10)
    assert "parked" in [e.event for e in stores.instances.events(inst)]
    janitor.run(stores, bus, outbox_grace_s=0.0)  # the API service's outbox pass
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    assert wait_until(lambda: converged(stores, agent), 5)
    assert agent.driver.list_instances("cn0-0") == [inst]
    assert audit(stores).ok


def test_a_claim_the_ledger_lost_under_a_spawn_is_placed_again(
    conf, stores, bus, api, agents, medium
) -> None:
    """The same rollback while the spawn runs: its settle finds the instance waiting."""
    release = threading.Event()
    driver = FakeDriver(1, SPEC, host="cn0", spawn_hook=lambda i, n: release.wait(10))
    agent = start(conf, stores, bus, "cn0", driver, interval_s=3600)
    agents.append(agent)
    inst = api.boot(USER, "vm", "medium").uuid
    assert wait_until(lambda: stores.instances.building("cn0") == {inst}, 10)
    _roll_back_to_waiting(stores, inst, "cn0")
    release.set()
    assert wait_until(lambda: agent.counters["republished"] == 1, 10)
    assert not agent.builds and agent.driver.list_instances("cn0-0") == []
    janitor.run(stores, bus, outbox_grace_s=0.0)
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    assert audit(stores).ok


@pytest.mark.parametrize("action", ["error", "log"])
def test_an_active_instance_whose_vm_is_gone_ends_in_error(
    conf, stores, bus, api, agents, medium, action
) -> None:
    """A hypervisor lost the VM, or a crash brought back a server whose delete its agent
    had done: it stayed ACTIVE with nothing running until someone deleted it."""
    agent = start(conf, stores, bus, "cn0", lost_instance_action=action)
    agents.append(agent)
    kept, lost = (api.boot(USER, name, "medium").uuid for name in ("kept", "lost"))
    assert wait_until(lambda: all(stores.instances.get(u).state == State.ACTIVE
                                  for u in (kept, lost)), 10)  # fmt: skip
    agent.driver.destroy(lost, stores.instances.get(lost).node or "")
    assert wait_until(lambda: agent.counters["reconcile_missing"] >= 1, 10)
    record = stores.instances.get(lost)
    if action == "log":
        assert record.state == State.ACTIVE and agent.counters["reconcile_lost"] == 0
        return
    assert wait_until(lambda: agent.counters["reconcile_lost"] == 1, 5)
    record = stores.instances.get(lost)
    assert record.state == State.ERROR and record.fault is not None
    assert record.fault["message"] == LOST_MESSAGE
    assert record.fault["details"]["host"] == "cn0"
    assert stores.ledger.get_allocations(lost).allocations == {}
    assert stores.instances.get(kept).state == State.ACTIVE
    assert wait_until(lambda: converged(stores, agent), 5)
    assert agent.index.totals()["VCPU"][0] == 2  # only the one that runs
    api.delete(USER, lost)  # its owner deletes it, as any server in ERROR
    assert stores.instances.get(lost).state == State.DELETED
    assert audit(stores).ok
