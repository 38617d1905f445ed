"""Host aggregates in the ledger: Nova's rules, and their mirroring into providers.

Runs on every ledger backend (fakeredis, then a real Redis).
"""

from __future__ import annotations

import dataclasses
import uuid as uuidlib

import pytest

from qsched import exception
from qsched.aggregates import (
    Aggregate,
    AggregateHostExists,
    AggregateHostNotFound,
    AggregateNameExists,
    AggregateNotFound,
    InvalidAggregateAction,
)
from qsched.ledger import Stores
from qsched.ledger.aggregates import MIRROR_BATCH
from qsched.ledger.base import Inventory, ProviderSpec
from qsched.resources import VCPU

OWN = "0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2a"  # an aggregate the agent registers itself


def register(stores: Stores, host: str, nodes: int = 1, aggregates: frozenset[str] = frozenset()):
    """Root providers (one per node) of ``host``, each with a child; heartbeat the host."""
    specs = []
    for n in range(nodes):
        root = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{host}-{n}"))
        child = str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{host}-{n}-gpu"))
        specs.append(ProviderSpec(root, f"{host}-{n}", {VCPU: Inventory(8)}, frozenset(),
                                  aggregates, None, host))  # fmt: skip
        specs.append(ProviderSpec(child, f"{host}-{n}-gpu", {}, parent_uuid=root, host=host))
    registered = stores.ledger.register_providers(specs)
    stores.agents.heartbeat(host, 30)
    return registered


def test_create_show_list_update_delete(stores: Stores) -> None:
    store = stores.aggregates
    first = store.create("rack1", "az1")
    second = store.create("rack2")
    assert (first.id, second.id) == (1, 2) and first.uuid != second.uuid
    assert first.metadata == {"availability_zone": "az1"} and first.availability_zone == "az1"
    assert second.availability_zone is None and second.hosts == frozenset()
    assert [a.name for a in store.list()] == ["rack1", "rack2"]
    with pytest.raises(AggregateNameExists, match="Aggregate rack1 already exists"):
        store.create("rack1")
    renamed = store.update(first.id, {"name": "rack9", "availability_zone": "az2"})
    assert (renamed.name, renamed.availability_zone) == ("rack9", "az2")
    assert renamed.updated_at is not None
    store.create("rack1")  # the old name is free again
    assert store.update(first.id, {"availability_zone": None}).metadata == {}
    with pytest.raises(AggregateNameExists):
        store.update(second.id, {"name": "rack9"})
    store.delete(second.id)
    with pytest.raises(AggregateNotFound, match="Aggregate 2 could not be found"):
        store.get(second.id)
    with pytest.raises(AggregateNotFound):
        store.delete(second.id)
    assert store.create("rack3").id == 4  # ids are never reused


def test_every_change_moves_the_version(stores: Stores) -> None:
    store = stores.aggregates
    seen = [store.version()]
    made = store.create("a")
    seen.append(store.version())
    store.set_metadata(made.id, {"k": "v"})
    seen.append(store.version())
    store.update(made.id, {"name": "b"})
    seen.append(store.version())
    store.delete(made.id)
    seen.append(store.version())
    assert seen == sorted(set(seen)) and len(seen) == 5


def test_metadata_set_and_removed_in_one_step(stores: Stores) -> None:
    store = stores.aggregates
    made = store.create("a")
    assert store.set_metadata(made.id, {"ssd": "true", "x": "1"}).metadata == {
        "ssd": "true", "x": "1",
    }  # fmt: skip
    assert store.set_metadata(made.id, {"x": None, "y": "2"}).metadata == {"ssd": "true", "y": "2"}
    with pytest.raises(InvalidAggregateAction, match="does not support empty named"):
        store.set_metadata(made.id, {"availability_zone": ""})
    with pytest.raises(AggregateNotFound):
        store.set_metadata(99, {"k": "v"})


def test_put_writes_an_aggregate_as_it_is_once_and_refuses_another_in_its_place(
    stores: Stores,
) -> None:
    """What the front door of several cells copies into a cell joined late: the id,
    uuid, name, metadata and creation time given, no host; a repeat writes nothing;
    another aggregate of its id or name, or its id and uuid with other metadata, is a
    conflict and nothing is written."""
    store = stores.aggregates
    copy = Aggregate(7, str(uuidlib.uuid4()), "rack7", {"availability_zone": "az7", "ssd": "1"},
                     frozenset({"elsewhere"}), created_at=1000.0)  # fmt: skip
    before = store.version()
    assert store.put(copy) is True
    assert store.get(7) == dataclasses.replace(copy, hosts=frozenset())
    assert store.version() > before and store.last_id() == 7
    assert store.put(copy) is False
    assert store.create("next").id == 8
    for other in (
        dataclasses.replace(copy, metadata={"availability_zone": "az7"}),  # other metadata
        dataclasses.replace(copy, uuid=str(uuidlib.uuid4())),  # another aggregate of id 7
        dataclasses.replace(copy, id=9, uuid=str(uuidlib.uuid4())),  # of its name
        dataclasses.replace(copy, id=9, name="next", uuid=str(uuidlib.uuid4())),
    ):
        with pytest.raises(exception.Conflict):
            store.put(other)
    with pytest.raises(AggregateNameExists):
        store.put(dataclasses.replace(copy, id=9, uuid=str(uuidlib.uuid4())))
    assert [(a.id, a.name) for a in store.list()] == [(7, "rack7"), (8, "next")]
    assert store.get(7).metadata == copy.metadata
    plain = Aggregate(10, str(uuidlib.uuid4()), "plain")
    assert store.put(plain) is True and store.get(10).metadata == {}


