"""Boots routed by host aggregates, with agents: zones, tenant isolation, isolated
aggregates and flavor extra specs, and a host leaving an aggregate.

Every test runs on each ledger (fakeredis, real Redis) and each bus (memory://, a
real RabbitMQ), with three in-process agents of one node each (8 VCPUs, and a child provider of 2
VGPUs that no flavor here asks for): ``cn-a``, ``cn-b`` and ``cn-gold`` (trait
``CUSTOM_GOLD``).
"""

from __future__ import annotations

import dataclasses
import gc
import uuid
from collections.abc import Iterator

import pytest

from agents.service import ComputeAgent
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec
from qsched.aggregates import NoHostsForTenant
from qsched.bus.kombu import KombuBus
from qsched.compute.api import ComputeAPI
from qsched.compute.boot import AvailabilityZoneNotAvailable
from qsched.conf import AgentOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.scheduling.records import details
from qsched.stack.cleanup import forget_bus
from tests.cloud import transport_url
from tests.helpers import wait_until

ADMIN = RequestContext.for_project("admin", "admin", ("admin", "member", "reader"))
HOSTS = {"cn-a": frozenset(), "cn-b": frozenset(), "cn-gold": frozenset({"CUSTOM_GOLD"})}
FLAVORS = [
    Flavor("small", 1, 512, 0),
    Flavor("gold", 1, 512, 0, extra_specs={"trait:CUSTOM_GOLD": "required"}),
    Flavor("ssd", 1, 512, 0, extra_specs={"aggregate_instance_extra_specs:ssd": "true"}),
]


@dataclasses.dataclass
class Cell:
    compute: ComputeAPI
    stores: Stores
    agents: list[ComputeAgent]

    def aggregate(
        self, name: str, hosts: list[str], zone: str | None = None, settle: bool = True,
        **metadata: str,
    ):  # fmt: skip
        made = self.compute.aggregates.create(ADMIN, name, zone)
        if metadata:
            self.compute.aggregates.set_metadata(ADMIN, made.id, metadata)
        for host in hosts:
            self.compute.aggregates.add_host(ADMIN, made.id, host)
        if settle:
            self.settle_views()
        return made

    def settle_views(self) -> None:
        """Every agent's index has the providers as the ledger holds them now."""
        for agent in self.agents:
            agent.reconciler.run_all()

    def boot(self, project: str, flavor: str = "small", zone: str | None = None) -> str:
        context = RequestContext.for_project("u", project)
        return self.compute.boot(context, "vm", flavor, "", availability_zone=zone).uuid

    def hosts_of(self, uuids: list[str]) -> set[str]:
        def placed() -> bool:
            return all(self.stores.instances.get(u).state == State.ACTIVE for u in uuids)

        assert wait_until(placed, 20), [self.stores.instances.get(u).state for u in uuids]
        return {self.stores.instances.get(u).host for u in uuids}


@pytest.fixture(params=["memory", pytest.param("rabbitmq", marks=pytest.mark.real)])
def cell(request: pytest.FixtureRequest, conf, stores: Stores) -> Iterator[Cell]:
    url = "memory://" if request.param == "memory" else transport_url("rabbitmq")
    prefix = f"agg{uuid.uuid4().hex[:10]}"
    bus = KombuBus(url, prefix=prefix)
    scheduler = SchedulerOptions.from_conf(conf).replace(
        build_timeout_s=3, limit_tenants_to_placement_aggregate=True,
        enable_isolated_aggregate_filtering=True,
    )  # fmt: skip
    compute = ComputeAPI(stores, bus, scheduler)
    for flavor in FLAVORS:
        stores.flavors.create(flavor)
    for project in ("pa", "pb", "pc"):
        stores.quota.set_limits(project, instances=-1, cores=-1, ram_mb=-1)
    agents = []
    try:
        for host, traits in HOSTS.items():
            options = AgentOptions.defaults().replace(
                host=host, class_poll_interval_s=0.05, heartbeat_interval_s=0.2
            )
            spec = FakeNodeSpec(vcpus=8, ram_mb=8192, disk_gb=0, traits=traits,
                                children=(FakeChild("gpu0", {"VGPU": 2}),))  # fmt: skip
            agent = ComputeAgent(options, stores, bus, FakeDriver(1, spec, host=host))
            agent.start(ready_timeout_s=5)
            agents.append(agent)
        yield Cell(compute, stores, agents)
    finally:
        for agent in agents:
            agent.stop(timeout_s=5)
        bus.close()
        if request.param == "rabbitmq":
            forget_bus(url, prefix, list(stores.agents.classes()), list(HOSTS))


