"""Availability zones, as Nova's ``os-availability-zone`` shows them.

A zone is one an agent registered (its ``[agent] availability_zone``) or one an
aggregate's ``availability_zone`` metadata makes. A host serves its agent's zone
and its aggregate's, as boots are routed (:meth:`qsched.compute.aggregates.AggregateAPI.route`).
A zone is available while one host serving it is up and its service enabled and
not forced down (:meth:`qsched.ledger.base.AgentRegistry.zones_available`).

The list is anyone's and costs O(number of zones): the registered zones, the
aggregate index the API keeps in memory, and one count per zone. The detail is
an admin view that scans the cell's services. qsched runs no conductor or
scheduler service, so Nova's ``internal`` zone is never listed.

No HTTP here: :mod:`qsched.api.availability_zones` calls the front door's
:class:`qsched.compute.parts.Zones`, which merges this, one cell's, over cells.
"""

from __future__ import annotations

import builtins
import dataclasses

from qsched.aggregates import AggregateIndex
from qsched.compute.aggregates import AggregateAPI
from qsched.compute.services import ServiceAPI, ServiceView
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.policies import availability_zone as zone_policy
from qsched.policy import Policy


@dataclasses.dataclass(frozen=True)
class Zone:
    """One zone, whether it is available, and (in the detail) the services of its
    hosts when it is: host -> its enabled compute service."""

    name: str
    available: bool
    hosts: dict[str, ServiceView] | None = None


class ZoneAPI:
    """The availability zones of one cell (see the module docstring)."""

    def __init__(self, stores: Stores, policy: Policy, aggregates: AggregateAPI) -> None:
        self.stores = stores
        self.policy = policy
        self.aggregates = aggregates

    def list(self, context: RequestContext) -> builtins.list[Zone]:
        """Every zone, available ones first, each by name (O(number of zones)).

        :raises Forbidden: ``os_compute_api:os-availability-zone:list`` refuses the caller.
        """
        self.policy.authorize(context, zone_policy.LIST, {})
        return self._zones()

    def detail(self, context: RequestContext) -> builtins.list[Zone]:
        """Every zone; an available one with its hosts' enabled services, as Nova
        lists them (an admin view: it scans the services).

        :raises Forbidden: ``os_compute_api:os-availability-zone:detail`` refuses the caller.
        """
        self.policy.authorize(context, zone_policy.DETAIL, {})
        aggregate_zone = aggregate_zones(self.aggregates.index())
        services = ServiceAPI(self.stores, self.policy)
        hosts: dict[str, dict[str, ServiceView]] = {}
        for view in services.views():
            if view.service.disabled:
                continue  # as Nova: a disabled service is in no zone's hosts
            host = view.service.host
            for zone in {view.service.zone, aggregate_zone.get(host)} - {None}:
                hosts.setdefault(str(zone), {})[host] = view
        return [
            dataclasses.replace(zone, hosts=hosts.get(zone.name, {})) if zone.available else zone
            for zone in self._zones()
        ]

    def _zones(self) -> builtins.list[Zone]:
        names = self.stores.agents.zones() | self.aggregates.index().zones()
        available = self.stores.agents.zones_available(names)
        zones = [Zone(name, available[name]) for name in names]
        return sorted(zones, key=lambda zone: (not zone.available, zone.name))


def aggregate_zones(index: AggregateIndex) -> dict[str, str]:
    """Host -> the zone its aggregate makes (a host is in one such zone at most)."""
    return {
        host: agg.availability_zone
        for agg in index.aggregates.values()
        if agg.availability_zone
        for host in agg.hosts
    }
