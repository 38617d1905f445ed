"""One timed phase: send boots at a fixed rate, wait for them to settle, sum up."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from qsched.admin import queries, why
from qsched.bench.cpu import CpuMeter
from qsched.bench.load import Sent, Submit, open_loop
from qsched.bench.measure import (
    BenchFailure,
    Outcome,
    check_lost,
    command_stats,
    commands_per_placement,
    percentiles,
    read_outcomes,
    wait_settled,
)
from qsched.bench.profile import Profiler
from qsched.bench.stack import Cloud

Say = Callable[[str], None]

STUCK_EXPLAINED = 3  # requests a failed phase explains, as `qsched-admin server why` would


@dataclasses.dataclass
class PhaseResult:
    """The requests of a phase and what became of them."""

    sends: list[Sent]
    outcomes: dict[str, Outcome]
    cpu: dict[str, Any] = dataclasses.field(default_factory=dict)  # during the sending
    profile: dict[str, Any] | None = None
    restarted: list[str] = dataclasses.field(default_factory=list)  # servers, mid-phase
    # INFO commandstats of the ledger's Redis before and after the sending
    redis_commands: tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]] = ({}, {})

    @property
    def accepted(self) -> list[Sent]:
        return [s for s in self.sends if s.uuid is not None]


def run_phase(
    cloud: Cloud,
    label: str,
    submit: Submit,
    flavors: Sequence[str],
    rate_per_s: float,
    workers: int,
    settle_timeout_s: float,
    say: Say,
    profiler: Profiler | None = None,
    **loop: Any,
) -> PhaseResult:
    """Send ``flavors`` open-loop at ``rate_per_s``; wait until all settle; check none is lost."""
    total = len(flavors)
    say(f"  {label}: {total} boots at {rate_per_s:g}/s ({total / rate_per_s:.1f}s)")
    commands_before = command_stats(cloud.stores)
    meter = CpuMeter(cloud.process_groups, cloud.redis_ports, cloud.spec.rabbit_home)
    meter.start()
    metered = time.perf_counter()
    if profiler is not None:
        profiler.start(label, cloud.profile_targets(), total / rate_per_s)
    sends = open_loop(
        submit,
        flavors,
        rate_per_s,
        workers,
        tick=lambda n: say(f"  {label}: {n}/{total} sent"),
        **loop,
    )
    cpu = meter.stop()
    commands = (commands_before, command_stats(cloud.stores))
    if cpu:
        cpu["seconds"] = round(time.perf_counter() - metered, 3)
    profile = profiler.stop() if profiler is not None else None
    uuids = [s.uuid for s in sends if s.uuid is not None]
    cloud.accepted += len(uuids)
    last = [0.0]

    def tick(done: int, of: int) -> None:
        if time.monotonic() - last[0] > 2 and done < of:
            last[0] = time.monotonic()
            say(f"  {label}: {done}/{of} settled")

    pending = wait_settled(cloud.stores, uuids, settle_timeout_s, tick)
    if pending:
        raise BenchFailure(
            f"{label}: {len(pending)} accepted requests still in BUILD {settle_timeout_s:.0f}s "
            f"after the last was sent (lost or stuck), e.g. {pending[:STUCK_EXPLAINED]}\n"
            + stuck_report(cloud, pending[:STUCK_EXPLAINED])
        )
    outcomes = read_outcomes(cloud.stores, uuids)
    check_lost(outcomes, uuids, label)
    if meter.restarted:
        say(f"  {label}: WARNING: a {' and a '.join(meter.restarted)} server process started "
            "or stopped during this phase (someone restarted it): figures disturbed")  # fmt: skip
    return PhaseResult(sends, outcomes, cpu, profile, meter.restarted, commands)


def stuck_report(cloud: Cloud, uuids: Sequence[str]) -> str:
    """``qsched-admin server why`` of each of ``uuids``, for a run that fails on them."""
    max_attempts = cloud.options.scheduler.max_attempts
    return "\n".join(
        why.render(queries.diagnose(cloud.stores, uuid, time.time(), max_attempts))
        for uuid in uuids
    )


def samples(result: PhaseResult) -> dict[str, list[Any]]:
    """Per request: due (s from the first), to claimed, to ACTIVE, API call (ms; None: never)."""
    first = result.sends[0].due if result.sends else 0.0
    rows: dict[str, list[Any]] = {"due_s": [], "claimed_ms": [], "active_ms": [], "api_ms": []}
    for sent in result.sends:
        outcome = result.outcomes.get(sent.uuid or "")
        rows["due_s"].append(round(sent.due - first, 4))
        rows["api_ms"].append(round((sent.answered - sent.sent) * 1000, 2))
        for key, at in (("claimed_ms", "claimed_at"), ("active_ms", "launched_at")):
            t = getattr(outcome, at, None) if outcome else None
            rows[key].append(None if t is None else round((t - sent.due) * 1000, 2))
    return rows


def summarize(result: PhaseResult, rate_per_s: float) -> dict[str, Any]:
    """Counts, latencies (ms) and rates of a phase, for the JSON report."""
    sends, outcomes = result.sends, result.outcomes
    ok = [(s, outcomes[s.uuid]) for s in sends if s.uuid is not None]
    states = Counter(o.state for _, o in ok)
    launched = [o.launched_at for _, o in ok if o.launched_at is not None]
    first_due = sends[0].due if sends else 0.0
    span_s = len(sends) / rate_per_s if rate_per_s else 0.0
    in_window = sum(1 for t in launched if t <= first_due + span_s)
    last = max(launched, default=first_due)
    errors = Counter(s.error.split(":")[0] for s in sends if s.error)
    return {
        "offered_per_s": rate_per_s,
        "requests": len(sends),
        "accepted": len(ok),
        "refused": len(sends) - len(ok),
        "refusals": dict(errors),
        "refusal_sample": next((s.error for s in sends if s.error), None),
        "active": states.get("ACTIVE", 0),
        "error": states.get("ERROR", 0),
        "submit_to_claimed_ms": percentiles(
            o.claimed_at - s.due for s, o in ok if o.claimed_at is not None
        ),
        "submit_to_active_ms": percentiles(
            o.launched_at - s.due for s, o in ok if o.launched_at is not None
        ),
        "api_call_ms": percentiles(s.answered - s.sent for s in sends),
        "generator_lag_ms": percentiles(s.sent - s.due for s in sends),
        "sent_per_s": _rate(len(sends), [s.sent for s in sends]),
        "placements_per_s": round(len(launched) / (last - first_due), 1)
        if last > first_due
        else 0.0,
        "placed_in_window_per_s": round(in_window / span_s, 1) if span_s else 0.0,
        "cpu_cores": result.cpu,
        "servers_restarted": result.restarted,
        "cpu_ms_per_placement": _cost(result.cpu, launched, first_due),
        "redis_per_placement": commands_per_placement(
            *result.redis_commands, _placed_within(result.cpu, launched, first_due)
        ),
        **({"profile": result.profile} if result.profile is not None else {}),
    }


def _placed_within(cores: dict[str, float], launched: list[float], began: float) -> int:
    """Placements done while the CPU (and Redis commands) were measured."""
    seconds = cores.get("seconds", 0.0)
    return sum(1 for t in launched if began <= t <= began + seconds)


def _cost(cores: dict[str, float], launched: list[float], began: float) -> dict[str, float]:
    """CPU ms per placement of each part, over the time its CPU use was measured."""
    seconds = cores.get("seconds", 0.0)
    placed = _placed_within(cores, launched, began)
    if not placed:
        return {}
    skip = ("cpus", "seconds")
    return {k: round(v * seconds * 1000 / placed, 3) for k, v in cores.items() if k not in skip}


def _rate(count: int, times: list[float]) -> float:
    if count < 2 or max(times) <= min(times):
        return 0.0
    return round((count - 1) / (max(times) - min(times)), 1)
