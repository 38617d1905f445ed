"""Quota and instance records, against fakeredis and a real Redis."""

from __future__ import annotations

import dataclasses
import functools
import uuid

import pytest

from qsched import exception
from qsched.conf import LedgerOptions
from qsched.flavors import Flavor
from qsched.ledger import Stores, instances
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, Inventory, State, Usage
from qsched.ledger.redis import read_many

FLAVOR = {"name": "m1.small", "vcpus": 2, "ram_mb": 2048}


def new_instance(project: str = "p1", flavor=FLAVOR) -> Instance:
    return Instance(str(uuid.uuid4()), project, "u1", "vm", flavor, State.BUILD)


def stores_flavor(stores: Stores) -> tuple[Flavor, str]:
    flavors = stores.flavors
    flavors.create(Flavor("m1.kept", 2, 2048, 20, "m1.kept"))
    return flavors.get_stored("m1.kept")


def provider(stores: Stores) -> str:
    rp = str(uuid.uuid4())
    stores.ledger.create_provider(rp, f"h-{rp[:8]}")
    stores.ledger.set_inventory(rp, 0, {"VCPU": Inventory(64), "MEMORY_MB": Inventory(65536)})
    return rp


class TestQuota:
    def test_defaults_and_overrides(self, stores: Stores) -> None:
        assert stores.quota.get_limits("p1") == Usage(10, 20, 51200)
        assert stores.quota.set_limits("p1", cores=4) == Usage(10, 4, 51200)
        assert stores.quota.get_limits("p2") == Usage(10, 20, 51200)
        with pytest.raises(exception.Invalid):
            stores.quota.set_limits("p1", ram_mb=-2)

    def test_reserve_is_idempotent_per_holder(self, stores: Stores) -> None:
        assert stores.quota.reserve("p1", "i1", 2, 512) == Usage(1, 2, 512)
        assert stores.quota.reserve("p1", "i1", 2, 512) == Usage(1, 2, 512)
        assert stores.quota.release("p1", "i1")
        assert not stores.quota.release("p1", "i1")
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)

    def test_exceeded_message_is_novas(self, stores: Stores) -> None:
        stores.quota.set_limits("p1", cores=20)
        for i in range(5):
            stores.quota.reserve("p1", f"i{i}", 4, 10)
        with pytest.raises(exception.QuotaExceeded) as err:
            stores.quota.reserve("p1", "i9", 4, 10)
        assert str(err.value) == (
            "Quota exceeded for cores: Requested 4, but already used 20 of 20 cores"
        )
        assert stores.quota.get_usage("p1") == Usage(5, 20, 50)

    @pytest.mark.parametrize(
        "limits, resource",
        [({"instances": 0}, "instances"), ({"ram_mb": 100}, "ram"), ({"cores": 1}, "cores")],
    )
    def test_each_limit(self, stores: Stores, limits, resource: str) -> None:
        stores.quota.set_limits("p1", **limits)
        with pytest.raises(exception.QuotaExceeded, match=f"for {resource}:"):
            stores.quota.reserve("p1", "i1", 2, 512)
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)

    def test_unlimited(self, stores: Stores) -> None:
        stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        for i in range(30):
            stores.quota.reserve("p1", f"i{i}", 8, 100000)
        assert stores.quota.get_usage("p1").instances == 30

    def test_bad_amounts(self, stores: Stores) -> None:
        with pytest.raises(exception.Invalid):
            stores.quota.reserve("p1", "i1", -1, 10)
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)


