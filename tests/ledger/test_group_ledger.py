"""Server groups in the ledger: the claim keeps a hard policy, releases give hosts back.

Run against fakeredis and a real Redis (``stores``). The claim script is the only
check: these tests call the ledger straight, as concurrent agents would.
"""

from __future__ import annotations

import uuid

import pytest

from qsched import exception
from qsched.ledger import Stores
from qsched.ledger.base import Instance, ServerGroup, State
from tests.ledger.test_ledger_contract import RAM, VCPU, make_provider, new_uuid


def make_group(
    stores: Stores, policy: str, max_server_per_host: int | None = None, project: str = "p1"
) -> ServerGroup:
    group = ServerGroup(new_uuid(), "g", project, "u1", policy, max_server_per_host)
    return stores.groups.create(group)


def member(stores: Stores, group: ServerGroup | None, project: str = "p1") -> str:
    uuid_ = new_uuid()
    flavor = {"name": "f", "vcpus": 1, "ram_mb": 512}
    record = Instance(uuid_, project, "u1", "vm", flavor, State.BUILD,
                      group=group.uuid if group else None)  # fmt: skip
    stores.instances.create(record, deadline=1e12)
    return uuid_


def claim(stores: Stores, uuid_: str, host: str, rp: str) -> None:
    stores.ledger.claim(uuid_, {rp: {VCPU: 1, RAM: 512}}, host, f"{host}-0")


@pytest.fixture
def hosts(stores: Stores) -> dict[str, str]:
    return {f"cn{i}": make_provider(stores, vcpus=8, ram_mb=8192) for i in range(3)}


def test_anti_affinity_refuses_a_second_member_on_a_host(stores, hosts) -> None:
    group = make_group(stores, "anti-affinity")
    first, second = member(stores, group), member(stores, group)
    claim(stores, first, "cn0", hosts["cn0"])
    with pytest.raises(exception.GroupPolicyRefused) as refused:
        claim(stores, second, "cn0", hosts["cn0"])
    assert str(refused.value) == (
        f"anti-affinity group {group.uuid} already has 1 server on cn0 (max_server_per_host 1)"
    )
    assert refused.value.kwargs["members"] == 1 and refused.value.kwargs["host"] == "cn0"
    assert stores.ledger.get_allocations(second).generation is None  # nothing taken
    assert stores.instances.get(second).host is None
    claim(stores, second, "cn1", hosts["cn1"])
    assert stores.groups.hosts(group.uuid) == {"cn0": 1, "cn1": 1}


def test_max_server_per_host(stores, hosts) -> None:
    group = make_group(stores, "anti-affinity", max_server_per_host=2)
    a, b, c = (member(stores, group) for _ in range(3))
    claim(stores, a, "cn0", hosts["cn0"])
    claim(stores, b, "cn0", hosts["cn0"])
    with pytest.raises(
        exception.GroupPolicyRefused, match=r"has 2 servers on cn0 \(max_server_per_host 2\)"
    ):
        claim(stores, c, "cn0", hosts["cn0"])
    assert stores.groups.members_on(group.uuid, "cn0") == 2


def test_affinity_refuses_every_host_but_the_groups_and_names_it(stores, hosts) -> None:
    group = make_group(stores, "affinity")
    first, second = member(stores, group), member(stores, group)
    claim(stores, first, "cn1", hosts["cn1"])
    with pytest.raises(exception.GroupPolicyRefused) as refused:
        claim(stores, second, "cn0", hosts["cn0"])
    assert refused.value.kwargs["holder"] == "cn1"
    assert str(refused.value) == f"affinity group {group.uuid} is on cn1, not cn0"
    claim(stores, second, "cn1", hosts["cn1"])
    assert stores.groups.hosts(group.uuid) == {"cn1": 2}


@pytest.mark.parametrize("policy", ["soft-affinity", "soft-anti-affinity"])
def test_soft_policies_pass_a_member_on_a_few_times_then_take_it(stores, hosts, policy) -> None:
    group = make_group(stores, policy)
    first, second = member(stores, group), member(stores, group)
    claim(stores, first, "cn0", hosts["cn0"])
    against = "cn0" if policy == "soft-anti-affinity" else "cn1"  # where it is not preferred
    for passes in range(1, 6):  # GROUP_SOFT_TRIES
        with pytest.raises(exception.GroupPolicyRefused) as refused:
            claim(stores, second, against, hosts[against])
        assert refused.value.kwargs["soft"] and refused.value.kwargs["passes"] == passes
    if policy == "soft-affinity":
        assert refused.value.kwargs["holder"] == "cn0"
        assert str(refused.value).endswith("is on cn0, not cn1: tried there")
    claim(stores, second, against, hosts[against])  # a preference never refuses for good
    assert sum(stores.groups.hosts(group.uuid).values()) == 2


def test_a_preferred_host_takes_a_soft_member_at_once(stores, hosts) -> None:
    group = make_group(stores, "soft-anti-affinity")
    claim(stores, member(stores, group), "cn0", hosts["cn0"])
    claim(stores, member(stores, group), "cn1", hosts["cn1"])  # no member there: no pass


def test_a_host_comes_back_when_a_claim_is_dropped(stores, hosts) -> None:
    """Release, requeue (failed spawn), ERROR and DELETED each give the host back, once."""
    group = make_group(stores, "anti-affinity")
    dropping = {
        "release": lambda u: stores.ledger.release(u, "cn0"),
        "requeue": lambda u: stores.instances.requeue(u, "cn0", "spawn failed"),
        "error": lambda u: stores.instances.set_error(u, "boom", {}),
        "delete": lambda u: stores.instances.delete(u),
    }
    for name, drop in dropping.items():
        uuid_ = member(stores, group)
        claim(stores, uuid_, "cn0", hosts["cn0"])
        assert stores.groups.hosts(group.uuid) == {"cn0": 1}, name
        drop(uuid_)
        if name in ("release", "delete"):
            drop(uuid_)  # twice changes nothing
        assert stores.groups.hosts(group.uuid) == {}, name
    assert stores.groups.members_on(group.uuid, "cn0") == 0


