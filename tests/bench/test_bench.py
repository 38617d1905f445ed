"""qsched-bench: its pure parts, and a tiny end-to-end run of the harness.

The smoke runs check that the harness works and that the run it reports is
sound (no over-commit, nothing lost, every figure present); they time nothing.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from agents.main import settle_heap
from qsched.bench import cells as cells_bench
from qsched.bench import cli, cpu, report
from qsched.bench import notify as notify_bench
from qsched.bench import reconcile as reconcile_bench
from qsched.bench.measure import percentiles
from qsched.bench.packing import BenchFlavor, best_fit, flavor_stream, fractions
from qsched.bench.phase import stuck_report
from qsched.bench.profile import top_frames
from qsched.bench.rules import node_size, spread
from qsched.bench.stack import CloudSpec, notification_url
from qsched.bench.timing import FullCollections
from qsched.conf import LedgerOptions, Options
from qsched.ledger import embedded, open_stores
from qsched.ledger.base import Instance, State
from qsched.ledger.server import unreachable
from tests.cloud import AMQP_URL, require_rabbitmq
from tests.conftest import real_redis, require_server

SMALL = {"VCPU": 1, "MEMORY_MB": 1}
BIG = {"VCPU": 2, "MEMORY_MB": 2}


def test_best_fit_fills_the_fullest_host_that_fits() -> None:
    hosts = [{"VCPU": 2, "MEMORY_MB": 2}, {"VCPU": 2, "MEMORY_MB": 2}]
    packing = best_fit(hosts, [SMALL, SMALL, BIG, BIG], stop_at_first_failure=True)
    # both smalls share host 0, the first big takes host 1, the second fits nowhere
    assert (packing.placed, packing.first_failure) == (3, 3)
    assert packing.fractions() == {"MEMORY_MB": 1.0, "VCPU": 1.0, "bottleneck": 1.0}


def test_best_fit_skips_what_does_not_fit_unless_told_to_stop() -> None:
    hosts = [{"VCPU": 2, "MEMORY_MB": 2}]
    stream = [BIG, {"VCPU": 1, "MEMORY_MB": 1}, SMALL]
    assert best_fit(hosts, stream, stop_at_first_failure=False).placed == 1
    assert best_fit([{"VCPU": 3, "MEMORY_MB": 3}], stream, False).placed == 2


def test_fractions_name_the_bottleneck() -> None:
    shares = fractions({"VCPU": 1, "MEMORY_MB": 3}, {"VCPU": 4, "MEMORY_MB": 4, "DISK_GB": 0})
    assert shares == {"MEMORY_MB": 0.75, "VCPU": 0.25, "bottleneck": 0.75}


def test_flavor_stream_is_seeded_and_weighted() -> None:
    flavors = [BenchFlavor("a", 1, 512, 1, weight=9), BenchFlavor("b", 1, 512, 1, weight=1)]
    stream = flavor_stream(flavors, 1000, seed=3)
    assert stream == flavor_stream(flavors, 1000, seed=3)
    assert 800 < sum(f.name == "a" for f in stream) < 980


def test_percentiles_are_nearest_rank_in_ms() -> None:
    stats = percentiles([i / 1000 for i in range(1, 101)])
    assert (stats["p50"], stats["p95"], stats["p99"], stats["max"]) == (50.0, 95.0, 99.0, 100.0)
    assert percentiles([])["p50"] is None


def test_node_counts_split_evenly_and_never_empty() -> None:
    spec = CloudSpec(10, 4, (), "memory://", "fakeredis://")
    assert spec.node_counts() == [3, 3, 2, 2]
    assert CloudSpec(2, 4, (), "memory://", "fakeredis://").node_counts() == [1, 1]


def test_top_frames_attribute_samples_to_our_innermost_frame() -> None:
    collapsed = (
        "run (threading.py:1);boot (agents/service.py:9);execute (redis/client.py:5) 3\n"
        "run (threading.py:1);boot (agents/service.py:9) 1\n"
    )
    top = top_frames([collapsed])
    assert top["samples"] == 4
    assert top["ours"] == [["boot (agents/service.py:9)", 100.0]]
    assert top["self"][0] == ["execute (redis/client.py:5)", 75.0]


def _scale(hosts: int, p50: float, p99: float) -> dict[str, object]:
    path = {"submit_to_claimed_ms": {"p50": p50, "p99": p99}}
    return {"hosts": hosts, "paths": {"library": path, "http": path},
            "registration": {"hosts_per_s": 9000.0, "seconds": 11.0, "agents": 4}}  # fmt: skip


def test_targets_are_judged_only_where_measured() -> None:
    full = report.targets({"scale": [_scale(100, 4.0, 9.0), _scale(100_000, 5.0, 60.0)]})
    verdicts = {row["target"]: row["met"] for row in full}
    assert verdicts[next(t for t in verdicts if t.startswith("flat") and "library" in t)]
    assert not verdicts[next(t for t in verdicts if t.startswith("p99") and "library" in t)]
    quick = report.targets({"scale": [_scale(100, 4.0, 9.0), _scale(10_000, 4.0, 9.0)]})
    assert all(row["met"] is None for row in quick)


def test_the_cost_of_metrics_and_notifications_compares_runs_apart_in_one_feature() -> None:
    def entry(metrics: bool, api_ms: float, notifications: bool = False) -> dict[str, Any]:
        cost = {"api": api_ms, "agents": 2.0 + notifications, "busy": 6.0}
        return {
            "hosts": 100,
            "metrics": metrics,
            "notifications": notifications,
            "paths": {path: {"cpu_ms_per_placement": cost} for path in ("http", "library")},
        }

    scale = [entry(True, 4.4), entry(False, 4.0), entry(True, 4.4, notifications=True),
             {**entry(True, 1.0), "hosts": 9}]  # fmt: skip
    rows = report.plumbing_cost(scale)
    seen = {(r["feature"], r["hosts"], r["path"], r["part"]): (r["off_ms"], r["on_ms"],
            r["change_pct"]) for r in rows}  # fmt: skip
    assert seen[("metrics", 100, "http", "api")] == (4.0, 4.4, 10.0)
    assert seen[("metrics", 100, "library", "api")] == (4.0, 4.4, 10.0)
    assert seen[("notifications", 100, "http", "agents")] == (2.0, 3.0, 50.0)
    assert seen[("notifications", 100, "library", "api")] == (4.4, 4.4, 0.0)
    assert {r["hosts"] for r in rows} == {100}  # N=9 ran one way only
    table = "\n".join(report.plumbing_cost_table(rows))
    assert "+10.0" in table and "+50.0" in table and "notifications" in table


def test_the_sweep_runs_each_feature_with_and_without_the_other_at_its_last() -> None:
    from qsched.bench.runner import sweep_variants as variants
    from qsched.bench.stack import notification_url

    assert variants((False, True), (False, True)) == [(False, False), (True, False), (True, True)]
    assert variants((True,), (False,)) == [(True, False)]
    assert variants((True,), (False, True)) == [(True, False), (True, True)]
    assert notification_url("amqp://guest:guest@127.0.0.1:5672//") == (
        "rabbit://guest:guest@127.0.0.1:5672/"
    )
    assert notification_url("amqp://u:p@h:5672/v1") == "rabbit://u:p@h:5672/v1"


def _check_run(result: Any, path: Path, scenarios: tuple[str, ...]) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(path.read_text())
    assert found["failures"] == []
    for name in scenarios:
        assert name in found
    for entry in found.get("scale", []):
        assert entry["audit"]["ok"] and entry["audit"]["overcommitted"] == 0
        for stats in entry["paths"].values():
            assert stats["active"] == stats["accepted"] > 0
            assert stats["submit_to_claimed_ms"]["count"] == stats["active"]
    return found


#: The smoke runs' small cloud: 8 hosts on 2 agent processes, 0.5 s phases at 40/s.
# A request stuck in a smoke run fails it, saying why, before the test's own timeout.
SMOKE = ["--sizes", "8", "--agents", "2", "--rate", "40", "--duration-s", "0.5",
         "--group-members", "8", "--settle-timeout-s", "60"]  # fmt: skip


def test_the_full_run_on_real_servers_carries_the_million_instances() -> None:
    """make bench is qsched-bench without --scenario: on real servers it runs every
    scenario, instances with its 1,000,000 preloaded; --quick and the embedded default
    leave it out and say how to run it."""
    assert "instances" in cli.SCENARIOS
    assert cli.default_scenarios(quick=False, embedded=False) == (tuple(cli.SCENARIOS), None)
    assert cli.PRESETS["preload"][0] == 1_000_000
    assert cli.PRESETS["instances_hosts"][0] == 100_000
    for quick, emulated in ((True, False), (False, True), (True, True)):
        chosen, why = cli.default_scenarios(quick=quick, embedded=emulated)
        assert "instances" not in chosen
        assert chosen == tuple(name for name in cli.SCENARIOS if name != "instances")
        assert why is not None and "--scenario instances" in why


def test_the_rules_cloud_holds_every_boot_it_sends() -> None:
    """The rules cloud keeps its servers: at 100 nodes the default nodes cannot hold
    the tenant-isolated class on its quarter of them (its boots would end waiting,
    a failed run), so they are made larger; from 1,000 on the default holds."""
    size = node_size(1500, 100, 100, 4)
    slots = min(size["node_ram_mb"] // 4096, size["node_vcpus"] * 4 // 2,
                size["node_disk_gb"] // 20)  # fmt: skip
    isolated_nodes, others = 25, 4 * 1500 + 100
    assert slots * isolated_nodes >= 1500 + others * isolated_nodes / 100
    assert 64 * isolated_nodes < 1500 + others * isolated_nodes / 100  # the default cannot
    for nodes in (1_000, 10_000, 100_000):
        assert node_size(1500, 250, nodes, 4) == {}


def test_a_stuck_request_is_explained_as_server_why_would(conf) -> None:
    """A phase that fails on requests still in BUILD says why each of a few waits."""
    stores = open_stores(LedgerOptions.from_conf(conf), url=f"fakeredis://bench-{uuid.uuid4().hex}")
    stuck = str(uuid.uuid4())
    flavor = {"name": "m1.tiny", "vcpus": 1, "ram_mb": 512}
    stores.instances.create(Instance(stuck, "p1", "u1", "vm", flavor, State.BUILD), deadline=1e12)
    cloud = SimpleNamespace(stores=stores, options=Options.from_conf(conf))
    report_ = stuck_report(cloud, [stuck])  # type: ignore[arg-type]
    assert stuck in report_ and "BUILD" in report_ and "m1.tiny" in report_


def test_the_isolated_hosts_are_spread_over_the_agent_processes() -> None:
    hosts = [f"a{p}-{h}" for p in range(4) for h in range(5)]  # 4 processes, in order
    taken = spread(hosts, 5)
    assert len(taken) == 5 and len({h.split("-")[0] for h in taken}) == 4
    assert spread(hosts[:5], 5) == hosts[:5]  # one process: all its hosts, as before
    assert spread(hosts, 1) == ["a0-0"]


def test_the_reconcile_pass_measure_reads_every_node_and_leaves_no_key() -> None:
    """``python -m qsched.bench.reconcile`` on the embedded ledger: its figures, and the
    passes' own evidence (every node of the host looked at, nothing found amiss)."""
    url = f"fakeredis://bench-{uuid.uuid4().hex}"
    found = reconcile_bench.measure(url, nodes=7, passes=2)
    assert (found["nodes"], found["providers"], found["passes"]) == (7, 14, 2)
    assert found["cpu_ms_per_pass"] > 0 and found["wall_ms_per_pass"] > 0
    assert found["last_pass"] == {"nodes": 7, "found_anything": False}
    out = CliRunner().invoke(reconcile_bench.main, ["--nodes", "3", "--passes", "1",
                                                    "--ledger-url", url])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["providers"] == 6
    assert embedded.connect(url, 2).keys("*") == []  # the same in-process server


