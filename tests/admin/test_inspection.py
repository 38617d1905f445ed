"""The Inspector and the Backend's chores, against fakeredis and a real Redis."""

from __future__ import annotations

import uuid

import pytest

from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import Consumer, Usage
from tests.conftest import WITH_CLUSTER, backend_url
from tests.ledger.test_ledger_contract import make_instance, make_provider


@pytest.fixture(params=WITH_CLUSTER)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """fakeredis, a real Redis, and a real three-master Redis Cluster."""
    return backend_url(request)


class Cell:
    """A provider with a claimed instance and an ACTIVE one, and a waiting instance."""

    def __init__(self, stores: Stores) -> None:
        self.rp = make_provider(stores)
        self.claimed, self.active, self.waiting = (make_instance(stores) for _ in range(3))
        stores.ledger.claim(self.claimed, {self.rp: {"VCPU": 2}}, "h1", "n1")
        stores.ledger.claim(self.active, {self.rp: {"VCPU": 1}}, "h1", "n1")
        stores.instances.set_active(self.active, "h1", "n1")


@pytest.fixture
def cell(stores: Stores) -> Cell:
    return Cell(stores)


def test_instance_records_of_the_whole_cell_or_some(stores: Stores, cell: Cell) -> None:
    every = stores.inspector.instance_records()
    assert set(every) == {cell.claimed, cell.active, cell.waiting}  # no history keys
    assert every[cell.active]["state"] == "ACTIVE" and every[cell.active]["host"] == "h1"
    some = stores.inspector.instance_records([cell.waiting, str(uuid.uuid4())], ("state", "node"))
    assert some == {cell.waiting: {"state": "BUILD"}}  # a waiting one has no node yet


def test_histories_as_stored(stores: Stores, cell: Cell) -> None:
    histories = stores.inspector.histories([cell.active, str(uuid.uuid4())])
    assert [e["event"] for e in histories[cell.active]] == ["accepted", "claimed", "active"]
    assert list(histories.values())[1] == []
    assert stores.inspector.events_trimmed(cell.active) == 0


def test_the_deadline_index_holds_what_is_not_active(stores: Stores, cell: Cell) -> None:
    assert sorted(stores.inspector.deadline_index()) == sorted([cell.claimed, cell.waiting])
    assert stores.inspector.waiting_count() == 2


def test_consumers_and_usage_counters(stores: Stores, cell: Cell) -> None:
    consumers = stores.inspector.consumers()
    assert consumers[cell.claimed] == Consumer(cell.claimed, 1, "p1", "u1", {cell.rp: {"VCPU": 2}})
    assert set(consumers) == {cell.claimed, cell.active}
    assert stores.inspector.project_usages() == {"p1": {"VCPU": 3}}


def test_quota_counters_and_holders(stores: Stores, cell: Cell) -> None:
    assert stores.inspector.quota_used() == {"p1": {"instances": 3, "cores": 3, "ram_mb": 1536}}
    held = stores.inspector.quota_held()["p1"]
    assert held == {u: Usage(1, 1, 512) for u in (cell.claimed, cell.active, cell.waiting)}


def test_providers_by_name_and_count(stores: Stores, cell: Cell) -> None:
    name = stores.ledger.get_provider(cell.rp).name
    assert stores.inspector.provider_uuid(name) == cell.rp
    assert stores.inspector.provider_uuid("nobody") is None
    assert stores.inspector.provider_count() == 1


def test_an_empty_cell(stores: Stores) -> None:
    assert stores.inspector.instance_records() == {} and stores.inspector.consumers() == {}
    assert stores.inspector.quota_used() == {} and stores.inspector.deadline_index() == []
    assert stores.backend.is_empty()


def test_scans_and_forget_stay_in_their_cell(conf, stores: Stores, ledger_url: str) -> None:
    """A cell whose name is a glob ("c[1]") neither sees nor drops cell1's records."""
    conf.set_override("cell", "c[1]", group="ledger")
    other = open_stores(LedgerOptions.from_conf(conf), url=ledger_url)
    mine, theirs = Cell(stores), Cell(other)
    assert set(other.inspector.instance_records()) == {theirs.claimed, theirs.active,
                                                       theirs.waiting}  # fmt: skip
    assert other.backend.forget_cell() > 0
    assert other.inspector.instance_records() == {} and other.inspector.provider_count() == 0
    assert mine.waiting in stores.inspector.instance_records()
    assert not stores.backend.is_empty()


def test_ping_and_close(stores: Stores) -> None:
    stores.backend.ping()
    stores.backend.close()
    stores.backend.ping()  # the client reconnects
    assert isinstance(stores.backend.command_stats(), dict)
