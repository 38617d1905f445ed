"""Figures of a run: request counts, faults and their recovery times, the table.

Times in the report are seconds from the start of the load (``at_s``) or
durations. Recovery after a fault is measured from the moment the part was
back (server answering again, restarted agent heartbeating), or for agent
faults from the signal, since the rest of the stack keeps serving:

* ``api_s``: until the API answered a boot with 202 again;
* ``placement_s``: until an instance went ACTIVE again;
* ``held_resolved_s`` (agent faults): from the signal until none of the
  instances the agent had claimed and not finished was still waiting on it;
* ``failover_s`` (RabbitMQ node losses): from the stop until the first instance
  whose boot was sent after it went ACTIVE, so its request went through the
  cluster without the lost node (``placement_s`` may count a spawn under way), and
  ``placed_while_down``: how many such instances went ACTIVE before the node was
  started again.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from qsched.chaos.checks import Snapshot
from qsched.chaos.faults import Fault
from qsched.chaos.load import Call

#: check name -> label in the table; every one of them must be empty for a pass
INVARIANTS = {
    "lost": "lost (accepted, no record)",
    "stuck": "stuck (a record not ACTIVE/ERROR/DELETED)",
    "stranded": "stranded (ended by the deadline, never in hand)",
    "lost_deletes": "lost deletes, resurrected (204, not DELETED)",
    "duplicates": "duplicates (placed twice)",
    "overcommits": "overcommits",
    "leaks": "leaks (allocations/quota, no live instance)",
    "accounting": "counter mismatches (usage, quota)",
    "partial_state": "partial state behind 5xx",
    "quota": "quota exceeded (sampled every second)",
    "unpublished": "held unpublished until their deadline",
    "index_before_drain": "agent index mismatches (before the drain)",
    "driver_before_drain": "driver mismatches (before the drain)",
    "audit": "ledger audit findings",
    "crashes": "unexpected process exits",
    "drain": "left after deleting everything",
    "index_after_drain": "agent index mismatches (after the drain)",
    "driver_after_drain": "driver mismatches, VMs left (after the drain)",
    "dead_letters": "poison not dead-lettered once, valid dead letters",
    "faults": "faults that failed or were not injected",
    "replication": "quorum queues missing a replica (RabbitMQ cluster)",
}
OUTAGES = ("broker_restart", "ledger_restart", "machine_crash", "ledger_stall", "master_kill")

#: What a crash of the ledger's machine may break under each ``[ledger] durability``:
#: ``async`` acknowledges writes the disk does not have yet, so boots answered 202 can
#: vanish (lost) and deletes answered 204 come back (lost deletes). Everything else
#: must hold: recovery converges whatever the setting (a server brought back whose VM
#: its agent had destroyed ends ERROR, a claim rolled back is placed again).
#: A master killed on a Sentinel set (``master_kill``) counts as such a crash: under
#: ``async`` the promoted replica may lack what the master had acknowledged.
LOSSY = ("machine_crash", "master_kill")
MAY_LOSE: dict[str, frozenset[str]] = {
    "async": frozenset({"lost", "lost_deletes"}),
    "replica": frozenset(),
    "disk": frozenset(),
}


def requests_summary(calls: list[Call], skipped: Counter[str]) -> dict[str, Any]:
    boots = [c for c in calls if c.kind == "boot"]
    deletes = [c for c in calls if c.kind == "delete"]
    return {
        "boots_sent": len(boots),
        "accepted": sum(1 for c in boots if c.status == 202),
        "boots_by_status": _by_status(boots),
        "deletes_sent": len(deletes),
        "deletes_by_status": _by_status(deletes),
        "skipped_client_busy": dict(skipped),
    }


def _by_status(calls: list[Call]) -> dict[str, int]:
    counts = Counter("no answer" if c.status is None else str(c.status) for c in calls)
    return dict(sorted(counts.items()))


def final_states(snap: Snapshot, accepted: list[str]) -> dict[str, Any]:
    """States of the accepted instances, and why those that went ERROR failed.

    An instance that went ERROR and was deleted afterwards (the load deletes
    everything in the end) still counts among the ERROR reasons: its fault stays.
    """
    records = [snap.records.get(u, {}) for u in accepted]
    reasons = Counter(str(e["reason"]) for e in errors(snap, accepted))
    states = Counter(r.get("state", "missing") for r in records)
    return {"states": dict(sorted(states.items())), "error_reasons": dict(reasons)}


def errors(snap: Snapshot, accepted: list[str]) -> list[dict[str, Any]]:
    """The accepted instances that went ERROR at some point, with their fault."""
    found = []
    for uuid in accepted:
        record = snap.records.get(uuid, {})
        if record.get("fault"):
            fault = json.loads(record["fault"])
            details = fault.get("details") or {}
            found.append(
                {
                    "instance": uuid,
                    "state": record.get("state"),
                    "reason": details.get("reason") or fault.get("message"),
                    "failed_on": details.get("failed_on"),
                }
            )
    return found


RESOLVING = ("active", "requeued", "released", "deleted", "error")


def fault_figures(
    fault: Fault,
    calls: list[Call],
    launched: list[float],
    history: dict[str, list[dict[str, Any]]],
    t0: float,
) -> dict[str, Any]:
    """What happened in one fault, and how long the system took to serve again."""
    out: dict[str, Any] = {
        "kind": fault.kind,
        "target": fault.target,
        "planned_at_s": fault.at_s,
        **fault.detail,
    }
    if fault.error:
        out["error"] = fault.error
    if fault.started is None:
        return out
    out["at_s"] = round(fault.started - t0, 2)
    if fault.restored is not None:
        out["back_after_s"] = round(fault.restored - fault.started, 2)
    base = fault.restored if fault.kind in OUTAGES else fault.started
    if base is not None:
        out.update(_recovery(fault.started, base, calls, launched))
    if fault.kind.startswith("agent"):
        out.update(_held(fault, history))
    if fault.kind == "rabbit_node_loss":
        out.update(_failover(fault.started, fault.detail.get("outage_s", 0.0), calls, history))
    return out


def _failover(
    started: float, outage_s: float, calls: list[Call], history: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """When boots sent after a node's stop went ACTIVE: the first, and how many while it
    was down."""
    after = [c.uuid for c in calls if c.kind == "boot" and c.status == 202 and c.sent >= started]
    active = [float(e.get("t", 0)) for u in after if u for e in history.get(u, [])
              if e.get("event") == "active"]  # fmt: skip
    return {
        "failover_s": _first_after(started, active),
        "placed_while_down": sum(1 for t in active if t < started + outage_s),
    }


def _recovery(
    started: float, base: float, calls: list[Call], launched: list[float]
) -> dict[str, Any]:
    boots = [c for c in calls if c.kind == "boot"]
    api_s = _first_after(base, (c.done for c in boots if c.status == 202))
    until = base + (api_s or 0.0)
    refused = sum(1 for c in boots if (c.status or 0) >= 500 and started <= c.done <= until)
    return {"api_s": api_s, "placement_s": _first_after(base, launched), "boots_5xx": refused}


def _held(fault: Fault, history: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """How the claims a dead agent left were resolved: the first event that ended each."""
    outcome: Counter[str] = Counter()
    for uuid in fault.held:
        later = [e for e in history.get(uuid, []) if float(e.get("t", 0)) >= (fault.started or 0)]
        first = next((e["event"] for e in later if e.get("event") in RESOLVING), "unresolved")
        outcome[first] += 1
    resolved_s = (
        fault.held_resolved - fault.started if fault.held_resolved and fault.started else None
    )
    return {
        "held": len(fault.held),
        "held_resolved_s": round(resolved_s, 2) if resolved_s is not None else None,
        "held_outcome": dict(outcome),
    }


def _first_after(base: float, times: Any) -> float | None:
    later = [t for t in times if t >= base]
    return round(min(later) - base, 2) if later else None


def launched_times(snap: Snapshot) -> list[float]:
    return sorted(float(r["launched_at"]) for r in snap.records.values() if r.get("launched_at"))


# -- the table -------------------------------------------------------------------------


def table(report: dict[str, Any]) -> str:
    """The short human summary of one transport's run."""
    req, faults = report["requests"], report["faults"]
    statuses = req["boots_by_status"]
    refused = {k: v for k, v in statuses.items() if k != "202"}
    rows: list[tuple[str, Any]] = [
        (
            "transport",
            f"{report['transport']} ({report['settings']['duration_s']:.0f} s, "
            f"seed {report['settings']['seed']})",
        ),
        ("ledger durability", _durability(report)),
        ("boots sent / accepted (202)", f"{req['boots_sent']} / {req['accepted']}"),
        ("boots refused", _counts(refused) or "none"),
        ("503s that left state behind", report["invariants"]["partial_state"]["count"]),
        ("deletes sent", f"{req['deletes_sent']} ({_counts(req['deletes_by_status'])})"),
        ("faults injected", _counts(faults["by_kind"]) or "none"),
        ("accepted ended as", _counts(report["final"]["states"])),
        ("went ERROR, by reason", _counts(report["final"]["error_reasons"]) or "none"),
        ("quiescence", _quiescence(report["quiescence"])),
        ("convergence waited (s)", _convergence(report.get("convergence", {}))),
        ("oldest unpublished boot (s)", report.get("outbox_max_age_s")),
    ]
    rows += [
        (label, _finding_count(report, name))
        for name, label in INVARIANTS.items()
        if name in report["invariants"]
    ]
    rows.append(("result", "PASS" if report["ok"] else "FAIL: " + ", ".join(report["failed"])))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("time to recover (s)")
    lines += [f"  {_fault_line(f)}" for f in faults["events"]]
    return "\n".join(lines)


