"""The agent's steps one at a time, on a ledger and no consumer: admit, place, settle."""

from __future__ import annotations

import dataclasses
import time
import uuid as uuidlib

import pytest

from agents.nodes import Pick
from agents.outcome import Code
from agents.registration import register_nodes
from agents.service import ComputeAgent
from agents.steps import Build
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec
from qsched.conf import AgentOptions
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import BootRequest, DeleteRequest
from qsched.scheduling.records import record_for
from tests.helpers import RecordingDelivery

SMALL, HUGE = Flavor("small", 1, 1024), Flavor("huge", 64, 1024)


@pytest.fixture
def agent(stores: Stores, bus) -> ComputeAgent:
    """An agent whose nodes are registered and indexed, not consuming (no start)."""
    driver = FakeDriver(1, FakeNodeSpec(vcpus=4, ram_mb=4096, disk_gb=0), host="cn1")
    agent = ComputeAgent(AgentOptions.defaults().replace(host="cn1"), stores, bus, driver)
    for view in register_nodes(stores.ledger, driver.nodes(), "nova", ()):
        agent.index.add_node(view)
        agent.placer.sample_node = view.name
    return agent


def waiting(stores: Stores, flavor: Flavor, timeout_s: float = 60) -> BootRequest:
    """A request recorded by a front door, its class published."""
    request = BootRequest.create(str(uuidlib.uuid4()), "p1", "u1", flavor, timeout_s=timeout_s)
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    scheduling_class = SchedulingClass(flavor)
    stores.agents.add_class(scheduling_class.name, scheduling_class.definition())
    stores.instances.create(record_for(request, "vm"), request.deadline)
    return request


def test_admit(agent: ComputeAgent, stores: Stores) -> None:
    request = waiting(stores, SMALL)
    assert agent.placer.admit(request).code is Code.ADMITTED  # learnt the class from the ledger
    stray = dataclasses.replace(request, scheduling_class="forged")
    unknown = agent.placer.admit(stray)
    assert (unknown.code, unknown.counter) == (Code.DEAD_LETTER, "unknown_class")
    late = waiting(stores, SMALL, timeout_s=-1)
    assert agent.placer.admit(late).code is Code.ENDED
    assert stores.instances.get(late.instance_uuid).state == State.ERROR


def test_every_code_a_step_ends_with_settles_the_delivery(agent: ComputeAgent) -> None:
    """One dispatch on the code: every code that ends the steps has its settle, the two
    between steps none; a delete ends with one of the codes any message may have."""
    assert set(agent.settle) == set(Code) - {Code.ADMITTED, Code.RULE_REFUSED}
    assert set(agent.settle_any) == {Code.ENDED, Code.DROP, Code.DEAD_LETTER}


def test_a_delete_is_settled_by_its_outcome(agent: ComputeAgent, stores: Stores) -> None:
    request = waiting(stores, SMALL)
    agent.placer.admit(request)
    node = agent.placer.place(request).pick
    assert node is not None
    asked = DeleteRequest("req-1", request.instance_uuid, "cn1", node.node)
    unasked = agent.deletes.delete(asked)  # its record is BUILD: no delete was asked
    assert unasked.code is Code.DEAD_LETTER and unasked.counter == "not_its_request"
    assert "the ledger records no delete" in unasked.reason
    delivery = RecordingDelivery()
    agent.delete(asked, delivery)
    assert delivery.settled == [("reject", unasked.reason)]
    assert agent.counters["not_its_request"] == 1
    gone = DeleteRequest("req-2", str(uuidlib.uuid4()), "cn1", node.node)
    assert agent.deletes.delete(gone).code is Code.DROP
    agent.delete(gone, delivery)
    assert delivery.settled[1:] == [("ack", None)] and agent.counters["dropped"] == 1


def test_a_redelivery_of_a_build_in_flight(agent: ComputeAgent, stores: Stores) -> None:
    request = waiting(stores, SMALL)
    assert agent.placer.admit(request).code is Code.ADMITTED
    placed = agent.placer.place(request)
    assert placed.code is Code.PLACED and placed.pick is not None
    assert agent.builds.get(request.instance_uuid) == Build(request, placed.pick)
    assert agent.placer.admit(request).code is Code.DROP  # our spawn of it runs
    stores.instances.requeue(request.instance_uuid, "cn1", "taken back")  # a janitor did
    assert agent.placer.admit(request).code is Code.LATER


