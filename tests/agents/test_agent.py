"""The compute agent end to end in one process: memory bus, fakeredis ledger."""

from __future__ import annotations

import pytest

from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched import exception
from qsched.compute.boot import FlavorRefNotFound
from qsched.conf import AgentOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State, Usage
from qsched.recovery.reaper import NO_VALID_HOST, reap_expired
from qsched.scheduling.message import BootRequest
from tests.helpers import RecordingDelivery, wait_until

USER = RequestContext.for_project("u1", "p1")


def make_agent(conf, stores, bus, host, nodes=2, vcpus=4, ram_mb=4096, **driver) -> ComputeAgent:
    conf.set_override("host", host, group="agent")
    conf.set_override("heartbeat_interval_s", 0.2, group="agent")
    conf.set_override("class_poll_interval_s", 0.05, group="agent")
    spec = FakeNodeSpec(vcpus=vcpus, ram_mb=ram_mb, disk_gb=0)
    agent = ComputeAgent(
        AgentOptions.from_conf(conf), stores, bus, FakeDriver(nodes, spec, host=host, **driver)
    )
    agent.start(ready_timeout_s=5)
    return agent


def settled(stores: Stores, uuids: list[str]) -> bool:
    return all(stores.instances.get(u).state != State.BUILD for u in uuids)


def test_boots_reach_active_without_overcommit(conf, stores, bus, api, agents) -> None:
    agents += [make_agent(conf, stores, bus, f"cn{i}") for i in range(2)]
    uuids = [api.boot(USER, f"vm{i}", "small").uuid for i in range(14)]
    assert wait_until(lambda: settled(stores, uuids), timeout_s=20)
    states = [stores.instances.get(u) for u in uuids]
    assert {s.state for s in states} == {State.ACTIVE}
    assert {s.host for s in states} == {"cn0", "cn1"}
    report = audit(stores)
    assert report.ok and not report.overcommitted, report.to_dict()
    for agent in agents:  # the running totals the heartbeat shows match the ledger
        used = sum(
            stores.ledger.get_provider(view.root.uuid).usages.get("VCPU", 0)
            for view in (agent.index.node(f"{agent.host}-{i}") for i in range(2))
        )
        assert agent.index.totals()["VCPU"] == (used, 8)


def test_a_started_agent_registers_its_zone(conf, stores, bus, api, agents) -> None:
    conf.set_override("availability_zone", "az1", group="agent")
    agents.append(make_agent(conf, stores, bus, "cn0"))
    assert stores.agents.zones() == {"az1"}
    booted = api.boot(USER, "vm", "small", availability_zone="az1").uuid
    assert wait_until(lambda: settled(stores, [booted]), timeout_s=10)
    assert stores.instances.get(booted).state == State.ACTIVE


def test_an_agent_without_a_zone_registers_none(conf, stores, bus, agents) -> None:
    conf.set_override("availability_zone", "", group="agent")
    agents.append(make_agent(conf, stores, bus, "cn0"))
    assert stores.agents.zones() == set()


def test_full_cloud_stops_consuming_and_the_deadline_ends_it(
    conf, stores, bus, api, agents
) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1, vcpus=2))
    placed = [api.boot(USER, f"vm{i}", "small").uuid for i in range(2)]
    assert wait_until(lambda: settled(stores, placed), timeout_s=10)
    assert wait_until(lambda: "small" not in agents[0].consumer.classes, timeout_s=5)
    late = api.boot(USER, "late", "small").uuid  # waits in the queue: nobody spins on it
    assert stores.instances.get(late).state == State.BUILD
    assert reap_expired(stores, now=stores.instances.get(late).deadline + 1) == 1
    failed = stores.instances.get(late)
    assert failed.state == State.ERROR and failed.fault["message"] == NO_VALID_HOST
    assert stores.quota.get_usage("p1") == Usage(2, 2, 2048)


def test_a_request_that_no_longer_fits_is_refused_and_requeued(
    conf, stores, bus, api, agents
) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1, vcpus=2))
    placed = [api.boot(USER, f"vm{i}", "small").uuid for i in range(2)]
    assert wait_until(lambda: settled(stores, placed), timeout_s=10)
    late = api.boot(USER, "late", "small").uuid
    msg = BootRequest.create(late, "p1", "u1", Flavor("small", 1, 1024, 0))
    delivery = RecordingDelivery()  # as if it arrived before the queue was cancelled
    agents[0].on_message(msg.encode(), delivery)
    ((how, requeued),) = delivery.settled
    assert how == "requeue" and requeued.tried_hosts == ()  # it never held it
    assert requeued.attempt == msg.attempt  # a refusal is not an attempt
    (refusal,) = [e for e in stores.instances.events(late) if e.event == "refused"]
    assert refusal.host == "cn0"
    assert refusal.detail["reason"] == "not enough VCPU on cn0-0: 0 free of 1 needed"
    assert refusal.detail["kind"] == "capacity"


