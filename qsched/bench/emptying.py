"""Empty a host of its servers, the two ways an operator does, and time it.

*Drain*: the host's compute service disabled, ``qsched-admin service drain``'s engine
(:class:`qsched.admin.drain.Drain`, at that command's default concurrency) lists the
host's servers from its hypervisors and live-migrates each away. *Evacuation*: the
host's service forced down (a host known dead), each server evacuated, one call after
another as ``nova host-evacuate`` does, then waited for.

Each host holds exactly the servers the bench put there: every other host's service
is disabled while they boot. The drain goes to the hosts left (the host to evacuate
kept disabled, so that it holds its own servers only), the evacuation to the same
hosts; then every service is enabled and up again. Both are timed from the first move
asked to the last server up on its new host with its migration ended, from the
ledger's own times (:func:`qsched.bench.measure.read_moves`); each move from its start
in the ledger to its destination's claim and to its end. A server that could not move
(refused, failed, still moving) fails the run, after its figures are in the report.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from qsched import exception
from qsched.admin.drain import Drain
from qsched.bench import measure
from qsched.bench.load import LibrarySubmitter
from qsched.bench.phase import run_phase
from qsched.bench.runner import SCALE_FLAVOR, Runner
from qsched.bench.stack import Cloud
from qsched.compute.services import COMPUTE_BINARY, Change
from qsched.context import ADMIN, RequestContext
from qsched.ledger.base import State

#: who disables, forces down, drains and evacuates
ADMIN_CONTEXT = RequestContext.for_project("bench-admin", "bench-admin", (ADMIN,))
#: ``qsched-admin service drain --concurrency``'s default: servers moving at once
DRAIN_CONCURRENCY = 4
#: what a move of each way ends in when it moved the server
MOVED = {"drain": "completed", "evacuation": "done"}


def empty_hosts(runner: Runner, cloud: Cloud, classes: list[str], entry: dict[str, Any]) -> None:
    """Put ``host_servers`` servers on each of two hosts; drain the first, evacuate the
    second (their summaries into ``entry``); every service enabled and up again after.

    :raises BenchFailure: a server could not move (once its summary is in ``entry``).
    """
    hosts = cloud.hosts_of_agents()
    if len(hosts) < 3:
        raise measure.BenchFailure(f"draining and evacuating a host needs 3 compute hosts "
                                   f"at least, this cloud has {len(hosts)}")  # fmt: skip
    drained, evacuated, others = hosts[0], hosts[1], hosts[2:]
    count = runner.settings.host_servers
    servers = {host: fill(runner, cloud, classes, host, count) for host in (drained, evacuated)}
    try:
        services(cloud, classes, enabled=others)
        entry["drain"] = drain(runner, cloud, drained, servers[drained])
        check(entry["drain"], "the drain")
        services(cloud, classes, enabled=others, down=[evacuated])
        entry["evacuation"] = evacuate(runner, cloud, evacuated, servers[evacuated])
        check(entry["evacuation"], "the evacuation")
    finally:
        services(cloud, classes, enabled=hosts)


def check(summary: dict[str, Any], way: str) -> None:
    """:raises BenchFailure: a server of the host could not move."""
    if summary["could_not_move"]:
        raise measure.BenchFailure(
            f"{way} of {summary['host']}: {summary['could_not_move']} of {summary['servers']} "
            f"servers could not move: {summary['why']}"
        )


def services(
    cloud: Cloud, classes: list[str], enabled: Sequence[str], down: Sequence[str] = ()
) -> None:
    """Enable the services of ``enabled``, disable every other one and force ``down``
    down (the others up); wait until every enabled one consumes every class.

    An agent hears of its service at its next heartbeat and shows what it consumes then
    in the one after: for a host enabled again, only a heartbeat one interval after the
    change counts. A disabled host that still consumes for a moment refuses what it
    gets (the claim checks its service) and stops at once: nobody waits for it.
    """
    agents = cloud.stores.agents
    woken = []
    for host in cloud.hosts_of_agents():
        off = host not in enabled
        if not off and not agents.service(host).schedulable:
            woken.append(host)
        change = Change(disabled=off, disabled_reason="bench" if off else None,
                        forced_down=host in down)  # fmt: skip
        cloud.compute.services.update(ADMIN_CONTEXT, host, COMPUTE_BINARY, change)
    heard, wanted = time.time() + cloud.spec.heartbeat_interval_s, frozenset(classes)
    deadline = time.monotonic() + 60.0
    while True:
        seen = {a.host: a for a in agents.list() if a.alive}
        late = [h for h in enabled if h not in seen or (h in woken and seen[h].last_seen <= heard)
                or not wanted <= frozenset(seen[h].detail.get("classes") or ())]  # fmt: skip
        if not late:
            return
        if time.monotonic() > deadline:
            raise measure.BenchFailure(f"hosts {late[:5]} do not consume {sorted(wanted)} 60s "
                                       "after their services were enabled")  # fmt: skip
        time.sleep(0.05)


def fill(runner: Runner, cloud: Cloud, classes: list[str], host: str, count: int) -> list[str]:
    """Boot ``count`` servers onto ``host`` alone (every other service disabled); their
    uuids, each checked ACTIVE there."""
    settings = runner.settings
    services(cloud, classes, enabled=[host])
    result = run_phase(
        cloud, f"{count} servers onto {host}", LibrarySubmitter(cloud.compute),
        [SCALE_FLAVOR.name] * count, settings.rate_per_s, settings.library_workers,
        settings.settle_timeout_s, runner.say,
    )  # fmt: skip
    uuids = [s.uuid for s in result.accepted if s.uuid is not None]
    placed = cloud.stores.instances.get_many(uuids)
    elsewhere = {u: (i.state.value, i.host) for u, i in placed.items()
                 if i.state != State.ACTIVE or i.host != host}  # fmt: skip
    if len(uuids) != count or elsewhere:
        raise measure.BenchFailure(f"{len(uuids)} of {count} servers accepted for {host}; "
                                   f"not ACTIVE there: {list(elsewhere.items())[:5]}")  # fmt: skip
    return uuids


def drain(runner: Runner, cloud: Cloud, host: str, uuids: list[str]) -> dict[str, Any]:
    """``qsched-admin service drain HOST``'s engine on the disabled ``host``."""
    runner.say(f"  draining {host}: {len(uuids)} servers, {DRAIN_CONCURRENCY} at a time")
    engine = Drain(cloud.compute.cell, ADMIN_CONTEXT)
    began = time.perf_counter()
    servers = engine.servers(host)
    listing_s = time.perf_counter() - began
    if sorted(s.uuid for s in servers) != sorted(uuids):
        raise measure.BenchFailure(f"the drain of {host} lists {len(servers)} servers, the "
                                   f"bench put {len(uuids)} there")  # fmt: skip
    started, began = time.time(), time.perf_counter()
    results = engine.run(servers, DRAIN_CONCURRENCY, runner.settings.settle_timeout_s + len(uuids))
    engine_s = time.perf_counter() - began
    why = {r.uuid: f"{r.outcome}: {r.why}" for r in results if r.outcome != "moved"}
    found = emptied(cloud, "drain", host, uuids, started, why)
    found.update(concurrency=DRAIN_CONCURRENCY, listing_s=round(listing_s, 3),
                 engine_s=round(engine_s, 3))  # fmt: skip
    runner.say(f"  {brief(found)}; listing {found['listing_s']}s, the engine "
               f"{found['engine_s']}s")  # fmt: skip
    return found


