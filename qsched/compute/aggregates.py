"""Host aggregates for the API: the admin's actions, and the routing a boot takes from them.

:class:`AggregateAPI` checks ``os_compute_api:os-aggregates:*`` and calls the
ledger's :class:`~qsched.ledger.base.AggregateStore`. :meth:`AggregateAPI.route`
is the boot's side: Nova's request filters (:func:`qsched.aggregates.request_filters`)
on an :class:`~qsched.aggregates.AggregateIndex` kept in memory and rebuilt when
the ledger's aggregate version moves. A boot that needs no aggregate (no zone of
an aggregate, no filter switched on, no ``aggregate_instance_extra_specs``) does
not read the ledger for it at all; one that does reads one number.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping

from qsched.aggregates import (
    AGGREGATE_SPEC_PREFIX,
    Aggregate,
    AggregateIndex,
    FilterOptions,
    NoHostsForTenant,
    request_filters,
)
from qsched.context import RequestContext
from qsched.flavors import Constraints, Flavor, request_groups
from qsched.ledger import Stores
from qsched.policies import aggregates as aggregates_policy
from qsched.policy import Policy


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a boot may go: its constraints for routing, the zone it asked for, and
    why it cannot go anywhere (a NoValidHost to record at once), if so."""

    constraints: Constraints
    requested_zone: str | None
    unplaceable: str | None = None


class AggregateAPI:
    """Aggregates of one cell (see the module docstring)."""

    def __init__(self, stores: Stores, policy: Policy, filters: FilterOptions) -> None:
        self.store = stores.aggregates
        self.policy = policy
        self.filters = filters
        self._index = AggregateIndex(())
        self._version = -1
        self._lock = threading.Lock()

    # -- the admin's actions --

    def list(self, context: RequestContext) -> list[Aggregate]:
        self.policy.authorize(context, aggregates_policy.INDEX)
        return self.store.list()

    def create(
        self,
        context: RequestContext,
        name: str,
        zone: str | None,
        aggregate_id: int | None = None,
        uuid: str | None = None,
    ) -> Aggregate:
        """``aggregate_id`` and ``uuid``: given by the front door of several cells, the
        same in every cell (None: the cell's next id and a new uuid)."""
        self.policy.authorize(context, aggregates_policy.CREATE)
        return self.store.create(name, zone, aggregate_id, uuid)

    def get(self, context: RequestContext, aggregate_id: int) -> Aggregate:
        self.policy.authorize(context, aggregates_policy.SHOW)
        return self.store.get(aggregate_id)

    def update(
        self, context: RequestContext, aggregate_id: int, changes: Mapping[str, str | None]
    ) -> Aggregate:
        self.policy.authorize(context, aggregates_policy.UPDATE)
        return self.store.update(aggregate_id, changes)

    def delete(self, context: RequestContext, aggregate_id: int) -> None:
        self.policy.authorize(context, aggregates_policy.DELETE)
        self.store.delete(aggregate_id)

    def add_host(self, context: RequestContext, aggregate_id: int, host: str) -> Aggregate:
        self.policy.authorize(context, aggregates_policy.ADD_HOST)
        return self.store.add_host(aggregate_id, host)

    def remove_host(self, context: RequestContext, aggregate_id: int, host: str) -> Aggregate:
        self.policy.authorize(context, aggregates_policy.REMOVE_HOST)
        return self.store.remove_host(aggregate_id, host)

    def set_metadata(
        self, context: RequestContext, aggregate_id: int, changes: Mapping[str, str | None]
    ) -> Aggregate:
        self.policy.authorize(context, aggregates_policy.SET_METADATA)
        return self.store.set_metadata(aggregate_id, changes)

    # -- a boot's routing --

    def has_zone(self, zone: str) -> bool:
        """Whether some aggregate makes ``zone`` (reads the version once)."""
        return zone in self.index().by_zone

    def route(self, project_id: str, constraints: Constraints, flavor: Flavor) -> Route:
        """The constraints a boot is routed by, once the aggregates had their say.

        A zone some aggregate makes becomes "one of the zone's aggregates"
        (``member_of_any``) and leaves the constraints, so that hosts join a zone
        by joining its aggregate; the zone is still what the boot asked for.
        """
        zone = constraints.availability_zone
        specs = flavor.extra_specs
        wanted = (
            zone
            or self.filters.limit_tenants_to_placement_aggregate
            or self.filters.enable_isolated_aggregate_filtering
            or any(key.startswith(AGGREGATE_SPEC_PREFIX) for key in specs)
        )
        if not wanted:
            return Route(constraints, zone)
        index = self.index()
        flavor_traits = frozenset().union(*(g.required_traits for g in request_groups(flavor)))
        try:
            routed = request_filters(
                index, self.filters, project_id, constraints, flavor_traits, specs
            )
        except NoHostsForTenant as exc:
            nowhere = dataclasses.replace(constraints, member_of_any=(frozenset(),))
            return Route(nowhere, zone, unplaceable=str(exc))
        if zone and zone in index.by_zone:
            routed = dataclasses.replace(routed, availability_zone=None)
        return Route(routed, zone)

    def index(self) -> AggregateIndex:
        """The aggregates as the filters read them, rebuilt when the ledger's version moved."""
        version = self.store.version()
        if version != self._version:
            with self._lock:
                if version != self._version:
                    self._index = AggregateIndex(self.store.list())
                    self._version = version
        return self._index