def test_room_again_resumes_consuming(conf, stores, bus, api, agents) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1, vcpus=1))
    first = api.boot(USER, "first", "small").uuid
    assert wait_until(lambda: settled(stores, [first]), timeout_s=10)
    waiting = api.boot(USER, "waiting", "small").uuid
    assert wait_until(lambda: "small" not in agents[0].consumer.classes, timeout_s=10)
    api.delete(USER, first)  # the agent destroys it and frees the node
    assert wait_until(lambda: settled(stores, [waiting]), timeout_s=10)
    assert stores.instances.get(waiting).state == State.ACTIVE
    assert audit(stores).ok


def test_spawn_failures_reschedule_then_end_in_error(conf, stores, bus, api, agents) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", failure_rate=1.0))
    doomed = api.boot(USER, "doomed", "small").uuid
    assert wait_until(lambda: settled(stores, [doomed]), timeout_s=10)
    record = stores.instances.get(doomed)
    assert record.state == State.ERROR and record.attempts == 3
    assert record.fault["details"]["reason"] == "max_attempts"
    (ended,) = [e for e in stores.instances.events(doomed) if e.event == "error"]
    assert "unpublished" not in ended.detail, "its request went out: three agents' tries"
    assert stores.instances.unpublished() == []
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
    assert audit(stores).ok


def test_poison_is_dead_lettered_and_the_rest_goes_on(conf, stores, bus, api, agents) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0"))
    good = api.boot(USER, "good", "small").uuid
    assert wait_until(lambda: settled(stores, [good]), timeout_s=10)
    entity = bus.wire.boot_entity("small")
    bus.wire.publish(entity, b"\xc1 not msgpack")
    after = api.boot(USER, "after", "small").uuid
    assert wait_until(lambda: settled(stores, [after]), timeout_s=10)
    assert stores.instances.get(after).state == State.ACTIVE
    assert wait_until(lambda: agents[0].counters["poison"] == 1, timeout_s=5)
    (dead,) = bus.take_dead_letters()
    assert dead.body == b"\xc1 not msgpack" and dead.reason


def test_deleted_before_placement_is_dropped(conf, stores, bus, api, agents) -> None:
    doomed = api.boot(USER, "doomed", "small").uuid
    api.delete(USER, doomed)
    agents.append(make_agent(conf, stores, bus, "cn0"))
    assert wait_until(lambda: agents[0].counters["dropped"] == 1, timeout_s=10)
    assert stores.instances.get(doomed).state == State.DELETED
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
    assert audit(stores).ok


def test_claims_that_keep_conflicting_requeue_the_request(
    conf, stores, bus, api, agents, monkeypatch
) -> None:
    """Every pick of the first delivery meets a provider another agent keeps changing
    (retries used up): the request is refused and requeued, not dropped, and placed
    once the provider is quiet."""
    from agents import placing

    real, calls = placing.retry.claim, []

    def contended(*args, **kwargs):
        calls.append(1)
        if len(calls) <= placing.MAX_PICKS:
            raise exception.ProviderGenerationConflict(provider="p-shared", expected=1,
                                                       current=2)  # fmt: skip
        return real(*args, **kwargs)

    monkeypatch.setattr(placing.retry, "claim", contended)
    agents.append(make_agent(conf, stores, bus, "cn0"))
    inst = api.boot(USER, "contended", "small").uuid
    assert wait_until(lambda: settled(stores, [inst]), timeout_s=10)
    assert stores.instances.get(inst).state == State.ACTIVE
    assert agents[0].counters["dropped"] == 0 and agents[0].counters["refused"] == 1
    refused = [e for e in stores.instances.events(inst) if e.event == "refused"]
    assert [e.detail["kind"] for e in refused] == ["conflict"]


def test_redelivery_does_not_place_twice(conf, stores, bus, api, agents) -> None:
    agents += [make_agent(conf, stores, bus, f"cn{i}") for i in range(2)]
    inst = api.boot(USER, "once", "small").uuid
    assert wait_until(lambda: settled(stores, [inst]), timeout_s=10)
    record = stores.instances.get(inst)
    again = BootRequest.create(inst, "p1", "u1", Flavor("small", 1, 1024, 0))
    bus.publish_boot(again)  # what a broker redelivery looks like to the agents
    assert wait_until(lambda: sum(a.counters["dropped"] for a in agents) == 1, timeout_s=10)
    assert stores.instances.get(inst).host == record.host
    consumers = [stores.ledger.get_allocations(inst)]
    assert len(consumers[0].allocations) == 1
    assert audit(stores).ok


def test_a_private_flavor_with_a_nova_name_reaches_active(conf, stores, bus, api, agents) -> None:
    """A name with spaces and non-ASCII routes under its queue-safe class key; only the
    granted project boots it."""
    flavor = Flavor("klein und fein", 1, 512, 0, "kuf", is_public=False, projects=frozenset({"p1"}))
    api.cell.flavors.create(flavor)
    agents.append(make_agent(conf, stores, bus, "cn0"))
    uuid = api.boot(USER, "vm", "kuf").uuid
    assert wait_until(lambda: settled(stores, [uuid]), timeout_s=20)
    assert stores.instances.get(uuid).state == State.ACTIVE
    other = RequestContext.for_project("u2", "p2")
    with pytest.raises(FlavorRefNotFound):
        api.boot(other, "vm", "kuf")
