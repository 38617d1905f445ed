"""Reads behind qsched-admin: rows of queues, agents, providers, servers; the "why" inputs.

Admin views, so they may scan: every agent, every provider, the waiting
requests of the deadline index. Nothing here writes. Rows are plain dicts of
raw values, described for scripts in :mod:`qsched.admin.schemas`.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from qsched import exception
from qsched.admin import capacity, why
from qsched.bus.base import Bus, QueueStats
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.base import AgentInfo, Event, Instance, Provider, State
from qsched.resources import SHARES_VIA_AGGREGATE
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.records import BootDetails, details
from qsched.scheduling.request import Request
from qsched.scheduling.views import ProviderView

CHUNK = 500  # commands per pipeline round trip in scans

T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- providers, in bulk -------------------------------------------------------------------


def all_providers(stores: Stores) -> list[Provider]:
    """Every provider of the cell, sorted by uuid (read in chunked round trips)."""
    return stores.ledger.list_providers()


# -- queues -------------------------------------------------------------------------------


@dataclasses.dataclass
class Waiting:
    """Requests of one class waiting for a host (BUILD, not claimed), from the ledger."""

    count: int = 0
    oldest_created: float | None = None


def waiting_by_class(stores: Stores) -> dict[str, Waiting]:
    """Scan the deadline index: per class, how many wait and since when the oldest does."""
    fields = ("state", "host", "created_at", "extra")
    found: defaultdict[str, Waiting] = defaultdict(Waiting)
    for chunk in chunks(stores.inspector.deadline_index()):
        for record in stores.inspector.instance_records(chunk, fields).values():
            if record.get("state") != State.BUILD.value or record.get("host"):
                continue
            waiting = found[_class_of(record.get("extra"))]
            waiting.count += 1
            created_at = float(record.get("created_at") or 0)
            if waiting.oldest_created is None or created_at < waiting.oldest_created:
                waiting.oldest_created = created_at
    return dict(found)


def _class_of(extra: str | None) -> str:
    """The class of a stored record's ``extra`` ("?" for a record no front door made)."""
    try:
        return BootDetails.from_extra(json.loads(extra or "{}")).scheduling_class
    except exception.Invalid:
        return "?"


def live_agents(stores: Stores) -> list[AgentInfo]:
    return [a for a in stores.agents.list() if a.alive]


def consumers_by_class(agents: Iterable[AgentInfo]) -> dict[str, list[str]]:
    """Per class, the live agents whose last heartbeat says they consume it."""
    found: defaultdict[str, list[str]] = defaultdict(list)
    for agent in agents:
        if agent.alive:
            for cls in agent.detail.get("classes") or ():
                found[str(cls)].append(agent.host)
    return dict(found)


def known_classes(stores: Stores, waiting: Mapping[str, Waiting]) -> list[str]:
    """The live classes, plus those requests still wait on (a changed flavor drops its class)."""
    return sorted(set(stores.agents.classes()) | set(waiting))


def queue_rows(stores: Stores, bus: Bus, now: float) -> list[dict[str, Any]]:
    """One row per scheduling class, then one for the dead letters."""
    waiting = waiting_by_class(stores)
    consumers = consumers_by_class(stores.agents.list())
    rows = []
    for cls in known_classes(stores, waiting):
        stats, exists = _stats(bus, cls)
        wait = waiting.get(cls, Waiting())
        rows.append(
            {
                "queue": stats.queue,
                "class": cls,
                "exists": exists,
                "ready": stats.ready,
                "unacked": stats.unacked,
                "consumers": stats.consumers,
                "agents": len(consumers.get(cls, ())),
                "waiting": wait.count,
                "oldest_s": None if wait.oldest_created is None else now - wait.oldest_created,
            }
        )
    dead = bus.dead_letter_stats()
    rows.append({"queue": dead.queue, "class": None, "exists": True, "ready": dead.ready,
                 "unacked": dead.unacked, "consumers": dead.consumers, "agents": None,
                 "waiting": None, "oldest_s": None})  # fmt: skip
    return rows


