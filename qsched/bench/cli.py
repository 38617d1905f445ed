"""``qsched-bench``: issue 6's benchmark, end to end, with a JSON report and a plot."""

from __future__ import annotations

import datetime
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import click

from qsched.bench import machine, report
from qsched.bench.measure import BenchFailure
from qsched.bench.runner import Runner, Settings
from qsched.bench.scenarios import SCENARIOS
from qsched.bench.stack import notification_url
from qsched.ledger import server
from qsched.stack import StackFailed
from qsched.stack.rabbitmq import RabbitCluster, RabbitFailed
from qsched.urls import masked

DEFAULT_LEDGER = "redis://127.0.0.1:6379/10"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_BUS_REDIS = "redis://127.0.0.1:6379/11"

#: (full, quick) defaults of the sizing options.
PRESETS: dict[str, tuple[Any, Any]] = {
    "sizes": ([100, 1_000, 10_000, 100_000], [100, 1_000, 10_000]),
    "rate": (100.0, 100.0),
    "duration_s": (15.0, 3.0),
    "saturation_hosts": (1_000, 1_000),
    "saturation_rates": (
        [100, 200, 300, 400, 500, 600, 650, 700, 750, 800, 900, 1000],
        [200, 400, 600],
    ),
    "step_s": (5.0, 2.0),
    "fill_hosts": (100, 40),
    "fill_rate": (100.0, 100.0),
    "burst_s": (4.0, 1.5),
    "plumbing_blocks": (3, 2),
    "plumbing_slice_s": (10.0, 6.0),
    "instances_hosts": (100_000, 10_000),
    "preload": (1_000_000, 100_000),
    "moves_sizes": ([100, 100_000], [100, 10_000]),
    "host_servers": (100, 25),
}


class Clock:
    """Progress lines on stderr, stamped with the time since the run began."""

    def __init__(self) -> None:
        self.began = time.monotonic()

    def say(self, message: str) -> None:
        click.echo(f"[{time.monotonic() - self.began:7.1f}s] {message}", err=True)


def _numbers(text: str | None, cast: type) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [cast(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: use comma-separated numbers") from exc


def pick_backends(
    embedded: bool,
    ledger_url: str,
    amqp_url: str,
    bus_redis_url: str,
    buses: tuple[str, ...],
    say: Any,
) -> tuple[bool, dict[str, str], dict[str, Any]]:
    """Real servers when they answer, the embedded default otherwise; say which."""
    facts: dict[str, Any] = {"embedded": embedded}
    if not embedded:
        why = machine.reachable(ledger_url)
        if why is not None:
            say(f"Redis ledger at {ledger_url} not reachable ({why}): embedded default")
            embedded, facts["ledger_unreachable"] = True, why
    transports: dict[str, str] = {}
    if not embedded:
        for name, url in (("rabbitmq", amqp_url), ("redis", bus_redis_url)):
            if buses and name not in buses:
                continue
            why = machine.reachable(url)
            if why is None:
                transports[name] = url
            else:
                say(f"{name} bus at {url} not reachable ({why}): skipped")
                facts[f"{name}_unreachable"] = why
        embedded = embedded or not transports
    if embedded:
        facts.update(
            embedded=True,
            summary="embedded default: fakeredis ledger, memory:// bus, "
            "everything in one process (not comparable with a deployment)",
        )
        return True, {"memory": "memory://"}, facts
    facts["ledger"] = {"url": masked(ledger_url), **server.redis_facts(ledger_url)}
    facts["buses"] = {
        name: {"url": masked(url), **machine.broker_facts(url)} for name, url in transports.items()
    }
    if "redis" in transports:
        facts["buses"]["redis"].update(server.redis_facts(transports["redis"]))
    bus = next(iter(facts["buses"].values()))
    facts["summary"] = (
        f"Redis {facts['ledger']['version']} ledger, "
        f"{bus.get('product') or 'kombu Redis'} {bus.get('version', '')} bus, "
        "separate processes"
    )
    return False, transports, facts


ON_OFF = {"on": (True,), "off": (False,), "both": (False, True)}
#: why a run without --scenario leaves the instances scenario out: its preload alone
#: takes about 17 min on a real Redis (docs/benchmarks.rst), and its memory figures are
#: a real Redis's (fakeredis has no INFO used_memory nor MEMORY USAGE)
WHY_NO_INSTANCES = {
    "quick": "--quick leaves the instances scenario out (its preload alone takes minutes); "
    "name it with --scenario instances",
    "embedded": "the embedded default leaves the instances scenario out (its memory "
    "figures are a real Redis's); start Redis, or name it with --scenario instances",
}


def default_scenarios(quick: bool, embedded: bool) -> tuple[tuple[str, ...], str | None]:
    """What a run without --scenario measures, and why instances is left out if it is.

    The full run on real servers measures every scenario, the million instances too.
    """
    why = WHY_NO_INSTANCES["quick"] if quick else WHY_NO_INSTANCES["embedded"] if embedded else None
    if why is None:
        return tuple(SCENARIOS), None
    return tuple(name for name in SCENARIOS if name != "instances"), why


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--quick", is_flag=True, help="The everyday run: N up to 10,000, short load (<2 min)."
)
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Choice(list(SCENARIOS)),
    help="Run only these scenarios (repeatable) [default: all on real servers; all but "
    "instances with --quick or on the embedded default].",
)
@click.option("--sizes", metavar="N,N,...", help="Scale sweep host counts.")
@click.option(
    "--agents",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Agent processes; the hosts are split evenly between them.",
)
@click.option("--rate", type=click.FloatRange(min=1), help="Scale sweep: boots/s offered per path.")
@click.option("--duration-s", type=click.FloatRange(min=0.1), help="Scale sweep: seconds per path.")
@click.option("--saturation-hosts", type=click.IntRange(1), help="Hosts of the saturation cloud.")
@click.option("--saturation-rates", metavar="R,R,...", help="Offered rates of the ladder.")
@click.option("--step-s", type=click.FloatRange(min=0.1), help="Seconds per saturation step.")
@click.option(
    "--burst-s",
    "burst",
    type=click.FloatRange(min=0),
    help="Scale sweep: seconds of a 1,000/s burst per N, to see what it places with a "
    "backlog (0: none).",
)
@click.option("--fill-hosts", type=click.IntRange(1), help="Hosts of the fill cloud.")
@click.option(
    "--instances-hosts",
    type=click.IntRange(1),
    help="Instances: hosts of its two clouds [default: 100,000; --quick 10,000].",
)
@click.option(
    "--preload",
    type=click.IntRange(0),
    help="Instances: current and past instances written into the second cloud before it "
    "is measured, half ACTIVE, half DELETED [default: 1,000,000; --quick 100,000]. Each "
    "takes 3-4 KB of the ledger's Redis memory, and about 1 ms to write on 2 cores "
    "(docs/scale.rst).",
)
@click.option("--moves-sizes", metavar="N,N,...", help="Moves: host counts of its clouds "
              "[default: 100,100000; --quick 100,10000].")  # fmt: skip
