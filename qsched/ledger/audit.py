"""Check the ledger's invariants from its own records, independently of the services.

An admin view: it scans every provider, consumer, quota record and instance of
the cell, through :class:`~qsched.ledger.base.Inspector` and the
ledger's own reads, so it works on any backend. Use it in tests, the demo
summary and fault-injection runs, never on a request path.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from typing import Any

from qsched import exception
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.base import HostRule, State
from qsched.scheduling.request import flavor_demand

_HOLDING = (State.BUILD.value, State.ACTIVE.value)


@dataclasses.dataclass
class AuditReport:
    providers: int = 0
    consumers: int = 0
    instances: Counter[str] = dataclasses.field(default_factory=Counter)  # by state
    overcommitted: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    usage_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    orphan_allocations: list[str] = dataclasses.field(default_factory=list)
    instance_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    quota_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    group_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: instances placed where their host rule (same_host, different_host, 2.74) forbids
    host_rule_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: a front door's instances holding other amounts than their own flavor asks
    flavor_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.overcommitted
            or self.usage_mismatches
            or self.orphan_allocations
            or self.instance_mismatches
            or self.quota_mismatches
            or self.group_mismatches
            or self.host_rule_mismatches
            or self.flavor_mismatches
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"instances": dict(self.instances), "ok": self.ok}


@dataclasses.dataclass
class _Scan:
    """What the scan sums up, to compare with the counters the scripts keep."""

    by_provider: defaultdict[str, Counter[str]] = dataclasses.field(
        default_factory=lambda: defaultdict(Counter)
    )
    by_project: defaultdict[str, Counter[str]] = dataclasses.field(
        default_factory=lambda: defaultdict(Counter)
    )
    placed_on: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # consumer -> rps
    held: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)  # consumer -> sums
    records: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)


def audit(stores: Stores) -> AuditReport:
    """Scan the cell and report every broken invariant."""
    report, scan = AuditReport(), _Scan()
    scan.records = _instances(stores)
    report.instances.update(r.get("state", "?") for r in scan.records.values())
    _sum_consumers(stores, report, scan)
    _check_providers(stores, report, scan)
    _check_projects(stores, report, scan)
    _check_instances(report, scan)
    _check_quota(stores, report, scan)
    _check_groups(stores, report, scan)
    _check_host_rules(report, scan)
    _check_flavors(report, scan)
    return report


_FIELDS = ("state", "host", "node", "project_id", "group", "group_host", "group_move_host",
           "hosts", "class", "flavor", "migration", "shelved")  # fmt: skip


def _instances(stores: Stores) -> dict[str, dict[str, str]]:
    found = stores.inspector.instance_records(fields=_FIELDS)
    return {uuid: {field: r.get(field, "") for field in _FIELDS}
            for uuid, r in found.items() if "state" in r}  # fmt: skip


def _sum_consumers(stores: Stores, report: AuditReport, scan: _Scan) -> None:
    for uuid, consumer in stores.inspector.consumers().items():
        report.consumers += 1
        scan.placed_on[uuid] = set(consumer.allocations)
        held = scan.held[uuid] = Counter()
        for rp, amounts in consumer.allocations.items():
            held.update(amounts)
            scan.by_provider[rp].update(amounts)
            scan.by_project[consumer.project_id or ""].update(amounts)
        record = scan.records.get(uuid)
        if record is not None and record["state"] not in _HOLDING:
            report.orphan_allocations.append(uuid)


def _check_providers(stores: Stores, report: AuditReport, scan: _Scan) -> None:
    providers = stores.ledger.list_providers()
    consumers_of = stores.ledger.providers_consumers([p.uuid for p in providers])
    expected_of: defaultdict[str, set[str]] = defaultdict(set)
    for consumer, rps in scan.placed_on.items():
        for rp in rps:
            expected_of[rp].add(consumer)
    for provider in providers:
        report.providers += 1
        summed = scan.by_provider[provider.uuid]
        for rc, inv in provider.inventories.items():
            used = provider.usages.get(rc, 0)
            if used > inv.capacity:
                report.overcommitted.append({"provider": provider.uuid, "resource_class": rc,
                                             "used": used, "capacity": inv.capacity})  # fmt: skip
        for rc in set(provider.usages) | set(summed):
            if provider.usages.get(rc, 0) != summed[rc]:
                report.usage_mismatches.append(
                    {"provider": provider.uuid, "resource_class": rc,
                     "usage": provider.usages.get(rc, 0), "allocated": summed[rc]}
                )  # fmt: skip
        consumers, expected = consumers_of[provider.uuid], expected_of.get(provider.uuid, set())
        if consumers != expected:
            report.usage_mismatches.append({"provider": provider.uuid,
                                            "consumers": sorted(consumers ^ expected)})  # fmt: skip


def _check_projects(stores: Stores, report: AuditReport, scan: _Scan) -> None:
    counted = stores.inspector.project_usages()
    for project in sorted(set(scan.by_project) | set(counted)):
        usages = counted.get(project, {})
        summed = {rc: n for rc, n in scan.by_project[project].items() if n}
        if usages != summed:
            report.usage_mismatches.append({"project": project, "usage": usages,
                                            "allocated": summed})  # fmt: skip


def _check_instances(report: AuditReport, scan: _Scan) -> None:
    """ACTIVE holds allocations on its host, unless shelved and offloaded: then none,
    but what an unshelve under way claimed; BUILD holds some only while claimed."""
    for uuid, record in scan.records.items():
        holds = uuid in scan.placed_on
        if record["shelved"] == "offloaded":
            if holds and not record["migration"]:
                report.instance_mismatches.append(
                    {"instance": uuid, "problem": "offloaded with allocations"}
                )
        elif record["state"] == State.ACTIVE.value and not holds:
            report.instance_mismatches.append(
                {"instance": uuid, "problem": "ACTIVE without allocations"}
            )
        elif record["state"] == State.BUILD.value and holds and not record["host"]:
            report.instance_mismatches.append(
                {"instance": uuid, "problem": "unclaimed BUILD with allocations"}
            )


def _check_quota(stores: Stores, report: AuditReport, scan: _Scan) -> None:
    """Quota used equals what the holders reserved, and only live instances hold quota."""
    used, held = stores.inspector.quota_used(), stores.inspector.quota_held()
    for project in sorted(set(used) | set(held)):
        holders = held.get(project, {})
        expected = {"instances": len(holders),
                    "cores": sum(u.cores for u in holders.values()),
                    "ram_mb": sum(u.ram_mb for u in holders.values())}  # fmt: skip
        counters = used.get(project, {})
        usage = {name: counters.get(name, 0) for name in expected}
        if usage != expected:
            report.quota_mismatches.append({"project": project, "used": usage, "held": expected})
        for holder in holders:
            record = scan.records.get(holder)
            if record is not None and record["state"] not in _HOLDING:
                report.quota_mismatches.append({"project": project, "holder": holder,
                                                "state": record["state"]})  # fmt: skip


def _check_groups(stores: Stores, report: AuditReport, scan: _Scan) -> None:
    """A group's hosts count its members holding a claim there, and keep its policy. A
    member that moves counts on its source and its destination (``group_move_host``)
    until its move settles; its host is one of them."""
    counted: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for uuid, record in scan.records.items():
        where = [h for h in (record["group_host"], record["group_move_host"]) if h]
        if not where:
            continue
        counted[record["group"]].update(where)
        if record["state"] not in _HOLDING or record["host"] not in where:
            report.group_mismatches.append({"instance": uuid, "counted_on": where[0],
                                            "state": record["state"],
                                            "host": record["host"]})  # fmt: skip
    for group in stores.groups.list_all():
        hosts = stores.groups.hosts(group.uuid)
        if hosts != dict(counted.get(group.uuid, {})):
            report.group_mismatches.append(
                {"group": group.uuid, "hosts": hosts, "claimed": dict(counted.get(group.uuid, {}))}
            )
        most = max(hosts.values(), default=0)
        broken = (group.policy == "affinity" and len(hosts) > 1) or (
            group.policy == "anti-affinity" and most > (group.max_server_per_host or 1)
        )
        if broken:
            report.group_mismatches.append({"group": group.uuid, "policy": group.policy,
                                            "hosts": hosts})  # fmt: skip


def _check_host_rules(report: AuditReport, scan: _Scan) -> None:
    """An instance holding a claim is on a host (and node) its host rule allows."""
    for uuid, record in scan.records.items():
        if not record["hosts"] or not record["host"] or record["state"] not in _HOLDING:
            continue
        rule = HostRule.from_dict(json.loads(record["hosts"]))
        broken = rule.refuses(record["host"], record["node"] or None)
        if broken:
            report.host_rule_mismatches.append(
                {"instance": uuid, "host": record["host"], "node": record["node"],
                 "rule": rule.to_dict(), "broken": broken}
            )  # fmt: skip


def _check_flavors(report: AuditReport, scan: _Scan) -> None:
    """A claim holds, summed over its providers, what its record's flavor asks: only for
    the records a front door made (they name their class), the ones claims come from a
    boot request for, and not while a move holds another flavor's amounts for them (a
    resize on its own host holds the larger of two). A flavor is compiled once however
    many instances have it."""
    demands: dict[str, dict[str, int] | None] = {}
    for uuid, record in scan.records.items():
        held = scan.held.get(uuid)
        moving = record["migration"]
        if held is None or not record["class"] or record["state"] not in _HOLDING or moving:
            continue
        raw = record["flavor"]
        if raw not in demands:
            demands[raw] = stored_demand(raw)
        asked = demands[raw]
        allocated = {rc: n for rc, n in held.items() if n}
        if asked is not None and allocated != asked:
            report.flavor_mismatches.append({"instance": uuid, "class": record["class"],
                                             "allocated": allocated, "flavor": asked})  # fmt: skip


def stored_demand(raw: str) -> dict[str, int] | None:
    """What a flavor as a record stores it asks of providers in all
    (:func:`~qsched.scheduling.request.flavor_demand`); None: unreadable."""
    try:
        return flavor_demand(Flavor.from_dict(json.loads(raw)))
    except (exception.Invalid, KeyError, TypeError, ValueError):
        return None
