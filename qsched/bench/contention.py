"""Claims under contention: how long an agent's claim takes and how many conflicts it met.

Many agents claiming on one sharing provider (shared storage) all write its generation:
a claim made on a view another agent's claim made stale conflicts
(``ProviderGenerationConflict``), is re-read and retried while it still fits
(:func:`qsched.ledger.retry.claim`). :class:`ClaimTimer` times the whole claim step of
agents (retries included); :func:`conflicts_per_claim` reads the conflicts each claimed
instance met from its history (the agent records each one as a ``conflict`` event).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from agents.placing import Placer
from agents.service import ComputeAgent
from qsched.bench.measure import percentiles
from qsched.ledger import Stores

#: How a generation conflict's message reads (qsched.exception.ProviderGenerationConflict).
GENERATION_CONFLICT = "generation conflict"


@dataclasses.dataclass
class ClaimTimer:
    """Times every claim step of the agents it is attached to (thread-safe)."""

    durations_s: list[float] = dataclasses.field(default_factory=list)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def attach(self, agents: Iterable[ComputeAgent]) -> ClaimTimer:
        for agent in agents:
            self._wrap(agent.placer)
        return self

    def _wrap(self, placer: Placer) -> None:
        claim = placer.claim

        def timed(*args: Any, **kwargs: Any) -> bool:
            began = time.perf_counter()
            try:
                return claim(*args, **kwargs)
            finally:
                with self._lock:
                    self.durations_s.append(time.perf_counter() - began)

        placer.claim = timed  # type: ignore[method-assign]

    def summary(self) -> dict[str, float | int | None]:
        """count, p50, p95, p99, max and mean of the claim steps, in ms."""
        with self._lock:
            return percentiles(self.durations_s)


def conflicts_per_claim(stores: Stores, uuids: Sequence[str]) -> dict[str, tuple[int, int]]:
    """For each instance that was claimed: the conflicts recorded in its history before
    its claim, all of them (generation conflicts resolved, and claims refused for
    capacity) and the generation conflicts alone."""
    found = {}
    for uuid in uuids:
        events = stores.instances.events(uuid)
        names = [e.event for e in events]
        if "claimed" not in names:
            continue
        before = [e for e in events[: names.index("claimed")] if e.event == "conflict"]
        stale = [e for e in before if GENERATION_CONFLICT in str(e.detail.get("reason", ""))]
        found[uuid] = (len(before), len(stale))
    return found


def conflicts_report(stores: Stores, uuids: Sequence[str]) -> dict[str, Any]:
    """Claims made, and the conflicts met on the way from the instances' histories:
    per claim (mean, max), and how many were generation conflicts. Each conflict was
    followed by a re-read and a new claim (a client-driven retry). Works for agents in
    any process."""
    counts = conflicts_per_claim(stores, uuids)
    claims = len(counts)
    conflicts = sum(c for c, _ in counts.values())
    return {
        "claims": claims,
        "conflicts": conflicts,
        "generation_conflicts": sum(g for _, g in counts.values()),
        "conflicts_per_claim": round(conflicts / claims, 2) if claims else None,
        "max_conflicts": max((c for c, _ in counts.values()), default=0),
        "claims_with_conflicts": sum(1 for c, _ in counts.values() if c),
    }


def contention_report(stores: Stores, uuids: Sequence[str], timer: ClaimTimer) -> dict[str, Any]:
    """:func:`conflicts_report` and the claim steps' latency (agents in this process)."""
    return {**conflicts_report(stores, uuids), "claim_ms": timer.summary()}