def test_delete_removes_the_member_error_keeps_it(stores, hosts) -> None:
    group = make_group(stores, "anti-affinity")
    kept, gone = member(stores, group), member(stores, group)
    stores.instances.set_error(kept, "boom", {})
    stores.instances.delete(gone)
    assert stores.groups.get(group.uuid).members == (kept,)  # Nova shows ERROR servers too


def test_an_active_member_keeps_its_host(stores, hosts) -> None:
    group = make_group(stores, "anti-affinity")
    uuid_ = member(stores, group)
    claim(stores, uuid_, "cn0", hosts["cn0"])
    stores.instances.set_active(uuid_, "cn0", "cn0-0")
    assert stores.ledger.release(uuid_, "cn0") is False  # ACTIVE keeps its claim
    assert stores.groups.hosts(group.uuid) == {"cn0": 1}
    with pytest.raises(exception.GroupPolicyRefused):
        claim(stores, member(stores, group), "cn0", hosts["cn0"])


def test_a_redelivered_claim_is_not_refused_by_its_own_group(stores, hosts) -> None:
    group = make_group(stores, "anti-affinity")
    uuid_ = member(stores, group)
    claim(stores, uuid_, "cn0", hosts["cn0"])
    again = stores.ledger.claim(uuid_, {hosts["cn0"]: {VCPU: 1, RAM: 512}}, "cn0", "cn0-0")
    assert again.already and stores.groups.hosts(group.uuid) == {"cn0": 1}


def test_member_and_group_limits(stores) -> None:
    stores.groups.limits = type(stores.groups.limits)(server_groups=1, server_group_members=1)
    stores.instances.group_members = 1
    group = make_group(stores, "affinity")
    with pytest.raises(exception.ServerGroupLimitExceeded, match="too many server groups"):
        make_group(stores, "affinity")
    make_group(stores, "affinity", project="p2")  # per project
    member(stores, group)
    with pytest.raises(exception.GroupMemberLimitExceeded, match="too many servers in group"):
        member(stores, group)
    assert stores.quota.get_usage("p1").instances == 1  # the refused one holds nothing


def test_a_boot_into_a_missing_group_holds_nothing(stores) -> None:
    ghost = ServerGroup(str(uuid.uuid4()), "g", "p1", "u1", "affinity")
    with pytest.raises(exception.GroupNotFound):
        member(stores, ghost)
    assert stores.quota.get_usage("p1").instances == 0


def test_a_deleted_group_keeps_no_rule(stores, hosts) -> None:
    group = make_group(stores, "anti-affinity")
    a, b = member(stores, group), member(stores, group)
    claim(stores, a, "cn0", hosts["cn0"])
    stores.groups.delete(group.uuid)
    with pytest.raises(exception.GroupNotFound):
        stores.groups.get(group.uuid)
    with pytest.raises(exception.GroupNotFound):
        stores.groups.delete(group.uuid)
    claim(stores, b, "cn0", hosts["cn0"])  # its servers live on, in no group
    stores.instances.delete(a)
    stores.instances.delete(b)
    assert stores.groups.hosts(group.uuid) == {} and stores.groups.list_all() == []


def test_listing(stores) -> None:
    mine = [make_group(stores, "affinity"), make_group(stores, "anti-affinity", 3)]
    other = make_group(stores, "soft-affinity", project="p2")
    assert [g.uuid for g in stores.groups.list_project("p1")] == [g.uuid for g in mine]
    assert {g.uuid for g in stores.groups.list_all()} == {*(g.uuid for g in mine), other.uuid}
    shown = stores.groups.get(mine[1].uuid, members=False)
    assert (shown.policy, shown.rules, shown.project_id) == (
        "anti-affinity", {"max_server_per_host": 3}, "p1",
    )  # fmt: skip


def test_park_puts_a_waiting_request_in_the_outbox(stores, hosts) -> None:
    uuid_ = new_uuid()
    record = Instance(uuid_, "p1", "u1", "vm", {"name": "f", "vcpus": 1, "ram_mb": 512},
                      State.BUILD)  # fmt: skip
    created = stores.instances.create(record, deadline=1e12)
    stores.instances.outbox_done([(uuid_, created.outbox)])  # published
    assert stores.instances.unpublished() == []
    assert stores.instances.park(uuid_, "cn0", "every host refused it")
    assert uuid_ in [u for u, _age in stores.instances.unpublished()]
    assert stores.instances.events(uuid_)[-1].event == "parked"
    claim(stores, uuid_, "cn0", hosts["cn0"])
    assert not stores.instances.park(uuid_, "cn0", "placed meanwhile")


def test_the_audit_checks_groups(stores, hosts) -> None:
    from qsched.ledger.audit import audit
    from tests.raw import redis_store

    group = make_group(stores, "anti-affinity")
    a, b = member(stores, group), member(stores, group)
    claim(stores, a, "cn0", hosts["cn0"])
    claim(stores, b, "cn1", hosts["cn1"])
    stores.instances.delete(b)
    report = audit(stores)
    assert report.ok, report.to_dict()
    raw = redis_store(stores)
    raw.client.hset(raw.keys.group_hosts(group.uuid), "cn0", 2)  # a counter off, two on cn0
    found = audit(stores).group_mismatches
    assert len(found) == 2 and found[1]["policy"] == "anti-affinity", found
