"""The placement rules scenario: classes with constraints next to a plain one, per N.

One cloud per N whose every node has a GPU child provider, run by as many compute
hosts as the anti-affinity group has members (``Settings.group_members``; each agent
process runs a share of them, :mod:`qsched.bench.agent` ``--hosts``), since a group's
policy is per host. The classes, each booted at the sweep's offered rate:

* plain: the sweep flavor;
* ``different_host`` of one server (a host rule);
* the sweep flavor booted by a project whose tenant-isolated aggregate holds a
  quarter of the hosts, spread over the agent processes
  (``limit_tenants_to_placement_aggregate``);
* a nested flavor (``resources1:VGPU=1`` from the GPU child);
* a flavor drawing on storage shared through an aggregate that holds every host, so
  that every agent claims on the one sharing provider: its contention figures;
* the members of one anti-affinity group, each on a host of its own.

The scenario fails (:class:`~qsched.bench.measure.BenchFailure`) when a rule is broken:
an isolated boot outside its aggregate, a ``different_host`` boot beside its anchor, two
members of the group on one host or one not placed, the shared provider used beyond its
capacity or not as its consumers say; and, as every scenario, when the ledger audit
finds an over-commit or a lost request.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

from qsched.bench import measure
from qsched.bench.contention import conflicts_report
from qsched.bench.load import LibrarySubmitter, Submit
from qsched.bench.packing import BenchFlavor
from qsched.bench.phase import PhaseResult, Say, run_phase, summarize
from qsched.bench.runner import SCALE_FLAVOR, Runner, brief
from qsched.bench.stack import Cloud, CloudSpec
from qsched.compute.host_rules import HostRequest
from qsched.context import ADMIN, RequestContext
from qsched.ledger.base import State

#: A nested flavor: the sweep's sizes, plus a VGPU from the node's GPU child provider.
GPU_FLAVOR = BenchFlavor(
    "bench.gpu", 2, 4096, 20,
    extra_specs=(("resources1:VGPU", "1"), ("trait1:CUSTOM_BENCH_GPU", "required")),
)  # fmt: skip
#: A flavor drawing on storage shared through an aggregate (a sharing provider of
#: CUSTOM_BENCH_SHARED_GB, which no node has: the class comes from the shared provider).
SHARED_FLAVOR = BenchFlavor(
    "bench.shared", 2, 4096, 20, extra_specs=(("resources:CUSTOM_BENCH_SHARED_GB", "10"),)
)
SHARED_GB = 10
#: Every node of the rules cloud carries a GPU child provider.
RULES_NODE_PROVIDERS = ("gpu0:VGPU=16;CUSTOM_BENCH_GPU",)
#: The project the tenant-isolated aggregate is for.
ISOLATED_PROJECT = "bench-isolated"
ANTI_AFFINITY = "anti-affinity group"
SHARED = "shared storage (sharing provider)"
#: Above this many compute hosts, their periodic work is spread out: heartbeats every
#: 10 s instead of 1 s, class reads every 10 s (the scenario primes its classes before
#: it measures), the reaper every 30 s, the reconcile every 60 s over 100 nodes at a
#: time (for 250 hosts about the node reads per second of four agents at the defaults).
#: Hundreds of agents at the bench's short start-up intervals cost more CPU idle than
#: the load they measure: a process of 250 hosts at 5 s and 2 s used 0.58 cores idle
#: (docs/benchmarks.rst). Their consumers share one thread, polled at the default.
MANY_HOSTS = 64
QUIET = {
    "heartbeat_interval_s": 10.0,
    "class_poll_interval_s": 10.0,
    "reap_interval_s": 30.0,
    "reconcile_interval_s": 60.0,
    "reconcile_batch": 100,
}


def run_rules(runner: Runner) -> list[dict[str, Any]]:
    """Per N: submit to claimed of classes with placement rules, next to a plain one."""
    results: list[dict[str, Any]] = []
    runner.partial["rules"] = results  # what was measured stays in the report on a failure
    for hosts in runner.settings.sizes:
        runner.say(f"[rules] N = {hosts:,} hosts")
        results.append(rules_one(runner, hosts))
    return results


def rules_spec(runner: Runner, hosts: int) -> CloudSpec:
    """The rules cloud of ``hosts`` nodes: ``group_members`` compute hosts (at most one
    per node), split between the agent processes; nodes large enough for every boot
    (:func:`node_size`)."""
    settings = runner.settings
    processes = max(1, min(settings.agents, hosts))
    agent_hosts = min(hosts, max(settings.group_members, processes))
    quiet = QUIET if agent_hosts > MANY_HOSTS else {}
    count = max(1, int(settings.rate_per_s * settings.duration_s))
    members = min(settings.group_members, agent_hosts)
    return runner.spec(
        hosts, (SCALE_FLAVOR, GPU_FLAVOR, SHARED_FLAVOR), http=False,
        node_providers=RULES_NODE_PROVIDERS, hosts_per_agent=-(-agent_hosts // processes),
        scheduler=(("limit_tenants_to_placement_aggregate", True),),
        **node_size(count, members, hosts, processes), **quiet,
    )  # fmt: skip


#: classes of the rules cloud booted ``count`` times each (all but the group's), and
#: the room left on the fullest node above what they need (warm-ups, uneven spread)
CLASSES = 5
HEADROOM = 1.25


def node_size(count: int, members: int, nodes: int, processes: int) -> dict[str, int]:
    """Node sizes (``CloudSpec`` fields) that hold every boot of a rules cloud: none
    when the default nodes do.

    Its servers stay until the cloud stops, so the cloud must hold them all. The
    fullest nodes are the isolated ones, one process's share of the nodes: they hold
    the whole tenant-isolated class and their share of the others. With the default
    nodes (64 boots of the sweep flavor each) a cloud of 100 nodes would end its
    tenant-isolated class in NoValidHost; from 1,000 nodes on the default holds.
    """
    share = 1 / processes
    per_node = count / (nodes * share) + ((CLASSES - 1) * count + members) / nodes
    slots = math.ceil(per_node * HEADROOM)
    fits = min(CloudSpec.node_ram_mb // SCALE_FLAVOR.ram_mb,
               int(CloudSpec.node_vcpus * CloudSpec.cpu_allocation_ratio) // SCALE_FLAVOR.vcpus,
               CloudSpec.node_disk_gb // SCALE_FLAVOR.disk_gb)  # fmt: skip
    if slots <= fits:
        return {}
    return {"node_ram_mb": slots * SCALE_FLAVOR.ram_mb,
            "node_vcpus": math.ceil(slots * SCALE_FLAVOR.vcpus / CloudSpec.cpu_allocation_ratio),
            "node_disk_gb": slots * SCALE_FLAVOR.disk_gb}  # fmt: skip


def rules_one(runner: Runner, hosts: int) -> dict[str, Any]:
    """One rules cloud, its classes measured one after another (module docstring)."""
    settings = runner.settings
    count = max(1, int(settings.rate_per_s * settings.duration_s))
    entry: dict[str, Any] = {"hosts": hosts}
    spec = rules_spec(runner, hosts)
    with runner.cloud(spec, entry) as cloud:
        entry["registration"] = cloud.registration
        agent_hosts = cloud.hosts_of_agents()
        entry["agent_hosts"] = len(agent_hosts)
        entry["intervals"] = {"heartbeat_s": spec.heartbeat_interval_s,
                              "class_poll_s": spec.class_poll_interval_s,
                              "reconcile_s": spec.reconcile_interval_s,
                              "bus_poll_s": spec.bus_poll_interval_s}  # fmt: skip
        isolated = _isolate(cloud, spread(agent_hosts, spec.agent_hosts()[0]), runner.say)
        entry["isolated_hosts"] = len(isolated)
        entry["shared_provider"] = _share(cloud, agent_hosts, runner.say)
        cloud.prime_classes([SCALE_FLAVOR.name, GPU_FLAVOR.name, SHARED_FLAVOR.name])
        compute = cloud.compute
        anchor, anchor_host = _anchor(cloud, runner.say)
        members = min(settings.group_members, len(agent_hosts))
        group = _group(cloud, runner.say)
        sent: dict[str, list[str]] = {"apart": [], "group": []}

        def recorded(submit: Submit, key: str) -> Submit:
            def send(name: str, flavor: str) -> str:
                sent[key].append(submit(name, flavor))
                return sent[key][-1]

            return send

        plain = LibrarySubmitter(compute)
        apart = LibrarySubmitter(compute, hosts=HostRequest(different_host=(anchor,)))
        classes: list[tuple[str, Submit, str, int]] = [
            ("plain", plain, SCALE_FLAVOR.name, count),
            # second, so that it and plain meet the same cloud: some of its requests first
            # reach the agent beside the anchor, whose claim refuses them
            ("different_host (host rule)", recorded(apart, "apart"), SCALE_FLAVOR.name,
             count),
            ("tenant-isolated aggregate", LibrarySubmitter(compute, project=ISOLATED_PROJECT),
             SCALE_FLAVOR.name, count),
            ("nested GPU (resources1:VGPU=1)", plain, GPU_FLAVOR.name, count),
            (SHARED, plain, SHARED_FLAVOR.name, count),
            (ANTI_AFFINITY, recorded(LibrarySubmitter(compute, group=group), "group"),
             SCALE_FLAVOR.name, members),
        ]  # fmt: skip
        entry["classes"] = {}
        for name, submit, flavor, boots in classes:
            # warm up without the group's hint: warm-up boots would join the group
            warm = plain if name == ANTI_AFFINITY else submit
            runner.warm_up(cloud, flavor, [(warm, settings.library_workers)])
            before = _claim_counters(cloud)
            result = run_phase(
                cloud, f"N={hosts} {name}", submit, [flavor] * boots, settings.rate_per_s,
                settings.library_workers, settings.settle_timeout_s, runner.say,
                profiler=runner.profiler,
            )  # fmt: skip
            stats = summarize(result, settings.rate_per_s)
            stats["conflicts_per_claim"] = _conflicts_per_claim(cloud, before)
            if name == SHARED:
                stats["contention"] = _contention(cloud, result, entry["shared_provider"])
            entry["classes"][name] = stats
            runner.say(f"  {name}: {brief(stats)}, "
                       f"{stats['conflicts_per_claim']} conflicts per claim")  # fmt: skip
        _check_isolated(cloud, set(isolated))
        _check_apart(cloud, sent["apart"], anchor_host)
        entry["host_rule"] = {"anchor_host": anchor_host, "boots": len(sent["apart"])}
        entry["group"] = _check_group(cloud, group, sent["group"], members)
        runner.say(f"  auditing the ledger ({hosts:,} nodes, {2 * hosts:,} providers)")
        entry["audit"] = measure.check_ledger(cloud.stores, f"rules N={hosts}")
        entry["mode"] = cloud.mode
        entry["bus"] = cloud.transport
    return entry


def _admin() -> RequestContext:
    return RequestContext.for_project("bench-admin", "bench-admin", (ADMIN,))


def _anchor(cloud: Cloud, say: Say, timeout_s: float = 60.0) -> tuple[str, str]:
    """A server for the host-rule class to keep away from (``different_host``), placed;
    its uuid and host."""
    uuid = LibrarySubmitter(cloud.compute)("bench-anchor", SCALE_FLAVOR.name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        host = cloud.stores.instances.get(uuid).host
        if host:
            say(f"  host rule: boots keep away from {uuid} on {host}")
            return uuid, host
        time.sleep(0.05)
    raise measure.BenchFailure(f"the host rule's anchor {uuid} was not placed in {timeout_s:.0f}s")


def _group(cloud: Cloud, say: Say) -> str:
    """An anti-affinity server group of the bench's project; its uuid."""
    owner = LibrarySubmitter(cloud.compute).context
    made = cloud.compute.groups.create(owner, "bench-anti-affinity", "anti-affinity")
    say(f"  server group {made.uuid}: anti-affinity")
    return made.uuid


