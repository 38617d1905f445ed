"""The instances scenario: a cloud with many current and past instances next to an empty one.

Two clouds of the same hosts, one after the other in the same run: one with no
instance, one preloaded (:func:`qsched.ledger.bulk.preload`, the real scripts
pipelined) with live ACTIVE instances spread over its nodes and past DELETED ones.
For each: the Redis memory the hosts take, then the preload (live, then past), the
keys of a sample measured one by one (``MEMORY USAGE``); the agents restarted (their
start reads every claim of their nodes); boots at a fixed rate through the library
path (submit to claimed, to ACTIVE); the same servers deleted at the same rate
(delete to DELETED); the audit; and, preloaded, ``archive-deleted`` of the past
instances (its rate, and the memory it gives back).

``used_memory`` is the whole server's: on a shared Redis, other databases' writes
show in its differences; the per-key figures are exact either way.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from typing import Any

from qsched.admin.archive import archive_deleted
from qsched.bench import measure
from qsched.bench.load import LibrarySubmitter, Sent, open_loop
from qsched.bench.phase import run_phase, summarize
from qsched.bench.runner import SCALE_FLAVOR, Runner
from qsched.bench.stack import Cloud
from qsched.ledger import bulk

#: instances whose keys are measured one by one, of each kind
MEMORY_SAMPLE = 1000


def run_instances(runner: Runner) -> list[dict[str, Any]]:
    """The same cloud with none and with ``preload_instances`` preloaded."""
    settings = runner.settings
    results = []
    for preload in dict.fromkeys((0, settings.preload_instances)):
        runner.say(f"[instances] {settings.instances_hosts:,} hosts, {preload:,} instances "
                   "preloaded")  # fmt: skip
        entry: dict[str, Any] = {"hosts": settings.instances_hosts, "preloaded": preload}
        runner.partial.setdefault("instances", []).append(entry)
        instances_one(runner, preload, entry)
        results.append(entry)
    runner.partial.pop("instances", None)
    return results


def instances_one(runner: Runner, preload: int, entry: dict[str, Any]) -> None:
    settings = runner.settings
    before = _memory(runner, None)
    spec = runner.spec(settings.instances_hosts, (SCALE_FLAVOR,), http=False)
    with runner.cloud(spec, entry) as cloud:
        memory: dict[str, Any] = {"scope": "INFO used_memory of the whole server, bytes"}
        memory["before"] = before
        memory["hosts"] = _memory(runner, cloud)
        entry["registration"] = cloud.registration
        live = int(preload * settings.preload_live_share)
        loaded = _preload(runner, cloud, live, preload - live, memory)
        entry["memory"] = memory
        entry["per_item_bytes"] = per_item(memory, settings.instances_hosts, live, preload - live)
        if loaded is not None:
            providers = [n.provider for n in _nodes(cloud)[:MEMORY_SAMPLE]]
            entry["keys_live"] = bulk.record_memory(cloud.stores, loaded.live[:MEMORY_SAMPLE],
                                                    providers)  # fmt: skip
            entry["keys_past"] = bulk.record_memory(cloud.stores, loaded.past[:MEMORY_SAMPLE], [])
        runner.say("  restarting the agents")
        entry["agent_restart"] = cloud.restart_agents()
        cloud.prime_classes([SCALE_FLAVOR.name])
        submit = LibrarySubmitter(cloud.compute)
        runner.warm_up(cloud, SCALE_FLAVOR.name, [(submit, settings.library_workers)])
        count = max(1, int(settings.rate_per_s * settings.duration_s))
        result = run_phase(
            cloud, f"{preload:,} preloaded", submit, [SCALE_FLAVOR.name] * count,
            settings.rate_per_s, settings.library_workers, settings.settle_timeout_s,
            runner.say,
        )  # fmt: skip
        entry["boots"] = summarize(result, settings.rate_per_s)
        booted = [s.uuid for s in result.accepted if s.uuid]
        entry["keys_booted"] = bulk.record_memory(cloud.stores, booted[:MEMORY_SAMPLE], [])
        entry["deletes"] = delete_phase(runner, cloud, booted)
        runner.say(f"  auditing the ledger ({settings.instances_hosts:,} providers)")
        entry["audit"] = measure.check_ledger(cloud.stores, f"instances {preload:,}")
        if loaded is not None and loaded.past:
            entry["archive"] = archive_phase(runner, cloud, memory)
    runner.say(f"  {_brief(entry)}")


def _preload(
    runner: Runner, cloud: Cloud, live: int, past: int, memory: dict[str, Any]
) -> bulk.Preloaded | None:
    """Live instances, then past ones, the memory after each."""
    if not live + past:
        return None
    nodes = _nodes(cloud)
    extra = _booted_extra(runner, cloud)
    flavor = {"name": SCALE_FLAVOR.name, "vcpus": SCALE_FLAVOR.vcpus,
              "ram_mb": SCALE_FLAVOR.ram_mb, "disk_gb": SCALE_FLAVOR.disk_gb}  # fmt: skip
    found = []
    for what, count in (("live", live), ("past", past)):
        runner.say(f"  preloading {count:,} {what} instances")
        live_n, past_n = (count, 0) if what == "live" else (0, count)
        done = bulk.preload(cloud.stores, nodes, flavor, live_n, past_n,
                            progress=_every(runner, what), extra=extra)  # fmt: skip
        memory[what] = _memory(runner, cloud)
        memory[f"{what}_load_s"] = done.seconds
        found.append(done)
    return bulk.Preloaded(found[0].live, found[1].past, found[0].seconds + found[1].seconds)


def _booted_extra(runner: Runner, cloud: Cloud) -> dict[str, Any]:
    """The boot details the front door records for one server booted here: what the
    preloaded records keep too, so that they are of a booted one's size."""
    cloud.prime_classes([SCALE_FLAVOR.name])
    uuid = LibrarySubmitter(cloud.compute)("bench-template", SCALE_FLAVOR.name)
    if _wait_for(cloud, [uuid], runner.settings.settle_timeout_s, "ACTIVE"):
        raise measure.BenchFailure(f"the template server {uuid} did not go ACTIVE")
    return dict(cloud.stores.instances.get(uuid).extra)


