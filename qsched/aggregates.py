"""Host aggregates, and the request filters that turn them into placement constraints.

An aggregate groups hosts under a name, with metadata. As Nova mirrors its host
aggregates into Placement, the ledger puts each member host's root providers in
the aggregate (``member_of`` then sees it); the metadata drives Nova's request
filters, which :func:`request_filters` applies to a boot before it is routed:

``availability_zone``
    The aggregate's hosts form that zone: a boot into it must land in one of the
    zone's aggregates (Nova's ``map_az_to_placement_aggregate``).
``filter_tenant_id`` (or ``filter_tenant_id<anything>``, one project each)
    With ``[scheduler] limit_tenants_to_placement_aggregate`` the project's boots
    land only in its aggregates; with ``placement_aggregate_required_for_tenants``
    too, a project with none gets NoValidHost (``require_tenant_aggregate``).
``trait:<NAME>=required``
    With ``[scheduler] enable_isolated_aggregate_filtering`` only boots requiring
    every such trait may land in the aggregate (``isolate_aggregates``).
any other key
    Matched by a flavor's ``aggregate_instance_extra_specs:<key>=<value>``: the
    boot lands only in aggregates whose ``<key>`` is ``<value>`` (Nova's
    ``AggregateInstanceExtraSpecsFilter``, exact values; a value of the metadata
    may list several, comma-separated).

The filters read an :class:`AggregateIndex`, built once per change of the
aggregates from all of them, so a boot costs the same whatever the number of
hosts or aggregates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from qsched import exception
from qsched.flavors import AGGREGATE_SPEC_PREFIX, Constraints

ZONE_KEY = "availability_zone"
TENANT_KEY = "filter_tenant_id"
TRAIT_PREFIX = "trait:"


class AggregateNotFound(exception.NotFound):
    msg_fmt = "Aggregate {aggregate_id} could not be found."


class AggregateNameExists(exception.Conflict):
    msg_fmt = "Aggregate {aggregate_name} already exists."


class AggregateHostExists(exception.Conflict):
    msg_fmt = "Aggregate {aggregate_id} already has host {host}."


class AggregateHostNotFound(exception.NotFound):
    msg_fmt = "Aggregate {aggregate_id} has no host {host}."


class InvalidAggregateAction(exception.Invalid):
    """Nova's ``InvalidAggregateAction*``: ``action`` is its verb phrase."""

    msg_fmt = "Cannot {action} {aggregate_id}. Reason: {reason}."


@dataclasses.dataclass(frozen=True)
class Aggregate:
    """One host aggregate as the ledger keeps it."""

    id: int
    uuid: str
    name: str
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hosts: frozenset[str] = frozenset()
    created_at: float = 0.0
    updated_at: float | None = None

    @property
    def availability_zone(self) -> str | None:
        return self.metadata.get(ZONE_KEY) or None

    @property
    def tenants(self) -> frozenset[str]:
        """Projects the ``filter_tenant_id*`` keys name."""
        return frozenset(v for k, v in self.metadata.items() if k.startswith(TENANT_KEY) and v)

    @property
    def isolating_traits(self) -> frozenset[str]:
        """Traits the ``trait:<NAME>=required`` keys name."""
        return frozenset(
            k[len(TRAIT_PREFIX) :]
            for k, v in self.metadata.items()
            if k.startswith(TRAIT_PREFIX) and v == "required"
        )


def check_metadata(changes: Mapping[str, Any]) -> dict[str, str | None]:
    """Metadata changes as ``set_metadata`` takes them: a value, or None to remove the key.

    :raises Invalid: an empty key, a key or value over 255 characters, or an empty zone.
    """
    checked: dict[str, str | None] = {}
    for key, value in changes.items():
        if not isinstance(key, str) or not 0 < len(key) <= 255:
            raise exception.Invalid(reason=f"metadata key {key!r} must be 1-255 characters")
        if value is not None and (not isinstance(value, str) or len(value) > 255):
            raise exception.Invalid(reason=f"metadata value of {key} must be at most 255 "
                                    "characters, or null to remove the key")  # fmt: skip
        checked[key] = value
    return checked


# -- request filters --


@dataclasses.dataclass(frozen=True)
class FilterOptions:
    """The ``[scheduler]`` switches of the request filters, as Nova names them."""

    limit_tenants_to_placement_aggregate: bool = False
    placement_aggregate_required_for_tenants: bool = False
    enable_isolated_aggregate_filtering: bool = False


class NoHostsForTenant(exception.QschedError):
    """The tenant filter leaves no host (Nova's RequestFilterFailed): NoValidHost."""

    msg_fmt = "No valid host was found. No hosts available for tenant {project}"


class AggregateIndex:
    """Every aggregate, indexed by what the request filters ask (built once per change)."""

    def __init__(self, aggregates: Iterable[Aggregate]) -> None:
        self.aggregates = {agg.uuid: agg for agg in aggregates}
        self.by_zone: dict[str, set[str]] = {}
        self.by_tenant: dict[str, set[str]] = {}
        self.by_metadata: dict[tuple[str, str], set[str]] = {}
        self.isolating: dict[str, frozenset[str]] = {}
        for agg in self.aggregates.values():
            if agg.availability_zone:
                self.by_zone.setdefault(agg.availability_zone, set()).add(agg.uuid)
            for tenant in agg.tenants:
                self.by_tenant.setdefault(tenant, set()).add(agg.uuid)
            if agg.isolating_traits:
                self.isolating[agg.uuid] = agg.isolating_traits
            for key, value in agg.metadata.items():
                for one in value.split(","):
                    self.by_metadata.setdefault((key, one.strip()), set()).add(agg.uuid)

    def zones(self) -> set[str]:
        return set(self.by_zone)


def request_filters(
    index: AggregateIndex,
    options: FilterOptions,
    project_id: str,
    constraints: Constraints,
    flavor_traits: frozenset[str],
    extra_specs: Mapping[str, str],
) -> Constraints:
    """``constraints`` with what the aggregates add, as Nova's request filters do.

    ``flavor_traits``: the traits the flavor requires (its extra specs); the image's
    are in ``constraints`` already.

    :raises NoHostsForTenant: the tenant filter is required and the project has no
        aggregate.
    """
    any_of = list(constraints.member_of_any)
    forbidden = set(constraints.forbidden_aggregates)
    zone = constraints.availability_zone
    if zone and zone in index.by_zone:
        any_of.append(frozenset(index.by_zone[zone]))
    if options.limit_tenants_to_placement_aggregate:
        mine = index.by_tenant.get(project_id)
        if mine:
            any_of.append(frozenset(mine))
        elif options.placement_aggregate_required_for_tenants:
            raise NoHostsForTenant(project=project_id)
    if options.enable_isolated_aggregate_filtering:
        required = flavor_traits | constraints.required_traits
        forbidden |= {uuid for uuid, traits in index.isolating.items() if not traits <= required}
    for key, value in sorted(extra_specs.items()):
        if key.startswith(AGGREGATE_SPEC_PREFIX):
            wanted = (key[len(AGGREGATE_SPEC_PREFIX) :], value.strip())
            any_of.append(frozenset(index.by_metadata.get(wanted, ())))
    return dataclasses.replace(
        constraints, member_of_any=tuple(any_of), forbidden_aggregates=frozenset(forbidden)
    )
