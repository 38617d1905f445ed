"""Read what happened to the requests a benchmark sent, from the ledger's own records.

Per instance: its state, when an agent claimed it (the ``claimed`` event the claim
script writes) and when it went ACTIVE (``launched_at``); per move, when it started
(``move_requested``), when its destination claimed it (``move_claimed``, the
``move_claim`` script's) and when it finished or failed (``move_finished``,
``move_failed``). All reads are pipelined in chunks; only the bench does them, after
(or between) the timed phases.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from qsched.ledger import Stores
from qsched.ledger.audit import audit

CHUNK = 2000
FINAL = frozenset({"ACTIVE", "ERROR", "DELETED"})


class BenchFailure(Exception):
    """An invariant broke during a run (over-commit, a lost request, a bad audit)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    uuid: str
    state: str | None  # None: no record at all
    host: str | None
    claimed_at: float | None
    launched_at: float | None


def read_outcomes(stores: Stores, uuids: Sequence[str]) -> dict[str, Outcome]:
    """State, host, claim and launch times of each instance."""
    found: dict[str, Outcome] = {}
    for start in range(0, len(uuids), CHUNK):
        chunk = uuids[start : start + CHUNK]
        records = stores.inspector.instance_records(chunk, ("state", "host", "launched_at"))
        histories = stores.inspector.histories(chunk)
        for uuid in chunk:
            record = records.get(uuid, {})
            launched = record.get("launched_at")
            found[uuid] = Outcome(
                uuid,
                record.get("state"),
                record.get("host") or None,
                _claimed_at(histories[uuid]),
                float(launched) if launched else None,
            )
    return found


def _claimed_at(events: Iterable[dict[str, Any]]) -> float | None:
    for entry in events:
        if entry.get("event") == "claimed":
            return float(entry["t"])
    return None


@dataclasses.dataclass(frozen=True)
class MoveTimes:
    """A server's last move, from its history: its migration, when the ledger started it,
    when its destination's claim landed (the first one: a destination that failed gives
    it back for another), and when it finished (None: it failed, or is under way)."""

    migration: str | None
    requested_at: float | None = None
    claimed_at: float | None = None
    finished_at: float | None = None
    failed: bool = False


def read_moves(stores: Stores, uuids: Sequence[str]) -> dict[str, MoveTimes]:
    """The last move of each server, from its history (pipelined in chunks)."""
    found: dict[str, MoveTimes] = {}
    for start in range(0, len(uuids), CHUNK):
        chunk = uuids[start : start + CHUNK]
        histories = stores.inspector.histories(chunk)
        found.update((uuid, _last_move(histories[uuid])) for uuid in chunk)
    return found


def _last_move(events: Sequence[dict[str, Any]]) -> MoveTimes:
    started = [e for e in events if e.get("event") == "move_requested"]
    if not started:
        return MoveTimes(None)
    migration = (started[-1].get("detail") or {}).get("migration")
    mine = [e for e in events if (e.get("detail") or {}).get("migration") == migration]

    def first(name: str) -> float | None:
        return next((float(e["t"]) for e in mine if e.get("event") == name), None)

    failed = any(e.get("event") == "move_failed" for e in mine)
    return MoveTimes(migration, first("move_requested"), first("move_claimed"),
                     first("move_finished"), failed)  # fmt: skip