def test_a_zone_made_by_an_aggregate_takes_its_hosts_only(cell: Cell) -> None:
    cell.aggregate("west", ["cn-b"], zone="az-west")
    booted = [cell.boot("pb", zone="az-west") for _ in range(4)]
    assert cell.hosts_of(booted) == {"cn-b"}
    record = cell.stores.instances.get(booted[0])
    assert details(record).availability_zone == "az-west"  # what the server shows
    with pytest.raises(AvailabilityZoneNotAvailable):
        cell.boot("pb", zone="az-nowhere")


def test_a_tenant_is_kept_to_its_aggregates(cell: Cell) -> None:
    """pa's boots land only on its aggregate's host; pb, named by no aggregate, anywhere."""
    cell.aggregate("pa-only", ["cn-a"], filter_tenant_id="pa")
    mine = [cell.boot("pa") for _ in range(6)]
    assert cell.hosts_of(mine) == {"cn-a"}
    others = [cell.boot("pb") for _ in range(12)]
    assert cell.hosts_of(others) - {"cn-gold"} >= {"cn-b"}  # not confined to cn-a


def test_with_tenant_isolation_off_a_named_tenant_is_not_confined(cell: Cell) -> None:
    """``[scheduler] limit_tenants_to_placement_aggregate = False``: the request filter
    does nothing, as Nova's, so pa goes beyond its aggregate's host. Twelve boots of 1
    VCPU cannot all fit cn-a's 8: with the filter on, four would end NoValidHost."""
    cell.compute.cell.aggregates.filters = dataclasses.replace(
        cell.compute.cell.aggregates.filters, limit_tenants_to_placement_aggregate=False
    )
    cell.aggregate("pa-only", ["cn-a"], filter_tenant_id="pa")
    mine = [cell.boot("pa") for _ in range(12)]
    assert cell.hosts_of(mine) - {"cn-a"}


def test_a_zone_and_a_tenant_aggregate_together_take_only_a_host_in_both(cell: Cell) -> None:
    """Two any-of groups (``member_of=in:`` twice): the zone's aggregate (cn-a, cn-b)
    and pa's (cn-b, cn-gold). Only cn-b is in both: of ten boots of 1 VCPU, its 8
    VCPUs take eight and the other two end NoValidHost; without either group they
    would all have found room."""
    cell.aggregate("west", ["cn-a", "cn-b"], zone="az-west")
    cell.aggregate("pa-only", ["cn-b", "cn-gold"], filter_tenant_id="pa")
    booted = [cell.boot("pa", zone="az-west") for _ in range(10)]

    def settled() -> bool:
        states = [cell.stores.instances.get(u).state for u in booted]
        return all(s in (State.ACTIVE, State.ERROR) for s in states)

    assert wait_until(settled, 20)
    records = [cell.stores.instances.get(u) for u in booted]
    active = [r for r in records if r.state == State.ACTIVE]
    assert {r.host for r in active} == {"cn-b"} and len(active) == 8
    failed = [r for r in records if r.state == State.ERROR]
    assert all(r.fault and r.fault["message"].startswith("No valid host") for r in failed)


def test_an_agent_sees_its_host_join_an_aggregate_within_a_heartbeat(cell: Cell) -> None:
    """No reconcile is forced: the agent notices the move at its next heartbeat (0.2 s
    here) and reads its nodes again, well before the boot's 3 s deadline; its next
    regular reconcile would come only after 10 s."""
    cell.aggregate("pa-only", ["cn-a"], settle=False, filter_tenant_id="pa")
    assert cell.hosts_of([cell.boot("pa")]) == {"cn-a"}
    assert cell.agents[0].counters["aggregates_changed"] >= 1


