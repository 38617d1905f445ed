"""Maintenance: a disabled or forced-down compute service drains its agent.

The agent stops taking new boots, keeps what it runs, reconciles and answers
deletes (``openstack compute service set --disable``). Embedded bus, and both
ledgers (the ``stores`` fixture).
"""

from __future__ import annotations

import threading

import pytest

from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched.conf import AgentOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.recovery import janitor
from qsched.scheduling.message import BootRequest
from tests.helpers import RecordingDelivery, wait_until

pytestmark = pytest.mark.timeout(60)

USER = RequestContext.for_project("u1", "p1")


def start_agent(conf, stores, bus, host: str) -> ComputeAgent:
    conf.set_override("host", host, group="agent")
    conf.set_override("heartbeat_interval_s", 0.1, group="agent")
    conf.set_override("class_poll_interval_s", 0.05, group="agent")
    driver = FakeDriver(1, FakeNodeSpec(vcpus=8, ram_mb=8192, disk_gb=0), host=host)
    agent = ComputeAgent(AgentOptions.from_conf(conf), stores, bus, driver)
    agent.start(ready_timeout_s=5)
    return agent


def state(stores: Stores, uuid: str) -> State:
    return stores.instances.get(uuid).state


def active(stores: Stores, api, name: str) -> str:
    uuid = api.boot(USER, name, "small").uuid
    assert wait_until(lambda: state(stores, uuid) == State.ACTIVE, timeout_s=10)
    return uuid


def test_a_disabled_agent_drains(conf, stores, bus, api, agents) -> None:
    cn0 = start_agent(conf, stores, bus, "cn0")
    agents.append(cn0)
    kept, deleted = active(stores, api, "kept"), active(stores, api, "deleted")
    stores.agents.update_service("cn0", disabled=True, disabled_reason="new disks")
    assert wait_until(lambda: cn0.consumer.classes == frozenset(), timeout_s=5)
    assert wait_until(lambda: stores.agents.class_consumers("small") == set(), timeout_s=5)
    waiting = api.boot(USER, "waiting", "small").uuid
    api.delete(USER, deleted)  # deletes are still answered
    assert wait_until(lambda: state(stores, deleted) == State.DELETED, timeout_s=10)
    assert cn0.driver.list_instances("cn0-0") == [kept]  # what runs stays
    report = cn0.reconcile_pass()  # and it still reconciles
    assert report.nodes == 1 and not report.reaped and not report.released
    assert state(stores, waiting) == State.BUILD and stores.instances.get(waiting).host is None
    cn1 = start_agent(conf, stores, bus, "cn1")
    agents.append(cn1)
    assert wait_until(lambda: state(stores, waiting) == State.ACTIVE, timeout_s=10)
    assert stores.instances.get(waiting).host == "cn1"
    assert cn0.counters["claimed"] == 2
    stores.agents.update_service("cn0", disabled=False)  # back in service
    assert wait_until(lambda: cn0.consumer.classes == {"small"}, timeout_s=5)
    assert wait_until(lambda: "cn0" in stores.agents.class_consumers("small"), timeout_s=5)
    report = audit(stores)
    assert report.ok, report.to_dict()


def test_the_claim_refuses_a_boot_taken_before_the_agent_knew(
    conf, stores, bus, api, agents
) -> None:
    cn0 = start_agent(conf, stores, bus, "cn0")
    agents.append(cn0)
    for task in cn0._periodic:  # no heartbeat: it does not learn it is disabled
        task.stop()
    stores.agents.update_service("cn0", disabled=True, disabled_reason="rack move")
    late = api.boot(USER, "late", "small").uuid
    msg = BootRequest.create(late, "p1", "u1", Flavor("small", 1, 1024, 0))
    delivery = RecordingDelivery()
    cn0.on_message(msg.encode(), delivery)
    ((how, requeued),) = delivery.settled
    assert how == "requeue" and requeued.attempt == 1 and requeued.tried_hosts == ()
    assert stores.instances.get(late).host is None
    refusal = stores.instances.events(late)[-1]
    assert (refusal.event, refusal.host, refusal.detail["kind"]) == ("refused", "cn0", "service")
    assert (
        refusal.detail["reason"] == "Service of host cn0 takes no new boots: disabled: rack move."
    )
    assert not cn0.gate.enabled and cn0.consumer.classes == frozenset()


def test_a_forced_down_agent_is_down(conf, stores, bus, api, agents) -> None:
    """Forced down, as for a fenced host: its instances are deleted locally and its
    agent, still running, reaps what the ledger deleted."""
    cn0 = start_agent(conf, stores, bus, "cn0")
    agents.append(cn0)
    placed = active(stores, api, "vm")
    stores.agents.update_service("cn0", forced_down=True)
    assert not stores.agents.alive("cn0")
    assert wait_until(lambda: cn0.consumer.classes == frozenset(), timeout_s=5)
    assert api.delete(USER, placed).state == State.DELETED  # locally, at once
    cn0.reconcile_pass()
    assert cn0.driver.list_instances("cn0-0") == []
    stores.agents.update_service("cn0", forced_down=False)
    assert stores.agents.alive("cn0")
    assert wait_until(lambda: cn0.consumer.classes == {"small"}, timeout_s=5)
    assert state(stores, active(stores, api, "again")) == State.ACTIVE


def test_the_janitor_takes_back_what_a_forced_down_host_was_building(
    conf, stores, bus, api, agents
) -> None:
    held = threading.Event()
    cn0 = start_agent(conf, stores, bus, "cn0")
    agents.append(cn0)
    cn0.driver.spawn_hook = lambda instance, node: held.wait(20)
    building = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.building("cn0") == {building}, timeout_s=10)
    cn1 = start_agent(conf, stores, bus, "cn1")
    agents.append(cn1)
    stores.agents.update_service("cn0", forced_down=True)
    report = janitor.run(stores, bus)  # cn0 still heartbeats: forced down is down
    assert (report.dead_agents, report.requeued) == (["cn0"], [building])
    assert wait_until(lambda: state(stores, building) == State.ACTIVE, timeout_s=10)
    record = stores.instances.get(building)
    assert (record.host, record.tried_hosts) == ("cn1", ("cn0",))
    # cn0's spawn goes on: forced down, its lease has ended, so it starts no VM, finds
    # its claim taken and lets the claim held for it go. Its lease ends at its next
    # heartbeat, which a loaded machine may hold back past cn1's spawn: wait for it
    term = cn0.builds.get(building).term
    assert wait_until(lambda: not cn0.lease.holds(term), timeout_s=10)
    held.set()
    assert wait_until(lambda: not cn0.builds, timeout_s=10)
    assert cn0.driver.list_instances("cn0-0") == [] and cn0.counters["spawn_taken"] == 1
    assert wait_until(lambda: stores.ledger.held_claims("cn0") == {}, timeout_s=10)
    report = audit(stores)
    assert report.ok, report.to_dict()
