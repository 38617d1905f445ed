"""``qsched-demo``: the whole system in one process, a burst of boots, a summary."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from http import client
from typing import Any
from urllib.parse import urlsplit

import click

from agents.virt.fake import FakeChild, FakeNodeSpec
from qsched.embedded import SharedState, Stack, embedded_options, start_stack
from qsched.flavors import Flavor
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, Provider, State

PROJECT, USER = "demo", "demo"
STATE_PORT = 8775  # --serve: the embedded ledger and bus, for qsched-admin
ADMIN_CONFIG = "qsched-demo.conf"
IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"  # any image UUID: the fake driver boots none
#: Every node's GPU, a child provider of its root (as the bench's nodes have).
GPU_TRAIT = "CUSTOM_DEMO_GPU"
GPU_CHILD = FakeChild.parse(f"gpu0:VGPU=8;{GPU_TRAIT}")
#: A nested flavor: its VGPU comes from the GPU child (a granular group), the rest
#: from the root.
GPU_FLAVOR = Flavor(
    "g1.vgpu", 2, 4096, 20,
    extra_specs={"resources1:VGPU": "1", f"trait1:{GPU_TRAIT}": "required"},
)  # fmt: skip
FLAVOR_MIX = (
    ("m1.tiny", 4), ("m1.small", 3), ("m1.medium", 2), ("m1.large", 1), (GPU_FLAVOR.name, 1),
)  # fmt: skip
#: The paced phase: well below what one process places, so nothing queues.
PACED_BOOTS, PACED_RATE_PER_S = 200, 50.0


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


Sent = list[tuple[float, int, dict[str, Any]]]  # (sent at, status, body) per POST


def burst(
    stack: Stack,
    boots: int,
    clients: int,
    seed: int,
    rate_per_s: float | None = None,
    label: str = "burst",
) -> Sent:
    """Send ``boots`` POSTs from ``clients`` threads, with a progress bar; at most
    ``rate_per_s`` a second if given (the n-th is sent n / rate seconds in)."""
    rng = random.Random(seed)
    names = [name for name, _ in FLAVOR_MIX]
    flavors = rng.choices(names, [weight for _, weight in FLAVOR_MIX], k=boots)
    start = time.monotonic()

    def send(i: int, flavor: str) -> tuple[float, int, dict[str, Any]]:
        if rate_per_s:
            time.sleep(max(0.0, start + i / rate_per_s - time.monotonic()))
        return post_server(stack.url, f"{label}-{i}", flavor)

    results = []
    with (
        ThreadPoolExecutor(clients) as pool,
        click.progressbar(length=boots, label=f"POST /v2.1/servers, {label:6}",
                          file=sys.stderr) as bar,
    ):  # fmt: skip
        futures = [pool.submit(send, i, f) for i, f in enumerate(flavors)]
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


def latencies(
    stack: Stack, results: Sent, records: Mapping[str, Instance], rate_per_s: float | None = None
) -> dict[str, Any]:
    """Where the time of the accepted boots of one phase went, from their ``records``
    and histories.

    ``submit_to_claimed_ms``: from the POST being sent to an agent's claim in the
    ledger (the scheduling latency, queueing included); ``claimed_to_active_ms``:
    the spawn and the ACTIVE write.
    """
    sent = {r[2]["server"]["id"]: r[0] for r in results if r[1] == 202}
    claimed, active = [], []
    for uuid, sent_at in sent.items():
        record = records[uuid]
        at = next((e.time for e in stack.stores.instances.events(uuid) if e.event == "claimed"),
                  None)  # fmt: skip
        if at is not None:
            claimed.append((at - sent_at) * 1000)
            if record.launched_at is not None:
                active.append((record.launched_at - at) * 1000)
    return {
        "boots": len(results),
        "rate_per_s": rate_per_s,
        "submit_to_claimed_ms": _percentiles(sorted(claimed)),
        "claimed_to_active_ms": _percentiles(sorted(active)),
    }


def summarize(stack: Stack, phases: dict[str, tuple[Sent, float | None]], elapsed_s: float) -> dict:
    """Counts from the instance records, latencies per phase; over-commit from the ledger."""
    results = [r for sent, _rate in phases.values() for r in sent]
    accepted = [r[2]["server"]["id"] for r in results if r[1] == 202]
    by_uuid = stack.stores.instances.get_many(accepted)  # one pipelined read
    records = [by_uuid[u] for u in accepted]
    states = Counter(r.state.value for r in records)
    providers = stack.stores.ledger.list_providers()
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
        "phases": {
            name: latencies(stack, sent, by_uuid, rate) for name, (sent, rate) in phases.items()
        },
        "nested": nested(stack, by_uuid, providers),
        "hosts": stack.providers,
        "hosts_used": sum(1 for p in providers if p.parent_uuid is None and any(p.usages.values())),
        "fill": _fill(providers),
        "elapsed_s": round(elapsed_s, 2),
        "placements_per_s": _pace(by_uuid, phases["burst"][0], elapsed_s),
    }


def nested(
    stack: Stack, records: Mapping[str, Instance], providers: Sequence[Provider]
) -> dict[str, int]:
    """The nested flavor's ACTIVE boots, and how many of them hold their VGPU on a GPU
    child of their own node's root with the trait (one allocations read per boot)."""
    by_uuid = {p.uuid: p for p in providers}
    mine = [u for u, r in records.items()
            if r.state == State.ACTIVE and r.flavor.get("name") == GPU_FLAVOR.name]  # fmt: skip
    placed = 0
    for uuid in mine:
        held = stack.stores.ledger.get_allocations(uuid).allocations
        gpus = [by_uuid[rp] for rp, amounts in held.items() if "VGPU" in amounts]
        roots = {by_uuid[rp].root_uuid for rp in held}
        if (len(gpus) == 1 and gpus[0].parent_uuid is not None and GPU_TRAIT in gpus[0].traits
                and held[gpus[0].uuid] == {"VGPU": 1} and len(roots) == 1):  # fmt: skip
            placed += 1
    return {"active": len(mine), "on_gpu_child": placed}


