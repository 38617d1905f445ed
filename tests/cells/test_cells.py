"""Several cells in one deployment, on a real three-master Redis Cluster.

Each cell is its stores (``[ledger] cell``: one hash slot) and its bus prefix (its
own queues on the shared broker, here kombu's in-process one); its agents are
configured with both and see its boots only. The cells' names are chosen so that
their slots are on different masters, which the first test shows.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest

from agents.service import ComputeAgent
from qsched import exception
from qsched.bus.kombu import KombuBus
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, LedgerOptions, SchedulerOptions
from qsched.flavors import Flavor
from qsched.ledger import Stores, cluster, open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.stack import CellConfig, ProcessStack
from qsched.stack.redis_cluster import RedisClusterServers
from tests.agents.test_agent import USER, make_agent, settled
from tests.conftest import TEST_DURABILITY
from tests.helpers import wait_until
from tests.raw import redis_store

pytestmark = pytest.mark.real

CELLS = ("cell1", "cell2")  # slots 5286 and 9413: the first and the second master


@dataclasses.dataclass
class Cell:
    name: str
    stores: Stores
    bus: KombuBus
    api: ComputeAPI
    agents: list[ComputeAgent] = dataclasses.field(default_factory=list)

    def owner(self) -> int:
        """The port of the master that owns the cell's slot."""
        store = redis_store(self.stores)
        return int(cluster.cell_node(store.client, store.keys.prefix).port)


def open_cell(conf, url: str, name: str) -> Cell:
    conf.set_override("cell", name, group="ledger")
    conf.set_override("build_timeout_s", 30, group="scheduler")
    stores = open_stores(LedgerOptions.from_conf(conf), url=url)
    bus = KombuBus("memory://", prefix=f"t{uuid.uuid4().hex[:8]}-{name}")
    api = ComputeAPI(stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf))
    api.cell.flavors.create(Flavor("small", 1, 1024, 0))
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    return Cell(name, stores, bus, api)


@pytest.fixture
def cells(conf, cluster_url: str) -> Iterator[list[Cell]]:
    opened = [open_cell(conf, cluster_url, name) for name in CELLS]
    yield opened
    for cell in opened:
        for agent in cell.agents:
            agent.stop(timeout_s=5)
        cell.bus.close()
        cell.stores.backend.close()


def keys_by_master(servers: RedisClusterServers, cell: str) -> dict[int, int]:
    """How many keys of ``cell`` each master holds (SCAN on each, no redirection)."""
    found = {}
    for port in servers.ports:
        with servers.client(port) as client:
            found[port] = sum(1 for _ in client.scan_iter(f"qsched:{{{cell}}}:*", count=1000))
    return found


def test_the_cells_are_on_different_masters(cells: list[Cell]) -> None:
    assert len({cell.owner() for cell in cells}) == len(cells)


def test_each_cells_agents_place_its_boots_only(conf, cells, redis_cluster) -> None:
    for cell in cells:
        cell.agents += [make_agent(conf, cell.stores, cell.bus, f"{cell.name}-cn{i}", nodes=1)
                        for i in range(2)]  # fmt: skip
    booted = {cell.name: [cell.api.boot(USER, f"vm{i}", "small").uuid for i in range(4)]
              for cell in cells}  # fmt: skip
    for cell in cells:
        uuids = booted[cell.name]
        assert wait_until(lambda c=cell, u=uuids: settled(c.stores, u), timeout_s=20)
        placed = [cell.stores.instances.get(u) for u in uuids]
        assert {i.state for i in placed} == {State.ACTIVE}
        assert {i.host for i in placed} <= {a.host for a in cell.agents}
        report = audit(cell.stores)
        assert report.ok and report.instances == {"ACTIVE": 4}, report.to_dict()
    first, second = cells
    with pytest.raises(exception.InstanceNotFound):  # a cell knows its own instances only
        second.stores.instances.get(booted[first.name][0])
    for cell in cells:  # and all its keys are on its master
        by_master = keys_by_master(redis_cluster, cell.name)
        assert by_master[cell.owner()] > 0
        assert sum(by_master.values()) == by_master[cell.owner()], by_master


def test_a_cells_boot_waits_for_that_cells_agents(conf, cells) -> None:
    """With agents in the first cell only, the second cell's boot is consumed by nobody:
    the first cell's agents do not see the second cell's queues."""
    first, second = cells
    first.agents.append(make_agent(conf, first.stores, first.bus, "cell1-cn0", nodes=1))
    waiting = second.api.boot(USER, "vm", "small").uuid
    placed = first.api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: settled(first.stores, [placed]), timeout_s=10)
    assert second.stores.instances.get(waiting).state == State.BUILD
    second.agents.append(make_agent(conf, second.stores, second.bus, "cell2-cn0", nodes=1))
    assert wait_until(lambda: settled(second.stores, [waiting]), timeout_s=10)
    assert second.stores.instances.get(waiting).host == "cell2-cn0"
    assert audit(first.stores).ok and audit(second.stores).ok


def test_an_agent_process_runs_on_a_cluster_url(tmp_path, cluster_url: str) -> None:
    """qsched-agent as a process reading ``[ledger] url = redis+cluster://...`` and
    ``[ledger] cell``: its nodes and heartbeats reach the cell's master. (Its bus is
    in-process here; the tests above carry boots.)"""
    config = CellConfig("memory://", cluster_url, "rcproc", cell="cell3",
                        options={"ledger": {"durability": TEST_DURABILITY}})  # fmt: skip
    stack = ProcessStack(tmp_path, config)
    try:
        stack.start_agent(0)
        stack.wait_ready(60)
        assert stack.stores.agents.alive(stack.host(0))
        assert stack.stores.inspector.provider_count() > 0
    finally:
        assert stack.stop() == {"agent0": 0}
        stack.forget()
        stack.close()
