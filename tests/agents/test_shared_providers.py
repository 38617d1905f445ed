"""Sharing providers (MISC_SHARES_VIA_AGGREGATE): the ledger's index of them, the fit that
takes classes from them, the agent's one view of each, and qsched-admin shared-provider.

The contention of many agents on one sharing provider: tests/agents/test_shared_contention.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from agents.nodes import NodeIndex
from qsched import exception
from qsched.admin import schemas
from qsched.admin.cli import cli
from qsched.chaos import checks
from qsched.flavors import Constraints, RequestGroup
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import ClaimGuard, Instance, Inventory, Provider, ProviderSpec, State
from qsched.resources import DISK_GB, MEMORY_MB, SHARES_VIA_AGGREGATE, VCPU
from qsched.scheduling.fit import fit_request, room
from qsched.scheduling.request import NO_CONSTRAINTS, Refusal, RefusalKind, Request
from qsched.scheduling.views import NodeView, ProviderView
from tests.conftest import DURABILITY_LINE
from tests.raw import redis_store

AGG = "11111111-1111-4111-8111-111111111111"
OTHER = "22222222-2222-4222-8222-222222222222"


def new_uuid() -> str:
    return str(uuid.uuid4())


# -- the ledger's index --------------------------------------------------------------------


def make_sharing(stores: Stores, name: str, aggregates: list[str], disk_gb: int = 100) -> str:
    rp = stores.ledger.create_provider(new_uuid(), name).uuid
    gen = stores.ledger.set_inventory(rp, 0, {DISK_GB: Inventory(disk_gb)})
    gen = stores.ledger.set_aggregates(rp, gen, aggregates)
    stores.ledger.set_traits(rp, gen, [SHARES_VIA_AGGREGATE])
    return rp


def test_the_index_follows_the_trait(stores: Stores) -> None:
    ledger = stores.ledger
    shared = make_sharing(stores, "nfs", [AGG])
    elsewhere = make_sharing(stores, "ceph", [OTHER])
    plain = ledger.create_provider(new_uuid(), "cn1").uuid
    ledger.set_aggregates(plain, 0, [AGG])
    assert set(ledger.sharing_providers()) == {shared, elsewhere}
    assert set(ledger.sharing_providers([AGG])) == {shared}
    assert ledger.sharing_providers([new_uuid()]) == {}
    gen = ledger.get_provider(shared).generation
    ledger.set_traits(shared, gen, ["CUSTOM_FAST"])  # no longer sharing
    assert set(ledger.sharing_providers([AGG, OTHER])) == {elsewhere}
    ledger.delete_provider(elsewhere, ledger.get_provider(elsewhere).generation)
    assert ledger.sharing_providers() == {}


def test_registering_keeps_the_index(stores: Stores) -> None:
    rp = new_uuid()
    inventory = {DISK_GB: Inventory(10)}
    sharing = frozenset({SHARES_VIA_AGGREGATE})
    stores.ledger.register_providers([ProviderSpec(rp, "san", inventory, sharing, {AGG})])
    assert set(stores.ledger.sharing_providers([AGG])) == {rp}
    stores.ledger.register_providers([ProviderSpec(rp, "san", inventory, frozenset(), {AGG})])
    assert stores.ledger.sharing_providers() == {}


def test_a_claim_takes_from_the_node_and_the_sharing_provider_at_once(stores: Stores) -> None:
    """Both generations are checked and capacity on both, in one step: nothing is
    written when either refuses."""
    ledger = stores.ledger
    shared = make_sharing(stores, "nfs", [AGG], disk_gb=10)
    node = ledger.create_provider(new_uuid(), "cn1").uuid
    ledger.set_inventory(node, 0, {VCPU: Inventory(4)})
    gen = ledger.get_provider(shared).generation
    with pytest.raises(exception.ProviderGenerationConflict):
        ledger.put_allocations(new_uuid(), {node: {VCPU: 1}, shared: {DISK_GB: 5}}, None,
                               "p", "u", {shared: gen - 1})  # fmt: skip
    assert ledger.get_provider(node).usages.get(VCPU, 0) == 0
    ledger.put_allocations(new_uuid(), {node: {VCPU: 1}, shared: {DISK_GB: 6}}, None,
                           "p", "u", {shared: gen})  # fmt: skip
    assert ledger.get_provider(shared).generation == gen + 1  # what the agent's view assumes
    with pytest.raises(exception.CapacityExceeded) as err:
        ledger.put_allocations(new_uuid(), {node: {VCPU: 1}, shared: {DISK_GB: 5}}, None,
                               "p", "u", {shared: gen + 1})  # fmt: skip
    assert err.value.kwargs["provider"] == shared
    assert ledger.get_provider(node).usages[VCPU] == 1


def test_the_claim_refuses_a_provider_that_no_longer_shares_with_the_node(
    stores: Stores,
) -> None:
    """An agent's view of who shares with its node may be stale; the claim checks it."""
    ledger = stores.ledger
    shared = make_sharing(stores, "nfs", [AGG])
    node = ledger.create_provider(new_uuid(), "cn1").uuid
    gen = ledger.set_inventory(node, 0, {VCPU: Inventory(4)})
    ledger.set_aggregates(node, gen, [AGG, OTHER])
    wanted = {node: {VCPU: 1}, shared: {DISK_GB: 5}}

    def claim(guard: ClaimGuard) -> str:
        record = Instance(new_uuid(), "p", "u", "vm", {"name": "f", "vcpus": 1, "ram_mb": 1},
                          State.BUILD)  # fmt: skip
        inst = stores.instances.create(record, deadline=1e12).uuid
        ledger.claim(inst, wanted, "h1", "cn1", guard=guard)
        return inst

    claim(ClaimGuard(node, sharing=frozenset({shared})))
    with pytest.raises(exception.ClaimRuleBroken, match=f"not in aggregate {OTHER}"):
        claim(ClaimGuard(node, member_of=frozenset({OTHER}), sharing=frozenset({shared})))
    ledger.set_aggregates(shared, ledger.get_provider(shared).generation, [new_uuid()])
    with pytest.raises(exception.ClaimRuleBroken, match=f"in no aggregate of provider {node}"):
        claim(ClaimGuard(node, sharing=frozenset({shared})))
    ledger.set_traits(shared, ledger.get_provider(shared).generation, [])
    with pytest.raises(exception.ClaimRuleBroken, match="not a sharing provider"):
        claim(ClaimGuard(node, sharing=frozenset({shared})))
    assert ledger.get_provider(shared).usages[DISK_GB] == 5  # the first claim only


