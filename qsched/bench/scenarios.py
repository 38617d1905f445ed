"""The scenarios: scale sweep, saturation, fill (issue 6), placement rules
(:mod:`qsched.bench.rules`), plumbing, moves (:mod:`qsched.bench.moves`) and instances.

Each starts its own cloud (:mod:`qsched.bench.stack`), primes the scheduling
classes so that every agent consumes them before the clock starts, measures,
audits the ledger (any over-commit or lost request raises
:class:`~qsched.bench.measure.BenchFailure`) and stops the cloud.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from qsched.bench import measure
from qsched.bench.instances import run_instances
from qsched.bench.load import HttpSubmitter, LibrarySubmitter, Submit
from qsched.bench.moves import run_moves
from qsched.bench.packing import BenchFlavor, best_fit, flavor_stream, fractions
from qsched.bench.phase import PhaseResult, run_phase, samples, summarize
from qsched.bench.plumbing import run_plumbing
from qsched.bench.rules import run_rules
from qsched.bench.runner import SCALE_FLAVOR, Runner, brief
from qsched.bench.stack import Cloud

#: Fill: Nova's m1 flavors, a memory-heavy and a CPU-heavy one, so that sizes do not all
#: divide each other and two resources compete.
FILL_FLAVORS = (
    BenchFlavor("m1.small", 1, 2048, 20, weight=4),
    BenchFlavor("m1.medium", 2, 4096, 40, weight=3),
    BenchFlavor("m1.large", 4, 8192, 80, weight=2),
    BenchFlavor("m1.xlarge", 8, 16384, 160, weight=1),
    BenchFlavor("r1.xlarge", 4, 24576, 80, weight=1),
    BenchFlavor("c1.xlarge", 16, 4096, 40, weight=1),
)
FILL_NODE = {"node_vcpus": 16, "node_ram_mb": 65536, "node_disk_gb": 1000}
FILL_SEED = 6


# -- 1. scale sweep --------------------------------------------------------------------


def run_scale(runner: Runner) -> list[dict[str, Any]]:
    """Per N: registration, latency through HTTP and the library call, agent peak RSS."""
    results = []
    for hosts in runner.settings.sizes:
        for metrics, notifications in runner.settings.variants():
            runner.say(f"[scale] N = {hosts:,} hosts, metrics {'on' if metrics else 'off'}, "
                       f"notifications {'on' if notifications else 'off'}")  # fmt: skip
            results.append(scale_one(runner, hosts, metrics, notifications))
    return results


def scale_one(
    runner: Runner, hosts: int, metrics: bool = True, notifications: bool = False
) -> dict[str, Any]:
    settings = runner.settings
    count = max(1, int(settings.rate_per_s * settings.duration_s))
    entry: dict[str, Any] = {"hosts": hosts, "metrics": metrics, "notifications": notifications}
    spec = runner.spec(hosts, (SCALE_FLAVOR,), http=True, metrics=metrics,
                       notifications=notifications)  # fmt: skip
    with runner.cloud(spec, entry) as cloud:
        entry["registration"] = cloud.registration
        cloud.prime_classes([SCALE_FLAVOR.name])
        paths = {}
        submitters: list[tuple[str, Submit, int]] = [
            ("http", HttpSubmitter(cloud.api_url or ""), settings.http_workers),
            ("library", LibrarySubmitter(cloud.compute), settings.library_workers),
        ]
        runner.warm_up(cloud, SCALE_FLAVOR.name, [(s, w) for _n, s, w in submitters])
        for name, submit, workers in submitters:
            result = run_phase(
                cloud,
                f"N={hosts} {name}",
                submit,
                [SCALE_FLAVOR.name] * count,
                settings.rate_per_s,
                workers,
                settings.settle_timeout_s,
                runner.say,
                profiler=runner.profiler,
            )
            paths[name] = summarize(result, settings.rate_per_s)
            if settings.samples:
                paths[name]["samples"] = samples(result)
            runner.say(f"  {name}: {brief(paths[name])}")
        entry["paths"] = paths
        if settings.burst_s:
            found = burst(runner, cloud, submitters[1][1], f"N={hosts} burst")
            if found is not None:
                entry["burst"] = found
        runner.say(f"  auditing the ledger ({hosts:,} providers)")
        entry["audit"] = measure.check_ledger(cloud.stores, f"scale N={hosts}")
        entry["agents"] = len(cloud.spec.node_counts())
        entry["mode"] = cloud.mode
        entry["bus"] = cloud.transport
    return entry


def room_left(cloud: Cloud) -> int:
    """Boots of the sweep's flavor that still fit with a margin (a full cloud refuses)."""
    return int(0.8 * (cloud.spec.slots(SCALE_FLAVOR) - cloud.accepted))


