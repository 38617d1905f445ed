"""Many agents claiming against one sharing provider: the hot spot of generations and 409s.

Eight in-process agents of one node each (no local disk) are in one host aggregate with
one shared DISK_GB provider sized for ``FITS`` boots. A burst of more boots than that
goes in at once. Every claim takes VCPU and MEMORY_MB on its node and DISK_GB on the
shared provider in one atomic step. A view of the shared provider older than its last
inventory change conflicts, is re-read and retried while it still fits; a view that
other agents' claims made stale in usage alone does not, since the step checks the
capacity itself. Exactly ``FITS`` boots end ACTIVE on the shared provider, its usage never
goes above its capacity (the ledger audit checks every provider, sharing ones
included), and the rest end NoValidHost at their deadline.

Runs on every ledger (fakeredis, real Redis) and bus (memory://, real RabbitMQ).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched.admin import queries, sharing
from qsched.bench.contention import ClaimTimer, contention_report
from qsched.bus.kombu import KombuBus
from qsched.compute.api import ComputeAPI
from qsched.conf import AgentOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.resources import DISK_GB
from qsched.stack.cleanup import forget_bus
from tests.cloud import transport_url
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

ADMIN = RequestContext.for_project("admin", "admin", ("admin", "member", "reader"))
HOSTS = [f"cn-s{i}" for i in range(8)]
DISK_PER_BOOT_GB = 10
FITS = 12  # boots the shared provider holds
BURST = 30  # after one boot that warms the agents up
DEADLINE_S = 6


@dataclasses.dataclass
class Cell:
    compute: ComputeAPI
    stores: Stores
    agents: list[ComputeAgent]
    shared: str  # the sharing provider's uuid
    timer: ClaimTimer


@pytest.fixture(params=["memory", pytest.param("rabbitmq", marks=pytest.mark.real)])
def cell(request: pytest.FixtureRequest, conf, stores: Stores) -> Iterator[Cell]:
    url = "memory://" if request.param == "memory" else transport_url("rabbitmq")
    prefix = f"shr{uuid.uuid4().hex[:10]}"
    bus = KombuBus(url, prefix=prefix)
    scheduler = SchedulerOptions.from_conf(conf).replace(build_timeout_s=DEADLINE_S)
    compute = ComputeAPI(stores, bus, scheduler)
    stores.flavors.create(Flavor("disk", 1, 256, DISK_PER_BOOT_GB))
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    agents: list[ComputeAgent] = []
    try:
        for host in HOSTS:
            options = AgentOptions.defaults().replace(
                host=host, class_poll_interval_s=0.05, heartbeat_interval_s=0.2,
                reap_interval_s=0.5, handback_pause_s=0.2,
                reconcile_interval_s=120,  # views go stale by the others' claims only
            )  # fmt: skip
            spec = FakeNodeSpec(vcpus=16, ram_mb=16384, disk_gb=0)  # no local disk
            agent = ComputeAgent(options, stores, bus, FakeDriver(1, spec, host=host))
            agent.start(ready_timeout_s=5)
            agents.append(agent)
        made = compute.aggregates.create(ADMIN, "shared-storage", None)
        for host in HOSTS:
            compute.aggregates.add_host(ADMIN, made.id, host)
        shared = sharing.create(
            stores, "shared-disk", {DISK_GB: FITS * DISK_PER_BOOT_GB}, [made.uuid]
        ).uuid
        for agent in agents:  # the agents read their nodes and the sharing provider
            agent.reconciler.run_all()
        yield Cell(compute, stores, agents, shared, ClaimTimer().attach(agents))
    finally:
        for agent in agents:
            agent.stop(timeout_s=5)
        bus.close()
        if request.param == "rabbitmq":
            forget_bus(url, prefix, list(stores.agents.classes()), HOSTS)


class UsageWatch:
    """Reads the sharing provider's usage over and over while the burst runs."""

    def __init__(self, stores: Stores, uuid: str) -> None:
        self.stores, self.uuid = stores, uuid
        self.highest = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.005):
            used = self.stores.ledger.get_provider(self.uuid).usages.get(DISK_GB, 0)
            self.highest = max(self.highest, used)

    def done(self) -> int:
        self.stop.set()
        self.thread.join(5)
        return self.highest