def test_the_audit_finds_an_over_commit_of_a_sharing_provider(stores: Stores) -> None:
    shared = make_sharing(stores, "nfs", [AGG], disk_gb=10)
    stores.ledger.put_allocations(new_uuid(), {shared: {DISK_GB: 10}}, None, "p", "u")
    assert audit(stores).ok
    store = redis_store(stores)
    store.client.hset(store.keys.provider(shared), f"u:{DISK_GB}", 11)  # behind the scripts
    found = audit(stores).overcommitted
    assert found == [{"provider": shared, "resource_class": DISK_GB, "used": 11, "capacity": 10}]


# -- the fit -------------------------------------------------------------------------------


def sharer(free_gb: int = 100, aggregates: frozenset[str] = frozenset({AGG}), **kw) -> ProviderView:
    return ProviderView(
        kw.get("uuid", "s-1"), kw.get("name", "nfs"), {DISK_GB: Inventory(100)},
        {DISK_GB: 100 - free_gb}, frozenset({SHARES_VIA_AGGREGATE}), aggregates,
    )  # fmt: skip


def compute(name: str = "cn1", disk_gb: int = 0, aggregates=frozenset({AGG})) -> NodeView:
    inventories = {VCPU: Inventory(4), MEMORY_MB: Inventory(4096)}
    if disk_gb:
        inventories[DISK_GB] = Inventory(disk_gb)
    return NodeView(name, (ProviderView(f"{name}-rp", name, inventories, aggregates=aggregates),))


def flavor_request(disk_gb: int = 10, constraints: Constraints = NO_CONSTRAINTS) -> Request:
    group = RequestGroup("", {VCPU: 1, MEMORY_MB: 512, DISK_GB: disk_gb})
    return Request((group,), constraints)