def burst(runner: Runner, cloud: Cloud, submit: Submit, label: str) -> dict[str, Any] | None:
    """Offer far more than the cloud places (library path) and time how fast it drains.

    ``capacity_per_s`` is the accepted boots over the time from the first one due to
    the last one ACTIVE: what the cloud places per second with a backlog, this
    machine's load generator included.
    """
    settings = runner.settings
    count = min(int(settings.burst_rate_per_s * settings.burst_s), room_left(cloud))
    if count < 10:
        runner.say(f"  {label}: skipped, the cloud has room for {room_left(cloud)} more")
        return None
    result = run_phase(
        cloud, label, submit, [SCALE_FLAVOR.name] * count, settings.burst_rate_per_s,
        settings.saturation_workers, settings.settle_timeout_s, runner.say,
    )  # fmt: skip
    stats = summarize(result, settings.burst_rate_per_s)
    launched = [o.launched_at for o in result.outcomes.values() if o.launched_at is not None]
    span_s = max(launched, default=0.0) - (result.sends[0].due if result.sends else 0.0)
    stats["capacity_per_s"] = round(len(launched) / span_s, 1) if span_s > 0 else 0.0
    runner.say(f"  burst: {stats['capacity_per_s']}/s placed with a backlog "
               f"({stats['sent_per_s']}/s sent)")  # fmt: skip
    return stats


# -- 2. saturation ---------------------------------------------------------------------


def run_saturation(runner: Runner) -> dict[str, Any]:
    """Per transport: a ladder of offered rates; the highest one still sustained."""
    return {name: saturate(runner, name, url) for name, url in runner.settings.transports.items()}


def saturate(runner: Runner, name: str, url: str) -> dict[str, Any]:
    settings = runner.settings
    runner.say(f"[saturation] {name}: {settings.saturation_hosts:,} hosts, library path")
    spec = runner.spec(settings.saturation_hosts, (SCALE_FLAVOR,), http=False, transport_url=url)
    entry: dict[str, Any] = {"transport": name, "hosts": settings.saturation_hosts}
    steps: list[dict[str, Any]] = []
    with runner.cloud(spec, entry) as cloud:
        cloud.prime_classes([SCALE_FLAVOR.name])
        submit = LibrarySubmitter(cloud.compute)
        runner.warm_up(cloud, SCALE_FLAVOR.name, [(submit, settings.saturation_workers)])
        misses = 0
        for rate in settings.saturation_rates:
            count = max(1, int(rate * settings.saturation_step_s))
            if count > room_left(cloud):
                entry["stopped"] = f"the cloud is nearly full before {rate:g}/s"
                runner.say(f"  {entry['stopped']}: ladder ends")
                break
            result = run_phase(
                cloud,
                f"{name} {rate:g}/s",
                submit,
                [SCALE_FLAVOR.name] * count,
                rate,
                settings.saturation_workers,
                settings.settle_timeout_s,
                runner.say,
                profiler=runner.profiler,
            )
            step = summarize(result, rate)
            if settings.samples:
                step["samples"] = samples(result)
            step["sustained"] = sustained(step, steps[0] if steps else step)
            steps.append(step)
            runner.say(
                f"  {rate:g}/s offered: {step['placed_in_window_per_s']}/s placed, "
                f"{brief(step)} -> {'sustained' if step['sustained'] else 'NOT sustained'}"
            )
            misses = 0 if step["sustained"] else misses + 1
            if misses >= 2:
                break
        entry["audit"] = measure.check_ledger(cloud.stores, f"saturation {name}")
    entry["steps"] = steps
    ok = [s for s in steps if s["sustained"]]
    entry["sustained_per_s"] = max((s["placed_in_window_per_s"] for s in ok), default=0.0)
    entry["peak_per_s"] = max((s["placed_in_window_per_s"] for s in steps), default=0.0)
    entry["generator_bound"] = any(s["sent_per_s"] < 0.95 * s["offered_per_s"] for s in steps)
    entry["saturated"] = len(ok) < len(steps)  # False: the ladder ended first
    entry["rule"] = SUSTAINED_RULE
    return entry


#: The issue's latency target: a rate that breaks it is not sustained, whatever it places.
P99_LIMIT_MS = 50.0
SUSTAINED_RULE = (
    "a step is sustained when the placements completed within its window reach 95% of the "
    "offered rate, its submit-to-claimed p99 stays under 50 ms (the issue's latency target) "
    "and its p50 within 2x (+5 ms) of the first step's"
)


def sustained(step: dict[str, Any], first: dict[str, Any]) -> bool:
    """See SUSTAINED_RULE."""
    claimed = step["submit_to_claimed_ms"]
    p50, p99, base = claimed["p50"], claimed["p99"], first["submit_to_claimed_ms"]["p50"]
    if p50 is None or p99 is None or base is None:
        return False
    keeps_up = step["placed_in_window_per_s"] >= 0.95 * step["offered_per_s"]
    return bool(keeps_up and p99 < P99_LIMIT_MS and p50 <= 2 * base + 5)


# -- 3. fill ---------------------------------------------------------------------------