def evacuate(runner: Runner, cloud: Cloud, host: str, uuids: list[str]) -> dict[str, Any]:
    """Evacuate each server of ``host``, whose service is forced down; wait for them."""
    runner.say(f"  evacuating {host} (forced down): {len(uuids)} servers")
    refused: dict[str, str] = {}
    started = time.time()
    for uuid in uuids:
        try:
            cloud.compute.moves.evacuate(ADMIN_CONTEXT, uuid)
        except exception.QschedError as exc:
            refused[uuid] = f"refused: {exc}"
    calls_s = time.time() - started
    measure.wait_moved(cloud.stores, uuids, runner.settings.settle_timeout_s)
    found = emptied(cloud, "evacuation", host, uuids, started, refused)
    found["calls_s"] = round(calls_s, 3)
    runner.say(f"  {brief(found)}; the calls {found['calls_s']}s")
    return found


def emptied(
    cloud: Cloud, way: str, host: str, uuids: list[str], started: float, why: dict[str, str]
) -> dict[str, Any]:
    """What became of ``host``'s servers, from the ledger: each ACTIVE on another host
    with its migration ended as ``way`` ends one, or why not."""
    records = cloud.stores.instances.get_many(uuids)
    times = measure.read_moves(cloud.stores, uuids)
    why = dict(why)
    for uuid in uuids:
        if uuid not in why:
            problem = _not_moved(cloud, records.get(uuid), times[uuid], host, MOVED[way])
            if problem:
                why[uuid] = problem
    moved = [times[u] for u in uuids if u not in why]
    ended = [t.finished_at for t in moved if t.finished_at is not None]
    return {
        "host": host,
        "servers": len(uuids),
        "moved": len(moved),
        "could_not_move": len(why),
        "why": dict(list(why.items())[:5]),
        "seconds": round(max(ended) - started, 3) if ended else None,
        "to_claimed_ms": measure.percentiles(
            t.claimed_at - t.requested_at for t in moved if t.claimed_at and t.requested_at
        ),
        "to_done_ms": measure.percentiles(
            t.finished_at - t.requested_at for t in moved if t.finished_at and t.requested_at
        ),
        "destinations": dict(Counter(records[u].host or "" for u in uuids if u not in why)),
    }


def _not_moved(
    cloud: Cloud, record: Any, times: measure.MoveTimes, host: str, status: str
) -> str | None:
    """Why a server of ``host`` did not move (None: it did)."""
    if record is None or times.migration is None:
        return "no move recorded"
    migration = cloud.stores.migrations.get(times.migration)
    if not migration.final:
        return f"migration {migration.uuid} still {migration.status}"
    if migration.status != status:
        return migration.fault or f"migration {migration.uuid} {migration.status}"
    if record.state != State.ACTIVE or record.host in (None, host) or record.migration:
        return f"{record.state.value} on {record.host}"
    return None


def brief(found: dict[str, Any]) -> str:
    done = found["to_done_ms"]
    return (
        f"{found['moved']} of {found['servers']} moved off {found['host']} in "
        f"{found['seconds']}s (each: done p50 {done['p50']} p99 {done['p99']} ms), "
        f"{found['could_not_move']} could not move"
    )
