"""Check the ledger's invariants from its own records, independently of the services.

An admin view: it scans every provider, consumer and instance of the cell. Use it
in tests, the demo summary and fault-injection runs, never on a request path.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Any

from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.ledger.redis import text


@dataclasses.dataclass
class AuditReport:
    providers: int = 0
    consumers: int = 0
    overcommitted: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    usage_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    orphan_allocations: list[str] = dataclasses.field(default_factory=list)
    quota_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.overcommitted
            or self.usage_mismatches
            or self.orphan_allocations
            or self.quota_mismatches
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


def audit(stores: Stores) -> AuditReport:
    """Scan the cell and report every broken invariant."""
    report = AuditReport()
    summed, project_summed = _sum_consumers(stores, report)
    for provider in stores.ledger.list_providers():
        report.providers += 1
        for rc, inv in provider.inventories.items():
            used = provider.usages.get(rc, 0)
            if used > inv.capacity:
                report.overcommitted.append(
                    {"provider": provider.uuid, "resource_class": rc, "used": used,
                     "capacity": inv.capacity}
                )  # fmt: skip
        for rc in set(provider.usages) | set(summed[provider.uuid]):
            if provider.usages.get(rc, 0) != summed[provider.uuid][rc]:
                report.usage_mismatches.append(
                    {"provider": provider.uuid, "resource_class": rc,
                     "usage": provider.usages.get(rc, 0), "allocated": summed[provider.uuid][rc]}
                )  # fmt: skip
    for project, amounts in project_summed.items():
        usages = stores.ledger.project_usages(project)
        if usages != {rc: n for rc, n in amounts.items() if n}:
            report.usage_mismatches.append({"project": project, "usage": usages,
                                            "allocated": dict(amounts)})  # fmt: skip
    _check_quota(stores, report)
    return report


def _consumer_uuids(stores: Stores) -> set[str]:
    prefix = stores.store.keys.consumer("")
    return {text(k)[len(prefix) :] for k in stores.store.client.scan_iter(f"{prefix}*", count=1000)}


def _sum_consumers(
    stores: Stores, report: AuditReport
) -> tuple[defaultdict[str, Counter[str]], defaultdict[str, Counter[str]]]:
    summed: defaultdict[str, Counter[str]] = defaultdict(Counter)
    project_summed: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for uuid in sorted(_consumer_uuids(stores)):
        consumer = stores.ledger.get_allocations(uuid)
        report.consumers += 1
        for rp, amounts in consumer.allocations.items():
            summed[rp].update(amounts)
            project_summed[consumer.project_id or ""].update(amounts)
        state = stores.store.client.hget(stores.store.keys.instance(uuid), "state")
        if state is not None and text(state) not in (State.BUILD.value, State.ACTIVE.value):
            report.orphan_allocations.append(uuid)
    return summed, project_summed


def _check_quota(stores: Stores, report: AuditReport) -> None:
    """Quota used must equal the sum of what holders reserved, per project."""
    client = stores.store.client
    suffix = ":held"
    pattern = stores.store.keys.quota_held("*")
    for key in client.scan_iter(pattern, count=1000):
        key_s = text(key)
        project = key_s[len(stores.store.keys.quota_held("")) - len(suffix) : -len(suffix)]
        held = [text(v).split() for v in client.hvals(key_s)]
        expected = {"instances": len(held), "cores": sum(int(c) for c, _ in held),
                    "ram_mb": sum(int(r) for _, r in held)}  # fmt: skip
        usage = dataclasses.asdict(stores.quota.get_usage(project))
        if usage != expected:
            report.quota_mismatches.append({"project": project, "used": usage,
                                            "held": expected})  # fmt: skip
