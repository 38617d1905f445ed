"""qsched-ledger-bench: how fast the ledger claims, and a short walk-through of it.

One operation is the full claim an agent makes: :func:`qsched.ledger.retry.claim`
of one flavor's resources on one provider, for an instance booted through quota
beforehand and still waiting in BUILD. Each backend builds one cloud, then runs
single-threaded and with N client threads; every run boots its own instances.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from qsched import exception
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores, server
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, Inventory, State
from qsched.ledger.retry import claim
from qsched.resources import DISK_GB, MEMORY_MB, VCPU
from qsched.urls import masked

DEFAULT_URL = "redis://127.0.0.1:6379/9"
PROJECT = "bench"
FLAVOR = {"name": "bench.small", "vcpus": 1, "ram_mb": 512, "disk_gb": 1}
CLAIM = {VCPU: 1, MEMORY_MB: 512, DISK_GB: 1}
# room for 1024 bench.small claims per provider
NODE = {
    VCPU: Inventory(64, allocation_ratio=16.0),
    MEMORY_MB: Inventory(512 * 1024),
    DISK_GB: Inventory(1024),
}
REFERENCE = {
    "system": "OpenStack Placement 16.0",
    "claims_per_s": [45, 80],
    "note": "reference figure for this kind of machine, not measured by this run",
}

Progress = Callable[[str, int], Any]  # (label, length) -> a click progress bar


@dataclasses.dataclass(frozen=True)
class Task:
    instance: str
    provider: str
    node: str


@dataclasses.dataclass(frozen=True)
class Result:
    backend: str
    threads: int
    claims: int
    refused: int
    conflicts: int
    seconds: float
    claims_per_s: float
    p50_ms: float
    p99_ms: float


@dataclasses.dataclass
class Report:
    providers: int
    claims: int
    threads: int
    results: list[Result] = dataclasses.field(default_factory=list)
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"reference": REFERENCE}


# Measuring


class Ticker:
    """A counter the client threads bump and the main thread drains into the progress bar."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def tick(self) -> None:
        with self._lock:
            self._count += 1

    def take(self) -> int:
        with self._lock:
            count, self._count = self._count, 0
        return count


@dataclasses.dataclass
class Client:
    """One client thread: its share of the claims and what it measured."""

    tasks: Sequence[Task]
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    refused: int = 0
    conflicts: int = 0
    failure: BaseException | None = None

    def run(self, stores: Stores, start: threading.Barrier, ticker: Ticker) -> None:
        start.wait()
        try:
            for task in self.tasks:
                self.claim_one(stores, task)
                ticker.tick()
        except Exception as exc:  # reported by the main thread, not lost with this one
            self.failure = exc

    def claim_one(self, stores: Stores, task: Task) -> None:
        began = time.perf_counter()
        try:
            done = claim(stores.ledger, task.instance, {task.provider: CLAIM}, task.node, task.node)
            self.conflicts += done.conflicts
        except exception.Conflict:
            self.refused += 1  # no room left, or the instance is not waiting any more
        self.latencies_s.append(time.perf_counter() - began)


def measure(backend: str, stores: Stores, tasks: list[Task], threads: int, bar: Any) -> Result:
    """Run ``tasks`` on ``threads`` client threads started together; time each claim."""
    clients = [Client(tasks[i::threads]) for i in range(threads)]
    start, ticker = threading.Barrier(threads + 1), Ticker()
    pool = [
        threading.Thread(target=c.run, args=(stores, start, ticker), daemon=True) for c in clients
    ]
    for thread in pool:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in pool:
        while thread.is_alive():
            thread.join(0.1)
            bar.update(ticker.take())
    seconds = time.perf_counter() - began
    bar.update(ticker.take())
    return summarize(backend, threads, clients, seconds)


