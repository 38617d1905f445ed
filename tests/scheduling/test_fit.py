"""qsched.scheduling.fit: allocations or a refusal, on flat and nested trees, against an oracle."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qsched import exception
from qsched.flavors import Constraints, Flavor, RequestGroup
from qsched.ledger.base import Inventory, Provider
from qsched.scheduling.fit import fit, fit_request, room
from qsched.scheduling.request import Refusal, RefusalKind, Request
from qsched.scheduling.views import NodeView, ProviderView

AGG_A = "11111111-1111-1111-1111-111111111111"
AGG_B = "22222222-2222-2222-2222-222222222222"


def flat(
    vcpus: int = 8,
    ram_mb: int = 8192,
    disk_gb: int = 100,
    usages: dict[str, int] | None = None,
    traits: frozenset[str] = frozenset(),
    aggregates: frozenset[str] = frozenset(),
    zone: str | None = "az1",
    **extra: Inventory,
) -> NodeView:
    inventories = {"VCPU": Inventory(vcpus), "MEMORY_MB": Inventory(ram_mb)}
    if disk_gb:
        inventories["DISK_GB"] = Inventory(disk_gb)
    inventories.update(extra)
    root = ProviderView("root", "cn1", inventories, usages or {}, traits, aggregates)
    return NodeView("cn1", (root,), zone)


def gpu(
    name: str, vgpus: int = 4, used: int = 0, traits: frozenset[str] = frozenset()
) -> ProviderView:
    inventories = {"VGPU": Inventory(vgpus)}
    return ProviderView(
        name, f"cn1_{name}", inventories, {"VGPU": used}, traits, parent_uuid="root"
    )


def nested(*children: ProviderView, root_usages: dict[str, int] | None = None) -> NodeView:
    root = flat(usages=root_usages).root
    return NodeView("cn1", (root, *children), "az1")


def group(
    suffix: str = "",
    traits_req: tuple[str, ...] = (),
    traits_forb: tuple[str, ...] = (),
    **resources: int,
) -> RequestGroup:
    return RequestGroup(suffix, resources, frozenset(traits_req), frozenset(traits_forb))


SMALL = (group(VCPU=2, MEMORY_MB=2048, DISK_GB=10),)


def refused(result: object, kind: RefusalKind) -> Refusal:
    assert isinstance(result, Refusal), result
    assert result.kind is kind, result
    return result


# -- flat nodes ------------------------------------------------------------------------------


def test_flat_fit_allocates_everything_on_the_root() -> None:
    assert fit(flat(), SMALL) == {"root": {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}}


def test_capacity_refusal_names_class_free_requested_provider() -> None:
    result = fit(flat(usages={"VCPU": 6}), (group(VCPU=4, MEMORY_MB=1),))
    refusal = refused(result, RefusalKind.CAPACITY)
    assert refusal.reason == "not enough VCPU on cn1: 2 free of 4 needed"
    assert (refusal.resource_class, refusal.free, refusal.requested) == ("VCPU", 2, 4)
    assert refusal.provider == "root" and refusal.node == "cn1"
    assert refusal.transient and str(refusal) == refusal.reason


def test_capacity_uses_reserved_and_allocation_ratio() -> None:
    node = flat(VCPU=Inventory(4, reserved=1, max_unit=16, allocation_ratio=4.0))  # 12
    assert not isinstance(fit(node, (group(VCPU=12, MEMORY_MB=1),)), Refusal)
    refusal = refused(fit(node, (group(VCPU=13, MEMORY_MB=1),)), RefusalKind.CAPACITY)
    assert refusal.free == 12


def test_over_used_provider_reports_zero_free_in_words() -> None:
    refusal = refused(fit(flat(usages={"VCPU": 10}), SMALL), RefusalKind.CAPACITY)
    assert "0 free of 2 needed" in refusal.reason and refusal.free == -2


def test_no_inventory() -> None:
    refusal = refused(fit(flat(), (group(VCPU=1, VGPU=1),)), RefusalKind.NO_INVENTORY)
    assert refusal.reason == "cn1 has no VGPU inventory"
    assert refusal.resource_class == "VGPU" and not refusal.transient


@pytest.mark.parametrize(
    ("inventory", "amount", "kind", "words"),
    [
        (Inventory(8, min_unit=2), 1, RefusalKind.MIN_UNIT, "amount 1 of VGPU is below min_unit 2"),
        (Inventory(8, max_unit=2), 3, RefusalKind.MAX_UNIT, "amount 3 of VGPU is above max_unit 2"),
        (Inventory(8), 9, RefusalKind.MAX_UNIT, "amount 9 of VGPU is above max_unit 8"),
        (
            Inventory(8, step_size=2),
            3,
            RefusalKind.STEP_SIZE,
            "amount 3 of VGPU is off step_size 2",
        ),
    ],
)
def test_unit_limits(inventory: Inventory, amount: int, kind: RefusalKind, words: str) -> None:
    refusal = refused(fit(flat(VGPU=inventory), (group(VCPU=1, VGPU=amount),)), kind)
    assert refusal.reason == f"{words} on cn1"
    assert refusal.requested == amount and not refusal.transient


def test_step_size_multiple_fits() -> None:
    node = flat(VGPU=Inventory(8, step_size=2, min_unit=2, max_unit=4))
    assert fit(node, (group(VCPU=1, VGPU=4),)) == {"root": {"VCPU": 1, "VGPU": 4}}


def test_static_reasons_come_before_capacity() -> None:
    node = flat(usages={"VCPU": 8}, VGPU=Inventory(8, step_size=2))
    refused(fit(node, (group(VCPU=1, VGPU=3),)), RefusalKind.STEP_SIZE)


def test_required_and_forbidden_traits_apply_to_the_root() -> None:
    node = flat(traits=frozenset({"HW_CPU_X86_AVX2", "CUSTOM_SLOW"}))
    ok = group(VCPU=1, traits_req=("HW_CPU_X86_AVX2",))
    assert not isinstance(fit(node, (ok,)), Refusal)
    missing = group(VCPU=1, traits_req=("HW_CPU_X86_AVX512F",))
    refusal = refused(fit(node, (missing,)), RefusalKind.REQUIRED_TRAIT)
    assert refusal.reason == "cn1 is missing required trait HW_CPU_X86_AVX512F"
    assert refusal.trait == "HW_CPU_X86_AVX512F"
    forbidden = group(VCPU=1, traits_forb=("CUSTOM_SLOW",))
    refusal = refused(fit(node, (forbidden,)), RefusalKind.FORBIDDEN_TRAIT)
    assert refusal.reason == "cn1 has forbidden trait CUSTOM_SLOW"


def test_constraint_traits_apply_to_the_root() -> None:
    node = flat(traits=frozenset({"CUSTOM_SLOW"}))
    refused(
        fit(node, SMALL, Constraints(required_traits=frozenset({"CUSTOM_FAST"}))),
        RefusalKind.REQUIRED_TRAIT,
    )
    refused(
        fit(node, SMALL, Constraints(forbidden_traits=frozenset({"CUSTOM_SLOW"}))),
        RefusalKind.FORBIDDEN_TRAIT,
    )


def test_availability_zone() -> None:
    assert not isinstance(fit(flat(), SMALL, Constraints(availability_zone="az1")), Refusal)
    refusal = refused(
        fit(flat(), SMALL, Constraints(availability_zone="az2")), RefusalKind.AVAILABILITY_ZONE
    )
    assert refusal.reason == "cn1 is not in availability zone az2 (it is in az1)"
    assert refusal.availability_zone == "az2"
    refusal = refused(
        fit(flat(zone=None), SMALL, Constraints(availability_zone="az2")),
        RefusalKind.AVAILABILITY_ZONE,
    )
    assert "(it is in no zone)" in refusal.reason


def test_aggregates_all_required_on_the_root() -> None:
    node = flat(aggregates=frozenset({AGG_A}))
    assert not isinstance(fit(node, SMALL, Constraints(member_of=frozenset({AGG_A}))), Refusal)
    both = Constraints(member_of=frozenset({AGG_A, AGG_B}))
    refusal = refused(fit(node, SMALL, both), RefusalKind.AGGREGATE)
    assert refusal.reason == f"cn1 is not a member of aggregate {AGG_B}"
    assert refusal.aggregate == AGG_B


def test_aggregate_groups_need_one_each_and_forbidden_ones_none() -> None:
    node = flat(aggregates=frozenset({AGG_A}))
    either = Constraints(member_of_any=(frozenset({AGG_A, AGG_B}),))
    assert not isinstance(fit(node, SMALL, either), Refusal)
    other = Constraints(member_of_any=(frozenset({AGG_A, AGG_B}), frozenset({AGG_B})))
    refusal = refused(fit(node, SMALL, other), RefusalKind.AGGREGATE)
    assert refusal.reason == f"cn1 is in none of the aggregates {AGG_B}"
    nothing = refused(fit(node, SMALL, Constraints(member_of_any=(frozenset(),))),
                      RefusalKind.AGGREGATE)  # fmt: skip
    assert "no aggregate matched the request" in nothing.reason
    barred = Constraints(forbidden_aggregates=frozenset({AGG_A}))
    refusal = refused(fit(node, SMALL, barred), RefusalKind.AGGREGATE)
    assert refusal.reason == f"cn1 is in aggregate {AGG_A}, which the request may not use"
    assert not isinstance(
        fit(flat(), SMALL, Constraints(forbidden_aggregates=frozenset({AGG_A}))), Refusal
    )


def test_children_inherit_nothing_but_root_membership_counts() -> None:
    child = gpu("g0")
    root = flat(aggregates=frozenset({AGG_A})).root
    node = NodeView("cn1", (root, child), "az1")
    request = (*SMALL, group("1", VGPU=1))
    result = fit(node, request, Constraints(member_of=frozenset({AGG_A})))
    assert result == {"root": {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}, "g0": {"VGPU": 1}}


def test_granular_group_on_a_flat_node_merges_with_unnumbered() -> None:
    node = flat(VGPU=Inventory(4))
    result = fit(node, (group(VCPU=1, VGPU=1), group("1", VGPU=2)))
    assert result == {"root": {"VCPU": 1, "VGPU": 3}}


def test_merged_amount_must_respect_max_unit() -> None:
    node = flat(VGPU=Inventory(8, max_unit=2))
    refusal = refused(fit(node, (group(VCPU=1, VGPU=2), group("1", VGPU=2))), RefusalKind.MAX_UNIT)
    assert refusal.reason == "amounts of VGPU add up to 4 on cn1, above max_unit 2"


def test_merged_capacity_on_a_flat_node() -> None:
    node = flat(VGPU=Inventory(4))
    refusal = refused(fit(node, (group(VCPU=1, VGPU=2), group("1", VGPU=3))), RefusalKind.CAPACITY)
    assert (refusal.requested, refusal.free) == (5, 4)


def test_isolate_on_a_flat_node_needs_separate_providers() -> None:
    node = flat(VGPU=Inventory(8))
    groups = (group(VCPU=1), group("1", VGPU=1), group("2", VGPU=1))
    assert fit(node, groups) == {"root": {"VCPU": 1, "VGPU": 2}}
    refusal = refused(fit(node, groups, isolate=True), RefusalKind.COMBINATION)
    assert "group_policy=isolate" in refusal.reason


def test_granular_group_traits_on_a_flat_node() -> None:
    node = flat(traits=frozenset({"CUSTOM_A"}), VGPU=Inventory(8))
    refusal = refused(
        fit(node, (group(VCPU=1), group("1", ("CUSTOM_B",), VGPU=1))), RefusalKind.REQUIRED_TRAIT
    )
    assert (
        refusal.reason == "group 1: cn1 is missing required trait CUSTOM_B" and refusal.group == "1"
    )


# -- nested nodes ------------------------------------------------------------------------


def test_granular_group_lands_on_one_child() -> None:
    node = nested(gpu("g0", used=4), gpu("g1"))
    result = fit(node, (*SMALL, group("1", VGPU=2)))
    assert result == {"root": {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}, "g1": {"VGPU": 2}}


def test_granular_group_is_never_split_across_providers() -> None:
    node = nested(gpu("g0", used=2), gpu("g1", used=2))
    refusal = refused(fit(node, (*SMALL, group("1", VGPU=3))), RefusalKind.CAPACITY)
    assert refusal.reason.startswith("group 1 fits no provider of cn1: ")
    assert "cn1_g0: 2 free of 3 needed" in refusal.reason and "cn1_g1" in refusal.reason


def test_granular_group_traits_pick_the_right_child() -> None:
    node = nested(
        gpu("g0", traits=frozenset({"CUSTOM_SLOW"})), gpu("g1", traits=frozenset({"CUSTOM_FAST"}))
    )
    result = fit(node, (*SMALL, group("1", ("CUSTOM_FAST",), VGPU=1)))
    assert not isinstance(result, Refusal) and result["g1"] == {"VGPU": 1}
    result = fit(node, (*SMALL, group("1", (), ("CUSTOM_FAST",), VGPU=1)))
    assert not isinstance(result, Refusal) and result["g0"] == {"VGPU": 1}


def test_single_reason_when_one_provider_is_relevant() -> None:
    node = nested(gpu("g0", traits=frozenset({"CUSTOM_SLOW"})))
    refusal = refused(
        fit(node, (*SMALL, group("1", ("CUSTOM_FAST",), VGPU=1))), RefusalKind.REQUIRED_TRAIT
    )
    assert refusal.reason == "group 1: cn1_g0 is missing required trait CUSTOM_FAST"
    assert refusal.provider == "g0"


def test_no_provider_has_the_class() -> None:
    refusal = refused(
        fit(nested(gpu("g0")), (*SMALL, group("1", CUSTOM_FPGA=1))), RefusalKind.NO_INVENTORY
    )
    assert refusal.reason == "group 1: no provider of cn1 has CUSTOM_FPGA inventory"
    refusal = refused(
        fit(nested(gpu("g0")), (group(VCPU=1, CUSTOM_FPGA=1),)), RefusalKind.NO_INVENTORY
    )
    assert refusal.reason == "no provider of cn1 has CUSTOM_FPGA inventory"


def test_unnumbered_classes_may_come_from_different_providers() -> None:
    node = nested(gpu("g0"))
    assert fit(node, (group(VCPU=1, VGPU=2),)) == {"root": {"VCPU": 1}, "g0": {"VGPU": 2}}


def test_isolate_puts_groups_on_different_children() -> None:
    node = nested(gpu("g0"), gpu("g1"))
    groups = (*SMALL, group("1", VGPU=1), group("2", VGPU=1))
    assert fit(node, groups)["g0"] == {"VGPU": 2}  # type: ignore[index]
    result = fit(node, groups, isolate=True)
    assert not isinstance(result, Refusal)
    assert result["g0"] == {"VGPU": 1} and result["g1"] == {"VGPU": 1}


def test_isolate_with_too_few_children_is_a_combination_refusal() -> None:
    groups = (*SMALL, group("1", VGPU=1), group("2", VGPU=1))
    refusal = refused(fit(nested(gpu("g0")), groups, isolate=True), RefusalKind.COMBINATION)
    assert refusal.reason == (
        "1, 2, VCPU, MEMORY_MB, DISK_GB each fit some provider of cn1 but not all at once "
        "(group_policy=isolate needs a separate provider per granular group)"
    )


def test_groups_that_fit_alone_but_not_together() -> None:
    groups = (*SMALL, group("1", VGPU=3), group("2", VGPU=3))
    refused(fit(nested(gpu("g0")), groups), RefusalKind.COMBINATION)
    assert not isinstance(fit(nested(gpu("g0"), gpu("g1")), groups), Refusal)


def test_root_traits_do_not_come_from_children() -> None:
    node = nested(gpu("g0", traits=frozenset({"HW_CPU_X86_AVX2"})))
    refused(
        fit(node, (group(VCPU=1, traits_req=("HW_CPU_X86_AVX2",)),)), RefusalKind.REQUIRED_TRAIT
    )


def test_static_refusal_preferred_over_capacity_on_trees() -> None:
    node = nested(gpu("g0", used=4), root_usages={"VCPU": 8})
    refused(fit(node, (group(VCPU=1), group("1", CUSTOM_FPGA=1))), RefusalKind.NO_INVENTORY)


# -- requests, views, room -------------------------------------------------------------------


def test_request_from_flavor_reads_group_policy() -> None:
    flavor = Flavor(
        "g1",
        2,
        2048,
        extra_specs={"resources1:VGPU": "1", "resources2:VGPU": "1", "group_policy": "isolate"},
    )
    request = Request.from_flavor(flavor, Constraints(availability_zone="az1"))
    assert request.isolate and request.granular_count == 2
    assert isinstance(fit_request(nested(gpu("g0")), request), Refusal)
    assert not isinstance(fit_request(nested(gpu("g0"), gpu("g1")), request), Refusal)


def test_fit_is_deterministic_and_pure() -> None:
    node = nested(gpu("g0"), gpu("g1"))
    groups = (*SMALL, group("1", VGPU=1), group("2", VGPU=1))
    assert fit(node, groups, isolate=True) == fit(node, groups, isolate=True)
    assert node.providers[1].usages == {"VGPU": 0}


def test_room_is_exact_on_flat_nodes() -> None:
    request = Request((group(VCPU=2, MEMORY_MB=1000),))
    assert room(flat(vcpus=8, ram_mb=4500), request) == 4
    assert room(flat(usages={"VCPU": 7}), request) == 0


def test_room_bounds_trees_from_above() -> None:
    request = Request((group(VCPU=1), group("1", VGPU=3)))
    assert room(nested(gpu("g0"), gpu("g1", used=4)), request) == 1
    assert room(nested(gpu("g0", used=2), gpu("g1", used=2)), request) == 1  # fit refuses
    assert room(flat(), Request((group("1", traits_req=("CUSTOM_A",)),))) > 1000


def test_node_view_validates_the_tree() -> None:
    root = flat().root
    with pytest.raises(exception.Invalid):
        NodeView("cn1", ())
    with pytest.raises(exception.Invalid):
        NodeView("cn1", (gpu("g0"), root))
    with pytest.raises(exception.Invalid):
        NodeView("cn1", (root, gpu("g0"), gpu("g0")))


def test_adjusted_adds_and_removes_usages_never_below_zero() -> None:
    node = nested(gpu("g0"))
    claimed = node.adjusted({"g0": {"VGPU": 3}, "root": {"VCPU": 1}}, 1)
    assert claimed.providers[1].usages == {"VGPU": 3} and claimed.providers[1].free("VGPU") == 1
    released = claimed.adjusted({"g0": {"VGPU": 5}}, -1)
    assert released.providers[1].usages == {"VGPU": 0}
    with pytest.raises(exception.ProviderNotFound):
        node.adjusted({"nope": {"VGPU": 1}}, 1)


def test_replaced_and_from_provider() -> None:
    node = flat()
    ledger = Provider(
        "root",
        "cn1",
        3,
        inventories={"VCPU": Inventory(2)},
        usages={"VCPU": 2},
        traits=frozenset({"CUSTOM_A"}),
    )
    fresh = node.replaced([ProviderView.from_provider(ledger)])
    assert fresh.root.free("VCPU") == 0 and fresh.root.traits == {"CUSTOM_A"}
    assert fresh.availability_zone == "az1"
    with pytest.raises(exception.ProviderNotFound):
        node.replaced([ProviderView("other", "x", {})])


# -- the tree search against a brute-force oracle --------------------------------------------

RCS = ("VCPU", "VGPU", "CUSTOM_FPGA")
TRAITS = ("CUSTOM_A", "CUSTOM_B")


@st.composite
def trees(draw: st.DrawFn) -> NodeView:
    providers = []
    for index in range(draw(st.integers(1, 4))):
        inventories = {}
        usages = {}
        for rc in draw(st.sets(st.sampled_from(RCS))):
            total = draw(st.integers(1, 6))
            inventories[rc] = Inventory(
                total,
                max_unit=draw(st.sampled_from([None, 2, 4])),
                step_size=draw(st.sampled_from([1, 1, 2])),
            )
            usages[rc] = draw(st.integers(0, total))
        traits = frozenset(draw(st.sets(st.sampled_from(TRAITS))))
        parent = None if index == 0 else f"p{draw(st.integers(0, index - 1))}"
        providers.append(
            ProviderView(f"p{index}", f"p{index}", inventories, usages, traits, parent_uuid=parent)
        )
    return NodeView("cn", tuple(providers))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    shared = draw(st.dictionaries(st.sampled_from(RCS), st.integers(1, 4), max_size=2))
    groups = [RequestGroup("", shared)]
    for suffix in ("1", "2")[: draw(st.integers(0, 2))]:
        resources = draw(
            st.dictionaries(st.sampled_from(RCS), st.integers(1, 4), min_size=1, max_size=2)
        )
        required = frozenset(draw(st.sets(st.sampled_from(TRAITS), max_size=1)))
        forbidden = frozenset(draw(st.sets(st.sampled_from(TRAITS), max_size=1))) - required
        groups.append(RequestGroup(suffix, resources, required, forbidden))
    return Request(tuple(groups), isolate=draw(st.booleans()))


def oracle_allocations(node: NodeView, request: Request) -> list[dict[str, dict[str, int]]]:
    """Every valid allocation, by enumerating every provider for every unit."""
    units = [
        (g.suffix, dict(g.resources), g.required_traits, g.forbidden_traits)
        for g in request.groups
        if g.suffix
    ]
    shared = {rc: n for g in request.groups if not g.suffix for rc, n in g.resources.items()}
    units += [("", {rc: n}, frozenset(), frozenset()) for rc, n in shared.items()]
    valid = []
    for choice in itertools.product(node.providers, repeat=len(units)):
        if valid_choice(units, choice, request.isolate):
            valid.append(merge(units, choice))
    return valid


def valid_choice(units: list, choice: tuple[ProviderView, ...], isolate: bool) -> bool:
    granular = [p.uuid for (suffix, *_), p in zip(units, choice, strict=True) if suffix]
    if isolate and len(set(granular)) != len(granular):
        return False
    for (suffix, amounts, required, forbidden), provider in zip(units, choice, strict=True):
        if suffix and not (required <= provider.traits and not forbidden & provider.traits):
            return False
        for rc, n in amounts.items():
            inv = provider.inventories.get(rc)
            if inv is None or n < inv.min_unit or n > inv.effective_max_unit or n % inv.step_size:
                return False
    for uuid, amounts in merge(units, choice).items():
        provider = next(p for p in choice if p.uuid == uuid)
        for rc, n in amounts.items():
            if n > provider.free(rc) or n > provider.inventories[rc].effective_max_unit:
                return False
    return True


def merge(units: list, choice: tuple[ProviderView, ...]) -> dict[str, dict[str, int]]:
    merged: dict[str, dict[str, int]] = {}
    for (_, amounts, *_), provider in zip(units, choice, strict=True):
        for rc, n in amounts.items():
            merged.setdefault(provider.uuid, {}).setdefault(rc, 0)
            merged[provider.uuid][rc] += n
    return merged


def emptied(node: NodeView) -> NodeView:
    providers = tuple(
        ProviderView(p.uuid, p.name, p.inventories, {}, p.traits, p.aggregates, p.parent_uuid)
        for p in node.providers
    )
    return NodeView(node.name, providers, node.availability_zone)


@settings(max_examples=400, deadline=None)
@given(trees(), requests())
def test_fit_agrees_with_brute_force(node: NodeView, request: Request) -> None:
    result = fit_request(node, request)
    valid = oracle_allocations(node, request)
    if isinstance(result, Refusal):
        assert not valid, (result, valid)
        if not result.transient:
            assert not oracle_allocations(emptied(node), request), result
    else:
        assert result in valid
        assert room(node, request) >= 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.integers(0, 64), st.integers(1, 16))
def test_room_counts_successive_fits_on_flat_nodes(
    total: int, step: int, used: int, amount: int
) -> None:
    inventories = {"VCPU": Inventory(10_000), "VGPU": Inventory(total, step_size=step)}
    node = NodeView("cn1", (ProviderView("root", "cn1", inventories, {"VGPU": min(used, total)}),))
    request = Request((group(VCPU=1), group("1", VGPU=amount)))
    first = fit_request(node, request)
    expected = room(node, request)
    copies = 0
    while not isinstance(result := fit_request(node, request), Refusal):
        node = node.adjusted(result, 1)
        copies += 1
    if isinstance(first, Refusal) and not first.transient:
        assert copies == 0
    else:
        assert copies == expected