@click.option("--host-servers", type=click.IntRange(1), help="Moves: servers of the host "
              "drained and of the host evacuated [default: 100; --quick 25].")  # fmt: skip
@click.option(
    "--plumbing-hosts",
    type=click.IntRange(1),
    default=Settings.plumbing_hosts,
    show_default=True,
    help="Plumbing: hosts of its cloud.",
)
@click.option(
    "--plumbing-blocks",
    type=click.IntRange(1),
    help="Plumbing: blocks of four slices (off, on, on, off) per comparison [default: 3; "
    "--quick 2].",
)
@click.option(
    "--plumbing-slice-s",
    type=click.FloatRange(min=0.1),
    help="Plumbing: seconds of boots in one slice [default: 10; --quick 6].",
)
@click.option(
    "--group-members",
    type=click.IntRange(1),
    default=250,
    show_default=True,
    help="Rules: members of the anti-affinity group, and compute hosts of the rules cloud "
    "(each agent process runs its share of them; at most one per node). Each host is an "
    "agent with its own AMQP connection: 1,000 need a broker allowed more file "
    "descriptors than RabbitMQ's default 1,024 (docs/benchmarks.rst).",
)
@click.option(
    "--ledger-url",
    default=DEFAULT_LEDGER,
    show_default=True,
    help="Redis for the ledger. Nothing is flushed: each cloud uses its own cell "
    "and deletes only its keys.",
)
@click.option(
    "--durability",
    type=click.Choice(["async", "replica", "disk"]),
    help="[ledger] durability of the clouds, on a ledger of the run's own instead of "
    "--ledger-url: a redis-server started for the run and set to match (disk: appendfsync "
    "always; async and replica: everysec; replica: with one replica, which WAIT counts), "
    "stopped at the end. Runs of one setting after another price each. Without it the "
    "clouds run async on --ledger-url (a benchmark's choice: a shared Redis may keep no "
    "AOF); the report says which.",
)
@click.option("--amqp-url", default=DEFAULT_AMQP, show_default=True, help="RabbitMQ.")
@click.option(
    "--rabbit-cluster",
    type=click.IntRange(1),
    help="Run on a RabbitMQ cluster of this many nodes of the run's own, started on "
    "loopback and stopped at the end, instead of --amqp-url: every process given every "
    "node, host queues quorum as well as boot queues (replicated on every node), and "
    "RabbitMQ's CPU that of its nodes only. About 30 s to start three.",
)
@click.option(
    "--bus-redis-url",
    default=DEFAULT_BUS_REDIS,
    show_default=True,
    help="Redis for kombu's Redis transport (saturation); only this run's keys are deleted.",
)
@click.option(
    "--metrics",
    type=click.Choice(["on", "off", "both"]),
    default="on",
    show_default=True,
    help="Prometheus metrics in the clouds ([api] metrics; each agent process serves "
    "its own). both: the scale sweep runs each N with them off, then on, and reports "
    "their cost per placement; the other scenarios run with them on.",
)
@click.option(
    "--notifications",
    type=click.Choice(["on", "off", "both"]),
    default="off",
    show_default=True,
    help="Versioned notifications from the clouds' agents and API, through oslo.messaging "
    "to the RabbitMQ of --amqp-url, on a topic of each cloud's own (deleted after). both: "
    "the scale sweep runs each N once more with them on (metrics as the last of "
    "--metrics) and reports their cost per placement. Needs RabbitMQ.",
)
@click.option(
    "--embedded",
    is_flag=True,
    help="Use the embedded default (fakeredis, memory://, one process) even if servers answer.",
)
@click.option(
    "--bus",
    "buses",
    multiple=True,
    type=click.Choice(["rabbitmq", "redis"]),
    help="Buses to use (repeatable) [default: both when they answer; the first runs the "
    "sweep and the fill].",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("bench-results/qsched-bench.json"),
    show_default=True,
    help="The JSON report; the plot goes next to it (.png).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the PNG instead.",
)
@click.option("--samples", is_flag=True, help="Keep every request's latencies in the JSON (large).")
@click.option(
    "--settle-timeout-s",
    type=click.FloatRange(min=1.0),
    default=Settings.settle_timeout_s,
    show_default=True,
    help="How long a phase waits, after its last send, for every request to leave BUILD; "
    "past it the run fails, with why the first few were not placed.",
)
@click.option(
    "--profile",
    "profile_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Sample every process with py-spy during each timed phase; collapsed stacks go "
    "here, the top frames into the JSON. Costs some CPU: not for the headline figures.",
)
@click.option(
    "--keep-logs",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep process logs and configs in this directory.",
)
def main(
    quick: bool,
    scenarios: tuple[str, ...],
    sizes: str | None,
    agents: int,
    rate: float | None,
    duration_s: float | None,
    saturation_hosts: int | None,
    saturation_rates: str | None,
    step_s: float | None,
    burst: float | None,
    fill_hosts: int | None,
    instances_hosts: int | None,
    preload: int | None,
    moves_sizes: str | None,
    host_servers: int | None,
    plumbing_hosts: int,
    plumbing_blocks: int | None,
    plumbing_slice_s: float | None,
    group_members: int,
    ledger_url: str,
    durability: str | None,
    amqp_url: str,
    rabbit_cluster: int | None,
    bus_redis_url: str,
    buses: tuple[str, ...],
    metrics: str,
    notifications: str,
    embedded: bool,
    output: Path,
    plot_path: Path | None,
    samples: bool,
    settle_timeout_s: float,
    profile_dir: Path | None,
    keep_logs: Path | None,
) -> None:
    """Measure qsched: scale sweep, saturation, fill, rules, plumbing, moves, instances.

    Starts real clouds (qsched-api under gunicorn, agent processes driving
    simulated hosts, RabbitMQ and a Redis ledger when they answer, otherwise the
    embedded default, said on stderr and in the report), sends boots, and reads
    every figure from the ledger's own records. Any over-commit or lost request
    fails the run (exit status 1) after the report is written.

    \b
    Scenarios:
      scale       N hosts (default 100 to 100,000): registration time, latency from
                  submit to claimed and to ACTIVE through HTTP and through the library
                  call at a fixed offered load, placements/s, agent peak RSS
      saturation  a ladder of offered rates per bus (RabbitMQ, kombu Redis): the
                  highest rate still sustained
      fill        mixed flavors into a finite cloud until the first NoValidHost, next
                  to an offline best-fit packing of the same stream
      rules       classes with placement rules next to a plain one, per N: a host
                  rule, a tenant-isolated aggregate, a nested GPU flavor, a provider
                  shared by every host (its conflicts), an anti-affinity group
      plumbing    one cloud (--plumbing-hosts) whose agents turn notifications and metrics
                  off and on between slices of the same load (off, on, on, off): the
                  agents' CPU per placement without and with each, and both against
                  the 10% they may add (needs RabbitMQ)
      moves       per N (--moves-sizes): submit to claimed of resizes and live migrations
                  at the sweep's rate; a host of --host-servers drained (qsched-admin
                  service drain's engine), another forced down and evacuated
      instances   the same cloud with no instance and with --preload current and past
                  instances: Redis memory per host and instance, agent restart,
                  submit to claimed, delete to DELETED, archive-deleted of the past ones

    Without --scenario, a run on real servers measures every scenario (make bench:
    about 40 min, 10 to 30 of them the instances scenario's two clouds and preload);
    --quick and the embedded default leave instances out, and say so.

    \b
    Examples:
      qsched-bench --quick
      qsched-bench
      qsched-bench --scenario instances --preload 1000000
      qsched-bench --scenario scale --sizes 100,100000 --duration-s 20
      qsched-bench --scenario moves --moves-sizes 100,100000
    """
    clock = Clock()
    pick = 1 if quick else 0
    settings_values = {key: value[pick] for key, value in PRESETS.items()}
    workdir = keep_logs or Path(tempfile.mkdtemp(prefix="qsched-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # The library's own log lines (e.g. boots refused while a broker restarts) go to a
    # file: stderr is for progress. The counts are in the report.
    logging.basicConfig(
        level=logging.INFO,
        filename=workdir / "bench.log",
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    cluster = None
    if rabbit_cluster:  # stopped when the command ends, however it ends
        cluster = start_cluster(rabbit_cluster, workdir, clock.say)
        click.get_current_context().call_on_close(cluster.stop)
        amqp_url = cluster.kombu_url
    # oslo.messaging's rabbit:// (every node of a cluster) for the notifications
    notifications_to = cluster.url if cluster is not None else notification_url(amqp_url)
    if durability is not None:
        if embedded:
            raise click.UsageError("--durability needs real servers: the embedded ledger "
                                   "keeps nothing (drop --embedded)")  # fmt: skip
        servers = start_ledger(durability, workdir, clock.say)
        click.get_current_context().call_on_close(lambda: stop_ledger(servers))
        ledger_url = servers[0].url
    embedded, transports, backends = pick_backends(
        embedded, ledger_url, amqp_url, bus_redis_url, buses, clock.say
    )
    if durability is not None and embedded:
        raise click.ClickException(f"--durability {durability}: no bus answers, so this "
                                   "run would be the embedded default, which keeps "
                                   "nothing")  # fmt: skip
    backends["durability"] = durability or "async"
    if not embedded:
        backends["summary"] += f", [ledger] durability = {backends['durability']}"
    if notifications != "off" and "rabbitmq" not in transports:
        raise click.UsageError(
            f"--notifications {notifications} needs RabbitMQ at --amqp-url, and this run has "
            "none (embedded, or --bus without rabbitmq): start RabbitMQ or drop the option"
        )
    settings = Settings(
        sizes=_numbers(sizes, int) or settings_values["sizes"],
        agents=agents,
        rate_per_s=rate or settings_values["rate"],
        duration_s=duration_s or settings_values["duration_s"],
        saturation_hosts=saturation_hosts or settings_values["saturation_hosts"],
        saturation_rates=_numbers(saturation_rates, float) or settings_values["saturation_rates"],
        saturation_step_s=step_s or settings_values["step_s"],
        fill_hosts=fill_hosts or settings_values["fill_hosts"],
        fill_rate_per_s=settings_values["fill_rate"],
        group_members=group_members,
        plumbing_hosts=plumbing_hosts,
        plumbing_blocks=plumbing_blocks or settings_values["plumbing_blocks"],
        plumbing_slice_s=plumbing_slice_s or settings_values["plumbing_slice_s"],
        instances_hosts=instances_hosts or settings_values["instances_hosts"],
        preload_instances=settings_values["preload"] if preload is None else preload,
        moves_sizes=_numbers(moves_sizes, int) or settings_values["moves_sizes"],
        host_servers=host_servers or settings_values["host_servers"],
        ledger_url=ledger_url,
        transports=transports,
        embedded=embedded,
        workdir=workdir,
        samples=samples,
        settle_timeout_s=settle_timeout_s,
        profile_dir=profile_dir,
        burst_s=settings_values["burst_s"] if burst is None else burst,
        metrics=ON_OFF[metrics],
        notifications=ON_OFF[notifications],
        notification_url=None if notifications == "off" else notifications_to,
        rabbit_home=None if cluster is None else str(cluster.dir),
        durability="async" if embedded else backends["durability"],
    )
    left_out = None
    if not scenarios:
        scenarios, left_out = default_scenarios(quick, embedded)
    command = shlex.join(["qsched-bench", *sys.argv[1:]])
    results: dict[str, Any] = {
        "tool": "qsched-bench",
        "command": command,
        "mode": "quick" if quick else "full",
        "scenarios": list(scenarios),
        "left_out": left_out,
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine.machine_facts(),
        "backends": backends,
        "rabbit_cluster": cluster and {"nodes": len(cluster.nodes), "started_s": cluster.started_s},
        "settings": _public(settings),
        "reference": report.REFERENCE,
        "failures": [],
    }
    clock.say(f"backends: {backends['summary']}")
    if left_out is not None:
        clock.say(left_out)
    busy = machine.busy_cores()
    results["machine"]["busy_cores_before"] = busy
    if busy is not None and busy > 0.3:
        clock.say(f"WARNING: {busy} of {os.cpu_count()} cores busy before the run started: "
                  "other work on this machine will show in the figures")  # fmt: skip
    runner = Runner(settings, clock.say)
    try:
        for name in scenarios:
            results[name] = SCENARIOS[name](runner)
    except (BenchFailure, StackFailed) as exc:
        results["failures"].append(f"{type(exc).__name__}: {exc}")
        clock.say(f"FAILED: {exc}")
    except Exception as exc:  # keep what was measured; the traceback goes in the report
        results["failures"].append(f"unexpected {type(exc).__name__}: {exc}\n"
                                   + traceback.format_exc())  # fmt: skip
        clock.say(f"FAILED (unexpected): {type(exc).__name__}: {exc}")
    finally:  # the sizes a failed scenario finished
        results.update({k: v for k, v in runner.partial.items() if v and k not in results})
    results["plumbing_cost"] = report.plumbing_cost(results.get("scale") or [])
    results["targets"] = report.targets(results)
    results["elapsed_s"] = round(time.monotonic() - clock.began, 1)
    results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finish(results, output, plot_path, clock)
    if results["failures"]:
        click.secho(f"qsched-bench FAILED (logs in {workdir}):", fg="red", bold=True, err=True)
        for failure in results["failures"]:
            click.secho(f"  {failure[:2000]}", fg="red", err=True)
        sys.exit(1)
    if keep_logs is None:
        shutil.rmtree(workdir, ignore_errors=True)


def start_cluster(nodes: int, workdir: Path, say: Any) -> RabbitCluster:
    """A RabbitMQ cluster of ``nodes`` for the run (``--rabbit-cluster``), formed."""
    say(f"starting a RabbitMQ cluster of {nodes} nodes")
    cluster = RabbitCluster(workdir, nodes)
    try:
        took = cluster.start()
    except RabbitFailed as exc:
        raise click.ClickException(f"the RabbitMQ cluster did not start: {exc}") from exc
    say(f"  RabbitMQ cluster of {nodes} nodes formed in {took}s: {cluster.kombu_url}")
    return cluster


def start_ledger(durability: str, workdir: Path, say: Any) -> list[server.RedisServer]:
    """The run's own ledger servers for ``--durability``, started (the master first)."""
    try:
        servers = server.start_for(workdir, durability)
    except server.RedisServerError as exc:
        raise click.ClickException(f"the ledger's redis-server did not start: {exc}") from exc
    say(
        f"ledger: a redis-server of the run's own on {servers[0].url}, appendfsync "
        f"{servers[0].fsync}, {len(servers) - 1} replica(s), [ledger] durability = {durability}"
    )
    return servers


def stop_ledger(servers: list[server.RedisServer]) -> None:
    for running in reversed(servers):
        running.stop()


def _public(settings: Settings) -> dict[str, Any]:
    """The settings for the report: no work directory, no passwords."""
    found = {k: v for k, v in vars(settings).items() if k != "workdir"}
    found["ledger_url"] = masked(settings.ledger_url)
    found["transports"] = {k: masked(v) for k, v in settings.transports.items()}
    return found


def finish(results: dict[str, Any], output: Path, plot_path: Path | None, clock: Clock) -> None:
    """Write the JSON, draw the plot, print the tables."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    png = plot_path or output.with_suffix(".png")
    why_not = report.plot(results, png)
    clock.say(f"report: {output}" + (f", plot: {png}" if why_not is None else f" ({why_not})"))
    click.echo(report.render(results))


if __name__ == "__main__":
    main()