def _stats(bus: Bus, cls: str) -> tuple[QueueStats, bool]:
    try:
        return bus.queue_stats(cls), True
    except exception.NotFound:  # RabbitMQ: nobody published to it or consumed it yet
        return QueueStats(bus.names.boot_queue(cls), None, None, None), False


# -- agents and capacity ------------------------------------------------------------------


def zones(agents: Iterable[AgentInfo]) -> dict[str, str | None]:
    """Availability zones of hosts whose heartbeat tells it."""
    return {a.host: a.detail["availability_zone"] for a in agents
            if "availability_zone" in a.detail}  # fmt: skip


def agent_rows(stores: Stores, now: float) -> list[dict[str, Any]]:
    """Every agent seen in the cell, alive or not, with what its nodes have free."""
    agents = stores.agents.list()
    nodes = capacity.nodes_by_host(all_providers(stores), zones(agents))
    rows = []
    for agent in agents:
        mine = nodes.get(agent.host, [])
        detail = agent.detail
        rows.append(
            {
                "host": agent.host,
                "alive": agent.alive,
                "last_seen": agent.last_seen,
                "age_s": now - agent.last_seen,
                "nodes": detail.get("nodes", len(mine)),
                "classes": list(detail.get("classes") or []),
                "building": detail.get("building"),
                "counters": dict(detail.get("counters") or {}),
                "free": capacity.total_free(mine),
                "largest_free": {rc: f.to_dict() for rc, f in capacity.largest_free(mine).items()},
            }
        )
    return rows


def zone_rows(stores: Stores) -> list[dict[str, Any]]:
    """Every registered availability zone, with the live agents whose heartbeat names it."""
    counts = Counter(zones(live_agents(stores)).values())
    return [{"zone": zone, "agents": counts[zone]} for zone in sorted(stores.agents.zones())]


def cluster_fill(providers: Iterable[Provider]) -> dict[str, dict[str, Any]]:
    """Per resource class: used, capacity and their ratio over every provider."""
    used: Counter[str] = Counter()
    cap: Counter[str] = Counter()
    for p in providers:
        for rc, inv in p.inventories.items():
            cap[rc] += inv.capacity
            used[rc] += p.usages.get(rc, 0)
    return {rc: {"used": used[rc], "capacity": cap[rc],
                 "ratio": round(used[rc] / cap[rc], 4) if cap[rc] else None}
            for rc in sorted(cap, key=capacity.class_order)}  # fmt: skip


# -- providers ----------------------------------------------------------------------------


def provider_row(p: Provider, names: Mapping[str, str]) -> dict[str, Any]:
    root_name = names.get(p.root_uuid or p.uuid, p.name)
    sharing = SHARES_VIA_AGGREGATE in p.traits
    return {
        "uuid": p.uuid,
        "name": p.name,
        "host": None if sharing else capacity.host_of(root_name),
        "sharing": sharing,
        "generation": p.generation,
        "parent_uuid": p.parent_uuid,
        "root_uuid": p.root_uuid,
        "inventories": {rc: _inventory(inv) for rc, inv in sorted(p.inventories.items())},
        "usages": {rc: p.usages.get(rc, 0) for rc in sorted(p.inventories)},
        "traits": sorted(p.traits),
        "aggregates": sorted(p.aggregates),
    }


def _inventory(inv: Any) -> dict[str, Any]:
    return {
        "total": inv.total,
        "reserved": inv.reserved,
        "min_unit": inv.min_unit,
        "max_unit": inv.effective_max_unit,
        "step_size": inv.step_size,
        "allocation_ratio": inv.allocation_ratio,
        "capacity": inv.capacity,
    }


