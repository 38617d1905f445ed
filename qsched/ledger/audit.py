"""Check the ledger's invariants from its own records, independently of the services.

An admin view: it scans every provider, consumer, quota record and instance of
the cell. Use it in tests, the demo summary and fault-injection runs, never on
a request path.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from typing import Any

from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.ledger.redis import read_many, text, text_map

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

    @property
    def ok(self) -> bool:
        return not (
            self.overcommitted
            or self.usage_mismatches
            or self.orphan_allocations
            or self.instance_mismatches
            or self.quota_mismatches
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
    return report


def _scan_suffixes(stores: Stores, prefix: str, suffix: str = "") -> set[str]:
    """The ``*`` part of every key ``<prefix>*<suffix>`` without a further ':'."""
    found = set()
    for key in stores.store.client.scan_iter(f"{prefix}*{suffix}", count=1000):
        middle = text(key)[len(prefix) : len(text(key)) - len(suffix)]
        if ":" not in middle:
            found.add(middle)
    return found


def _instances(stores: Stores) -> dict[str, dict[str, str]]:
    uuids = sorted(_scan_suffixes(stores, stores.store.keys.instance("")))
    pipe = stores.store.client.pipeline(transaction=False)
    for uuid in uuids:
        pipe.hmget(stores.store.keys.instance(uuid), "state", "host", "project_id")
    records = {}
    for uuid, (state, host, project) in zip(uuids, pipe.execute(), strict=True):
        if state is not None:
            records[uuid] = {"state": text(state), "host": text(host or b""),
                             "project_id": text(project or b"")}  # fmt: skip
    return records


def _sum_consumers(stores: Stores, report: AuditReport, scan: _Scan) -> None:
    uuids = sorted(_scan_suffixes(stores, stores.store.keys.consumer("")))
    found = read_many(
        stores.store.client, "hgetall", [stores.store.keys.consumer(u) for u in uuids]
    )
    for uuid, raw in zip(uuids, found, strict=True):
        fields = text_map(raw)
        if not fields:
            continue
        allocations: dict[str, dict[str, int]] = json.loads(fields["allocs"])
        report.consumers += 1
        scan.placed_on[uuid] = set(allocations)
        for rp, amounts in allocations.items():
            scan.by_provider[rp].update(amounts)
            scan.by_project[fields.get("project", "")].update(amounts)
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
    projects = set(scan.by_project) | _scan_suffixes(
        stores, stores.store.keys.project_usage(""), ":usage"
    )
    for project in sorted(projects):
        usages = stores.ledger.project_usages(project)
        summed = {rc: n for rc, n in scan.by_project[project].items() if n}
        if usages != summed:
            report.usage_mismatches.append({"project": project, "usage": usages,
                                            "allocated": summed})  # fmt: skip


def _check_instances(report: AuditReport, scan: _Scan) -> None:
    """ACTIVE holds allocations on its host; BUILD holds some only while claimed."""
    for uuid, record in scan.records.items():
        holds = uuid in scan.placed_on
        if record["state"] == State.ACTIVE.value and not holds:
            report.instance_mismatches.append(
                {"instance": uuid, "problem": "ACTIVE without allocations"}
            )
        elif record["state"] == State.BUILD.value and holds and not record["host"]:
            report.instance_mismatches.append(
                {"instance": uuid, "problem": "unclaimed BUILD with allocations"}
            )


def _check_quota(stores: Stores, report: AuditReport, scan: _Scan) -> None:
    """Quota used equals what the holders reserved, and only live instances hold quota."""
    keys = stores.store.keys
    projects = _scan_suffixes(stores, keys.quota_used("")[: -len(":used")], ":used")
    projects |= _scan_suffixes(stores, keys.quota_held("")[: -len(":held")], ":held")
    for project in sorted(projects):
        held = text_map(stores.store.client.hgetall(keys.quota_held(project)))
        amounts = [v.split() for v in held.values()]
        expected = {"instances": len(held), "cores": sum(int(c) for c, _ in amounts),
                    "ram_mb": sum(int(r) for _, r in amounts)}  # fmt: skip
        usage = dataclasses.asdict(stores.quota.get_usage(project))
        if usage != expected:
            report.quota_mismatches.append({"project": project, "used": usage, "held": expected})
        for holder in held:
            record = scan.records.get(holder)
            if record is not None and record["state"] not in _HOLDING:
                report.quota_mismatches.append({"project": project, "holder": holder,
                                                "state": record["state"]})  # fmt: skip