def wait_moved(
    stores: Stores,
    uuids: Sequence[str],
    timeout_s: float,
    resized: bool = False,
    interval_s: float = 0.1,
) -> list[str]:
    """Wait until no server moves any more (with ``resized``: or waits for a confirm,
    VERIFY_RESIZE); return those still moving at the timeout."""
    pending = list(uuids)
    deadline = time.monotonic() + timeout_s
    while pending:
        records = stores.inspector.instance_records(pending, ("migration", "resized"))
        pending = [u for u in pending if _moving(records.get(u, {}), resized)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(interval_s)
    return pending


def _moving(record: dict[str, str], resized: bool) -> bool:
    if not record.get("migration"):
        return False
    return not (resized and record.get("resized") == "1")


def states(stores: Stores, uuids: Sequence[str]) -> dict[str, str | None]:
    """The state of each instance (None: no record)."""
    found = stores.instances.placements(uuids)
    return {u: found[u].state.value if u in found else None for u in uuids}


def wait_settled(
    stores: Stores,
    uuids: Sequence[str],
    timeout_s: float,
    tick: Callable[[int, int], None] | None = None,
    interval_s: float = 0.1,
) -> list[str]:
    """Wait until no instance is in BUILD; return those still in BUILD at the timeout."""
    pending = list(uuids)
    deadline = time.monotonic() + timeout_s
    while pending:
        now = states(stores, pending)
        pending = [u for u in pending if now[u] not in FINAL]
        if tick is not None:
            tick(len(uuids) - len(pending), len(uuids))
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(interval_s)
    return pending


def percentiles(values_s: Iterable[float]) -> dict[str, float | int | None]:
    """count, p50, p95, p99, max and mean of durations in seconds, reported in ms."""
    ordered = sorted(values_s)
    if not ordered:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}

    def rank(q: float) -> float:
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000, 2)

    return {
        "count": len(ordered),
        "p50": rank(0.50),
        "p95": rank(0.95),
        "p99": rank(0.99),
        "max": round(ordered[-1] * 1000, 2),
        "mean": round(sum(ordered) / len(ordered) * 1000, 2),
    }


def cloud_usage(stores: Stores) -> tuple[dict[str, int], dict[str, int]]:
    """(used, capacity) by resource class over every provider (an admin scan)."""
    used: dict[str, int] = {}
    capacity: dict[str, int] = {}
    for provider in stores.ledger.list_providers():
        for rc, inventory in provider.inventories.items():
            capacity[rc] = capacity.get(rc, 0) + inventory.capacity
            used[rc] = used.get(rc, 0) + provider.usages.get(rc, 0)
    return used, capacity


def host_capacities(stores: Stores) -> list[dict[str, int]]:
    """Each provider's capacity by resource class (for the offline reference)."""
    return [
        {rc: inv.capacity for rc, inv in p.inventories.items()}
        for p in stores.ledger.list_providers()
    ]


def command_stats(stores: Stores) -> dict[str, tuple[int, int]]:
    """Calls and microseconds so far of each command of the ledger's Redis (whole server)."""
    return stores.backend.command_stats()


def commands_per_placement(
    before: dict[str, tuple[int, int]],
    after: dict[str, tuple[int, int]],
    placed: int,
    top: int = 10,
) -> dict[str, dict[str, float]]:
    """The Redis commands that cost the server most per placement: calls and µs each."""
    if not (before and after and placed):
        return {}
    delta = {
        name: (calls - before.get(name, (0, 0))[0], usec - before.get(name, (0, 0))[1])
        for name, (calls, usec) in after.items()
    }
    ranked = sorted(delta.items(), key=lambda item: -item[1][1])[:top]
    return {
        name: {"calls": round(calls / placed, 2), "usec": round(usec / placed, 1)}
        for name, (calls, usec) in ranked
        if calls > 0
    }


def check_ledger(stores: Stores, where: str) -> dict[str, Any]:
    """Audit the ledger (it scans the cell); raise BenchFailure if an invariant broke."""
    began = time.perf_counter()
    report = audit(stores)
    summary = {
        "ok": report.ok,
        "providers": report.providers,
        "consumers": report.consumers,
        "instances": dict(report.instances),
        "overcommitted": len(report.overcommitted),
        "usage_mismatches": len(report.usage_mismatches),
        "orphan_allocations": len(report.orphan_allocations),
        "instance_mismatches": len(report.instance_mismatches),
        "quota_mismatches": len(report.quota_mismatches),
        "seconds": round(time.perf_counter() - began, 2),
    }
    if not report.ok:
        detail = json.dumps(report.to_dict(), default=str)[:2000]
        raise BenchFailure(f"{where}: the ledger audit failed: {detail}")
    return summary


def check_lost(outcomes: dict[str, Outcome], accepted: Sequence[str], where: str) -> None:
    """Every accepted request ends ACTIVE or ERROR: raise BenchFailure otherwise."""
    lost = [u for u in accepted if outcomes[u].state not in ("ACTIVE", "ERROR")]
    if lost:
        sample = {u: outcomes[u].state for u in lost[:5]}
        raise BenchFailure(f"{where}: {len(lost)} accepted requests lost (e.g. {sample})")
