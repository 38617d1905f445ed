"""Does a request fit a node? Pure functions over the agent's view of one node (no I/O).

A node is a tree of resource providers: the root compute node first, then children such as
NUMA nodes or GPUs. :func:`fit` answers with the allocations that would satisfy a request on
the node, or a :class:`Refusal` that says why not. The agent uses the same function to decide
which scheduling classes it subscribes to and to check each message; the ledger claim re-checks
capacity atomically afterwards, so a stale view costs a conflict, never an over-commit.

Placement semantics, and the choices made where Placement leaves room:

- Capacity is ``(total - reserved) * allocation_ratio``; free is capacity minus usage.
- Every amount is checked against its provider's ``min_unit``, ``max_unit`` and ``step_size``.
  When several groups land on the same provider and class, the amounts add up and the sum must
  stay within ``max_unit`` too, because that sum is what the ledger will be asked to allocate.
- A granular group (``resources1:VGPU=1``) is satisfied entirely by one provider of the tree,
  which must carry the group's required traits and none of its forbidden ones. With
  ``group_policy=isolate`` different granular groups use different providers; the unnumbered
  group may still share a provider with any of them.
- The unnumbered group's resources may come from any providers of the tree, each resource class
  from a single provider.
- The unnumbered group's required and forbidden traits, and those of the request's
  :class:`~qsched.flavors.Constraints` (image traits), apply to the root provider: they describe
  the compute host (CPU flags, hypervisor capabilities), like Placement's ``root_required``.
- ``member_of`` requires every listed aggregate (like repeated ``member_of`` parameters), each
  group of ``member_of_any`` one of its aggregates (``member_of=in:a,b``), and no aggregate of
  ``forbidden_aggregates`` may hold the node (``member_of=!in:a,b``); all checked on the root
  provider; children inherit their root's aggregates, as in Placement.
- The availability zone is a property of the node.
- Sharing providers (trait ``MISC_SHARES_VIA_AGGREGATE``, shared storage): a resource class of
  the unnumbered group that no provider of the tree has inventory of, and that no granular
  group asks for, comes from a sharing provider in one of the root's aggregates, each class
  from one provider, as Placement's "resources from sharing providers". The sharing provider
  must pass the request's aggregate rules too (``member_of``: Placement applies them to every
  provider of the candidate). A class the tree has inventory of always comes from the tree.
  Granular groups never use sharing providers. The views of the sharing providers are passed
  in (``sharing``): one per provider for a whole agent, never a copy per node.
- The choice is deterministic: providers are tried in tree order (root first), groups in order
  (granular groups by suffix, then the unnumbered classes), first fit wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from qsched.flavors import Constraints, RequestGroup
from qsched.resources import SHARES_VIA_AGGREGATE
from qsched.scheduling.request import NO_CONSTRAINTS, Refusal, RefusalKind, Request, Unit
from qsched.scheduling.views import NodeView, ProviderView

Allocations = dict[str, dict[str, int]]
"""{provider uuid: {resource class: amount}}"""

ROOM_UNBOUNDED = 1 << 30
"""What :func:`room` says for a request that asks for no resources at all."""


def fit(
    node: NodeView,
    groups: Sequence[RequestGroup],
    constraints: Constraints = NO_CONSTRAINTS,
    *,
    isolate: bool = False,
) -> Allocations | Refusal:
    """The allocations that satisfy ``groups`` and ``constraints`` on ``node``, or why not.

    Compiles the request on every call; hold a :class:`Request` and call :func:`fit_request`
    when fitting the same request many times.
    """
    return fit_request(node, Request(tuple(groups), constraints, isolate))


def fit_request(
    node: NodeView,
    request: Request,
    sharing: Sequence[ProviderView] = (),
    *,
    shared_room: bool = True,
) -> Allocations | Refusal:
    """Like :func:`fit` for a compiled request. Static reasons are reported before capacity.

    ``sharing``: views of sharing providers the node may reach (those in none of its root's
    aggregates are skipped). ``shared_room``: False checks everything about them but their
    free amounts (what the node index ranks by: a node's own room).
    """
    refusal = _check_node(node, request)
    if refusal is not None:
        return refusal
    shared = shared_classes(node, request, sharing) if sharing else _NONE
    if shared:
        return _fit_sharing(node, request, sharing, shared, shared_room)
    return _fit_own(node, request)


def _fit_own(node: NodeView, request: Request) -> Allocations | Refusal:
    if len(node.providers) == 1:
        return _fit_single(node, node.providers[0], request)
    return _fit_tree(node, request)


_NONE: frozenset[str] = frozenset()


def shared_classes(
    node: NodeView, request: Request, sharing: Sequence[ProviderView]
) -> frozenset[str]:
    """The classes the node would take from a sharing provider: unnumbered only, without
    inventory anywhere in its tree, offered by one of ``sharing`` (O(classes x providers))."""
    granular = {rc for u in request.units if u.granular for rc, _ in u.amounts}
    found = set()
    for unit in request.units:
        rc = unit.amounts[0][0]
        if unit.granular or rc in granular:
            continue
        if any(rc in p.inventories for p in node.providers):
            continue
        if any(rc in p.inventories for p in sharing):
            found.add(rc)
    return frozenset(found)


def room(node: NodeView, request: Request, shared: frozenset[str] = _NONE) -> int:
    """How many copies of ``request`` the node's free resources could hold, at most.

    Exact on a single-provider node where the request fits once; on a tree an upper bound
    (it sums free amounts over providers and ignores traits and group boundaries). Classes
    in ``shared`` come from sharing providers and do not count (:func:`shared_classes`).
    """
    providers = node.providers
    best = ROOM_UNBOUNDED
    if len(providers) == 1:
        free = providers[0].free_by_rc
        for rc, amount in request.demand:
            copies = free.get(rc, 0) // amount
            if copies < best and rc not in shared:
                best = copies
    else:
        for rc, amount in request.demand:
            if rc in shared:
                continue
            copies = sum(max(p.free_by_rc.get(rc, 0), 0) for p in providers) // amount
            best = min(best, copies)
    return max(best, 0)


def _fit_sharing(
    node: NodeView,
    request: Request,
    sharing: Sequence[ProviderView],
    shared: frozenset[str],
    shared_room: bool,
) -> Allocations | Refusal:
    """The tree without the ``shared`` classes, then each of them from a sharing provider."""
    own = _fit_own(node, _without(request, shared))
    if isinstance(own, Refusal):
        return own
    allocations = {uuid: dict(amounts) for uuid, amounts in own.items()}
    for rc, amount in request.demand:
        if rc not in shared:
            continue
        found = _from_sharing(node, request.constraints, sharing, rc, amount, shared_room)
        if isinstance(found, Refusal):
            return found
        allocations.setdefault(found, {})[rc] = amount
    return allocations


def _without(request: Request, shared: frozenset[str]) -> Request:
    """The request less the ``shared`` classes of its unnumbered group."""
    groups = tuple(
        g if g.suffix else dataclasses.replace(
            g, resources={rc: n for rc, n in g.resources.items() if rc not in shared}
        )
        for g in request.groups
    )  # fmt: skip
    return Request(groups, request.constraints, request.isolate, request.same_subtree)


def _from_sharing(
    node: NodeView,
    constraints: Constraints,
    sharing: Sequence[ProviderView],
    rc: str,
    amount: int,
    check_room: bool,
) -> str | Refusal:
    """The first sharing provider the node reaches that can give ``amount`` of ``rc``."""
    refusals: list[Refusal] = []
    root_aggregates = node.providers[0].aggregates
    for provider in sharing:
        if rc not in provider.inventories or SHARES_VIA_AGGREGATE not in provider.traits:
            continue
        if not provider.aggregates & root_aggregates:
            continue
        if not _aggregates_allow(provider.aggregates, constraints):
            reason = f"sharing provider {provider.name} is outside the request's aggregates"
            refusals.append(Refusal(RefusalKind.AGGREGATE, reason, node.name, provider.uuid))
            continue
        refusal = _check_amount(node, provider, rc, amount, "")
        if refusal is None and check_room and amount > provider.free(rc):
            refusal = _capacity_refusal(node, provider, rc, amount, "")
        if refusal is None:
            return provider.uuid
        refusals.append(refusal)
    if not refusals:
        reason = f"{node.name} reaches no sharing provider of {rc}"
        return Refusal(RefusalKind.NO_INVENTORY, reason, node.name, resource_class=rc)
    return next((r for r in refusals if r.transient), refusals[0])


def _aggregates_allow(aggregates: frozenset[str], constraints: Constraints) -> bool:
    """Whether a provider in ``aggregates`` passes ``member_of``, ``member_of_any`` and
    ``forbidden_aggregates``."""
    if constraints.member_of and not constraints.member_of <= aggregates:
        return False
    if any(not group & aggregates for group in constraints.member_of_any):
        return False
    return not constraints.forbidden_aggregates & aggregates


def _check_node(node: NodeView, request: Request) -> Refusal | None:
    """Zone, aggregates and root traits: what does not depend on usage."""
    zone = request.constraints.availability_zone
    if zone and zone != node.availability_zone:
        reason = (
            f"{node.name} is not in availability zone {zone} "
            f"(it is in {node.availability_zone or 'no zone'})"
        )
        return Refusal(RefusalKind.AVAILABILITY_ZONE, reason, node.name, availability_zone=zone)
    root = node.providers[0]
    refusal = _check_aggregates(node, root, request.constraints)
    if refusal is not None:
        return refusal
    return _check_traits(node, root, "", request.root_required, request.root_forbidden)


def _check_aggregates(
    node: NodeView, root: ProviderView, constraints: Constraints
) -> Refusal | None:
    """``member_of`` (all), each group of ``member_of_any`` (one), ``forbidden_aggregates``."""
    aggregates = root.aggregates
    member_of = constraints.member_of
    if member_of and not member_of <= aggregates:
        aggregate = min(member_of - aggregates)
        reason = f"{node.name} is not a member of aggregate {aggregate}"
        return Refusal(RefusalKind.AGGREGATE, reason, node.name, root.uuid, aggregate=aggregate)
    for group in constraints.member_of_any:
        if not group & aggregates:
            named = ", ".join(sorted(group)) or "(none: no aggregate matched the request)"
            reason = f"{node.name} is in none of the aggregates {named}"
            first = min(group) if group else None
            return Refusal(RefusalKind.AGGREGATE, reason, node.name, root.uuid, aggregate=first)
    barred = constraints.forbidden_aggregates & aggregates
    if barred:
        aggregate = min(barred)
        reason = f"{node.name} is in aggregate {aggregate}, which the request may not use"
        return Refusal(RefusalKind.AGGREGATE, reason, node.name, root.uuid, aggregate=aggregate)
    return None


def _check_traits(
    node: NodeView,
    provider: ProviderView,
    group: str,
    required: frozenset[str],
    forbidden: frozenset[str],
) -> Refusal | None:
    traits = provider.traits
    if required and not required <= traits:
        trait = min(required - traits)
        reason = f"{_where(provider, group)} is missing required trait {trait}"
        kind = RefusalKind.REQUIRED_TRAIT
    elif forbidden and not forbidden.isdisjoint(traits):
        trait = min(forbidden & traits)
        reason = f"{_where(provider, group)} has forbidden trait {trait}"
        kind = RefusalKind.FORBIDDEN_TRAIT
    else:
        return None
    return Refusal(kind, reason, node.name, provider.uuid, trait=trait, group=group)


def _where(provider: ProviderView, group: str) -> str:
    return f"group {group}: {provider.name}" if group else provider.name


def _check_amount(
    node: NodeView, provider: ProviderView, rc: str, amount: int, group: str
) -> Refusal | None:
    """Inventory, min_unit, max_unit and step_size: whether the amount can ever fit here."""
    inv = provider.inventories.get(rc)
    if (
        inv is not None
        and inv.min_unit <= amount <= (inv.total if inv.max_unit is None else inv.max_unit)
        and not amount % inv.step_size
    ):
        return None
    return _amount_refusal(node, provider, rc, amount, group)


def _amount_refusal(
    node: NodeView, provider: ProviderView, rc: str, amount: int, group: str
) -> Refusal:
    inv = provider.inventories.get(rc)
    where = _where(provider, group)
    if inv is None:
        kind, reason = RefusalKind.NO_INVENTORY, f"{where} has no {rc} inventory"
    elif amount < inv.min_unit:
        kind, reason = RefusalKind.MIN_UNIT, f"amount {amount} of {rc} is below min_unit"
        reason = f"{reason} {inv.min_unit} on {where}"
    elif amount > inv.effective_max_unit:
        kind, reason = RefusalKind.MAX_UNIT, f"amount {amount} of {rc} is above max_unit"
        reason = f"{reason} {inv.effective_max_unit} on {where}"
    else:
        kind, reason = RefusalKind.STEP_SIZE, f"amount {amount} of {rc} is off step_size"
        reason = f"{reason} {inv.step_size} on {where}"
    return Refusal(kind, reason, node.name, provider.uuid, rc, amount, group=group)


def _capacity_refusal(
    node: NodeView, provider: ProviderView, rc: str, amount: int, group: str
) -> Refusal:
    free = provider.free_by_rc.get(rc, 0)
    where = _where(provider, group)
    reason = f"not enough {rc} on {where}: {max(free, 0)} free of {amount} needed"
    return Refusal(
        RefusalKind.CAPACITY, reason, node.name, provider.uuid, rc, amount, free, group=group
    )


def _check_merged(node: NodeView, provider: ProviderView, rc: str, amount: int) -> Refusal | None:
    limit = provider.inventories[rc].effective_max_unit
    if amount <= limit:
        return None
    reason = f"amounts of {rc} add up to {amount} on {provider.name}, above max_unit {limit}"
    return Refusal(RefusalKind.MAX_UNIT, reason, node.name, provider.uuid, rc, amount)


def _fit_single(node: NodeView, provider: ProviderView, request: Request) -> Allocations | Refusal:
    """The whole request on the one provider of a flat node (the hot path)."""
    if request.isolate and request.granular_count > 1:
        return _combination(node, request)
    for unit in request.units:
        if unit.granular:
            refusal = _check_traits(node, provider, unit.group, unit.required, unit.forbidden)
            if refusal is not None:
                return refusal
        for rc, amount in unit.amounts:
            refusal = _check_amount(node, provider, rc, amount, unit.group)
            if refusal is not None:
                return refusal
    free = provider.free_by_rc
    for rc, amount in request.demand:
        if amount > free.get(rc, 0):
            return _capacity_refusal(node, provider, rc, amount, "")
    demand = dict(request.demand)
    for rc in request.merged:
        refusal = _check_merged(node, provider, rc, demand[rc])
        if refusal is not None:
            return refusal
    return {provider.uuid: demand} if demand else {}


def _fit_unit(node: NodeView, provider: ProviderView, unit: Unit) -> Refusal | None:
    """Whether one provider alone could satisfy one unit, ignoring the other units."""
    refusal = None
    for rc, amount in unit.amounts:
        if rc not in provider.inventories:
            return _amount_refusal(node, provider, rc, amount, unit.group)
    if unit.granular:
        refusal = _check_traits(node, provider, unit.group, unit.required, unit.forbidden)
    for rc, amount in unit.amounts:
        refusal = refusal or _check_amount(node, provider, rc, amount, unit.group)
    for rc, amount in unit.amounts:
        if refusal is None and amount > provider.free_by_rc.get(rc, 0):
            refusal = _capacity_refusal(node, provider, rc, amount, unit.group)
    return refusal


def _fit_tree(node: NodeView, request: Request) -> Allocations | Refusal:
    candidates = [[p for p in node.providers if _unit_fits(p, u)] for u in request.units]
    if not all(candidates):
        return _tree_refusal(node, request, candidates)
    allocations: Allocations = {}
    chosen: dict[str, str] = {}
    if _search(request, candidates, 0, allocations, set(), chosen, _Tree(node)):
        return allocations
    return _combination(node, request)


class _Tree:
    """A node's parent links, for ``same_subtree``."""

    __slots__ = ("parents",)

    def __init__(self, node: NodeView) -> None:
        self.parents = {p.uuid: p.parent_uuid for p in node.providers}

    def under(self, uuid: str, ancestor: str) -> bool:
        """Whether ``uuid`` is ``ancestor`` or below it."""
        current: str | None = uuid
        while current is not None:
            if current == ancestor:
                return True
            current = self.parents.get(current)
        return False

    def one_subtree(self, uuids: set[str]) -> bool:
        """Whether one of ``uuids`` has all the others under it."""
        return any(all(self.under(u, top) for u in uuids) for top in uuids)


def _unit_fits(provider: ProviderView, unit: Unit) -> bool:
    """The quick yes or no of :func:`_fit_unit`, without building a refusal."""
    traits = provider.traits
    if unit.required and not unit.required <= traits:
        return False
    if unit.forbidden and not unit.forbidden.isdisjoint(traits):
        return False
    inventories = provider.inventories
    free = provider.free_by_rc
    for rc, amount in unit.amounts:
        inv = inventories.get(rc)
        if inv is None or not inv.min_unit <= amount <= free[rc]:
            return False
        if amount > inv.effective_max_unit or amount % inv.step_size:
            return False
    return True


def _tree_refusal(
    node: NodeView, request: Request, candidates: list[list[ProviderView]]
) -> Refusal:
    """Why the units without a candidate fit nowhere; a reason that never changes first."""
    refusals = []
    for unit, found in zip(request.units, candidates, strict=True):
        if not found:
            tried = [_fit_unit(node, p, unit) for p in node.providers]
            refusals.append(_unit_refusal(node, unit, [r for r in tried if r is not None]))
    return min(refusals, key=lambda r: r.transient)


def _unit_refusal(node: NodeView, unit: Unit, tried: list[Refusal]) -> Refusal:
    """One refusal for a unit no provider satisfies: every relevant reason in the text."""
    relevant = [r for r in tried if r.kind is not RefusalKind.NO_INVENTORY]
    if not relevant:
        classes = ", ".join(rc for rc, _ in unit.amounts)
        reason = f"no provider of {node.name} has {classes} inventory"
        if unit.granular:
            reason = f"group {unit.group}: {reason}"
        return Refusal(RefusalKind.NO_INVENTORY, reason, node.name, group=unit.group)
    primary = next((r for r in relevant if r.transient), relevant[0])
    if len(relevant) == 1:
        return primary
    what = f"group {unit.group}" if unit.granular else unit.amounts[0][0]
    reasons = "; ".join(r.reason.removeprefix(f"{what}: ") for r in relevant)
    reason = f"{what} fits no provider of {node.name}: {reasons}"
    return dataclasses.replace(primary, reason=reason)


def _search(
    request: Request,
    candidates: list[list[ProviderView]],
    index: int,
    allocations: Allocations,
    taken: set[str],
    chosen: dict[str, str],
    tree: _Tree,
) -> bool:
    """Depth-first: give unit ``index`` and the ones after it a provider, first fit wins.

    ``chosen``: the provider of each granular group so far, for ``same_subtree``.
    """
    if index == len(request.units):
        if request.same_subtree:
            return tree.one_subtree({chosen[g] for g in request.same_subtree})
        return True
    unit = request.units[index]
    isolated = request.isolate and unit.granular
    for provider in candidates[index]:
        if isolated and provider.uuid in taken:
            continue
        current = allocations.get(provider.uuid, {})
        if not _has_room(provider, unit, current):
            continue
        _add(allocations, provider.uuid, unit.amounts, 1)
        if isolated:
            taken.add(provider.uuid)
        if unit.granular:
            chosen[unit.group] = provider.uuid
        if _search(request, candidates, index + 1, allocations, taken, chosen, tree):
            return True
        _add(allocations, provider.uuid, unit.amounts, -1)
        if isolated:
            taken.discard(provider.uuid)
    return False


def _has_room(provider: ProviderView, unit: Unit, current: Mapping[str, int]) -> bool:
    for rc, amount in unit.amounts:
        total = current.get(rc, 0) + amount
        if total > provider.free(rc) or total > provider.inventories[rc].effective_max_unit:
            return False
    return True


def _add(
    allocations: Allocations, uuid: str, amounts: Iterable[tuple[str, int]], sign: int
) -> None:
    current = allocations.setdefault(uuid, {})
    for rc, amount in amounts:
        current[rc] = current.get(rc, 0) + sign * amount
        if not current[rc]:
            del current[rc]
    if not current:
        del allocations[uuid]


def _combination(node: NodeView, request: Request) -> Refusal:
    names = ", ".join(u.group or u.amounts[0][0] for u in request.units)
    reason = f"{names} each fit some provider of {node.name} but not all at once"
    if request.isolate:
        reason += " (group_policy=isolate needs a separate provider per granular group)"
    if request.same_subtree:
        groups = ",".join(sorted(request.same_subtree, key=lambda g: (len(g), g)))
        reason += f" (same_subtree={groups} needs their providers under one of them)"
    return Refusal(RefusalKind.COMBINATION, reason, node.name)