def test_a_class_the_tree_lacks_comes_from_a_sharing_provider() -> None:
    result = fit_request(compute(), flavor_request(), [sharer()])
    assert result == {"cn1-rp": {VCPU: 1, MEMORY_MB: 512}, "s-1": {DISK_GB: 10}}
    alone = fit_request(compute(), flavor_request())
    assert isinstance(alone, Refusal) and alone.kind is RefusalKind.NO_INVENTORY


def test_the_tree_inventory_wins_over_a_sharing_provider() -> None:
    result = fit_request(compute(disk_gb=50), flavor_request(), [sharer()])
    assert result == {"cn1-rp": {VCPU: 1, MEMORY_MB: 512, DISK_GB: 10}}


def test_a_sharing_provider_outside_the_roots_aggregates_is_not_reached() -> None:
    result = fit_request(compute(aggregates=frozenset({OTHER})), flavor_request(), [sharer()])
    assert isinstance(result, Refusal) and result.kind is RefusalKind.NO_INVENTORY
    assert "reaches no sharing provider of DISK_GB" in result.reason


def test_without_the_trait_a_provider_shares_nothing() -> None:
    plain = ProviderView("s-1", "nfs", {DISK_GB: Inventory(100)}, aggregates=frozenset({AGG}))
    assert isinstance(fit_request(compute(), flavor_request(), [plain]), Refusal)


def test_member_of_applies_to_the_sharing_provider_too() -> None:
    """As Placement's allocation candidates: a sharing provider outside member_of is not
    used (bug 1792503's gabbits)."""
    node = compute(aggregates=frozenset({AGG, OTHER}))
    wanted = flavor_request(constraints=Constraints(member_of=frozenset({OTHER})))
    result = fit_request(node, wanted, [sharer()])
    assert isinstance(result, Refusal) and result.kind is RefusalKind.AGGREGATE
    second = sharer(aggregates=frozenset({AGG, OTHER}), uuid="s-2", name="ceph")
    assert fit_request(node, wanted, [sharer(), second]) == {
        "cn1-rp": {VCPU: 1, MEMORY_MB: 512}, "s-2": {DISK_GB: 10},
    }  # fmt: skip


def test_a_full_sharing_provider_is_a_capacity_refusal_naming_it() -> None:
    result = fit_request(compute(), flavor_request(), [sharer(free_gb=5)])
    assert isinstance(result, Refusal) and result.transient
    assert (result.provider, result.free) == ("s-1", 5)
    assert result.reason == "not enough DISK_GB on nfs: 5 free of 10 needed"
    # the index ranks by the node's own room: that ignores the sharing provider's
    assert isinstance(fit_request(compute(), flavor_request(), [sharer(0)], shared_room=False),
                      dict)  # fmt: skip
    assert room(compute(), flavor_request(), frozenset({DISK_GB})) == 4


def test_a_granular_group_never_takes_from_a_sharing_provider() -> None:
    groups = (RequestGroup("", {VCPU: 1}), RequestGroup("1", {DISK_GB: 10}))
    assert isinstance(fit_request(compute(), Request(groups), [sharer()]), Refusal)


# -- the agent's index ---------------------------------------------------------------------


def provider_record(view: ProviderView, generation: int) -> Provider:
    return Provider(view.uuid, view.name, generation, None, view.uuid, view.inventories,
                    view.usages, view.traits, view.aggregates)  # fmt: skip


def test_the_index_keeps_one_view_and_ranks_nodes_by_their_own_room() -> None:
    index = NodeIndex()
    for i in range(3):
        index.add_node(compute(f"cn{i}"))
    index.add_request("disk", flavor_request(disk_gb=40))
    assert not index.can_fit("disk")  # no sharing provider known yet
    index.set_sharing({"s-1": provider_record(sharer(), 7)})
    assert index.can_fit("disk") and index.root_aggregates() == {AGG}
    pick = index.pick("disk")
    assert pick is not None and pick.allocations["s-1"] == {DISK_GB: 40}
    assert index.shared_generations(pick.allocations) == {"s-1": 7}
    index.claim(pick.node, pick.allocations)
    assert index.sharing()[0].free(DISK_GB) == 60
    assert index.shared_generations(pick.allocations) == {"s-1": 8}  # the claim bumped it
    second = index.pick("disk")
    assert second is not None
    index.claim(second.node, second.allocations)
    assert index.pick("disk") is None  # 20 GB left: the sharing provider is short
    assert index.can_fit("disk")  # every node keeps its place, by its own room
    index.set_sharing({"s-1": provider_record(sharer(), 8)})  # read before our claims
    assert index.sharing()[0].free(DISK_GB) == 20  # an older read does not undo them
    index.release(second.node, second.allocations)
    assert index.pick("disk") is not None