def _durability(report: dict[str, Any]) -> str:
    allowed = report.get("allowed_losses") or []
    text = str(report.get("durability", "?"))
    return f"{text} (a machine crash may lose: {', '.join(allowed)})" if allowed else text


def _convergence(convergence: dict[str, Any]) -> str:
    return ", ".join(f"{when} {c['waited_s']}" for when, c in convergence.items()) or "-"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _finding_count(report: dict[str, Any], name: str) -> str:
    count = report["invariants"][name]["count"]
    allowed = name in (report.get("allowed_losses") or [])
    return f"{count} (allowed: {report.get('durability')})" if count and allowed else str(count)


def _quiescence(q: dict[str, Any]) -> str:
    state = "reached" if q["reached"] else f"NOT reached, {q['waiting']} still waiting"
    return f"{state} after {q['waited_s']} s"


def _fault_line(f: dict[str, Any]) -> str:
    parts = [f"{f['kind']:<15}", f"{f.get('target', ''):<22}", f"@{f.get('at_s', '-')}"]
    show: list[tuple[str, str, Callable[[Any], str]]] = [
        ("back_after_s", "back", str),
        ("api_s", "api", str),
        ("placement_s", "placed", str),
        ("failover_s", "failover", str),
        ("placed_while_down", "placed while down", str),
        ("node_start_s", "node start", str),
        ("whole_after_s", "whole", str),
        ("boots_5xx", "5xx", str),
        ("frozen_s", "frozen", str),
        ("stalled_s", "stalled", str),
        ("in_flight", "in flight", str),
        ("lost_bytes", "AOF bytes cut", str),
        ("messages", "sent", str),
        ("held", "held", str),
        ("held_resolved_s", "resolved", str),
        ("held_outcome", "->", _counts),
    ]
    if not f.get("held"):
        show = [item for item in show if item[0] not in ("held_resolved_s", "held_outcome")]
    parts += [f"{label} {fmt(f[key])}" for key, label, fmt in show if key in f]
    if f.get("error"):
        parts.append(f"ERROR {f['error']}")
    return "  ".join(parts)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=_default)


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    return str(value)