def run_fill(runner: Runner) -> dict[str, Any]:
    """A mixed stream into a finite cloud until the first NoValidHost; vs best fit offline."""
    settings = runner.settings
    hosts = settings.fill_hosts
    runner.say(f"[fill] {hosts} hosts, mixed flavors at {settings.fill_rate_per_s:g}/s")
    spec = runner.spec(
        hosts,
        FILL_FLAVORS,
        http=False,
        build_timeout_s=settings.fill_timeout_s,
        heartbeat_interval_s=0.2,
        class_poll_interval_s=0.2,
        reap_interval_s=1.0,
        **FILL_NODE,
    )
    entry: dict[str, Any] = {
        "hosts": hosts,
        "flavors": [dataclasses.asdict(f) for f in FILL_FLAVORS],
        "node": FILL_NODE,
        "seed": FILL_SEED,
    }
    with runner.cloud(spec, entry) as cloud:
        names = [f.name for f in FILL_FLAVORS]
        cloud.prime_classes(names)
        capacities = measure.host_capacities(cloud.stores)
        stream = flavor_stream(FILL_FLAVORS, hosts * 40, FILL_SEED)
        stop = threading.Event()
        watch = NoValidHostWatch(cloud, names, stop)
        watch.start()
        try:
            result = run_phase(
                cloud,
                "fill",
                LibrarySubmitter(cloud.compute),
                [f.name for f in stream],
                settings.fill_rate_per_s,
                settings.library_workers,
                settings.fill_timeout_s + settings.settle_timeout_s,
                runner.say,
                profiler=runner.profiler,
                stop=stop,
            )
        finally:
            stop.set()
            watch.join()
        entry["detected"] = watch.found
        entry["bus"] = cloud.transport
        used, capacity = measure.cloud_usage(cloud.stores)
        entry.update(compare_fill(result, stream, capacities, used, capacity))
        entry["audit"] = measure.check_ledger(cloud.stores, "fill")
    runner.say(
        f"  fill at first NoValidHost {entry['qsched']['at_first_nvh']['bottleneck']:.1%}"
        f" (reference {entry['reference']['at_first_failure']['fractions']['bottleneck']:.1%})"
        f", after drain {entry['qsched']['after_drain']['bottleneck']:.1%}"
        f" (reference {entry['reference']['same_requests']['fractions']['bottleneck']:.1%})"
    )
    return entry


class NoValidHostWatch(threading.Thread):
    """Sets ``stop`` once a class has messages waiting and no live agent consumes it."""

    def __init__(self, cloud: Cloud, classes: list[str], stop: threading.Event) -> None:
        super().__init__(name="nvh-watch", daemon=True)
        self.cloud, self.classes, self.stop = cloud, classes, stop
        self.found: dict[str, Any] | None = None

    def run(self) -> None:
        while not self.stop.wait(0.05):
            consumed = set().union(*self.cloud.agent_classes().values())
            orphans = [c for c in self.classes if c not in consumed]
            depths = self.cloud.queue_depths(orphans) if orphans else {}
            stuck = {c: n for c, n in depths.items() if n}
            if stuck:
                used, capacity = measure.cloud_usage(self.cloud.stores)
                self.found = {
                    "at": time.time(),
                    "waiting": stuck,
                    "consumed": sorted(consumed),
                    "fractions": fractions(used, capacity),
                }
                self.stop.set()


def compare_fill(
    result: PhaseResult,
    stream: list[BenchFlavor],
    capacities: list[dict[str, int]],
    used: dict[str, int],
    capacity: dict[str, int],
) -> dict[str, Any]:
    """qsched's fill at its first NoValidHost and after the drain, and the references."""
    by_name = {f.name: f for f in stream}
    accepted = result.accepted
    states = {s.index: result.outcomes[s.uuid or ""].state for s in accepted}
    placed = [s for s in accepted if states[s.index] == "ACTIVE"]
    failed = [s for s in accepted if states[s.index] == "ERROR"]
    order = {s.index: n for n, s in enumerate(accepted)}  # position among accepted
    first = min((order[s.index] for s in failed), default=None)
    before = [s for s in placed if first is None or order[s.index] < first]
    used_first: dict[str, int] = {}
    for s in before:
        for rc, n in by_name[s.flavor].demand.items():
            used_first[rc] = used_first.get(rc, 0) + n
    demands = [by_name[s.flavor].demand for s in accepted]
    tail = [f.demand for f in stream[len(result.sends) :]]
    return {
        "requests": len(result.sends),
        "accepted": len(accepted),
        "active": len(placed),
        "no_valid_host": len(failed),
        "first_nvh_index": first,
        "qsched": {
            "at_first_nvh": fractions(used_first, capacity),
            "after_drain": fractions(used, capacity),
        },
        "reference": {
            "at_first_failure": best_fit(capacities, demands + tail, True).to_dict(),
            "same_requests": best_fit(capacities, demands, False).to_dict(),
        },
    }


Scenario = Callable[[Runner], Any]
SCENARIOS: dict[str, Scenario] = {
    "scale": run_scale,
    "saturation": run_saturation,
    "fill": run_fill,
    "rules": run_rules,
    "plumbing": run_plumbing,
    "moves": run_moves,
    "instances": run_instances,
}