def test_the_cells_measure_times_every_call_on_one_cell_and_on_several() -> None:
    """``python -m qsched.bench.cells --embedded``: a line for one cell, then one per
    number of cells, each call timed, the boots drawn into every cell, and no server's
    CPU claimed where there is no server."""
    lines = list(cells_bench.run([2], 20, cells_bench.Keyspaces(None)))
    assert [(line["cells"], line["deployment"]) for line in lines] == [
        (1, "one cell, no [cells]"),
        (2, "2 cells behind one front door"),
    ]
    for line in lines:
        for call, times in (("boot", 20), ("show", 20), ("list", 2), ("flavor", 2),
                            ("keypair", 2)):  # fmt: skip
            assert line[call]["calls"] == times
            assert line[call]["wall_ms_p50"] > 0 and line[call]["front_cpu_ms"] > 0
            assert line[call]["api_redis_cpu_ms"] is line[call]["cells_redis_cpu_ms"] is None
    assert lines[0]["landed"] == [20]
    assert sum(lines[1]["landed"]) == 20 and min(lines[1]["landed"]) > 0
    out = CliRunner().invoke(cells_bench.main, ["--embedded", "--calls", "10", "--cells", "1"])
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["landed"] for line in out.output.splitlines()] == [[10], [10]]


@pytest.mark.real
def test_the_cells_measure_reads_each_servers_cpu(tmp_path: Path) -> None:
    """On servers of its own (one a keyspace): the API keyspace's and the cells' CPU
    per call are read apart, and every server it started is stopped."""
    if shutil.which("redis-server") is None:
        require_server("redis-server", "PATH", FileNotFoundError("redis-server"),
                       "install Redis (apt-get install redis-server)")  # fmt: skip
    servers = cells_bench.Servers(tmp_path)
    try:
        one, two = cells_bench.run([2], 50, cells_bench.Keyspaces(servers))
    finally:
        servers.stop()
    assert one["boot"]["api_redis_cpu_ms"] is None and one["boot"]["cells_redis_cpu_ms"] > 0
    assert two["boot"]["api_redis_cpu_ms"] > 0 and two["boot"]["cells_redis_cpu_ms"] > 0
    assert min(two["landed"]) > 0 and len(servers.running) == 4
    assert all(process.poll() is not None for process, _port in servers.running)