def test_a_burst_on_one_shared_provider_never_over_commits_it(cell: Cell) -> None:
    capacity = FITS * DISK_PER_BOOT_GB
    assert all([p.uuid for p in a.index.sharing()] == [cell.shared] for a in cell.agents)
    context = RequestContext.for_project("u", "p1")
    # One boot first, so that every agent consumes the class when the burst comes (else
    # the first to learn it may take the whole burst alone: no contention to see).
    first = cell.compute.boot(context, "vm-first", "disk", "").uuid
    assert wait_until(lambda: cell.stores.instances.get(first).state == State.ACTIVE, 10)
    assert wait_until(
        lambda: all("disk" in a.consumer.classes for a in cell.agents if a.consumer), 10
    )
    time.sleep(0.5)  # the brokers hear of the last consumers
    # Another writer (an operator setting the same inventory again) moves the sharing
    # provider's generation just before the burst: every agent's view of it is stale,
    # as it would be after another process's claim, so claims meet conflicts.
    shared = cell.stores.ledger.get_provider(cell.shared)
    cell.stores.ledger.set_inventory(cell.shared, shared.generation, shared.inventories)
    watch = UsageWatch(cell.stores, cell.shared)
    burst = [cell.compute.boot(context, f"vm{i}", "disk", "").uuid for i in range(BURST)]
    booted = [first, *burst]

    def settled() -> bool:
        states = [cell.stores.instances.get(u).state for u in booted]
        return all(s in (State.ACTIVE, State.ERROR) for s in states)

    assert wait_until(settled, DEADLINE_S + 20, 0.05)
    highest = watch.done()
    records = [cell.stores.instances.get(u) for u in booted]
    active = [r for r in records if r.state == State.ACTIVE]
    failed = [r for r in records if r.state == State.ERROR]
    assert len(active) == FITS and len(failed) == BURST + 1 - FITS
    assert all(r.fault and r.fault["message"].startswith("No valid host") for r in failed)
    why = queries.live_view(cell.stores, failed[0]).explain()  # qsched-admin server why
    assert f"largest free: 0 {DISK_GB} on shared-disk" in why, why
    shared = cell.stores.ledger.get_provider(cell.shared)
    assert shared.usages[DISK_GB] == capacity and highest <= capacity
    for record in active:  # each holds its disk on the shared provider, its CPU on its node
        held = cell.stores.ledger.get_allocations(record.uuid).allocations
        assert held[cell.shared] == {DISK_GB: DISK_PER_BOOT_GB}
        assert DISK_GB not in held[_root(cell, record.node)]
    report = audit(cell.stores)
    assert report.ok, report.to_dict()
    figures = contention_report(cell.stores, booted, cell.timer)
    figures["hosts_used"] = len({r.host for r in active})
    figures["highest_usage"], figures["capacity"] = highest, capacity
    print("shared-provider contention:", json.dumps(figures, sort_keys=True))
    assert figures["claims"] == FITS
    # Every view was stale when the burst came: the first claim of a host that had not
    # read the provider again meanwhile met a generation conflict, and was retried.
    assert figures["hosts_used"] >= 2
    assert figures["generation_conflicts"] >= 1
    # Only the inventory write makes a view conflict: a view stale in usage alone is
    # checked against capacity inside the claim. So a host conflicts once at most (its
    # first claim on the view from before the write), never again after its re-read.
    assert figures["max_conflicts"] == 1
    assert figures["conflicts"] <= len(cell.agents)


def _root(cell: Cell, node: str | None) -> str:
    for agent in cell.agents:
        if node in agent.index:
            return agent.index.node(node).root.uuid
    raise AssertionError(f"no agent drives {node}")


def test_a_shared_provider_taken_out_of_the_aggregate_serves_no_more_claims(cell: Cell) -> None:
    """The agents' views still have it; the claim checks that it still serves the node's
    tree, refuses, and the agent reads the sharing providers again: the boot ends
    NoValidHost with nothing claimed, never on the provider that left.

    A boot of the class is placed and deleted first, so that the agents consume the
    class before the change and the stranded boot's deadline is not spent learning it:
    on a loaded machine it once ended NoValidHost with no agent's attempt recorded."""
    ledger = cell.stores.ledger
    context = RequestContext.for_project("u", "p1")
    warm = cell.compute.boot(context, "warm", "disk", "").uuid
    assert wait_until(lambda: cell.stores.instances.get(warm).state == State.ACTIVE, 20)
    cell.compute.delete(context, warm)
    assert wait_until(lambda: cell.stores.instances.get(warm).state == State.DELETED, 20)
    ledger.set_aggregates(cell.shared, ledger.get_provider(cell.shared).generation, [])
    stranded = cell.compute.boot(context, "vm", "disk", "").uuid
    assert wait_until(lambda: cell.stores.instances.get(stranded).state == State.ERROR, 20)
    events = [e.event for e in cell.stores.instances.events(stranded)]
    assert "claimed" not in events and "conflict" in events
    assert ledger.get_provider(cell.shared).usages.get(DISK_GB, 0) == 0
    assert audit(cell.stores).ok


def test_claims_out_of_conflict_retries_are_tried_again_not_dead_lettered(cell: Cell) -> None:
    """With no re-read allowed inside a claim (``[ledger] max_conflict_retries = 0``),
    every generation conflict reaches the agent: it reads the views again and picks
    again, or requeues the request. Every boot that fits is placed; none is lost to the
    dead letters."""
    for agent in cell.agents:
        agent.placer.claim_retries = 0
    context = RequestContext.for_project("u", "p1")
    booted = [cell.compute.boot(context, f"vm{i}", "disk", "").uuid for i in range(FITS + 4)]

    def settled() -> bool:
        states = [cell.stores.instances.get(u).state for u in booted]
        return all(s in (State.ACTIVE, State.ERROR) for s in states)

    assert wait_until(settled, DEADLINE_S + 20, 0.05)
    states = [cell.stores.instances.get(u).state for u in booted]
    assert states.count(State.ACTIVE) == FITS
    assert sum(a.counters["conflicts"] for a in cell.agents) >= 1
    assert cell.compute.cell.bus.dead_letter_stats().ready in (0, None)
    assert sum(a.counters["poison"] for a in cell.agents) == 0
    assert audit(cell.stores).ok