class TestInstances:
    def test_create_reserves_quota(self, stores: Stores) -> None:
        inst = stores.instances.create(new_instance(), deadline=100.0)
        assert (inst.state, inst.task_state, inst.attempts) == (State.BUILD, "scheduling", 0)
        assert inst.quota == Usage(1, 2, 2048) and inst.deadline == 100.0
        assert stores.quota.get_usage("p1") == Usage(1, 2, 2048)
        assert [i.uuid for i in stores.instances.list_project("p1")] == [inst.uuid]
        assert stores.instances.expired(now=99.0) == []
        assert stores.instances.expired(now=100.0) == [inst.uuid]

    def test_create_returns_what_get_reads(self, stores: Stores) -> None:
        record = dataclasses.replace(
            new_instance(), extra={"metadata": {"k": "v"}, "image_ref": "img"}
        )
        created = stores.instances.create(record, deadline=123.25)
        assert created == stores.instances.get(record.uuid)
        assert created.created_at == created.updated_at > 0

    def test_create_checks_the_flavor_the_caller_kept(self, stores: Stores) -> None:
        flavor, stored = stores_flavor(stores)
        kept = stores.instances.create(new_instance(), 1e12, expect_flavor=(flavor.id, stored))
        assert kept.state == State.BUILD
        stores.flavors.update(flavor.id, lambda f: dataclasses.replace(f, vcpus=4))
        stale = new_instance()
        with pytest.raises(exception.FlavorChanged, match=r"m1\.kept changed"):
            stores.instances.create(stale, 1e12, expect_flavor=(flavor.id, stored))
        stores.flavors.delete(flavor.id)
        with pytest.raises(exception.FlavorChanged):
            stores.instances.create(stale, 1e12, expect_flavor=(flavor.id, stored))
        with pytest.raises(exception.InstanceNotFound):
            stores.instances.get(stale.uuid)
        assert stores.quota.get_usage("p1") == Usage(1, 2, 2048)

    def test_get_many(self, stores: Stores, monkeypatch) -> None:
        monkeypatch.setattr(instances, "read_many", functools.partial(read_many, chunk=2))
        made = [stores.instances.create(new_instance(), deadline=1e12) for _ in range(3)]
        unknown = str(uuid.uuid4())
        found = stores.instances.get_many([i.uuid for i in made] + [unknown])
        assert found == {i.uuid: stores.instances.get(i.uuid) for i in made}

    def test_over_quota_records_nothing(self, stores: Stores) -> None:
        stores.quota.set_limits("p1", instances=1)
        stores.instances.create(new_instance(), deadline=1e12)
        refused = new_instance()
        with pytest.raises(exception.QuotaExceeded, match="instances"):
            stores.instances.create(refused, deadline=1e12)
        with pytest.raises(exception.InstanceNotFound):
            stores.instances.get(refused.uuid)
        assert stores.quota.get_usage("p1").instances == 1

    def test_duplicate_uuid(self, stores: Stores) -> None:
        inst = new_instance()
        stores.instances.create(inst, deadline=1e12)
        with pytest.raises(exception.InstanceExists):
            stores.instances.create(inst, deadline=1e12)
        assert stores.quota.get_usage("p1").instances == 1

    def test_life_of_an_instance(self, stores: Stores) -> None:
        rp = provider(stores)
        inst = stores.instances.create(new_instance(), deadline=50.0).uuid
        stores.instances.add_event(inst, "refused", host="h0", reason="not enough VCPU")
        stores.ledger.claim(inst, {rp: {"VCPU": 2, "MEMORY_MB": 2048}}, "h1", "n1")
        stores.instances.set_active(inst, "h1", "n1")
        active = stores.instances.get(inst)
        assert (active.state, active.host, active.task_state) == (State.ACTIVE, "h1", "")
        assert stores.instances.expired(now=1e12) == []
        with pytest.raises(exception.InstanceNotWaiting):
            stores.instances.set_active(inst, "h2", "n2")
        deleted = stores.instances.delete(inst)
        assert deleted.state == State.DELETED and deleted.quota is None
        assert stores.instances.delete(inst).state == State.DELETED  # idempotent
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
        assert stores.ledger.get_provider(rp).usages == {"VCPU": 0, "MEMORY_MB": 0}
        assert stores.instances.list_project("p1") == []
        events = [(e.event, e.host) for e in stores.instances.events(inst)]
        assert events == [("accepted", None), ("refused", "h0"), ("claimed", "h1"),
                          ("active", "h1"), ("deleted", "h1")]  # fmt: skip
        assert audit(stores).ok

    def test_requeue_counts_attempts_and_releases(self, stores: Stores) -> None:
        rp = provider(stores)
        inst = stores.instances.create(new_instance(), deadline=1e12).uuid
        stores.ledger.claim(inst, {rp: {"VCPU": 2}}, "h1", "n1")
        with pytest.raises(exception.InstanceNotWaiting):
            stores.instances.requeue(inst, "h2", "not mine")
        after = stores.instances.requeue(inst, "h1", "spawn failed")
        assert (after.attempts, after.host, after.state) == (1, None, State.BUILD)
        assert stores.ledger.get_provider(rp).usages == {"VCPU": 0}
        stores.ledger.claim(inst, {rp: {"VCPU": 2}}, "h2", "n2")

    def test_requeue_of_an_instance_being_deleted_ends_it(self, stores: Stores) -> None:
        rp = provider(stores)
        inst = stores.instances.create(new_instance(), deadline=1e12).uuid
        stores.ledger.claim(inst, {rp: {"VCPU": 2}}, "h1", "n1")
        stores.instances.mark_deleting(inst)
        after = stores.instances.requeue(inst, "h1", "spawn failed")
        assert after.state == State.DELETED and after.host == "h1"
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
        assert audit(stores).ok

    def test_requeue_of_an_unclaimed_instance(self, stores: Stores) -> None:
        inst = stores.instances.create(new_instance(), deadline=1e12).uuid
        with pytest.raises(exception.InstanceNotWaiting):
            stores.instances.requeue(inst, "h1", "agent h1 is down", claimed_only=True)
        after = stores.instances.requeue(inst, "h1", "no room")
        assert (after.attempts, after.host, after.state) == (1, None, State.BUILD)

    def test_error_releases_everything_and_keeps_the_fault(self, stores: Stores) -> None:
        rp = provider(stores)
        inst = stores.instances.create(new_instance(), deadline=1e12).uuid
        stores.ledger.claim(inst, {rp: {"VCPU": 2}}, "h1", "n1")
        assert stores.instances.set_error(
            inst, "No valid host was found. ", {"refusals": {"h1": "spawn failed"}}
        )
        failed = stores.instances.get(inst)
        assert failed.state == State.ERROR and failed.fault is not None
        assert failed.fault["code"] == 500
        assert failed.fault["details"] == {"refusals": {"h1": "spawn failed"}}
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
        assert stores.ledger.get_allocations(inst).generation is None
        assert not stores.instances.set_error(inst, "again", {})
        assert stores.instances.get(inst).fault == failed.fault
        assert stores.instances.expired(now=1e13) == []
        assert audit(stores).ok

    def test_error_does_not_touch_an_active_instance(self, stores: Stores) -> None:
        rp = provider(stores)
        inst = stores.instances.create(new_instance(), deadline=1e12).uuid
        stores.ledger.claim(inst, {rp: {"VCPU": 2}}, "h1", "n1")
        stores.instances.set_active(inst, "h1", "n1")
        assert not stores.instances.set_error(inst, "late", {})
        assert stores.instances.get(inst).state == State.ACTIVE
        assert stores.quota.get_usage("p1").instances == 1

    def test_history_is_trimmed(self, conf, ledger_url: str) -> None:
        from qsched.ledger import open_stores

        conf.set_override("max_events", 10, group="ledger")
        stores = open_stores(LedgerOptions.from_conf(conf), url=ledger_url)
        inst = stores.instances.create(new_instance(), deadline=1e12).uuid
        for i in range(25):
            stores.instances.add_event(inst, "refused", host=f"h{i}")
        events = stores.instances.events(inst)
        assert len(events) == 10 and events[-1].host == "h24"

    def test_unknown_instance(self, stores: Stores) -> None:
        missing = str(uuid.uuid4())
        for call in (stores.instances.get, stores.instances.delete):
            with pytest.raises(exception.InstanceNotFound):
                call(missing)
        with pytest.raises(exception.InvalidUUID):
            stores.instances.create(
                Instance("x", "p1", "u1", "vm", FLAVOR, State.BUILD), deadline=1.0
            )