def _every(runner: Runner, what: str) -> Any:
    last = [time.monotonic()]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 10 or done == total:
            last[0] = time.monotonic()
            runner.say(f"    {what}: {done:,}/{total:,}")

    return progress


def _nodes(cloud: Cloud) -> list[bulk.Node]:
    """Every root provider of the cloud as a node to place preloaded instances on."""
    providers = cloud.stores.ledger.list_providers()
    return [bulk.Node(p.host or "", p.name, p.uuid) for p in providers
            if p.parent_uuid is None and p.host]  # fmt: skip


def _memory(runner: Runner, cloud: Cloud | None) -> int | None:
    """The ledger server's used_memory: through the cloud's stores, or (None: before it
    starts) a connection of its own."""
    if cloud is not None:
        return bulk.used_memory(cloud.stores)
    return None if runner.settings.embedded else bulk.used_memory_at(runner.settings.ledger_url)


def per_item(memory: dict[str, Any], hosts: int, live: int, past: int) -> dict[str, Any]:
    """Bytes per host, per live and per past instance, from the differences of
    ``used_memory`` (None where a figure is missing)."""

    def share(after: str, before: str, count: int) -> float | None:
        a, b = memory.get(after), memory.get(before)
        return round((a - b) / count, 1) if a is not None and b is not None and count else None

    return {
        "host": share("hosts", "before", hosts),
        "live_instance": share("live", "hosts", live),
        "past_instance": share("past", "live", past),
    }


def delete_phase(runner: Runner, cloud: Cloud, uuids: Sequence[str]) -> dict[str, Any]:
    """Delete ``uuids`` at the boots' rate; delete call to DELETED in the ledger."""
    settings = runner.settings
    context = LibrarySubmitter(cloud.compute).context  # the owner of the boots

    def delete(_name: str, uuid: str) -> str:
        cloud.compute.delete(context, uuid)
        return uuid

    runner.say(f"  deleting {len(uuids)} at {settings.rate_per_s:g}/s")
    sends = open_loop(delete, list(uuids), settings.rate_per_s, settings.library_workers)
    left = _wait_for(cloud, list(uuids), settings.settle_timeout_s)
    if left:
        raise measure.BenchFailure(f"{len(left)} deleted servers not DELETED after "
                                   f"{settings.settle_timeout_s:g}s (e.g. {left[:3]})")  # fmt: skip
    return _delete_stats(cloud, sends)


def _wait_for(
    cloud: Cloud, uuids: list[str], timeout_s: float, state: str = "DELETED"
) -> list[str]:
    """Wait until every one is in ``state``; those that are not at the timeout."""
    deadline = time.monotonic() + timeout_s
    while uuids:
        found = measure.states(cloud.stores, uuids)
        uuids = [u for u in uuids if found[u] != state]
        if not uuids or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return uuids


def _delete_stats(cloud: Cloud, sends: Sequence[Sent]) -> dict[str, Any]:
    latencies, errors = [], [s.error for s in sends if s.error]
    for sent in sends:
        if sent.uuid is None:
            continue
        ended = [e.time for e in cloud.stores.instances.events(sent.uuid) if e.event == "deleted"]
        if ended:
            latencies.append(ended[-1] - sent.sent)
    return {
        "deletes": len(sends),
        "deleted": len(latencies),
        "errors": len(errors),
        "error_sample": errors[:3],
        "delete_to_deleted_ms": measure.percentiles(latencies),
    }


def archive_phase(runner: Runner, cloud: Cloud, memory: dict[str, Any]) -> dict[str, Any]:
    """archive-deleted of every past instance; the history goes to memory (discarded):
    its rate and the memory it gives back."""
    runner.say("  archiving the deleted instances")
    out = _Counting()
    report = archive_deleted(cloud.stores.archive, out, time.time() + 1, batch=1000)
    memory["archived"] = _memory(runner, cloud)
    done = report.to_dict()
    done["history_bytes"] = out.size
    done["per_s"] = round(report.archived / report.seconds, 1) if report.seconds else None
    return done


class _Counting(io.StringIO):
    """A history stream that keeps only its size (the scenario needs no history)."""

    size = 0

    def write(self, text: str) -> int:
        self.size += len(text)
        return len(text)


def _brief(entry: dict[str, Any]) -> str:
    boots, deletes = entry["boots"]["submit_to_claimed_ms"], entry["deletes"]
    restart = entry.get("agent_restart") or {}
    return (
        f"claimed p50 {boots['p50']} p99 {boots['p99']} ms; delete p50 "
        f"{deletes['delete_to_deleted_ms']['p50']} p99 {deletes['delete_to_deleted_ms']['p99']}"
        f" ms; agents restarted in {restart.get('ready_s')} s; per item "
        f"{entry['per_item_bytes']}"
    )