def test_a_host_joins_and_its_root_providers_follow(stores: Stores) -> None:
    store = stores.aggregates
    made = store.create("gpu-rack")
    with pytest.raises(exception.ComputeHostNotFound, match="Compute host cn1 could not be found"):
        store.add_host(made.id, "cn1")
    root, child = register(stores, "cn1")
    joined = store.add_host(made.id, "cn1")
    assert joined.hosts == {"cn1"} and store.host_aggregates("cn1") == {made.uuid}
    after = stores.ledger.get_provider(root.uuid)
    assert after.aggregates == {made.uuid}
    assert after.generation == root.generation + 1  # a claim on the old view conflicts
    assert stores.ledger.get_provider(child.uuid).aggregates == frozenset()  # roots carry it
    with pytest.raises(AggregateHostExists, match=f"Aggregate {made.id} already has host cn1"):
        store.add_host(made.id, "cn1")
    left = store.remove_host(made.id, "cn1")
    assert left.hosts == frozenset() and stores.ledger.get_provider(root.uuid).aggregates == set()
    with pytest.raises(AggregateHostNotFound, match=f"Aggregate {made.id} has no host cn1"):
        store.remove_host(made.id, "cn1")


def test_registration_keeps_the_hosts_aggregates_and_removal_keeps_its_own(
    stores: Stores,
) -> None:
    store = stores.aggregates
    made = store.create("rack")
    register(stores, "cn1", aggregates=frozenset({OWN}))
    store.add_host(made.id, "cn1")
    (root, _child) = register(stores, "cn1", aggregates=frozenset({OWN}))  # an agent restart
    assert root.aggregates == {OWN, made.uuid}
    assert stores.ledger.get_provider(root.uuid).aggregates == {OWN, made.uuid}
    store.remove_host(made.id, "cn1")
    assert stores.ledger.get_provider(root.uuid).aggregates == {OWN}


def test_mirroring_goes_in_batches_to_every_root(stores: Stores) -> None:
    nodes = MIRROR_BATCH * 2 + 7
    roots = register(stores, "big", nodes)[::2]
    made = stores.aggregates.create("all")
    stores.aggregates.add_host(made.id, "big")
    found = stores.ledger.get_providers([r.uuid for r in roots])
    assert len(found) == nodes and all(p.aggregates == {made.uuid} for p in found.values())


def test_a_host_is_in_one_zone(stores: Stores) -> None:
    store = stores.aggregates
    register(stores, "cn1")
    register(stores, "cn2")
    east = store.create("east", "az-east")
    west = store.create("west", "az-west")
    plain = store.create("plain")
    store.add_host(east.id, "cn1")
    store.add_host(plain.id, "cn1")  # no zone: no conflict
    with pytest.raises(
        InvalidAggregateAction,
        match=f"Cannot add host to aggregate {west.id}. Reason: One or more hosts already in "
        r"availability zone\(s\) \['az-east'\].",
    ):
        store.add_host(west.id, "cn1")
    with pytest.raises(InvalidAggregateAction, match="Cannot update metadata of aggregate"):
        store.set_metadata(plain.id, {"availability_zone": "az-west"})
    with pytest.raises(InvalidAggregateAction, match="Cannot update aggregate"):
        store.update(plain.id, {"availability_zone": "az-west"})
    store.set_metadata(plain.id, {"availability_zone": "az-east"})  # the same zone is fine
    store.add_host(west.id, "cn2")
    assert store.get(west.id).hosts == {"cn2"}


def test_an_aggregate_with_hosts_is_not_deleted(stores: Stores) -> None:
    register(stores, "cn1")
    made = stores.aggregates.create("rack")
    stores.aggregates.add_host(made.id, "cn1")
    with pytest.raises(InvalidAggregateAction, match="Host aggregate is not empty"):
        stores.aggregates.delete(made.id)
    stores.aggregates.remove_host(made.id, "cn1")
    stores.aggregates.delete(made.id)
