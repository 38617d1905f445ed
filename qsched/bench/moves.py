"""The moves scenario: resizes and live migrations per N, a host drained and one evacuated.

One cloud per N (``Settings.moves_sizes``: 100 and 100,000 hosts by default), the scale
sweep's nodes and agent processes, run by :data:`COMPUTE_HOSTS` compute hosts at every N
(each agent process runs its share of them, :mod:`qsched.bench.agent` ``--hosts``, as
the rules scenario does). A move is never claimed by its own host: that host hands it
back and pauses its class for ``[agent] handback_pause_s`` (1 s). On the sweep's four
compute hosts a quarter of the moves would meet their own host first and the pauses
would keep the agents idle most of the time (docs/benchmarks.rst, "Moves"); in a cloud
of 100,000 compute hosts one move in 100,000 does. In each cloud, after a host of
``host_servers`` servers drained and another evacuated (:mod:`qsched.bench.emptying`):

* resize: servers booted, then resized to a flavor of more cores (the same RAM, so
  that both sides held until the confirm fit at 100 hosts) through the front door's
  ``resize`` in this process (the library path, as the sweep's boots), open-loop at
  the sweep's rate; then confirmed;
* live migration: servers booted, then ``live_migrate``'d (no host named) the same way.

*Submit to claimed* runs from the call's start to the ``move_claimed`` event that the
destination's ``move_claim`` script writes in the server's history (the migration
leaves ``pre-migrating`` / ``accepted``); *submit to done* to ``move_finished``
(VERIFY_RESIZE for a resize, ``completed`` for a live migration). A few moves of each
kind go first, unmeasured (connections, pools, lazy loads). A move that failed, or
did not end within ``settle_timeout_s``, fails the run; so does the ledger audit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from qsched.bench import measure
from qsched.bench.cpu import CpuMeter
from qsched.bench.emptying import ADMIN_CONTEXT, empty_hosts
from qsched.bench.load import LibrarySubmitter, Sent, Submit, open_loop
from qsched.bench.packing import BenchFlavor
from qsched.bench.phase import run_phase
from qsched.bench.runner import SCALE_FLAVOR, Runner
from qsched.bench.stack import Cloud

#: The sweep's flavor with twice the cores: a resize to it holds no more RAM, the
#: scarcest resource of the sweep's nodes.
RESIZE_FLAVOR = BenchFlavor("bench.medium.cpu", 4, 4096, 20)
FLAVORS = (SCALE_FLAVOR, RESIZE_FLAVOR)
#: compute hosts of a moves cloud (fewer when it has fewer nodes), at every N: one in 16
#: moves meets its own host first and is handed back (a few ms, and a pause of its class
#: on that host alone)
COMPUTE_HOSTS = 16
RESIZE, LIVE = "resize", "live migration"


def run_moves(runner: Runner) -> list[dict[str, Any]]:
    """Per N: resize and live migration latency, a host drained, a host evacuated."""
    results: list[dict[str, Any]] = []
    runner.partial["moves"] = results  # what was measured stays in the report on a failure
    for hosts in runner.settings.moves_sizes:
        runner.say(f"[moves] N = {hosts:,} hosts")
        entry: dict[str, Any] = {"hosts": hosts}
        results.append(entry)
        moves_one(runner, hosts, entry)
    return results


def moves_one(runner: Runner, hosts: int, entry: dict[str, Any]) -> None:
    settings = runner.settings
    processes = max(1, min(settings.agents, hosts))
    spec = runner.spec(hosts, FLAVORS, http=False,
                       hosts_per_agent=-(-COMPUTE_HOSTS // processes))  # fmt: skip
    with runner.cloud(spec, entry) as cloud:
        entry["registration"] = cloud.registration
        entry["compute_hosts"] = len(cloud.hosts_of_agents())
        classes = [f.name for f in FLAVORS]
        cloud.prime_classes(classes)
        empty_hosts(runner, cloud, classes, entry)
        owner = LibrarySubmitter(cloud.compute).context

        def resize(_name: str, uuid: str) -> str:
            cloud.compute.moves.resize(owner, uuid, RESIZE_FLAVOR.name)
            return uuid

        def confirm(_name: str, uuid: str) -> str:
            cloud.compute.moves.confirm(owner, uuid)
            return uuid

        def live(_name: str, uuid: str) -> str:
            cloud.compute.moves.live_migrate(ADMIN_CONTEXT, uuid)
            return uuid

        entry["resize"], resized = timed_moves(runner, cloud, RESIZE, resize)
        check(entry["resize"], f"N={hosts} resize")
        entry["confirm"] = confirm_all(runner, cloud, confirm, resized)
        entry["live_migration"], _ = timed_moves(runner, cloud, LIVE, live)
        check(entry["live_migration"], f"N={hosts} live migration")
        runner.say(f"  auditing the ledger ({hosts:,} providers)")
        entry["audit"] = measure.check_ledger(cloud.stores, f"moves N={hosts}")
        entry["mode"] = cloud.mode
        entry["bus"] = cloud.transport


def timed_moves(
    runner: Runner, cloud: Cloud, kind: str, call: Submit
) -> tuple[dict[str, Any], list[str]]:
    """Boot servers, move a few of them unmeasured, then the rest open-loop at the
    sweep's rate; the summary of the measured ones, and every server booted."""
    settings = runner.settings
    count = max(1, int(settings.rate_per_s * settings.duration_s))
    warm = max(settings.warmup, 2 * settings.library_workers)
    label = f"N={cloud.spec.hosts} {kind}"
    booted = run_phase(
        cloud, f"{label}: servers to move", LibrarySubmitter(cloud.compute),
        [SCALE_FLAVOR.name] * (warm + count), 4 * settings.rate_per_s,
        settings.library_workers, settings.settle_timeout_s, runner.say,
    )  # fmt: skip
    uuids = [s.uuid for s in booted.accepted if s.uuid is not None]
    move_phase(runner, cloud, f"{label} warm-up", call, uuids[:warm], kind == RESIZE)
    found = move_phase(runner, cloud, label, call, uuids[warm:], kind == RESIZE)
    runner.say(f"  {kind}: {brief(found)}")
    return found, uuids


