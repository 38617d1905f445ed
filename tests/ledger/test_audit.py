"""The audit is the oracle of the other tests: each break of the ledger must show in it.

Each case corrupts one record behind the scripts' back, on fakeredis, a real Redis and a
real Redis Cluster, and checks that exactly the matching finding appears.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from qsched.ledger import Stores
from qsched.ledger.audit import AuditReport, audit
from qsched.ledger.base import Instance, Inventory, State
from tests.conftest import WITH_CLUSTER, backend_url
from tests.raw import redis_store


@pytest.fixture(params=WITH_CLUSTER)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """fakeredis, a real Redis, and a real three-master Redis Cluster."""
    return backend_url(request)


class Cell:
    """One provider with a claimed instance, one with an ACTIVE one, and a waiting one."""

    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        self.keys = redis_store(stores).keys
        self.client = redis_store(stores).client
        self.rp = self._provider()
        self.claimed = self._instance()
        stores.ledger.claim(self.claimed, {self.rp: {"VCPU": 2, "MEMORY_MB": 512}}, "h1", "n1")
        self.active = self._instance()
        stores.ledger.claim(self.active, {self.rp: {"VCPU": 1}}, "h1", "n1")
        stores.instances.set_active(self.active, "h1", "n1")
        self.waiting = self._instance()

    def _provider(self) -> str:
        rp = str(uuid.uuid4())
        self.stores.ledger.create_provider(rp, f"n-{rp[:8]}")
        self.stores.ledger.set_inventory(
            rp, 0, {"VCPU": Inventory(4), "MEMORY_MB": Inventory(4096)}
        )
        return rp

    def _instance(self) -> str:
        flavor = {"name": "small", "vcpus": 1, "ram_mb": 512}
        record = Instance(str(uuid.uuid4()), "p1", "u1", "vm", flavor, State.BUILD)
        return self.stores.instances.create(record, deadline=1e12).uuid


BREAKS: dict[str, tuple[Callable[[Cell], object], Callable[[AuditReport], list]]] = {
    "usage above capacity": (
        lambda c: c.client.hset(c.keys.provider(c.rp), "u:VCPU", 17),
        lambda r: r.overcommitted,
    ),
    "usage counter off": (
        lambda c: c.client.hincrby(c.keys.provider(c.rp), "u:MEMORY_MB", 1),
        lambda r: r.usage_mismatches,
    ),
    "consumer missing from its provider's set": (
        lambda c: c.client.srem(c.keys.provider_consumers(c.rp), c.claimed),
        lambda r: r.usage_mismatches,
    ),
    "project usage off": (
        lambda c: c.client.hincrby(c.keys.project_usage("p1"), "VCPU", 1),
        lambda r: r.usage_mismatches,
    ),
    "allocations of an ended instance": (
        lambda c: c.client.hset(c.keys.instance(c.claimed), "state", "DELETED"),
        lambda r: r.orphan_allocations,
    ),
    "ACTIVE without allocations": (
        lambda c: c.client.hset(c.keys.instance(c.waiting), "state", "ACTIVE"),
        lambda r: r.instance_mismatches,
    ),
    "unclaimed BUILD with allocations": (
        lambda c: c.client.hset(c.keys.instance(c.claimed), "host", ""),
        lambda r: r.instance_mismatches,
    ),
    "a claim of other amounts than its flavor asks": (  # the claimed one holds 2 VCPU
        lambda c: c.client.hset(c.keys.instance(c.claimed), "class", "small"),
        lambda r: r.flavor_mismatches,
    ),
    "quota used off": (
        lambda c: c.client.hincrby(c.keys.quota_used("p1"), "cores", 1),
        lambda r: r.quota_mismatches,
    ),
}


def test_a_consistent_cell_is_ok(stores: Stores) -> None:
    Cell(stores)
    report = audit(stores)
    assert report.ok, report.to_dict()
    assert (report.providers, report.consumers) == (1, 2)
    assert report.instances == {"BUILD": 2, "ACTIVE": 1}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_break_is_found(stores: Stores, name: str) -> None:
    cell = Cell(stores)
    corrupt, finding = BREAKS[name]
    corrupt(cell)
    report = audit(stores)
    assert not report.ok and finding(report), report.to_dict()
