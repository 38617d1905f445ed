"""Moves in the ledger (docs/moves.rst): the migration consumer, confirm, revert,
failures and retries, a resize on its own host, group rules, quota, and a server
that ends while it moves.

Run against fakeredis and a real Redis (``stores``). Each script is the only check:
these tests call the ledger straight, as the API and concurrent agents would.
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib

import pytest

from qsched import exception
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, MoveRequest, ServerGroup, State
from qsched.ledger.base.migrations import EVACUATION, LIVE_MIGRATION, MIGRATION, RESIZE
from tests.ledger.test_ledger_contract import RAM, VCPU, make_provider, new_uuid

SMALL = {"name": "small", "vcpus": 1, "ram_mb": 512}
BIG = {"name": "big", "vcpus": 2, "ram_mb": 1024}


def amounts(flavor: dict) -> dict[str, int]:
    return {VCPU: flavor["vcpus"], RAM: flavor["ram_mb"]}


class Cloud:
    """Hosts h0.. of one provider each (4 VCPU, 2048 MB), their agents beating."""

    def __init__(self, stores: Stores, hosts: int = 3, vcpus: int = 4) -> None:
        self.stores = stores
        self.rps = {f"h{i}": make_provider(stores, vcpus=vcpus, ram_mb=2048) for i in range(hosts)}
        for host in self.rps:
            stores.agents.heartbeat(host, 60)

    def server(self, host: str = "h0", flavor: dict = SMALL, group: str | None = None) -> str:
        uuid = new_uuid()
        record = Instance(uuid, "p1", "u1", "vm", flavor, State.BUILD, group=group)
        self.stores.instances.create(record, deadline=1e12)
        self.stores.ledger.claim(uuid, {self.rps[host]: amounts(flavor)}, host, f"{host}-0")
        self.stores.instances.set_active(uuid, host, f"{host}-0")
        return uuid

    def start(self, server: str, kind: str = MIGRATION, **fields) -> str:
        mig = new_uuid()
        request = MoveRequest(server, mig, kind, "req-1", "u1", "p1", time.time() + 60, **fields)
        self.stores.migrations.start(request)
        return mig

    def claim(self, mig: str, host: str, flavor: dict = SMALL) -> str:
        rp = self.rps[host]
        return self.stores.migrations.claim(mig, {rp: amounts(flavor)}, host, f"{host}-0").status

    def used(self, host: str) -> dict[str, int]:
        return dict(self.stores.ledger.get_provider(self.rps[host]).usages)

    def held(self, project: str = "p1") -> tuple[int, int]:
        usage = self.stores.quota.get_usage(project)
        return usage.cores, usage.ram_mb


@pytest.fixture
def cloud(stores: Stores) -> Cloud:
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    return Cloud(stores)


def test_a_cold_migration_holds_both_sides_until_confirmed(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    record = stores.instances.get(server)
    assert (record.migration, record.task_state.value) == (mig, "resize_prep")
    assert stores.migrations.get(mig).status == "pre-migrating"
    assert cloud.claim(mig, "h1") == "migrating"
    assert cloud.claim(mig, "h1") == "migrating"  # the same claim again takes nothing more
    assert cloud.used("h0") == amounts(SMALL) and cloud.used("h1") == amounts(SMALL)
    assert audit(stores).ok
    assert stores.ledger.get_allocations(mig).allocations == {cloud.rps["h0"]: amounts(SMALL)}
    assert stores.ledger.get_allocations(server).allocations == {cloud.rps["h1"]: amounts(SMALL)}
    assert stores.migrations.on_host("h0")[0].uuid == mig
    assert stores.migrations.finish(mig, "h1") == "finished"
    record = stores.instances.get(server)
    assert (record.host, record.resized, record.task_state.value) == ("h1", True, "")
    assert stores.migrations.confirm(mig, "ask")["status"] == "confirming"
    assert stores.migrations.confirm(mig, "done", "h0")["status"] == "confirmed"
    assert cloud.used("h0") == {VCPU: 0, RAM: 0} and cloud.used("h1") == amounts(SMALL)
    assert stores.ledger.get_allocations(mig).generation is None
    record = stores.instances.get(server)
    assert (record.host, record.resized, record.migration) == ("h1", False, None)
    assert stores.migrations.on_host("h0") == [] and stores.migrations.on_host("h1") == []
    assert audit(stores).ok
    again = stores.migrations.confirm(mig, "done", "h0")
    assert again == {"already": True, "status": "confirmed"}


def test_a_revert_gives_the_source_back_and_frees_the_destination(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server, RESIZE, new_flavor=BIG, new_class="big", cores=2, ram_mb=1024)
    assert cloud.held() == (2, 1024)  # the larger flavor's quota from the start
    cloud.claim(mig, "h1", BIG)
    stores.migrations.finish(mig, "h1")
    assert stores.instances.get(server).flavor == BIG
    asked = stores.migrations.revert(mig, "ask")
    assert (asked["status"], asked["dest_compute"]) == ("reverting", "h1")
    assert stores.instances.get(server).task_state.value == "resize_reverting"
    stores.migrations.revert(mig, "done", "h1")
    record = stores.instances.get(server)
    assert (record.host, record.flavor, record.resized) == ("h0", SMALL, False)
    assert record.task_state.value == ""
    assert cloud.used("h0") == amounts(SMALL) and cloud.used("h1") == {VCPU: 0, RAM: 0}
    assert stores.ledger.get_allocations(server).allocations == {cloud.rps["h0"]: amounts(SMALL)}
    assert cloud.held() == (1, 512)
    assert stores.migrations.get(mig).status == "reverted"


def test_a_confirmed_resize_holds_the_new_flavor_and_its_quota(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0", BIG)
    mig = cloud.start(server, RESIZE, new_flavor=SMALL, new_class="small", cores=1, ram_mb=512)
    assert cloud.held() == (2, 1024)  # a smaller flavor frees quota only once confirmed
    cloud.claim(mig, "h1", SMALL)
    stores.migrations.finish(mig, "h1")
    stores.migrations.confirm(mig, "ask")
    stores.migrations.confirm(mig, "done", "h0")
    assert cloud.held() == (1, 512) and stores.instances.get(server).quota.cores == 1
    assert cloud.used("h1") == amounts(SMALL) and cloud.used("h0") == {VCPU: 0, RAM: 0}


def test_a_resize_on_its_own_host_holds_the_larger_flavor_only(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0", {"name": "a", "vcpus": 2, "ram_mb": 512})
    other = {"name": "b", "vcpus": 1, "ram_mb": 1024}
    mig = cloud.start(server, RESIZE, new_flavor=other, new_class="b", cores=1, ram_mb=1024,
                      same_host=True)  # fmt: skip
    assert cloud.claim(mig, "h0", other) == "migrating"
    assert cloud.used("h0") == {VCPU: 2, RAM: 1024}  # the larger per class, never both
    assert audit(stores).ok
    assert stores.ledger.get_allocations(mig).generation is None
    stores.migrations.finish(mig, "h0")
    stores.migrations.confirm(mig, "ask")  # its own host: nothing to destroy, done at once
    assert cloud.used("h0") == {VCPU: 1, RAM: 1024}
    assert stores.migrations.get(mig).status == "confirmed"


def test_a_resize_on_its_own_host_reverts_to_what_it_held(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0", SMALL)
    mig = cloud.start(server, RESIZE, new_flavor=BIG, new_class="big", cores=2, ram_mb=1024,
                      same_host=True)  # fmt: skip
    cloud.claim(mig, "h0", BIG)
    assert cloud.used("h0") == amounts(BIG)
    stores.migrations.finish(mig, "h0")
    stores.migrations.revert(mig, "ask")
    stores.migrations.revert(mig, "done", "h0")
    assert cloud.used("h0") == amounts(SMALL) and cloud.held() == (1, 512)


def test_a_move_refuses_its_own_host_a_host_not_asked_for_and_a_full_one(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    with pytest.raises(exception.HostRuleRefused, match="is the server's own host"):
        cloud.claim(mig, "h0")
    for _ in range(4):
        cloud.server("h2")
    with pytest.raises(exception.CapacityExceeded):
        cloud.claim(mig, "h2")
    named = cloud.start(cloud.server("h1"), host="h2")
    with pytest.raises(exception.HostRuleRefused, match="not one of the hosts"):
        cloud.claim(named, "h0")
    assert stores.migrations.get(mig).status == "pre-migrating"  # nothing taken
    assert cloud.used("h0") == amounts(SMALL)


def test_a_failed_destination_is_never_tried_again_and_attempts_end_it(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server, max_attempts=2)
    cloud.claim(mig, "h1")
    assert stores.migrations.fail(mig, "h1", "spawn failed", retry=True) is True
    assert cloud.used("h1") == {VCPU: 0, RAM: 0} and cloud.used("h0") == amounts(SMALL)
    assert stores.ledger.get_allocations(server).allocations == {cloud.rps["h0"]: amounts(SMALL)}
    with pytest.raises(exception.MoveTriedHost):
        cloud.claim(mig, "h1")
    cloud.claim(mig, "h2")
    assert stores.migrations.fail(mig, "h2", "spawn failed", retry=True) is False
    found = stores.migrations.get(mig)
    assert (found.status, found.tried, found.fault) == ("error", ("h1", "h2"), "spawn failed")
    record = stores.instances.get(server)
    assert (record.state, record.host, record.migration) == (State.ACTIVE, "h0", None)
    assert record.task_state.value == ""
    assert cloud.used("h2") == {VCPU: 0, RAM: 0}


def test_states_refuse_a_second_move_and_an_evacuation_from_a_live_host(cloud: Cloud) -> None:
    server = cloud.server("h0")
    cloud.start(server)
    with pytest.raises(exception.InstanceInvalidState, match="task_state resize_prep"):
        cloud.start(server, LIVE_MIGRATION)
    with pytest.raises(exception.InstanceInvalidState, match="evacuation"):
        cloud.start(server, EVACUATION)
    with pytest.raises(exception.ComputeServiceInUse):
        cloud.start(cloud.server("h1"), EVACUATION)


def test_a_larger_flavor_past_the_quota_is_refused_before_anything(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    stores.quota.set_limits("p1", instances=-1, cores=1, ram_mb=-1)
    with pytest.raises(exception.QuotaExceeded):
        cloud.start(server, RESIZE, new_flavor=BIG, new_class="big", cores=2, ram_mb=1024)
    assert stores.instances.get(server).migration is None and cloud.held() == (1, 512)


def test_a_server_deleted_while_it_moves_leaves_the_other_side_held(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    cloud.claim(mig, "h1")
    stores.instances.delete(server, destroyed_on="h0")  # its source destroyed it
    # h1 may be spawning it still: held for h1 until its agent says the VM is gone
    assert cloud.used("h0") == {VCPU: 0, RAM: 0} and cloud.used("h1") == amounts(SMALL)
    assert stores.ledger.held_claims("h1") == {server: mig}
    assert stores.migrations.get(mig).status == "error"
    assert stores.ledger.release_held("h1", server)
    assert cloud.used("h1") == {VCPU: 0, RAM: 0}


def test_a_server_deleted_while_its_move_to_a_named_host_waits_holds_nothing_there(
    cloud: Cloud,
) -> None:
    """No destination claimed it: the host asked for holds nothing of it, and its source's
    side ends with it as any claim does."""
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server, host="h1")
    stores.instances.delete(server, destroyed_on="h0")
    assert cloud.used("h0") == {VCPU: 0, RAM: 0} and not any(cloud.used("h1").values())
    assert stores.ledger.held_claims("h1") == {} and stores.ledger.held_claims("h0") == {}
    assert stores.migrations.get(mig).status == "error" and audit(stores).ok


def test_a_server_deleted_after_it_moved_leaves_the_source_held(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    cloud.claim(mig, "h1")
    stores.migrations.finish(mig, "h1")
    stores.instances.delete(server, destroyed_on="h1")
    assert cloud.used("h1") == {VCPU: 0, RAM: 0} and cloud.used("h0") == amounts(SMALL)
    assert stores.ledger.held_claims("h0") == {server: mig}
    stores.ledger.release_held("h0", server)
    assert cloud.used("h0") == {VCPU: 0, RAM: 0}


def test_an_evacuation_holds_the_dead_source_until_its_agent_returns(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    stores.agents.forget("h0")
    mig = cloud.start(server, EVACUATION)
    cloud.claim(mig, "h1")
    assert stores.migrations.finish(mig, "h1") == "done"
    record = stores.instances.get(server)
    assert (record.host, record.migration, record.task_state.value) == ("h1", None, "")
    assert stores.ledger.held_claims("h0") == {server: mig}
    assert cloud.used("h0") == amounts(SMALL)  # until h0's agent says its VM is gone
    stores.ledger.release_held("h0", server)
    assert cloud.used("h0") == {VCPU: 0, RAM: 0} and cloud.used("h1") == amounts(SMALL)


def test_a_confirm_with_the_source_silent_holds_its_side(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    cloud.claim(mig, "h1")
    stores.migrations.finish(mig, "h1")
    stores.agents.forget("h0")
    assert stores.migrations.confirm(mig, "ask")["status"] == "confirmed"
    assert stores.ledger.held_claims("h0") == {server: mig}


def test_a_live_migration_runs_once_its_destination_is_ready(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server, LIVE_MIGRATION)
    assert cloud.claim(mig, "h1") == "preparing"
    with pytest.raises(exception.MoveNotUnderWay):
        stores.migrations.finish(mig, "h0")  # the source sends it once h1 is ready
    assert stores.migrations.finish(mig, "h1") == "running"
    assert stores.migrations.finish(mig, "h1") == "running"  # said again: the same
    assert stores.instances.get(server).task_state.value == "migrating"
    assert stores.migrations.finish(mig, "h0") == "completed"
    assert cloud.used("h0") == {VCPU: 0, RAM: 0} and cloud.used("h1") == amounts(SMALL)
    record = stores.instances.get(server)
    assert (record.host, record.migration, record.task_state.value) == ("h1", None, "")
    assert audit(stores).ok


def test_a_live_migration_its_source_could_not_send_rolls_back(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server, LIVE_MIGRATION)
    cloud.claim(mig, "h1")
    stores.migrations.finish(mig, "h1")
    assert stores.migrations.fail(mig, "h0", "the copy failed", retry=True) is False
    found = stores.migrations.get(mig)
    assert (found.status, found.tried) == ("failed", ())  # rolled back, not retried
    assert cloud.used("h0") == amounts(SMALL) and cloud.used("h1") == {VCPU: 0, RAM: 0}
    assert stores.instances.get(server).host == "h0" and audit(stores).ok


def group(stores: Stores, policy: str) -> str:
    made = ServerGroup(str(uuidlib.uuid4()), "g", "p1", "u1", policy)
    return stores.groups.create(made).uuid


def test_a_member_moving_counts_on_both_hosts_until_it_settles(cloud: Cloud) -> None:
    stores = cloud.stores
    anti = group(stores, "anti-affinity")
    a, b = cloud.server("h0", group=anti), cloud.server("h1", group=anti)
    move_a = cloud.start(a)
    cloud.claim(move_a, "h2")
    assert stores.groups.hosts(anti) == {"h0": 1, "h1": 1, "h2": 1}
    assert audit(stores).ok
    move_b = cloud.start(b)
    with pytest.raises(exception.GroupPolicyRefused):
        cloud.claim(move_b, "h2")  # a is on its way there
    with pytest.raises(exception.GroupPolicyRefused):
        cloud.claim(move_b, "h0")  # a may come back there (a revert)
    stores.migrations.finish(move_a, "h2")
    assert audit(stores).ok
    stores.migrations.confirm(move_a, "ask")
    stores.migrations.confirm(move_a, "done", "h0")
    assert stores.groups.hosts(anti) == {"h1": 1, "h2": 1}
    cloud.claim(move_b, "h0")
    stores.migrations.fail(move_b, "h0", "spawn failed", retry=False)
    assert stores.groups.hosts(anti) == {"h1": 1, "h2": 1}


def test_parallel_moves_of_an_anti_affinity_group_keep_it_apart(stores: Stores) -> None:
    """20 members over 25 hosts, each moved at once by racing destinations: never two
    members counted on one host, and every member ends on one host."""
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    stores.quota.update_limits("p1", {"server_group_members": -1})
    cloud = Cloud(stores, hosts=25)
    anti = group(stores, "anti-affinity")
    members = [cloud.server(f"h{i}", group=anti) for i in range(20)]
    moves = [cloud.start(m) for m in members]
    free = [f"h{i}" for i in range(20, 25)]

    def race(mig: str) -> None:
        for host in [*free, *(f"h{i}" for i in range(20))]:
            try:
                cloud.claim(mig, host)
                return
            except (exception.GroupPolicyRefused, exception.HostRuleRefused):
                continue

    threads = [threading.Thread(target=race, args=(m,)) for m in moves]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = stores.groups.hosts(anti)
    assert max(counts.values()) == 1 and audit(stores).ok
    claimed = [m for m in moves if stores.migrations.get(m).status == "migrating"]
    assert len(claimed) == 5  # only the five free hosts could take one
    assert sum(counts.values()) == 25


def test_both_sides_of_a_move_are_explained_to_the_agents(cloud: Cloud) -> None:
    """An agent's reconcile must leave a move alone: the records place the server on
    both of its hosts, and neither side's allocations is a leak."""
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    cloud.claim(mig, "h1")
    placed = stores.instances.placements([server])[server]
    assert placed.on("h0", "h0-0") and placed.on("h1", "h1-0") and not placed.on("h2")
    for host in ("h0", "h1"):
        for consumer in (server, mig):
            assert not stores.ledger.release_unexplained(consumer, host, cloud.rps[host])
    assert cloud.used("h0") == amounts(SMALL) and cloud.used("h1") == amounts(SMALL)
    stores.migrations.finish(mig, "h1")
    stores.migrations.confirm(mig, "ask")
    stores.migrations.confirm(mig, "done", "h0")
    assert stores.instances.placements([server])[server].moving == ()