def summarize(backend: str, threads: int, clients: list[Client], seconds: float) -> Result:
    failures = [c.failure for c in clients if c.failure is not None]
    if failures:
        raise click.ClickException(f"{backend}: a client thread failed: {failures[0]!r}")
    latencies = sorted(s for c in clients for s in c.latencies_s)
    return Result(
        backend=backend,
        threads=threads,
        claims=len(latencies),
        refused=sum(c.refused for c in clients),
        conflicts=sum(c.conflicts for c in clients),
        seconds=round(seconds, 3),
        claims_per_s=round(len(latencies) / seconds, 1) if seconds else 0.0,
        p50_ms=round(percentile(latencies, 0.50) * 1000, 3),
        p99_ms=round(percentile(latencies, 0.99) * 1000, 3),
    )


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0.0 when it is empty)."""
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# Setting up


def open_bench_stores(url: str, durability: str = "async") -> Stores:
    options = LedgerOptions.defaults().replace(
        durability=durability,
        durability_timeout_ms=5000,  # a loaded machine
    )
    stores = open_stores(options, url=url)
    stores.quota.set_limits(PROJECT, instances=-1, cores=-1, ram_mb=-1)
    return stores


def build_cloud(stores: Stores, providers: int, progress: Progress) -> list[tuple[str, str]]:
    """Create ``providers`` compute nodes with room for 1024 claims each; (uuid, name)."""
    cloud = [(str(uuid.uuid4()), f"bench-node-{i:06d}") for i in range(providers)]
    with progress("providers", providers) as bar:
        for rp, name in cloud:
            stores.ledger.create_provider(rp, name)
            stores.ledger.set_inventory(rp, 0, NODE)
            bar.update(1)
    return cloud


def boot(
    stores: Stores, cloud: list[tuple[str, str]], count: int, progress: Progress
) -> list[Task]:
    """Boot ``count`` instances through quota (BUILD) and pick a random node for each."""
    rng, tasks = random.Random(count), []
    with progress("instances", count) as bar:
        for _ in range(count):
            inst = Instance(str(uuid.uuid4()), PROJECT, "bench", "vm", FLAVOR, State.BUILD)
            stores.instances.create(inst, deadline=time.time() + 3600)
            rp, name = rng.choice(cloud)
            tasks.append(Task(inst.uuid, rp, name))
            bar.update(1)
    return tasks


def bench_backend(
    backend: str,
    url: str,
    report: Report,
    thread_counts: Sequence[int],
    progress: Progress,
    durability: str = "async",
) -> None:
    """Build one cloud on ``url``, then time the claims at each thread count."""
    stores = open_bench_stores(url, durability)
    cloud = build_cloud(stores, report.providers, progress)
    for threads in thread_counts:
        tasks = boot(stores, cloud, report.claims, progress)
        with progress(f"claims, {backend}, {threads} thread(s)", len(tasks)) as bar:
            report.results.append(measure(backend, stores, tasks, threads, bar))


# Real Redis


def check_redis_url(url: str, force: bool) -> None:
    """Refuse what cannot be a scratch database: a bad URL, or db 0 without --force."""
    try:
        db = server.db_number(url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--redis-url") from exc
    if db == 0 and not force:
        raise click.BadParameter(
            "this would FLUSH db 0, usually the one that matters; pick a scratch db "
            "(redis://host:6379/9) or add --force",
            param_hint="--redis-url",
        )


def bench_real_redis(
    url: str, report: Report, thread_counts: Sequence[int], progress: Progress
) -> None:
    why = server.unreachable(url)
    if why is not None:
        reason = f"real Redis at {masked(url)} not reachable ({why}): skipped"
        report.skipped.append({"backend": "redis", "reason": reason})
        return
    with server.flushed(url):
        bench_backend("redis", url, report, thread_counts, progress)


# Durability: servers of the run's own, one per setting


def bench_durability(report: Report, thread_counts: Sequence[int], progress: Progress) -> None:
    """Claims under each ``[ledger] durability``, each on redis-servers started for it.

    ``async`` on a server with ``appendfsync everysec``; ``replica`` on such a
    server and one replica; ``disk`` on a server with ``appendfsync always``. All
    on this machine, so ``replica`` pays a loopback round trip, not a network's,
    and ``disk`` this machine's fsync.
    """
    with tempfile.TemporaryDirectory(prefix="qsched-durability-") as tmp:
        for mode in ("async", "replica", "disk"):
            servers = server.start_for(Path(tmp), mode, mode)
            try:
                bench_backend(f"redis {mode}", servers[0].url, report, thread_counts, progress,
                              mode)  # fmt: skip
            finally:
                for running in reversed(servers):
                    running.stop()


# Output


def render_table(report: Report) -> str:
    lines = [
        f"qsched ledger claims: {report.providers} providers, {report.claims} claims per run",
        "",
        f"{'backend':<14} {'threads':>7} {'claims/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'refused':>8} {'conflicts':>9}",
    ]
    for r in report.results:
        lines.append(
            f"{r.backend:<14} {r.threads:>7} {r.claims_per_s:>10.1f} {r.p50_ms:>8.3f} "
            f"{r.p99_ms:>8.3f} {r.refused:>8} {r.conflicts:>9}"
        )
    lines += [s["reason"] for s in report.skipped]
    low, high = REFERENCE["claims_per_s"]
    lines += [
        "",
        f"Reference, NOT measured by this run: {REFERENCE['system']} claims "
        f"{low}-{high}/s on this kind of machine.",
    ]
    return "\n".join(lines)


def stderr_progress(label: str, length: int) -> Any:
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)


# The demo


def step(number: int, title: str) -> None:
    click.secho(f"\n{number}. {title}", bold=True)


def demo_cloud(stores: Stores) -> dict[str, str]:
    """Three compute nodes: 4 cores (x4.0), 16 GiB, 100 GB each. {uuid: name}."""
    step(1, "Three compute nodes report their inventory")
    nodes = {str(uuid.uuid4()): f"node-{i}" for i in (1, 2, 3)}
    for rp, name in nodes.items():
        stores.ledger.create_provider(rp, name)
        inventory = {
            VCPU: stores.ledger.default_inventory(VCPU, 4),
            MEMORY_MB: Inventory(16384),
            DISK_GB: Inventory(100),
        }
        generation = stores.ledger.set_inventory(rp, 0, inventory)
        click.echo(
            f"   {name}: VCPU 4 x4.0 = 16, MEMORY_MB 16384, DISK_GB 100 (generation {generation})"
        )
    return nodes


def demo_flavor(name: str, vcpus: int, ram_mb: int) -> dict[str, Any]:
    return {"name": name, "vcpus": vcpus, "ram_mb": ram_mb, "disk_gb": 10}


def demo_create(stores: Stores, name: str, flavor: dict[str, Any]) -> Instance:
    inst = Instance(str(uuid.uuid4()), "demo", "alice", name, flavor, State.BUILD)
    return stores.instances.create(inst, deadline=time.time() + 600)


def demo_boot(stores: Stores, nodes: dict[str, str]) -> None:
    step(3, "Boot three m1.medium (2 VCPU, 4096 MB): reserve quota, claim, go ACTIVE")
    for i, (rp, node) in enumerate(nodes.items(), 1):
        inst = demo_create(stores, f"vm-{i}", demo_flavor("m1.medium", 2, 4096))
        done = claim(
            stores.ledger, inst.uuid, {rp: {VCPU: 2, MEMORY_MB: 4096, DISK_GB: 10}}, node, node
        )
        stores.instances.set_active(inst.uuid, node, node)
        click.echo(
            f"   vm-{i}: BUILD -> claimed on {node} (consumer generation "
            f"{done.generation}) -> ACTIVE"
        )


def demo_usages(stores: Stores, nodes: dict[str, str]) -> None:
    for rp, name in nodes.items():
        provider = stores.ledger.get_provider(rp)
        used = ", ".join(
            f"{rc} {provider.usages.get(rc, 0)}/{inv.capacity}"
            for rc, inv in sorted(provider.inventories.items())
        )
        click.echo(f"   {name}: {used} (generation {provider.generation})")
    demo_quota(stores)


def demo_quota(stores: Stores) -> None:
    usage, limits = stores.quota.get_usage("demo"), stores.quota.get_limits("demo")
    click.echo(
        f"   project demo quota: instances {usage.instances}/{limits.instances}, "
        f"cores {usage.cores}/{limits.cores}, ram {usage.ram_mb}/{limits.ram_mb} MB"
    )


def demo_over_quota(stores: Stores) -> None:
    step(5, "Over quota: boot an m1.large (4 VCPU, 8192 MB)")
    try:
        demo_create(stores, "vm-big", demo_flavor("m1.large", 4, 8192))
    except exception.QuotaExceeded as exc:
        click.echo(f"   refused, nothing recorded: {exc}")


def demo_over_capacity(stores: Stores, nodes: dict[str, str]) -> None:
    step(6, "Over capacity: an m1.bigmem (1 VCPU, 16384 MB) fits the quota, but no node")
    inst = demo_create(stores, "vm-bigmem", demo_flavor("m1.bigmem", 1, 16384))
    demo_quota(stores)
    for rp, node in nodes.items():
        try:
            claim(stores.ledger, inst.uuid, {rp: {VCPU: 1, MEMORY_MB: 16384}}, node, node)
        except exception.CapacityExceeded as exc:
            click.echo(f"   {node} refuses the claim, nothing written: {exc}")
    stores.instances.set_error(inst.uuid, "No valid host was found.", {"tried": list(nodes)})
    click.echo("   vm-bigmem goes ERROR (No valid host was found.) and its quota comes back")


def demo_audit(stores: Stores) -> None:
    report = audit(stores)
    step(8, f"Audit of the ledger's own records: {'ok' if report.ok else 'BROKEN'}")
    click.echo(
        f"   {report.providers} providers, {report.consumers} consumers; over-committed "
        f"{len(report.overcommitted)}, usage mismatches {len(report.usage_mismatches)}, "
        f"orphan allocations {len(report.orphan_allocations)}, quota mismatches "
        f"{len(report.quota_mismatches)}"
    )


def run_demo() -> None:
    click.secho("qsched ledger demo (in-process fakeredis, nothing is kept)", bold=True)
    embedded = LedgerOptions.defaults().replace(durability="async")  # it keeps nothing anyway
    stores = open_stores(embedded, url=f"fakeredis://demo-{uuid.uuid4().hex}")
    nodes = demo_cloud(stores)
    step(2, "Project demo gets a quota: 10 instances, 8 cores, 32768 MB")
    stores.quota.set_limits("demo", instances=10, cores=8, ram_mb=32768)
    demo_boot(stores, nodes)
    step(4, "Usages: each claim bumped its node's generation once")
    demo_usages(stores, nodes)
    demo_over_quota(stores)
    demo_over_capacity(stores, nodes)
    step(7, "Usages after the refusals: as before")
    demo_usages(stores, nodes)
    demo_audit(stores)


# The command


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--redis-url",
    default=DEFAULT_URL,
    show_default=True,
    metavar="URL",
    help="Real Redis to measure. WARNING: its database is FLUSHED (FLUSHDB) before and "
    "after the run. db 0 is refused unless --force.",
)
@click.option(
    "--backend",
    type=click.Choice(["all", "redis", "fakeredis", "durability"]),
    default="all",
    show_default=True,
    help="Which ledger backends to measure. A real Redis that does not answer is "
    "reported and skipped. durability: instead, each [ledger] durability setting (async, "
    "replica, disk) on redis-servers this run starts for it (needs redis-server on PATH; "
    "--redis-url is not used).",
)
@click.option(
    "--providers",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Compute nodes in the cloud, each with room for 1024 claims.",
)
@click.option(
    "--claims",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Claims per run, each on an instance booted beforehand.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Client threads of the concurrent run (a run with 1 comes first).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for scripts.",
)
@click.option("--force", is_flag=True, help="Allow --redis-url to name db 0 (and flush it).")
@click.option(
    "--demo",
    is_flag=True,
    help="Instead: a short walk-through on in-process fakeredis (a few seconds).",
)
def main(
    redis_url: str,
    backend: str,
    providers: int,
    claims: int,
    threads: int,
    fmt: str,
    force: bool,
    demo: bool,
) -> None:
    """Measure how fast the qsched ledger claims resources.

    One claim is what a compute agent does once it has picked a node: the full
    qsched.ledger.retry.claim of one flavor (1 VCPU, 512 MB, 1 GB) on one
    provider, for an instance booted through quota beforehand and waiting in
    BUILD. Each backend (in-process fakeredis, then a real Redis at --redis-url)
    gets a cloud of --providers nodes; then --claims claims are timed from one
    client thread, and again from --threads client threads. The output gives
    claims per second and the p50 and p99 latency of one claim, next to the
    OpenStack Placement 16.0 reference figure (45-80 claims/s on this kind of
    machine), which this run does not measure.

    \b
    The --redis-url database is FLUSHED before and after: point it at a scratch
    database, never at a ledger in use.

    \b
    Columns:
      claims/s   claims finished per second of wall time, all threads together
      p50, p99   latency of one claim, conflict retries included
      refused    claims the ledger turned down (no room left); none on a default run
      conflicts  generation conflicts the clients resolved by re-reading

    \b
    Examples:
      qsched-ledger-bench
      qsched-ledger-bench --backend fakeredis --providers 100 --claims 500
      qsched-ledger-bench --redis-url redis://10.0.0.5:6379/15 --threads 32 --format json
      qsched-ledger-bench --backend durability   # what each [ledger] durability costs
      qsched-ledger-bench --demo
    """
    if demo:
        run_demo()
        return
    report = Report(providers, claims, threads)
    thread_counts = sorted({1, threads})
    if backend == "durability":
        bench_durability(report, thread_counts, stderr_progress)
        text = json.dumps(report.to_dict(), indent=2) if fmt == "json" else render_table(report)
        click.echo(text)
        return
    if backend != "fakeredis":
        check_redis_url(redis_url, force)
    if backend != "redis":
        url = f"fakeredis://bench-{uuid.uuid4().hex}"
        bench_backend("fakeredis", url, report, thread_counts, stderr_progress)
    if backend != "fakeredis":
        bench_real_redis(redis_url, report, thread_counts, stderr_progress)
    text = json.dumps(report.to_dict(), indent=2) if fmt == "json" else render_table(report)
    click.echo(text)
