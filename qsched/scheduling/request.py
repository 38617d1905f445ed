"""What a request asks of a node, compiled once per scheduling class, and why a node
refuses it.

A :class:`Request` is a flavor's request groups (:func:`qsched.flavors.request_groups`)
plus the constraints a boot adds, compiled into the units :mod:`qsched.scheduling.fit`
checks (a granular group is one unit; the unnumbered group's classes one unit each), its
total demand by resource class, and the traits its root provider must and must not
carry. A :class:`Refusal` says why a node cannot take one (its :class:`RefusalKind`:
capacity, traits, aggregates..., transient or not).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from qsched.flavors import Constraints, Flavor, RequestGroup, request_groups, same_subtree

Allocations = dict[str, dict[str, int]]
"""{provider uuid: {resource class: amount}}"""


NO_CONSTRAINTS = Constraints()


class RefusalKind(enum.StrEnum):
    """Why a request does not fit a node; CAPACITY and COMBINATION may change with usage."""

    AVAILABILITY_ZONE = "availability_zone"
    AGGREGATE = "aggregate"
    REQUIRED_TRAIT = "required_trait"
    FORBIDDEN_TRAIT = "forbidden_trait"
    NO_INVENTORY = "no_inventory"
    MIN_UNIT = "min_unit"
    MAX_UNIT = "max_unit"
    STEP_SIZE = "step_size"
    CAPACITY = "capacity"
    COMBINATION = "combination"
    SERVER_GROUP = "server_group"  # a host the claim refused for the group's policy
    HOST_RULE = "host_rule"  # a host the claim refused for the request's host rule
    CONFLICT = "conflict"  # the node fits, but its claims kept failing in the ledger


_TRANSIENT = frozenset({RefusalKind.CAPACITY, RefusalKind.COMBINATION, RefusalKind.SERVER_GROUP,
                        RefusalKind.CONFLICT})  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A request does not fit a node: ``reason`` for people, the other fields for code.

    ``group`` is the request group's suffix ("" for the unnumbered group), ``provider`` the
    uuid of the provider the reason is about, ``requested`` and ``free`` amounts of
    ``resource_class``.
    """

    kind: RefusalKind
    reason: str
    node: str
    provider: str | None = None
    resource_class: str | None = None
    requested: int | None = None
    free: int | None = None
    trait: str | None = None
    aggregate: str | None = None
    availability_zone: str | None = None
    group: str | None = None

    @property
    def transient(self) -> bool:
        """True when the request may fit once usage drops; False when it never will."""
        return self.kind in _TRANSIENT

    def __str__(self) -> str:
        return self.reason


@dataclasses.dataclass(frozen=True, slots=True)
class Unit:
    """What one provider must satisfy: a granular group, or one unnumbered class."""

    group: str
    amounts: tuple[tuple[str, int], ...]
    required: frozenset[str] = frozenset()
    forbidden: frozenset[str] = frozenset()

    @property
    def granular(self) -> bool:
        return bool(self.group)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A request compiled once and fitted many times (one per scheduling class).

    ``groups`` as :func:`qsched.flavors.request_groups` returns them; ``isolate`` is
    ``group_policy=isolate``; ``same_subtree`` the suffixes of granular groups whose
    providers must all sit under one of them.
    """

    groups: tuple[RequestGroup, ...]
    constraints: Constraints = NO_CONSTRAINTS
    isolate: bool = False
    same_subtree: frozenset[str] = frozenset()
    units: tuple[Unit, ...] = dataclasses.field(init=False, repr=False, compare=False)
    demand: tuple[tuple[str, int], ...] = dataclasses.field(init=False, repr=False, compare=False)
    merged: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)
    granular_count: int = dataclasses.field(init=False, repr=False, compare=False)
    root_required: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)
    root_forbidden: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups = tuple(self.groups)
        unnumbered = [g for g in groups if not g.suffix]
        shared: dict[str, int] = {}
        for g in unnumbered:
            for rc, amount in g.resources.items():
                shared[rc] = shared.get(rc, 0) + amount
        units = [
            Unit(g.suffix, _nonzero(g.resources), g.required_traits, g.forbidden_traits)
            for g in sorted((g for g in groups if g.suffix), key=_suffix_order)
        ]
        units += [Unit("", ((rc, amount),)) for rc, amount in shared.items() if amount]
        self._set("groups", groups)
        self._set("units", tuple(units))
        self._set("granular_count", sum(u.granular for u in units))
        self._set_demand(units)
        self._set("root_required", _union(unnumbered, "required_traits", self.constraints))
        self._set("root_forbidden", _union(unnumbered, "forbidden_traits", self.constraints))

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def _set_demand(self, units: list[Unit]) -> None:
        demand: dict[str, int] = {}
        merged: set[str] = set()
        for unit in units:
            for rc, amount in unit.amounts:
                if rc in demand:
                    merged.add(rc)
                demand[rc] = demand.get(rc, 0) + amount
        self._set("demand", tuple(demand.items()))
        self._set("merged", frozenset(merged))

    @classmethod
    def from_flavor(cls, flavor: Flavor, constraints: Constraints = NO_CONSTRAINTS) -> Request:
        """The request of a flavor's extra specs plus constraints.

        :raises Invalid: malformed extra specs.
        """
        isolate = flavor.extra_specs.get("group_policy") == "isolate"
        return cls(request_groups(flavor), constraints, isolate, same_subtree(flavor))


def _suffix_order(group: RequestGroup) -> tuple[int, str]:
    return len(group.suffix), group.suffix  # "2" before "10"


def _nonzero(resources: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple((rc, amount) for rc, amount in resources.items() if amount)


def _union(groups: list[RequestGroup], field: str, constraints: Constraints) -> frozenset[str]:
    traits: set[str] = set(getattr(constraints, field))
    for g in groups:
        traits |= getattr(g, field)
    return frozenset(traits)


def flavor_demand(flavor: Flavor) -> dict[str, int]:
    """What ``flavor`` asks of providers in all, by resource class, over its request
    groups (classes asked for 0 left out).

    :raises Invalid: malformed extra specs.
    """
    return {rc: n for rc, n in Request.from_flavor(flavor).demand if n}