def test_place_claims_or_says_why_not(agent: ComputeAgent, stores: Stores) -> None:
    huge = waiting(stores, HUGE)
    agent.placer.admit(huge)
    refused = agent.placer.place(huge)
    assert refused.code is Code.REFUSED and "VCPU" in str(refused.refusal)
    small = waiting(stores, SMALL)
    agent.placer.admit(small)
    placed = agent.placer.place(small)
    assert placed.code is Code.PLACED and placed.pick is not None
    assert stores.instances.get(small.instance_uuid).host == "cn1"
    assert agent.index.totals()["VCPU"][0] == 1


def test_settle_and_give_back(agent: ComputeAgent, stores: Stores, bus) -> None:
    done, failed = waiting(stores, SMALL), waiting(stores, SMALL)
    for request in (done, failed):
        agent.placer.admit(request)
        agent.placer.place(request)
    built = agent.builds.get(done.instance_uuid)
    assert built is not None
    agent.spawner.settle(built)
    assert stores.instances.get(done.instance_uuid).state == State.ACTIVE
    again = agent.builds.get(failed.instance_uuid)
    assert again is not None
    agent.spawner.give_back(again, "the hypervisor said no")
    record = stores.instances.get(failed.instance_uuid)
    assert (record.state, record.host, record.attempts, record.tried_hosts) == (
        State.BUILD, None, 1, ("cn1",),
    )  # fmt: skip
    assert len(agent.builds) == 0 and agent.index.totals()["VCPU"][0] == 1
    assert time.time() < failed.deadline


def _conflicts(stores: Stores, request: BootRequest) -> list[str]:
    """The generation conflicts a request's claims met, from its history."""
    events = stores.instances.events(request.instance_uuid)
    return [str(e.detail["reason"]) for e in events if e.event == "conflict"]


def test_a_claim_checks_the_nodes_generation_and_rereads_a_stale_one(
    agent: ComputeAgent, stores: Stores
) -> None:
    """Another process's release (the API's local delete, the reaper: both end the
    instance in the ledger) moves the node's generation behind the agent's back. The
    agent's next claim there conflicts once, re-reads the node, is retried and counted,
    and the re-read view carries the claims after it without a conflict."""
    first = waiting(stores, SMALL)
    agent.placer.admit(first)
    assert agent.placer.place(first).code is Code.PLACED
    assert agent.counters["conflicts"] == 0  # the agent's own claim moved its view too
    stores.instances.delete(first.instance_uuid)  # not through this agent
    second = waiting(stores, SMALL)
    agent.placer.admit(second)
    pick = agent.placer.place(second).pick
    assert isinstance(pick, Pick)
    assert agent.counters["conflicts"] == 1
    assert [r for r in _conflicts(stores, second) if "generation conflict" in r] != []
    root = stores.ledger.get_provider(agent.index.node(pick.node).root.uuid)
    assert agent.index.node(pick.node).root.generation == root.generation
    assert agent.index.totals()["VCPU"][0] == 1  # the re-read saw the release
    for _ in range(3):
        more = waiting(stores, SMALL)
        agent.placer.admit(more)
        assert agent.placer.place(more).code is Code.PLACED
    assert agent.counters["conflicts"] == 1


def test_a_nested_claim_passes_the_generation_of_every_provider_it_takes_from(
    stores: Stores, bus
) -> None:
    """A granular group on a child: the claim passes the root's and the child's
    generations, and a child moved by another writer conflicts and is re-read."""
    gpu = FakeChild("gpu0", {"VGPU": 4}, frozenset({"CUSTOM_GPU_A"}))
    spec = FakeNodeSpec(vcpus=4, ram_mb=4096, disk_gb=0, children=(gpu,))
    driver = FakeDriver(1, spec, host="cn1")
    agent = ComputeAgent(AgentOptions.defaults().replace(host="cn1"), stores, bus, driver)
    for view in register_nodes(stores.ledger, driver.nodes(), "nova", ()):
        agent.index.add_node(view)
    flavor = Flavor("vgpu", 1, 512, extra_specs={"resources1:VGPU": "1"})
    request = waiting(stores, flavor)
    agent.placer.admit(request)
    node = driver.nodes()[0].name
    root, child = agent.index.node(node).providers
    other = str(uuidlib.uuid4())  # another writer comes onto the child and leaves it
    generation = stores.ledger.put_allocations(other, {child.uuid: {"VGPU": 1}}, None, "p9", "u9")
    stores.ledger.put_allocations(other, {}, generation, "p9", "u9")
    pick = agent.placer.place(request).pick
    assert isinstance(pick, Pick) and set(pick.allocations) == {root.uuid, child.uuid}
    assert agent.counters["conflicts"] == 1
    assert [r for r in _conflicts(stores, request) if child.uuid in r] != []
    generations = agent.index.generations(node, pick.allocations)
    held = stores.ledger.get_providers([root.uuid, child.uuid])
    assert generations == {u: p.generation for u, p in held.items()}