def provider_rows(
    stores: Stores,
    host: str | None = None,
    traits: Sequence[str] = (),
    aggregates: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Providers in tree order (roots by name, each followed by its children, depth
    first, by name), each with its ``depth``; filters: the host, every trait, every
    aggregate."""
    providers = all_providers(stores)
    names = {p.uuid: p.name for p in providers}
    children: dict[str | None, list[Provider]] = {}
    for p in providers:
        children.setdefault(p.parent_uuid, []).append(p)
    ordered: list[dict[str, Any]] = []

    def walk(parent: str | None, depth: int) -> None:
        for p in sorted(children.get(parent, ()), key=lambda p: p.name):
            ordered.append({**provider_row(p, names), "depth": depth})
            walk(p.uuid, depth + 1)

    walk(None, 0)
    return [
        r
        for r in ordered
        if (host is None or r["host"] == host)
        and set(traits) <= set(r["traits"])
        and set(aggregates) <= set(r["aggregates"])
    ]


def find_provider(stores: Stores, ref: str) -> Provider:
    """A provider by uuid or by name (names are unique, as in Placement).

    :raises ProviderNotFound:
    """
    try:
        return stores.ledger.get_provider(ref)
    except exception.ProviderNotFound:
        uuid = stores.inspector.provider_uuid(ref)
        if uuid is None:
            raise
        return stores.ledger.get_provider(uuid)


def provider_doc(stores: Stores, ref: str) -> dict[str, Any]:
    provider = find_provider(stores, ref)
    names = {provider.uuid: provider.name}
    if provider.root_uuid and provider.root_uuid != provider.uuid:
        names[provider.root_uuid] = stores.ledger.get_provider(provider.root_uuid).name
    doc = provider_row(provider, names)
    doc["consumers"] = sorted(stores.ledger.provider_consumers(provider.uuid))
    return doc


# -- allocations, usages, quota -----------------------------------------------------------


def allocations_doc(stores: Stores, consumer_uuid: str) -> dict[str, Any]:
    """A consumer's allocations, with provider names.

    :raises NotFound: the consumer holds nothing (Placement answers an empty set;
        an operator asking by hand wants to know).
    """
    consumer = stores.ledger.get_allocations(consumer_uuid)
    if consumer.generation is None:
        raise exception.NotFound(f"Consumer {consumer_uuid} holds no allocations.")
    providers = stores.ledger.get_providers(sorted(consumer.allocations))
    rows = []
    for rp, amounts in sorted(consumer.allocations.items()):
        name = providers[rp].name if rp in providers else None
        rows += [{"provider": rp, "provider_name": name, "resource_class": rc, "amount": n}
                 for rc, n in sorted(amounts.items())]  # fmt: skip
    return {
        "consumer": consumer.uuid,
        "generation": consumer.generation,
        "project_id": consumer.project_id,
        "user_id": consumer.user_id,
        "allocations": rows,
    }


def quota_doc(stores: Stores, project_id: str) -> dict[str, Any]:
    limits = dataclasses.asdict(stores.quota.get_limits(project_id))
    used = dataclasses.asdict(stores.quota.get_usage(project_id))
    return {
        "project_id": project_id,
        "resources": [{"resource": k, "used": used[k], "limit": limits[k]} for k in limits],
    }


def usages_doc(stores: Stores, project_id: str) -> dict[str, Any]:
    """What a project's allocations hold per resource class, and its quota."""
    usages = stores.ledger.project_usages(project_id)
    return {
        "project_id": project_id,
        "usages": [{"resource_class": rc, "used": n} for rc, n in sorted(usages.items())],
        "quota": quota_doc(stores, project_id)["resources"],
    }


# -- servers ------------------------------------------------------------------------------


def instance_row(inst: Instance) -> dict[str, Any]:
    return {
        "uuid": inst.uuid,
        "name": inst.name,
        "project_id": inst.project_id,
        "state": inst.state.value,
        "task_state": inst.task_state.value or None,
        "host": inst.host,
        "node": inst.node,
        "flavor": inst.flavor.get("name"),
        "scheduling_class": why.scheduling_class(inst),
        "attempts": inst.attempts,
        "created_at": inst.created_at,
    }


def server_rows(stores: Stores, project_id: str, status: str | None) -> list[dict[str, Any]]:
    found = stores.instances.list_project(project_id)
    if status:
        found = [i for i in found if i.state.value == status.upper()]
    return [instance_row(i) for i in sorted(found, key=lambda i: (i.created_at, i.uuid))]


def events_trimmed(stores: Stores, uuid: str) -> int:
    return stores.inspector.events_trimmed(uuid)


def server_doc(stores: Stores, uuid: str) -> dict[str, Any]:
    """The whole record and its history. :raises InstanceNotFound:"""
    inst = stores.instances.get(uuid)
    cls = why.scheduling_class(inst)
    return {
        **instance_row(inst),
        "user_id": inst.user_id,
        "flavor": dict(inst.flavor),
        "fault": dict(inst.fault) if inst.fault else None,
        "updated_at": inst.updated_at,
        "launched_at": inst.launched_at,
        "deadline": inst.deadline,
        "quota": dataclasses.asdict(inst.quota) if inst.quota else None,
        "extra": dict(inst.extra),
        "events_trimmed": events_trimmed(stores, uuid),
        "events": [_event_row(e, cls) for e in stores.instances.events(uuid)],
    }


def _event_row(e: Event, cls: str) -> dict[str, Any]:
    return {"time": e.time, "event": e.event, "host": e.host, "node": e.node,
            "detail": dict(e.detail), "text": why.describe(e, cls)}  # fmt: skip


def diagnose(stores: Stores, uuid: str, now: float, max_attempts: int) -> why.Diagnosis:
    """Why the request of instance ``uuid`` is where it is. :raises InstanceNotFound:"""
    inst = stores.instances.get(uuid)
    events = stores.instances.events(uuid)
    live = None
    if inst.state == State.ERROR or (inst.state == State.BUILD and not inst.host):
        live = live_view(stores, inst)
    return why.diagnose(inst, events, now, max_attempts, live, events_trimmed(stores, uuid),
                        group_view(stores, inst))  # fmt: skip


def group_view(stores: Stores, inst: Instance) -> why.GroupView | None:
    """The instance's server group and where its members hold hosts (None: in no group,
    or the group was deleted)."""
    if inst.group is None:
        return None
    try:
        group = stores.groups.get(inst.group, members=False)
    except exception.GroupNotFound:
        return None
    hosts = stores.groups.hosts(group.uuid)
    return why.GroupView(group.uuid, group.policy, group.max_server_per_host, hosts)


def live_view(stores: Stores, inst: Instance) -> why.Live:
    """Who could take the request now: live agents, its consumers, nodes that fit."""
    cls = why.scheduling_class(inst)
    agents = live_agents(stores)
    hosts = [a.host for a in agents]
    consumers = consumers_by_class(agents).get(cls, [])
    request = _request(stores, inst, cls)
    report = None
    if request is not None:
        asked = request.constraints.availability_zone
        # where an agent does not tell its zone, assume the asked one (and say so)
        node_zones = {a.host: a.detail.get("availability_zone", asked) for a in agents}
        zone_checked = not asked or all("availability_zone" in a.detail for a in agents)
        providers = all_providers(stores)
        by_host = capacity.nodes_by_host(providers, node_zones)
        nodes = [n for host in hosts for n in by_host.get(host, [])]
        sharing = [ProviderView.from_provider(p) for p in providers
                   if SHARES_VIA_AGGREGATE in p.traits]  # fmt: skip
        report = capacity.fit_report(nodes, request, zone_checked, sharing)
    return why.Live(cls, hosts, consumers, report)


def _request(stores: Stores, inst: Instance, cls: str) -> Request | None:
    """The request as agents compile it: the class definition, else the record's own
    flavor and constraints; None for a record that says neither."""
    definition = stores.agents.classes().get(cls)
    try:
        if definition is not None:
            return SchedulingClass.from_definition(definition).request()
        constraints = details(inst).constraints
        return SchedulingClass(Flavor.from_dict(inst.flavor), constraints).request()
    except (exception.Invalid, KeyError, TypeError):
        return None


# -- flavors ------------------------------------------------------------------------------


def flavor_row(flavor: Flavor) -> dict[str, Any]:
    return {**flavor.to_dict(), "is_public": flavor.is_public}