def _pace(records: Mapping[str, Instance], burst_sent: Sent, elapsed_s: float) -> float:
    """The burst's boots that went ACTIVE, per second of the burst."""
    active = sum(1 for u in _accepted(burst_sent) if records[u].state == State.ACTIVE)
    return round(active / elapsed_s, 1) if elapsed_s else 0.0


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    def at(q: float) -> float | None:
        return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None

    return {"p50": at(0.50), "p99": at(0.99), "max": round(values[-1], 1) if values else None}


def _fill(providers: Sequence[Provider]) -> dict[str, float]:
    used: Counter[str] = Counter()
    capacity: Counter[str] = Counter()
    for provider in providers:
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
        *_phase_rows(summary["phases"]),
        ("nested (g1.vgpu) on a GPU child",
         f"{summary['nested']['on_gpu_child']} of {summary['nested']['active']} ACTIVE"),
        ("hosts used", f"{summary['hosts_used']} of {summary['hosts']}"),
        ("fill", ", ".join(f"{rc} {v:.0%}" for rc, v in summary["fill"].items())),
        ("placements per second", f"{summary['placements_per_s']} (the burst's pace)"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        click.echo(f"{name:<{width}}  {value}")


def _phase_rows(phases: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """Submit to claimed is the scheduling latency when paced, queueing in the burst."""
    rows = []
    for name, phase in phases.items():
        claimed, active = phase["submit_to_claimed_ms"], phase["claimed_to_active_ms"]
        pace, what = _PACES.get(name, ("all at once", "queueing behind the burst"))
        if phase["rate_per_s"]:
            pace = f"{phase['rate_per_s']:g}/s"
        rows += [
            (f"{name}: {phase['boots']} boots, {pace}", ""),
            ("  submit to claimed p50 / p99 ms", f"{claimed['p50']} / {claimed['p99']} ({what})"),
            ("  claimed to ACTIVE p50 / p99 ms", f"{active['p50']} / {active['p99']} (spawn)"),
        ]
    return rows


_PACES = {
    "first": ("one per flavor", "agents learn the new class"),
    "paced": ("", "scheduling"),
}


def run_phases(
    stack: Stack, boots: int, clients: int, seed: int, settle_s: float
) -> tuple[dict[str, tuple[Sent, float | None]], float]:
    """The phases of the demo and the burst's duration.

    First one boot per flavor, one after another: agents consume a class only once
    they learnt it from the ledger (within ``[agent] class_poll_interval_s``), so
    the first request of a class waits for that. Then :data:`PACED_BOOTS` paced at
    :data:`PACED_RATE_PER_S`: what placing one request costs. Then the rest as one
    burst: throughput, and queueing.
    """
    phases: dict[str, tuple[Sent, float | None]] = {}
    first = [post_server(stack.url, f"first-{name}", name) for name, _ in FLAVOR_MIX[:boots]]
    wait_settled(stack, _accepted(first), settle_s)
    phases["first"] = (first, None)
    boots -= len(first)
    paced = min(PACED_BOOTS, boots // 4)
    if paced:
        sent = burst(stack, paced, clients, seed, PACED_RATE_PER_S, label="paced")
        wait_settled(stack, _accepted(sent), settle_s)
        phases["paced"] = (sent, PACED_RATE_PER_S)
    started = time.monotonic()
    sent = burst(stack, boots - paced, clients, seed + 1, label="burst")
    wait_settled(stack, _accepted(sent), settle_s)
    phases["burst"] = (sent, None)
    return phases, time.monotonic() - started


def _accepted(sent: Sent) -> list[str]:
    return [r[2]["server"]["id"] for r in sent if r[1] == 202]


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
    """Run qsched on the embedded default and place boots, paced then in a burst.

    Everything runs in this process with no server to install: the API on a
    local port (Nova's /v2.1 shapes), agents driving simulated hosts, the
    kombu memory:// bus and an in-process fakeredis ledger, which keeps nothing
    past the process ([ledger] durability = async, said on stderr; a deployment's
    default, disk, needs a real Redis). Boots mix m1.tiny,
    m1.small, m1.medium, m1.large and the nested g1.vgpu (a VGPU from the node's
    GPU child provider) 4:3:2:1:1 and go through HTTP like any
    client: first 200 paced at 50 a second, well below what one process
    places, so their submit-to-claimed time is what scheduling one request
    costs; then the rest at once, which measures throughput, and whose
    submit-to-claimed time is mostly queueing behind the burst. The counts
    come from the instance records; over-committed providers are computed from
    the ledger's own allocations.

    Hosts have 32 VCPUs (allocation ratio 4.0), 128 GiB of RAM and 2 TB of disk,
    and a GPU child provider with 8 VGPUs and the trait CUSTOM_DEMO_GPU. The end
    checks that every ACTIVE g1.vgpu holds its VGPU on its node's GPU child.
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
    spec = FakeNodeSpec(vcpus=32, ram_mb=131072, disk_gb=2000, cpu_allocation_ratio=4.0,
                        children=(GPU_CHILD,))  # fmt: skip
    stack = start_stack(options, hosts, agents, spec, port=8774 if serve else 0,
                        spawn_delay_s=spawn_delay_s, failure_rate=failure_rate)  # fmt: skip
    click.echo(f"embedded ledger (fakeredis, in this process; nothing survives it): "
               f"[ledger] durability = {options.ledger.durability}", err=True)  # fmt: skip
    stack.stores.quota.set_limits(PROJECT, instances=-1, cores=-1, ram_mb=-1)
    stack.stores.flavors.create(GPU_FLAVOR)
    try:
        if boots:
            phases = run_phases(stack, boots, clients, seed, timeout_s + 5)
            summary = summarize(stack, *phases)
            click.echo(json.dumps(summary, indent=2)) if as_json else print_table(summary)
            misplaced = summary["nested"]["active"] - summary["nested"]["on_gpu_child"]
            if (summary["lost"] or summary["overcommitted_providers"] or misplaced
                    or not summary["audit_ok"]):  # fmt: skip
                raise click.ClickException("an invariant broke: see the summary above")
        if serve:
            serve_until_interrupted(stack, lambda s: click.echo(s, err=True))
    finally:
        stack.stop()
        if shared is not None:
            shared.stop()
