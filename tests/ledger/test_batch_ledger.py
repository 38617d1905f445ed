"""Multi-create in the ledger: Nova's count, and a batch placed all or none.

Run against fakeredis and a real Redis (``stores``): the scripts are the only check.
"""

from __future__ import annotations

import pytest

from qsched import exception
from qsched.ledger import Stores
from qsched.ledger.base import Instance, State, Usage
from tests.ledger.test_group_ledger import make_group
from tests.ledger.test_ledger_contract import RAM, VCPU, make_provider, new_uuid

FLAVOR = {"name": "f", "vcpus": 1, "ram_mb": 512}


def batch(stores: Stores, most: int, least: int = 1, group: str | None = None,
          rid: str | None = None) -> list[Instance]:  # fmt: skip
    members = [
        Instance(new_uuid(), "p1", "u1", f"vm-{n}", FLAVOR, State.BUILD, group=group)
        for n in range(1, most + 1)
    ]
    return stores.instances.create_batch(members, least, rid or f"r-{new_uuid()[:8]}", 1e12,
                                         lone_name="vm")  # fmt: skip


def claim(stores: Stores, uuid_: str, host: str, rp: str):
    return stores.ledger.claim(uuid_, {rp: {VCPU: 1, RAM: 512}}, host, f"{host}-0")


@pytest.fixture
def rp(stores: Stores) -> str:
    return make_provider(stores, vcpus=16, ram_mb=16384)


def test_as_many_as_the_quota_allows(stores) -> None:
    stores.quota.set_limits("p1", instances=3)
    made = batch(stores, 5, 2)
    assert [m.name for m in made] == ["vm-1", "vm-2", "vm-3"]
    assert {m.batch for m in made} == {made[0].batch} and made[0].batch
    assert stores.quota.get_usage("p1") == Usage(3, 3, 1536)
    assert [stores.instances.get(m.uuid).name for m in made] == ["vm-1", "vm-2", "vm-3"]


def test_fewer_than_min_count_is_novas_quota_error_and_holds_nothing(stores) -> None:
    stores.quota.set_limits("p1", instances=3)
    with pytest.raises(exception.QuotaExceeded) as refused:
        batch(stores, 5, 4)
    assert str(refused.value) == (
        "Quota exceeded for instances: Requested 4-5, but already used 0 of 3 instances"
    )
    stores.quota.set_limits("p1", instances=-1, cores=2)
    with pytest.raises(exception.QuotaExceeded, match="cores: Requested 3, but already used 0"):
        batch(stores, 3, 3)
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
    assert stores.instances.list_project("p1") == []


def test_a_lone_member_keeps_its_name_and_is_in_no_batch(stores, rp) -> None:
    stores.quota.set_limits("p1", instances=1)
    (made,) = batch(stores, 3)
    assert (made.name, made.batch) == ("vm", None)
    assert claim(stores, made.uuid, "cn0", rp).permitted


def test_a_batch_is_permitted_once_every_member_holds_a_claim(stores, rp) -> None:
    made = batch(stores, 3)
    results = [claim(stores, m.uuid, "cn0", rp) for m in made]
    assert [r.permitted for r in results] == [False, False, True]
    assert {r.batch for r in results} == {made[0].batch}
    again = claim(stores, made[0].uuid, "cn0", rp)  # a redelivery: counted once
    assert again.already and again.permitted
    assert stores.instances.batches([made[0].batch]) == {made[0].batch: "permitted"}


def test_a_dropped_claim_counts_no_more(stores, rp) -> None:
    made = batch(stores, 2)
    claim(stores, made[0].uuid, "cn0", rp)
    stores.instances.requeue(made[0].uuid, "cn0", "agent died")  # back to waiting
    assert not claim(stores, made[1].uuid, "cn0", rp).permitted
    assert claim(stores, made[0].uuid, "cn0", rp).permitted


def test_one_member_in_error_ends_the_whole_batch_and_frees_every_claim(stores, rp) -> None:
    made = batch(stores, 3)
    for m in made[:2]:
        claim(stores, m.uuid, "cn0", rp)
    stores.instances.set_error(made[2].uuid, "No valid host was found.", {"reason": "deadline"})
    records = [stores.instances.get(m.uuid) for m in made]
    assert {r.state for r in records} == {State.ERROR}
    assert records[0].fault["details"] == {
        "reason": "batch", "batch": made[0].batch, "member": made[2].uuid,
    }  # fmt: skip
    assert records[0].fault["message"] == "No valid host was found."
    assert all(stores.ledger.get_allocations(m.uuid).generation is None for m in made)
    assert stores.ledger.get_provider(rp).usages == {VCPU: 0, RAM: 0}
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
    assert stores.instances.batches([made[0].batch]) == {made[0].batch: "failed"}


def test_a_deleted_member_leaves_the_batch(stores, rp) -> None:
    made = batch(stores, 3)
    claim(stores, made[0].uuid, "cn0", rp)
    claim(stores, made[1].uuid, "cn0", rp)
    stores.instances.delete(made[2].uuid)  # the two others hold claims: complete
    assert stores.instances.batches([made[0].batch]) == {made[0].batch: "permitted"}
    assert stores.instances.get(made[0].uuid).state == State.BUILD


def test_after_its_permit_members_are_on_their_own(stores, rp) -> None:
    made = batch(stores, 2)
    for m in made:
        claim(stores, m.uuid, "cn0", rp)
    stores.instances.set_error(made[0].uuid, "spawn failed", {})
    assert stores.instances.get(made[1].uuid).state == State.BUILD


def test_group_members_quota_counts_the_whole_batch(stores) -> None:
    stores.instances.group_members = 2
    group = make_group(stores, "anti-affinity")
    with pytest.raises(exception.GroupMemberLimitExceeded):
        batch(stores, 3, group=group.uuid)
    made = batch(stores, 2, group=group.uuid)
    assert sorted(stores.groups.get(group.uuid).members) == sorted(m.uuid for m in made)


def test_a_taken_reservation_id_is_a_conflict(stores) -> None:
    batch(stores, 2, rid="r-taken000")
    with pytest.raises(exception.Conflict, match="r-taken000"):
        batch(stores, 2, rid="r-taken000")