def spread(hosts: list[str], count: int) -> list[str]:
    """``count`` of ``hosts`` taken evenly along them. An agent process's hosts come one
    after another, so the tenant-isolated class is served by every process, as the
    other classes are, and not all its boots by one interpreter of 250 simulated hosts
    (which 250 real hosts are not)."""
    return hosts[:: max(1, len(hosts) // count)][:count]


def _isolate(cloud: Cloud, hosts: list[str], say: Say) -> list[str]:
    """An aggregate for the isolated project holding ``hosts``; the hosts."""
    aggregates = cloud.compute.aggregates
    made = aggregates.create(_admin(), "bench-isolated", None)
    aggregates.set_metadata(_admin(), made.id, {"filter_tenant_id": ISOLATED_PROJECT})
    mirrored, seen = _join(cloud, made.id, hosts)
    say(f"  aggregate for {ISOLATED_PROJECT}: {len(hosts)} hosts, {mirrored:.2f}s to mirror "
        f"into their providers, {seen:.2f}s until their agents read every node again")  # fmt: skip
    return hosts


def _share(cloud: Cloud, hosts: list[str], say: Say) -> dict[str, Any]:
    """A sharing provider of CUSTOM_BENCH_SHARED_GB in an aggregate with every host: the
    shared-storage class's only source, on which every agent claims."""
    from qsched.admin import sharing

    made = cloud.compute.aggregates.create(_admin(), "bench-shared-storage", None)
    capacity = 10 * 10_000_000  # room for every boot of the run: contention, not a full pool
    provider = sharing.create(cloud.stores, "bench-shared-storage",
                              {"CUSTOM_BENCH_SHARED_GB": capacity}, [made.uuid])  # fmt: skip
    mirrored, seen = _join(cloud, made.id, hosts)
    say(
        f"  shared storage: provider {provider.name} in an aggregate with all {len(hosts)} "
        f"hosts, {mirrored:.2f}s to mirror, {seen:.2f}s until every node was read again"
    )
    return {"hosts": len(hosts), "uuid": provider.uuid, "capacity_gb": capacity}


def _join(cloud: Cloud, aggregate: int, hosts: list[str]) -> tuple[float, float]:
    """Add ``hosts`` to an aggregate and wait until each one's agent read all its nodes
    again; the seconds to mirror the membership into their providers, and until the last
    agent had read them. The timed phases start after it, so they measure placing, not
    that one-time refresh; the second figure includes up to one heartbeat of delay."""
    before = _rereads(cloud)
    began = time.perf_counter()
    for host in hosts:
        cloud.compute.aggregates.add_host(_admin(), aggregate, host)
    mirrored = time.perf_counter() - began
    deadline = time.monotonic() + 300.0
    while time.monotonic() < deadline:
        now = _rereads(cloud)
        late = [h for h in hosts if now.get(h, 0) <= before.get(h, 0)]
        if not late:
            return mirrored, time.perf_counter() - began
        time.sleep(0.1)
    raise measure.BenchFailure(f"agents {late[:5]} did not read their nodes again in 300s")


def _rereads(cloud: Cloud) -> dict[str, int]:
    """How often each agent read all its nodes again after its aggregates moved (its
    ``aggregate_rereads`` counter, as its last heartbeat shows it)."""
    return {
        a.host: int((a.detail.get("counters") or {}).get("aggregate_rereads", 0))
        for a in cloud.stores.agents.list()
    }


def _claim_counters(cloud: Cloud) -> tuple[int, int]:
    """Claims and generation conflicts so far, summed over the agents' heartbeats."""
    claimed = conflicts = 0
    for agent in cloud.stores.agents.list():
        counters = agent.detail.get("counters") or {}
        claimed += int(counters.get("claimed", 0))
        conflicts += int(counters.get("conflicts", 0))
    return claimed, conflicts


def _conflicts_per_claim(cloud: Cloud, before: tuple[int, int]) -> float:
    """Conflicts per claim during a phase (heartbeats lag: wait for one more beat)."""
    time.sleep(cloud.spec.heartbeat_interval_s + 0.3)
    claimed, conflicts = _claim_counters(cloud)
    claims = claimed - before[0]
    return round((conflicts - before[1]) / claims, 2) if claims else 0.0


def _contention(cloud: Cloud, result: PhaseResult, shared: dict[str, Any]) -> dict[str, Any]:
    """The shared class's conflicts from its instances' histories (each one followed by
    a re-read and a retry), the agents that claimed on the provider, and its usage,
    checked against its capacity and against what its consumers hold."""
    uuids = [s.uuid for s in result.accepted if s.uuid is not None]
    found = conflicts_report(cloud.stores, uuids)
    placed = cloud.stores.instances.get_many(uuids)
    found["claiming_hosts"] = len({i.host for i in placed.values() if i.host})
    ledger, uuid = cloud.stores.ledger, shared["uuid"]
    provider = ledger.sharing_providers()[uuid]
    inventory = provider.inventories["CUSTOM_BENCH_SHARED_GB"]
    used, capacity = provider.usages.get("CUSTOM_BENCH_SHARED_GB", 0), inventory.capacity
    consumers = len(ledger.providers_consumers([uuid])[uuid])
    if used > capacity or used != SHARED_GB * consumers:
        raise measure.BenchFailure(f"shared provider {uuid}: {used} GB used of {capacity}, "
                                   f"{consumers} consumers of {SHARED_GB} GB")  # fmt: skip
    found["provider"] = {"used_gb": used, "capacity_gb": capacity, "consumers": consumers,
                         "generation": provider.generation}  # fmt: skip
    return found


def _check_isolated(cloud: Cloud, isolated: set[str]) -> None:
    where = {s.host for s in cloud.stores.instances.list_project(ISOLATED_PROJECT) if s.host}
    if not where <= isolated:
        raise measure.BenchFailure(f"isolated boots outside their aggregate: {where - isolated}")


def _check_apart(cloud: Cloud, sent: list[str], anchor_host: str) -> None:
    placed = cloud.stores.instances.get_many(sent)
    beside = sorted(u for u, i in placed.items() if i.host == anchor_host)
    if beside:
        raise measure.BenchFailure(f"different_host boots on {anchor_host}: {beside[:5]}")


def _check_group(cloud: Cloud, group: str, sent: list[str], members: int) -> dict[str, Any]:
    """Every member of the anti-affinity group ACTIVE, each on a host of its own."""
    placed = cloud.stores.instances.get_many(sent)
    hosts = [i.host for i in placed.values() if i.state == State.ACTIVE and i.host]
    if len(sent) != members or len(hosts) != members:
        raise measure.BenchFailure(f"anti-affinity group {group}: {len(hosts)} of {members} "
                                   f"members placed ({len(sent)} accepted)")  # fmt: skip
    shared = {h for h, n in Counter(hosts).items() if n > 1}
    if shared:
        raise measure.BenchFailure(f"anti-affinity group {group}: several members on "
                                   f"{sorted(shared)[:5]}")  # fmt: skip
    return {"uuid": group, "members": members, "hosts": len(set(hosts))}