@pytest.mark.real
def test_the_notification_measure_sends_every_message_and_leaves_no_queue() -> None:
    """``python -m qsched.bench.notify`` on RabbitMQ: three messages a placement reach
    its queue, none lost, and its figures add up; its queue and exchange are gone."""
    require_rabbitmq()
    url = notification_url(AMQP_URL)
    found = notify_bench.measure(url, rate=50, seconds=1)
    assert found["messages"] == 3 * found["placements"] >= 3 * 50
    assert found["held_by_broker"] == found["messages"] and found["lost"] == 0
    # the parts are timed apart, the building alone first: with the sending down to a
    # few hundredths of a ms, that part alone can come out above the whole on a shared
    # machine, so only the sum is checked (docs/notifications.rst, "Cost")
    cpu_ms, build_ms = found["cpu_ms_per_placement"], found["build_ms_per_placement"]
    assert cpu_ms > 0 and build_ms > 0 and found["pace_ms_per_placement"] > 0
    assert abs(found["send_ms_per_placement"] - (cpu_ms - build_ms)) < 0.002
    out = CliRunner().invoke(notify_bench.main, ["--rate", "20", "--seconds", "1", "--url", url])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["held_by_broker"] == 3 * 20
    args = ["--rate", "20", "--seconds", "1", "--url", url, "--rounds", "2", "--hold", "1000"]
    out = CliRunner().invoke(notify_bench.main, args)
    assert out.exit_code == 0, out.output
    found = json.loads(out.output)
    turns = found["turns"]
    assert len(turns["off_ms"]) == len(turns["on_ms"]) == 2 and turns["sent"] == 2 * 20
    assert found["held_by_broker"] == found["messages"] == 3 * (20 + 2 * 20)
    assert turns["added_ms"] == round(statistics.median(turns["on_ms"])
                                      - statistics.median(turns["off_ms"]), 3)  # fmt: skip