# -- qsched-admin shared-provider ------------------------------------------------------------


def admin(tmp_path: Path, ledger_url: str):
    config = tmp_path / "qsched.conf"
    config.write_text(
        f"[DEFAULT]\ntransport_url = memory://\n[ledger]\nurl = {ledger_url}\n" + DURABILITY_LINE
    )
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, ["--config-file", str(config), *args])
        assert result.exit_code == code, result.output
        return result.stdout if code == 0 else result.stderr

    return run


def test_admin_creates_lists_and_deletes_a_shared_provider(
    tmp_path: Path, ledger_url: str, stores: Stores
) -> None:
    run = admin(tmp_path, ledger_url)
    created = run("shared-provider", "create", "nfs", "--inventory", "DISK_GB=1000",
                  "--allocation-ratio", "1.5", "--aggregate", AGG, "-f", "json")  # fmt: skip
    made = json.loads(created)
    jsonschema.validate(made, schemas.SHARED_PROVIDER)
    assert made["sharing"] and made["aggregates"] == [AGG]
    assert made["inventories"][DISK_GB]["capacity"] == 1500
    assert SHARES_VIA_AGGREGATE in made["traits"]
    assert set(stores.ledger.sharing_providers([AGG])) == {made["uuid"]}
    listed = json.loads(run("shared-provider", "list", "-f", "json"))
    jsonschema.validate(listed, schemas.SHARED_PROVIDERS)
    jsonschema.validate(json.loads(run("providers", "-f", "json")), schemas.PROVIDERS)
    assert [r["name"] for r in listed] == ["nfs"]
    assert "nfs (shared)" in run("providers")
    out = run("shared-provider", "create", "nfs2", "--inventory", "DISK_GB", "--aggregate", AGG,
              code=2)  # fmt: skip
    assert "CLASS=TOTAL" in out
    out = run("shared-provider", "create", "nfs2", "--inventory", "DISK_GB=5", "--aggregate",
              "no-such-aggregate", code=1)  # fmt: skip
    assert "No host aggregate 'no-such-aggregate'" in out
    assert [p.name for p in stores.ledger.list_providers()] == ["nfs"]  # nothing half-made
    run("shared-provider", "create", "nfs", "--inventory", "DISK_GB=5", "--aggregate", AGG,
        code=1)  # fmt: skip
    run("shared-provider", "delete", "nfs")
    assert stores.ledger.sharing_providers() == {}
    assert "no shared provider" in run("shared-provider", "list")


def test_the_chaos_checks_see_a_sharing_provider_as_no_hosts(stores: Stores) -> None:
    """A claim on a node and a sharing provider is not "on several hosts"; an over-commit
    of the sharing provider is still one."""
    shared = make_sharing(stores, "nfs", [AGG], disk_gb=10)
    node = stores.ledger.create_provider(new_uuid(), "cn1-0").uuid
    stores.ledger.set_inventory(node, 0, {VCPU: Inventory(4)})
    stores.ledger.put_allocations(new_uuid(), {node: {VCPU: 1}, shared: {DISK_GB: 10}}, None,
                                  "p", "u")  # fmt: skip
    snap = checks.take_snapshot(stores, ["cn1"])
    assert checks.duplicates(snap, {}) == [] and checks.overcommits(snap) == []
    store = redis_store(stores)
    store.client.hset(store.keys.provider(shared), f"u:{DISK_GB}", 12)
    found = checks.overcommits(checks.take_snapshot(stores, ["cn1"]))
    assert [f["provider"] for f in found] == [shared]