def move_phase(
    runner: Runner, cloud: Cloud, label: str, call: Submit, uuids: Sequence[str], resize: bool
) -> dict[str, Any]:
    """Move ``uuids`` open-loop at the sweep's rate, wait until each move ended (or, a
    resize, waits for its confirm), and sum up."""
    settings = runner.settings
    rate = settings.rate_per_s
    runner.say(f"  {label}: {len(uuids)} moves at {rate:g}/s ({len(uuids) / rate:.1f}s)")
    meter = CpuMeter(cloud.process_groups, cloud.redis_ports, cloud.spec.rabbit_home)
    meter.start()
    began = time.perf_counter()
    sends = open_loop(call, list(uuids), rate, settings.library_workers)
    cpu = meter.stop()
    if cpu:
        cpu["seconds"] = round(time.perf_counter() - began, 3)
    accepted = [s.uuid for s in sends if s.uuid is not None]
    pending = measure.wait_moved(cloud.stores, accepted, settings.settle_timeout_s, resize)
    if pending:
        raise measure.BenchFailure(f"{label}: {len(pending)} moves still under way "
                                   f"{settings.settle_timeout_s:g}s after the last was asked "
                                   f"for, e.g. {pending[:3]}")  # fmt: skip
    return summarize(sends, measure.read_moves(cloud.stores, accepted), rate, cpu)


def summarize(
    sends: Sequence[Sent], moves: dict[str, measure.MoveTimes], rate: float, cpu: dict[str, Any]
) -> dict[str, Any]:
    """Counts and latencies (ms) of a phase of moves, for the JSON report."""
    done = [(s, moves[s.uuid]) for s in sends if s.uuid is not None]
    moved = [(s, m) for s, m in done if m.finished_at is not None]
    errors = [s.error for s in sends if s.error]
    return {
        "offered_per_s": rate,
        "moves": len(sends),
        "accepted": len(done),
        "refused": len(errors),
        "refusal_sample": errors[:3],
        "moved": len(moved),
        "failed": len(done) - len(moved),
        "submit_to_claimed_ms": measure.percentiles(
            m.claimed_at - s.sent for s, m in done if m.claimed_at is not None
        ),
        "submit_to_done_ms": measure.percentiles(
            m.finished_at - s.sent for s, m in moved if m.finished_at is not None
        ),
        "api_call_ms": measure.percentiles(s.answered - s.sent for s in sends),
        "generator_lag_ms": measure.percentiles(s.sent - s.due for s in sends),
        "cpu_cores": cpu,
    }


def confirm_all(
    runner: Runner, cloud: Cloud, call: Callable[[str, str], str], uuids: list[str]
) -> dict[str, Any]:
    """Confirm every resize of ``uuids`` that waits for it (unmeasured: the cloud
    settles before the next phase).

    :raises BenchFailure: a confirm refused, or not ended within ``settle_timeout_s``.
    """
    settings = runner.settings
    records = cloud.stores.inspector.instance_records(uuids, ("resized",))
    uuids = [u for u in uuids if records.get(u, {}).get("resized") == "1"]
    runner.say(f"  confirming {len(uuids)} resizes")
    began = time.perf_counter()
    sends = open_loop(call, uuids, 4 * settings.rate_per_s, settings.library_workers)
    errors = [s.error for s in sends if s.error]
    pending = measure.wait_moved(cloud.stores, uuids, settings.settle_timeout_s)
    if errors or pending:
        raise measure.BenchFailure(f"{len(errors)} confirms refused (e.g. {errors[:2]}), "
                                   f"{len(pending)} not ended (e.g. {pending[:2]})")  # fmt: skip
    return {"confirmed": len(uuids), "seconds": round(time.perf_counter() - began, 2)}


def check(stats: dict[str, Any], label: str) -> None:
    """:raises BenchFailure: a move of the phase failed."""
    if stats["failed"]:
        raise measure.BenchFailure(f"{label}: {stats['failed']} of {stats['accepted']} moves "
                                   "failed")  # fmt: skip


def brief(stats: dict[str, Any]) -> str:
    claimed, done = stats["submit_to_claimed_ms"], stats["submit_to_done_ms"]
    return (
        f"claimed p50 {claimed['p50']} p99 {claimed['p99']} ms, done p50 {done['p50']} "
        f"p99 {done['p99']} ms, {stats['moved']} moved, {stats['failed']} failed, "
        f"{stats['refused']} refused"
    )