def test_smoke_run_on_the_embedded_default(tmp_path: Path) -> None:
    """Scale, saturation and fill (the rules scenario is the next test: each of the two
    takes about 20 s alone, several times that on a loaded machine)."""
    out = tmp_path / "bench.json"
    args = ["--embedded", *SMOKE, "--scenario", "scale", "--scenario", "saturation",
            "--scenario", "fill", "--burst-s", "0.1", "--saturation-hosts", "8",
            "--saturation-rates", "40", "--step-s", "0.5", "--fill-hosts", "2",
            "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    found = _check_run(result, out, ("scale", "saturation", "fill"))
    assert found["backends"]["embedded"] is True
    assert found["scale"][0]["burst"]["capacity_per_s"] > 0
    fill = found["fill"]
    assert fill["no_valid_host"] >= 1 and fill["first_nvh_index"] is not None
    assert fill["audit"]["ok"]
    assert out.with_suffix(".png").exists() or not _has_matplotlib()


def test_smoke_rules_run_on_the_embedded_default(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--embedded", *SMOKE, "--scenario", "rules", "-o", str(out)]
    result = CliRunner().invoke(cli.main, args)
    found = _check_run(result, out, ("rules",))
    assert found["backends"]["embedded"] is True
    _check_rules(found)
    assert "Placement rules (library path" in result.output


@pytest.mark.real
@pytest.mark.slow
def test_smoke_run_on_real_servers(tmp_path: Path) -> None:
    real_redis()
    require_rabbitmq()
    out = tmp_path / "bench.json"
    args = ["--scenario", "scale", "--scenario", "rules", *SMOKE, "--burst-s", "0",
            "--bus", "rabbitmq", "--amqp-url", AMQP_URL, "-o", str(out)]  # fmt: skip
    found = _check_run(CliRunner().invoke(cli.main, args), out, ("scale", "rules"))
    assert found["backends"]["embedded"] is False
    _check_rules(found)
    registration = found["scale"][0]["registration"]
    assert registration["hosts"] == 8 and registration["per_agent"][0]["nodes"] == 4
    # the rules cloud: 2 agent processes of 4 compute hosts, each with one node
    rules = found["rules"][0]["registration"]["per_agent"]
    assert [(r["nodes"], r["hosts"]) for r in rules] == [(4, 4), (4, 4)]


@pytest.mark.real
@pytest.mark.slow
def test_saturation_on_a_rabbitmq_cluster_of_the_runs_own(tmp_path: Path) -> None:
    """``--rabbit-cluster``: the run starts its own RabbitMQ (one node here, for time),
    places on it with quorum host queues, counts only its node's CPU as RabbitMQ's,
    and stops it at the end."""
    real_redis()
    if shutil.which("rabbitmq-server") is None:
        require_server("rabbitmq-server", "PATH", FileNotFoundError("rabbitmq-server"),
                       "install RabbitMQ (apt-get install rabbitmq-server)")  # fmt: skip
    out = tmp_path / "bench.json"
    args = ["--scenario", "saturation", *SMOKE, "--bus", "rabbitmq", "--rabbit-cluster", "1",
            "--saturation-hosts", "8", "--saturation-rates", "40", "--step-s", "0.5",
            "--keep-logs", str(tmp_path / "run"), "-o", str(out)]  # fmt: skip
    found = _check_run(CliRunner().invoke(cli.main, args), out, ("saturation",))
    assert found["rabbit_cluster"]["nodes"] == 1 and found["rabbit_cluster"]["started_s"] > 0
    assert found["settings"]["rabbit_home"] == str(tmp_path / "run" / "rabbit-cluster")
    (step,) = found["saturation"]["rabbitmq"]["steps"]
    assert step["active"] == step["accepted"] > 0 and step["cpu_cores"]["rabbitmq"] > 0
    home = found["settings"]["rabbit_home"]
    assert cpu._runs_from(os.getpid(), None) and not cpu._runs_from(os.getpid(), home)
    nodes = [pid for pid, (_ppid, _cpu, comm) in cpu._processes().items()
             if comm == "beam.smp" and cpu._runs_from(pid, home)]  # fmt: skip
    assert nodes == []  # stopped with the run


def test_the_clouds_say_their_durability_async_unless_the_run_brings_a_ledger() -> None:
    """A cloud on --ledger-url (a shared Redis, no AOF) says async; --durability needs
    servers of the run's own, which the embedded default is not."""
    spec = CloudSpec(8, 2, (), "memory://", "redis://127.0.0.1:6379/10")
    assert spec.options()["ledger"]["durability"] == "async"
    assert CloudSpec(8, 2, (), "memory://", "x", durability="disk").options()["ledger"] == {
        "cpu_allocation_ratio": 4.0, "durability": "disk"}  # fmt: skip
    refused = CliRunner().invoke(cli.main, ["--embedded", "--durability", "disk"])
    assert refused.exit_code == 2 and "--durability needs real servers" in refused.output


@pytest.mark.real
@pytest.mark.slow
def test_saturation_on_a_ledger_of_the_runs_own_that_fsyncs_every_write(tmp_path: Path) -> None:
    """``--durability disk``: the run starts a redis-server with appendfsync always for
    the ledger, its clouds run [ledger] durability = disk on it, and it is stopped at the
    end; the report says so."""
    require_rabbitmq()
    if shutil.which("redis-server") is None:
        require_server("redis-server", "PATH", FileNotFoundError("redis-server"),
                       "apt-get install redis-server")  # fmt: skip
    out = tmp_path / "bench.json"
    args = ["--scenario", "saturation", *SMOKE, "--bus", "rabbitmq", "--amqp-url", AMQP_URL,
            "--durability", "disk", "--saturation-hosts", "8", "--saturation-rates", "40",
            "--step-s", "0.5", "--keep-logs", str(tmp_path / "run"), "-o", str(out)]  # fmt: skip
    found = _check_run(CliRunner().invoke(cli.main, args), out, ("saturation",))
    ledger = found["backends"]["ledger"]
    assert (ledger["appendonly"], ledger["appendfsync"]) == ("yes", "always")
    assert found["backends"]["durability"] == found["settings"]["durability"] == "disk"
    assert "[ledger] durability = disk" in found["backends"]["summary"]
    (step,) = found["saturation"]["rabbitmq"]["steps"]
    assert step["active"] == step["accepted"] > 0
    assert unreachable(found["settings"]["ledger_url"]) is not None  # stopped with the run


def _check_rules(found: dict) -> None:
    """Every class of the rules scenario placed all its boots; the isolated ones on the
    isolated hosts only, the group's members each on a host of its own, the shared
    provider within its capacity (the scenario fails otherwise); the ledger audited
    clean."""
    (entry,) = found["rules"]
    assert set(entry["classes"]) == {
        "plain", "tenant-isolated aggregate", "nested GPU (resources1:VGPU=1)",
        "shared storage (sharing provider)", "different_host (host rule)",
        "anti-affinity group",
    }  # fmt: skip
    for stats in entry["classes"].values():
        assert stats["active"] == stats["accepted"] > 0
        assert stats["conflicts_per_claim"] >= 0
    assert entry["audit"]["ok"] and entry["agent_hosts"] == 8 and entry["isolated_hosts"] == 4
    assert entry["group"]["members"] == entry["group"]["hosts"] == 8
    assert entry["classes"]["anti-affinity group"]["accepted"] == 8
    shared = entry["classes"]["shared storage (sharing provider)"]["contention"]
    assert shared["claims"] == entry["classes"]["shared storage (sharing provider)"]["active"]
    assert shared["claiming_hosts"] >= 2 and entry["shared_provider"]["hosts"] == 8
    assert shared["provider"]["used_gb"] <= shared["provider"]["capacity_gb"]
    # the scenario fails if one landed beside the server they keep away from
    assert entry["host_rule"]["boots"] >= entry["classes"]["different_host (host rule)"]["accepted"]


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_full_collections_are_counted_and_timed_and_the_others_are_not() -> None:
    seen = FullCollections().install()
    try:
        gc.collect(0)
        gc.collect(1)
        assert seen.to_counters()["gc_full_collections"] == 0
        gc.collect()
        gc.collect()
    finally:
        gc.callbacks.remove(seen._seen)
    counted = seen.to_counters()
    assert counted["gc_full_collections"] == 2
    assert seen.total_ms > 0 and seen.longest_ms <= seen.total_ms


def test_settle_heap_freezes_what_outlives_the_start() -> None:
    kept = [{"node": n} for n in range(1000)]
    before = gc.get_freeze_count()
    try:
        settle_heap()
        assert gc.get_freeze_count() >= before + len(kept)
    finally:
        gc.unfreeze()
