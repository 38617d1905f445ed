"""``qsched-demo``: the whole system in one process, a burst of boots, a summary."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from http import client
from typing import Any
from urllib.parse import urlsplit

import click

from agents.virt.fake import FakeNodeSpec
from qsched.embedded import SharedState, Stack, embedded_options, start_stack
from qsched.ledger.audit import audit
from qsched.ledger.base import State

PROJECT, USER = "demo", "demo"
STATE_PORT = 8775  # --serve: the embedded ledger and bus, for qsched-admin
ADMIN_CONFIG = "qsched-demo.conf"
IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"  # any image UUID: the fake driver boots none
FLAVOR_MIX = (("m1.tiny", 4), ("m1.small", 3), ("m1.medium", 2), ("m1.large", 1))


def post_server(base_url: str, name: str, flavor: str) -> tuple[float, int, dict[str, Any]]:
    """POST /v2.1/servers like a client would; returns (sent at, status, body)."""
    parts = urlsplit(base_url)
    conn = client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    body = json.dumps({"server": {"name": name, "flavorRef": flavor, "imageRef": IMAGE}})
    headers = {"Content-Type": "application/json", "X-Auth-Token": f"{USER}:{PROJECT}"}
    sent = time.time()
    try:
        conn.request("POST", "/v2.1/servers", body, headers)
        response = conn.getresponse()
        return sent, response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def burst(stack: Stack, boots: int, clients: int, seed: int) -> list[tuple[float, int, dict]]:
    """Send ``boots`` POSTs from ``clients`` threads, with a progress bar."""
    rng = random.Random(seed)
    names = [name for name, _ in FLAVOR_MIX]
    flavors = rng.choices(names, [weight for _, weight in FLAVOR_MIX], k=boots)
    results = []
    with (
        ThreadPoolExecutor(clients) as pool,
        click.progressbar(length=boots, label="POST /v2.1/servers", file=sys.stderr) as bar,
    ):
        futures = [pool.submit(post_server, stack.url, f"vm-{i}", f) for i, f in enumerate(flavors)]
        for future in as_completed(futures):
            results.append(future.result())
            bar.update(1)
    return results


def wait_settled(stack: Stack, uuids: list[str], timeout_s: float) -> None:
    """Wait until no accepted instance is in BUILD, with a progress bar."""
    deadline = time.monotonic() + timeout_s
    pending = set(uuids)
    with click.progressbar(length=len(uuids), label="placed or failed ", file=sys.stderr) as bar:
        while pending and time.monotonic() < deadline:
            done = {u for u in pending if stack.stores.instances.get(u).state != State.BUILD}
            pending -= done
            bar.update(len(done))
            if pending:
                time.sleep(0.05)


def summarize(stack: Stack, results: list[tuple[float, int, dict]], elapsed_s: float) -> dict:
    """Counts and latencies from the instance records; over-commit from the ledger itself."""
    accepted = {r[2]["server"]["id"]: r[0] for r in results if r[1] == 202}
    records = [stack.stores.instances.get(u) for u in accepted]
    states = Counter(r.state.value for r in records)
    latencies = sorted(
        (r.launched_at - accepted[r.uuid]) * 1000 for r in records if r.launched_at is not None
    )
    report = audit(stack.stores)
    overcommitted = {item["provider"] for item in report.overcommitted}
    return {
        "boots": len(results),
        "accepted": len(accepted),
        "refused": len(results) - len(accepted),
        "active": states.get("ACTIVE", 0),
        "error": states.get("ERROR", 0),
        "lost": sum(1 for r in records if r.state not in (State.ACTIVE, State.ERROR)),
        "overcommitted_providers": len(overcommitted),
        "audit_ok": report.ok,
        "latency_ms": _percentiles(latencies),
        "hosts": stack.providers,
        "hosts_used": sum(
            1 for p in stack.stores.ledger.list_providers() if any(p.usages.values())
        ),
        "fill": _fill(stack),
        "elapsed_s": round(elapsed_s, 2),
        "placements_per_s": round(states.get("ACTIVE", 0) / elapsed_s, 1) if elapsed_s else 0.0,
    }


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    def at(q: float) -> float | None:
        return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None

    return {"p50": at(0.50), "p99": at(0.99), "max": round(values[-1], 1) if values else None}


def _fill(stack: Stack) -> dict[str, float]:
    used: Counter[str] = Counter()
    capacity: Counter[str] = Counter()
    for provider in stack.stores.ledger.list_providers():
        for rc, inventory in provider.inventories.items():
            capacity[rc] += inventory.capacity
            used[rc] += provider.usages.get(rc, 0)
    return {rc: round(used[rc] / capacity[rc], 3) for rc in sorted(capacity) if capacity[rc]}


def print_table(summary: dict) -> None:
    rows = [
        ("boots sent", summary["boots"]),
        ("accepted (202)", summary["accepted"]),
        ("ACTIVE", summary["active"]),
        ("ERROR", summary["error"]),
        ("lost", summary["lost"]),
        ("over-committed providers", summary["overcommitted_providers"]),
        ("POST to ACTIVE p50 / p99 ms",
         f"{summary['latency_ms']['p50']} / {summary['latency_ms']['p99']}"),
        ("hosts used", f"{summary['hosts_used']} of {summary['hosts']}"),
        ("fill", ", ".join(f"{rc} {v:.0%}" for rc, v in summary["fill"].items())),
        ("placements per second", summary["placements_per_s"]),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        click.echo(f"{name:<{width}}  {value}")


def serve_until_interrupted(stack: Stack, echo: Callable[[str], None]) -> None:
    echo(f"qsched is serving on {stack.url}/v2.1 (Ctrl-C stops it). Try:")
    echo(f"  curl -s -H 'X-Auth-Token: demo:demo' {stack.url}/v2.1/flavors")
    echo(
        f"  curl -s -H 'X-Auth-Token: demo:demo' -H 'Content-Type: application/json' "
        f"""-d '{{"server": {{"name": "vm1", "flavorRef": "m1.small", "imageRef": "{IMAGE}"}}}}' """
        f"{stack.url}/v2.1/servers"
    )
    echo(f"From another terminal: qsched-admin --config-file {ADMIN_CONFIG} queues")
    echo(f"  (also agents, providers, top, server why ID; {ADMIN_CONFIG} was written here)")
    stopped = threading.Event()
    try:
        stopped.wait()
    except KeyboardInterrupt:
        echo("stopping")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--boots",
    type=click.IntRange(0),
    default=None,
    help="Boot requests to send through HTTP [default: 2000; 0 with --serve].",
)
@click.option(
    "--hosts",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    help="Simulated compute hosts.",
)
@click.option(
    "--agents",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Agent threads sharing the hosts.",
)
@click.option(
    "--clients",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Concurrent HTTP clients.",
)
@click.option(
    "--spawn-delay-s",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Seconds each fake spawn takes.",
)
@click.option(
    "--failure-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Share of spawns that fail and get rescheduled.",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(1),
    default=120.0,
    show_default=True,
    help="Build timeout: a request not placed by then ends in ERROR NoValidHost.",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the flavor mix.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--serve",
    is_flag=True,
    help="Keep the stack up on 127.0.0.1:8774 for curl or python-novaclient "
    "(token 'demo:demo' or 'admin') until Ctrl-C. The ledger and bus are then served "
    "on 127.0.0.1:8775 (Redis protocol) and qsched-demo.conf is written in the current "
    "directory, so that qsched-admin --config-file qsched-demo.conf can inspect them.",
)
def main(
    boots: int | None,
    hosts: int,
    agents: int,
    clients: int,
    spawn_delay_s: float,
    failure_rate: float,
    timeout_s: float,
    seed: int,
    as_json: bool,
    serve: bool,
) -> None:
    """Run qsched on the embedded default and place a burst of boots.

    Everything runs in this process with no server to install: the API on a
    local port (Nova's /v2.1 shapes), agents driving simulated hosts, the
    kombu memory:// bus and an in-process fakeredis ledger. The burst mixes
    m1.tiny, m1.small, m1.medium and m1.large 4:3:2:1 and goes through HTTP
    like any client. The summary counts come from the instance records;
    over-committed providers are computed from the ledger's own allocations.

    Hosts have 32 VCPUs (allocation ratio 4.0), 128 GiB of RAM and 2 TB of disk.
    """  # fmt: skip
    boots = (0 if serve else 2000) if boots is None else boots
    overrides: dict[str, tuple[str | None, object]] = {"build_timeout_s": ("scheduler", timeout_s)}
    shared = SharedState(STATE_PORT) if serve else None
    if shared is not None:
        overrides |= {"url": ("ledger", shared.ledger_url),
                      "transport_url": (None, shared.transport_url)}  # fmt: skip
    options = embedded_options(**overrides)
    if shared is not None:
        shared.write_config(options, ADMIN_CONFIG)
    spec = FakeNodeSpec(vcpus=32, ram_mb=131072, disk_gb=2000, cpu_allocation_ratio=4.0)
    stack = start_stack(options, hosts, agents, spec, port=8774 if serve else 0,
                        spawn_delay_s=spawn_delay_s, failure_rate=failure_rate)  # fmt: skip
    stack.stores.quota.set_limits(PROJECT, instances=-1, cores=-1, ram_mb=-1)
    try:
        if boots:
            started = time.monotonic()
            results = burst(stack, boots, clients, seed)
            accepted = [r[2]["server"]["id"] for r in results if r[1] == 202]
            wait_settled(stack, accepted, timeout_s + 5)
            summary = summarize(stack, results, time.monotonic() - started)
            click.echo(json.dumps(summary, indent=2)) if as_json else print_table(summary)
            if summary["lost"] or summary["overcommitted_providers"] or not summary["audit_ok"]:
                raise click.ClickException("an invariant broke: see the summary above")
        if serve:
            serve_until_interrupted(stack, lambda s: click.echo(s, err=True))
    finally:
        stack.stop()
        if shared is not None:
            shared.stop()