def test_a_silent_destination_is_taken_over_its_side_held_and_the_move_goes_on(
    cloud: Cloud,
) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    cloud.claim(mig, "h1")
    with pytest.raises(exception.AgentAlive):
        stores.migrations.fail(mig, "h1", "down", retry=True, take_over=True)
    stores.agents.forget("h1")
    assert stores.migrations.fail(mig, "h1", "down", retry=True, take_over=True) is True
    held = stores.ledger.held_claims("h1")
    assert list(held) == [server] and held[server] != mig  # the move may go on: its own id
    assert cloud.used("h1") == amounts(SMALL)  # its VM may run there
    assert stores.ledger.get_allocations(server).allocations == {cloud.rps["h0"]: amounts(SMALL)}
    assert cloud.claim(mig, "h2") == "migrating" and audit(stores).ok
    assert stores.ledger.get_allocations(held[server]).allocations == {
        cloud.rps["h1"]: amounts(SMALL)}  # fmt: skip
    stores.ledger.release_held("h1", server)
    assert cloud.used("h1") == {VCPU: 0, RAM: 0} and audit(stores).ok


def test_a_confirm_whose_source_fell_silent_is_taken_over(cloud: Cloud) -> None:
    stores, server = cloud.stores, cloud.server("h0")
    mig = cloud.start(server)
    cloud.claim(mig, "h1")
    stores.migrations.finish(mig, "h1")
    stores.migrations.confirm(mig, "ask")
    stores.agents.forget("h0")
    assert stores.migrations.confirm(mig, "take_over", "h0")["status"] == "confirmed"
    assert stores.ledger.held_claims("h0") == {server: mig} and audit(stores).ok
