"""Hypervisors, as Nova's ``os-hypervisors`` shows them: read-only admin views.

Every root provider an agent registers for its host is one hypervisor (a compute
node: ``hypervisor_hostname`` is the node's name), with the ledger's integer id
(before microversion 2.53) and its provider uuid (from 2.53). Its state and
status are its host's compute service's; its sizes are the root provider's
inventories and usages (where Nova's compute node keeps them), and what runs
there is the provider's consumers (``rp:<uuid>:consumers``), never a scan of
the instances. ``current_workload`` counts those still building on the host.

No HTTP here: :mod:`qsched.api.hypervisors` calls the front door's
:class:`qsched.compute.parts.Hypervisors`, which merges this, one cell's, over
cells. Every call is an admin view: a page costs O(its hypervisors and their
servers); a pattern search and the statistics read every hypervisor, a page of
providers at a time.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence

from qsched import exception
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import Provider, Service
from qsched.policy import Policy
from qsched.resources import DISK_GB, MEMORY_MB, VCPU

#: Hypervisors read per round trip when every one is read (a search, the statistics).
CHUNK = 500
#: What Nova's fake virt driver reports, the only driver qsched agents run.
HYPERVISOR_TYPE = "fake"
HYPERVISOR_VERSION = 1000
_CPU_FEATURE_PREFIX = "HW_CPU_X86_"


class HypervisorNotFound(exception.NotFound):
    msg_fmt = "Hypervisor with ID '{id}' could not be found."


class NoHypervisorMatches(exception.NotFound):
    msg_fmt = "No hypervisor matching '{pattern}' could be found."


@dataclasses.dataclass(frozen=True)
class Server:
    """One server on a hypervisor, as Nova lists them."""

    uuid: str
    name: str


@dataclasses.dataclass(frozen=True)
class HypervisorView:
    """A hypervisor with its service: ``up`` (the host's heartbeat, not forced down),
    the instances holding allocations there (``consumers``), how many of them are
    still building (``building``), and its servers when they were asked for."""

    id: int
    provider: Provider
    service: Service
    up: bool
    consumers: frozenset[str]
    building: int
    servers: tuple[Server, ...] | None = None

    @property
    def uuid(self) -> str:
        return self.provider.uuid

    @property
    def hostname(self) -> str:
        return self.provider.name

    def total(self, resource_class: str) -> int:
        inventory = self.provider.inventories.get(resource_class)
        return inventory.total if inventory else 0

    def used(self, resource_class: str) -> int:
        """What instances use, plus what the host keeps for itself (Nova counts its
        reserved memory and disk as used)."""
        inventory = self.provider.inventories.get(resource_class)
        reserved = inventory.reserved if inventory and resource_class != VCPU else 0
        return self.provider.usages.get(resource_class, 0) + reserved

    @property
    def cpu_features(self) -> list[str]:
        """The CPU flags the node's traits name (``HW_CPU_X86_AVX2`` is ``avx2``)."""
        return sorted(
            t[len(_CPU_FEATURE_PREFIX) :].lower()
            for t in self.provider.traits
            if t.startswith(_CPU_FEATURE_PREFIX)
        )


@dataclasses.dataclass(frozen=True)
class Statistics:
    """Sums over the hypervisors of enabled services, as Nova's statistics add them."""

    count: int = 0
    vcpus: int = 0
    vcpus_used: int = 0
    memory_mb: int = 0
    memory_mb_used: int = 0
    local_gb: int = 0
    local_gb_used: int = 0
    running_vms: int = 0
    current_workload: int = 0

    def add(self, view: HypervisorView) -> Statistics:
        return Statistics(
            self.count + 1,
            self.vcpus + view.total(VCPU), self.vcpus_used + view.used(VCPU),
            self.memory_mb + view.total(MEMORY_MB), self.memory_mb_used + view.used(MEMORY_MB),
            self.local_gb + view.total(DISK_GB), self.local_gb_used + view.used(DISK_GB),
            self.running_vms + len(view.consumers), self.current_workload + view.building,
        )  # fmt: skip


class HypervisorAPI:
    """Read the hypervisors of one cell, as policy allows (see the module docstring)."""

    def __init__(self, stores: Stores, policy: Policy | None = None) -> None:
        self.stores = stores
        self.policy = policy or Policy()

    def authorize(self, context: RequestContext, rule: str) -> None:
        """Check one of :mod:`qsched.policies.hypervisors` (each route has its own), before
        anything else is read.

        :raises Forbidden: ``rule`` refuses the caller.
        """
        self.policy.authorize(context, rule, {})

    def page(
        self,
        limit: int | None,
        marker: int | str | None = None,
        with_servers: bool = False,
    ) -> builtins.list[HypervisorView]:
        """At most ``limit`` hypervisors by id (None: every one), after the one named
        ``marker`` (its integer id, or from 2.53 its uuid). The caller authorized the call.

        :raises MarkerNotFound: no hypervisor is ``marker`` (400).
        """
        after = 0 if marker is None else self._marker_id(marker)
        views: builtins.list[HypervisorView] = []
        hosts = _Hosts(self.stores, every=limit is None)
        while limit is None or len(views) < limit:  # a node without a service is left out
            found = self.stores.ledger.hypervisors(after, limit and limit - len(views))
            views += self._views(found, with_servers, hosts=hosts)
            if limit is None or not found:
                break
            after = found[-1][0]
        return views

    def search(self, pattern: str, with_servers: bool = False) -> builtins.list[HypervisorView]:
        """Every hypervisor whose name contains ``pattern`` (Nova's ``LIKE %pattern%``).

        :raises NoHypervisorMatches: none does (404).
        """
        hosts = _Hosts(self.stores, every=True)
        matches = [
            view
            for chunk in self._chunks()
            for view in self._views(chunk, with_servers, lambda p: pattern in p.name, hosts)
        ]
        if not matches:
            raise NoHypervisorMatches(pattern=pattern)
        return matches

    def get(self, ref: int | str, with_servers: bool = False) -> HypervisorView:
        """One hypervisor by integer id, or from 2.53 by uuid.

        :raises HypervisorNotFound: no such hypervisor, or its host has no service (404).
        """
        ledger = self.stores.ledger
        if isinstance(ref, int):
            uuid = ledger.hypervisor_uuid(ref)
            ids = {} if uuid is None else {uuid: ref}
        else:
            ids = ledger.hypervisor_ids([ref])
        views = self._views([(n, u) for u, n in ids.items()], with_servers)
        if not views:
            raise HypervisorNotFound(id=ref)
        return views[0]

    def statistics(self) -> Statistics:
        """Sums over every hypervisor whose service is enabled (Nova's rule)."""
        total, hosts = Statistics(), _Hosts(self.stores, every=True)
        for chunk in self._chunks():
            for view in self._views(chunk, False, hosts=hosts):
                if not view.service.disabled:
                    total = total.add(view)
        return total

    def _marker_id(self, marker: int | str) -> int:
        if isinstance(marker, int):
            found = self.stores.ledger.hypervisor_uuid(marker) is not None
            if found:
                return marker
        else:
            ids = self.stores.ledger.hypervisor_ids([marker])
            if marker in ids:
                return ids[marker]
        raise exception.MarkerNotFound(marker=marker)

    def _chunks(self) -> Iterator[builtins.list[tuple[int, str]]]:
        after = 0
        while chunk := self.stores.ledger.hypervisors(after, CHUNK):
            yield chunk
            after = chunk[-1][0]

    def _views(
        self,
        found: Sequence[tuple[int, str]],
        with_servers: bool,
        keep: Callable[[Provider], bool] | None = None,
        hosts: _Hosts | None = None,
    ) -> builtins.list[HypervisorView]:
        """Views of ``found`` (id, uuid), in that order, those ``keep`` keeps; those
        whose host lost its service are left out, as Nova leaves out a compute node
        without one. ``hosts``: what a scan read of the hosts already."""
        ledger = self.stores.ledger
        providers = ledger.get_providers([uuid for _, uuid in found])
        if keep is not None:
            providers = {u: p for u, p in providers.items() if keep(p)}
        by_host = (hosts or _Hosts(self.stores)).read(
            {p.host for p in providers.values() if p.host}
        )
        consumers = ledger.providers_consumers(list(providers))
        names = self._names(set().union(*consumers.values())) if with_servers else {}
        views = []
        for hypervisor_id, uuid in found:
            provider = providers.get(uuid)
            host = by_host.get(provider.host or "") if provider else None
            if provider is None or host is None:
                continue
            service, up, building = host
            held = frozenset(consumers.get(uuid, ()))
            servers = None
            if with_servers:
                servers = tuple(Server(u, names[u]) for u in sorted(held) if u in names)
            views.append(
                HypervisorView(hypervisor_id, provider, service, up, held,
                               len(held & building), servers)
            )  # fmt: skip
        return views

    def _names(self, uuids: set[str]) -> Mapping[str, str]:
        records = self.stores.instances.get_many(sorted(uuids))
        return {uuid: record.name for uuid, record in records.items()}


class _Hosts:
    """Per host: its service, whether it is up, what it is building; each host read
    once. For a scan (``every``) the services and heartbeats are read in two pipelined
    passes first, leaving one round trip per host (its builds); else three (O(1) each).
    """

    def __init__(self, stores: Stores, every: bool = False) -> None:
        self.stores = stores
        self.found: dict[str, tuple[Service, bool, frozenset[str]] | None] = {}
        self.services: dict[str, Service] | None = None
        self.alive: dict[str, bool] = {}
        if every:
            self.services = {s.host: s for s in stores.agents.services()}
            self.alive = {agent.host: agent.alive for agent in stores.agents.list()}

    def read(self, hosts: set[str]) -> dict[str, tuple[Service, bool, frozenset[str]]]:
        """Those of ``hosts`` that have a service."""
        for host in sorted(hosts - self.found.keys()):
            self.found[host] = self._one(host)
        return {host: found for host in hosts if (found := self.found[host]) is not None}

    def _one(self, host: str) -> tuple[Service, bool, frozenset[str]] | None:
        agents = self.stores.agents
        if self.services is not None:
            service, up = self.services.get(host), self.alive.get(host, False)
        else:
            try:
                service, up = agents.service(host), agents.alive(host)
            except exception.ComputeHostNotFound:
                service, up = None, False
        if service is None:
            return None
        return service, up, frozenset(self.stores.instances.building(host))