def test_a_move_reads_the_root_providers_again_and_not_every_node(
    cell: Cell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move changes the root providers' aggregates and no allocation: the agent reads
    those roots again (its index then holds the aggregate) without a full reconcile,
    whose reads of every consumer and record a change of a large aggregate would have
    every host in it make at once. In a process that froze its heap after the start
    the new views are frozen too."""
    agent = cell.agents[0]
    full: list[object] = []
    monkeypatch.setattr(agent.reconciler, "run_all", lambda: full.append(1))
    frozen: list[object] = []  # as in qsched-agent, which froze its start's heap
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 1)
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    before = agent.counters["aggregate_rereads"]
    made = cell.aggregate("pa-only", ["cn-a"], settle=False, filter_tenant_id="pa")
    assert wait_until(lambda: agent.counters["aggregate_rereads"] > before, 5)
    node = agent.index.names(0)[0][0]
    view = agent.index.node(node)
    assert made.uuid in view.root.aggregates
    assert [p.name for p in view.providers] == [node, f"{node}_gpu0"], view.providers
    assert full == []
    assert frozen, "the new root views were left to the collector"
    assert cell.hosts_of([cell.boot("pa")]) == {"cn-a"}


def test_a_tenant_without_an_aggregate_ends_no_valid_host_when_one_is_required(
    cell: Cell,
) -> None:
    cell.compute.cell.aggregates.filters = dataclasses.replace(
        cell.compute.cell.aggregates.filters, placement_aggregate_required_for_tenants=True
    )
    cell.aggregate("pa-only", ["cn-a"], filter_tenant_id="pa")
    refused = cell.boot("pc")
    instance = cell.stores.instances.get(refused)
    assert instance.state == State.ERROR
    assert instance.fault is not None
    assert instance.fault["message"] == str(NoHostsForTenant(project="pc"))
    assert cell.stores.quota.get_usage("pc").instances == 0
    assert cell.hosts_of([cell.boot("pa")]) == {"cn-a"}


def test_an_isolated_aggregate_takes_only_boots_that_require_its_trait(cell: Cell) -> None:
    cell.aggregate("gold", ["cn-gold"], **{"trait:CUSTOM_GOLD": "required"})
    plain = [cell.boot("pb") for _ in range(12)]
    assert "cn-gold" not in cell.hosts_of(plain)
    gold = [cell.boot("pb", "gold") for _ in range(3)]
    assert cell.hosts_of(gold) == {"cn-gold"}


def test_flavor_extra_specs_pick_aggregates_by_metadata(cell: Cell) -> None:
    cell.aggregate("fast", ["cn-b"], ssd="true")
    cell.aggregate("slow", ["cn-a"], ssd="false")
    booted = [cell.boot("pb", "ssd") for _ in range(4)]
    assert cell.hosts_of(booted) == {"cn-b"}


def test_a_host_leaving_the_aggregate_takes_no_more_of_its_boots(cell: Cell) -> None:
    """The mirroring bumps the host's provider generation and the claim checks the
    aggregates itself: the agent's next claim on its old view is refused, it reads the
    node again, and the class no longer fits there. With no other host in the
    aggregate the boot ends NoValidHost rather than on the host that left."""
    made = cell.aggregate("pa-only", ["cn-b"], filter_tenant_id="pa")
    assert cell.hosts_of([cell.boot("pa") for _ in range(2)]) == {"cn-b"}
    cell.compute.aggregates.remove_host(ADMIN, made.id, "cn-b")  # no reconcile: the claim sees it
    stranded = cell.boot("pa")

    def ended() -> bool:
        return cell.stores.instances.get(stranded).state != State.BUILD

    assert wait_until(ended, 15)
    instance = cell.stores.instances.get(stranded)
    assert (instance.state, instance.host) == (State.ERROR, None)
    events = [e.event for e in cell.stores.instances.events(stranded)]
    assert "claimed" not in events
    cell.compute.aggregates.add_host(ADMIN, made.id, "cn-a")
    cell.settle_views()
    assert cell.hosts_of([cell.boot("pa") for _ in range(2)]) == {"cn-a"}
