"""``qsched-chaos``: the fault-injection run, for one transport or both."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from qsched.chaos.report import table, to_json
from qsched.chaos.runner import AMQP_URL, ChaosRun, RunSettings
from qsched.chaos.servers import ChaosError, RabbitFailed, RedisServerError
from qsched.chaos.stack import StackSpec
from qsched.conf.ledger import DEFAULT_DURABILITY, DURABILITY_MODES
from qsched.stack import StackFailed


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


#: the transports of --transport both, all and rabbit, in order
TRANSPORTS = {"both": ["amqp", "redis"], "all": ["amqp", "redis", "oslo"],
              "rabbit": ["amqp", "oslo"]}  # fmt: skip

#: the option giving how many faults of each kind
COUNT_OPTIONS = {
    "agent_kill": "kills",
    "agent_term": "terms",
    "broker_restart": "broker_restarts",
    "ledger_restart": "ledger_restarts",
    "agent_freeze": "freezes",
    "api_worker_kill": "worker_kills",
    "machine_crash": "crashes",
    "ledger_stall": "stalls",
    "poison": "poisons",
    "master_kill": "master_kills",
    "rabbit_node_loss": "node_losses",
}
#: the faults that hit the one ledger server: none of them on a Sentinel set
SERVER_OPTIONS = {"ledger_restarts": "--ledger-restarts", "crashes": "--crashes",
                  "stalls": "--stalls"}  # fmt: skip


def _counts(o: dict[str, Any]) -> dict[str, int]:
    from qsched.chaos.faults import default_counts

    counts = default_counts(o["duration_s"], o["ledger"], cluster=bool(o["rabbit_cluster"]))
    given = {kind: o[option] for kind, option in COUNT_OPTIONS.items()}
    # a kind the ledger cannot take has no default (master_kill on one redis-server): 0
    return {k: (v if v is not None else counts.get(k, 0)) for k, v in given.items()}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--transport",
    type=click.Choice(["amqp", "redis", "oslo", "both", "all", "rabbit"]),
    default="all",
    show_default=True,
    help="Bus to test: the kombu bus on RabbitMQ (amqp) or on Redis (redis), the "
    "oslo.messaging bus on a RabbitMQ node of the run's own (oslo); both: amqp then "
    "redis; all: amqp, redis, then oslo; rabbit: amqp then oslo (the transports that "
    "--rabbit-cluster serves).",
)
@click.option(
    "--rabbit-cluster",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Run amqp and oslo on a RabbitMQ cluster of this many nodes of the run's own "
    "(at least 3, so that quorum queues keep a majority through a node loss; about 40 s "
    "to start three on two cores) instead of the machine's RabbitMQ or a single node: "
    "kombu's failover list (amqp) or oslo.messaging's multi-host rabbit:// URL (oslo) "
    "names every node, and --node-losses replace the broker restart. 0: no cluster.",
)
@click.option(
    "--host-queues",
    type=click.Choice(["classic", "quorum"]),
    default=None,
    help="[bus] host_queue_type of the run [default: quorum with --rabbit-cluster, "
    "classic otherwise]. classic on a cluster shows what it costs: an agent whose host "
    "queue was on the lost node consumes nothing until the node is back.",
)
@click.option(
    "--node-losses",
    type=click.IntRange(0),
    default=None,
    help="With --rabbit-cluster: RabbitMQ nodes stopped for --outage-s under load and "
    "started again, the next node each time, the one listed first to begin with, "
    "after the cluster is whole again [default: 2].",
)
@click.option(
    "--node-loss",
    "node_loss",
    type=click.Choice(["kill", "stop"]),
    default="kill",
    show_default=True,
    help="How a node loss stops a node: kill (SIGKILL of its Erlang VM, a crash) or "
    "stop (rabbitmqctl stop, a clean shutdown).",
)
@click.option(
    "--ledger",
    type=click.Choice(["redis", "sentinel"]),
    default="redis",
    show_default=True,
    help="Where the ledger lives: redis, one redis-server of the run's own (its faults: "
    "--ledger-restarts, --crashes, --stalls); sentinel, a Redis Sentinel set of the run's "
    "own (a master, two replicas, three sentinels, down-after 1 s) reached through a "
    "redis+sentinel:// URL, whose fault is --master-kills. With sentinel, --durability "
    "replica is the one that promises no acknowledged loss in a failover.",
)
@click.option(
    "--duration-s",
    type=click.FloatRange(10),
    default=240.0,
    show_default=True,
    help="Seconds of load per transport; faults happen within it.",
)
@click.option(
    "--seed",
    type=int,
    default=1,
    show_default=True,
    help="Seed of the load, the fault plan and the fake driver's failures.",
)
@click.option(
    "--agents", type=click.IntRange(1), default=3, show_default=True, help="qsched-agent processes."
)
@click.option(
    "--nodes-per-agent",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Fake nodes per agent.",
)
@click.option(
    "--node-vcpus",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="VCPUs per fake node (allocation ratio 1.0).",
)
@click.option(
    "--rate",
    type=click.FloatRange(0.1, 100),
    default=4.0,
    show_default=True,
    help="Boots per second (a Poisson stream).",
)
@click.option(
    "--move-rate",
    type=click.FloatRange(0),
    default=0.5,
    show_default=True,
    help="Moves per second of the load's servers: resizes, cold and live migrations, "
    "shelves, each confirmed, reverted or unshelved a moment later (0: none).",
)
@click.option(
    "--lifetime-s",
    type=click.FloatRange(0.1),
    default=8.0,
    show_default=True,
    help="Mean lifetime of a server before the load deletes it.",
)
@click.option(
    "--clients",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Concurrent HTTP clients; a boot finding them all busy is skipped.",
)
@click.option(
    "--spawn-delay-s",
    type=click.FloatRange(0),
    default=1.0,
    show_default=True,
    help="Fake driver: seconds per spawn (the window a kill can hit).",
)
@click.option(
    "--failure-rate",
    type=click.FloatRange(0, 1),
    default=0.05,
    show_default=True,
    help="Fake driver: share of spawns that fail and get rescheduled.",
)
@click.option(
    "--build-timeout-s",
    type=click.FloatRange(5),
    default=30.0,
    show_default=True,
    help="[scheduler] build_timeout_s: the deadline of every request.",
)
@click.option(
    "--outage-s",
    type=click.FloatRange(0),
    default=5.0,
    show_default=True,
    help="How long a broker or ledger restart keeps the server down.",
)
@click.option(
    "--kills",
    type=click.IntRange(0),
    default=None,
    help="Agent SIGKILLs [default: one per 45 s of run].",
)
@click.option(
    "--terms",
    type=click.IntRange(0),
    default=None,
    help="Agent SIGTERMs [default: one per 120 s of run].",
)
@click.option(
    "--broker-restarts",
    type=click.IntRange(0),
    default=None,
    help="RabbitMQ (or bus Redis) restarts [default: 1].",
)
@click.option(
    "--ledger-restarts",
    type=click.IntRange(0),
    default=None,
    help="Ledger Redis restarts [default: 1].",
)
@click.option(
    "--freezes",
    type=click.IntRange(0),
    default=None,
    help="Agent SIGSTOPs past the heartbeat TTL, then SIGCONT [default: one per 120 s].",
)
@click.option(
    "--worker-kills",
    type=click.IntRange(0),
    default=None,
    help="API worker SIGKILLs during a burst of boots [default: one per 120 s].",
)
@click.option(
    "--crashes",
    type=click.IntRange(0),
    default=None,
    help="Crashes of the ledger's machine (SIGKILL, AOF cut back) [default: 1].",
)
@click.option(
    "--stalls",
    type=click.IntRange(0),
    default=None,
    help="Ledger stalls (SIGSTOP past the services' ledger timeout) [default: 1].",
)
@click.option(
    "--poisons",
    type=click.IntRange(0),
    default=None,
    help="Rounds of poison messages on the boot and host queues [default: one per 120 s].",
)
@click.option(
    "--master-kills",
    type=click.IntRange(0),
    default=None,
    help="--ledger sentinel: SIGKILLs of the ledger's master under load; the killed "
    "server comes back as a replica --outage-s after the promotion [default: 1 with "
    "--ledger sentinel, else 0].",
)
@click.option(
    "--durability",
    type=click.Choice(DURABILITY_MODES),
    default=None,
    help="[ledger] durability of the run, its ledger servers set to match: disk "
    "(appendfsync always; a machine crash must lose nothing), async (appendfsync "
    "everysec; a machine crash or a killed master may lose acknowledged writes, and the "
    "run reports those losses without failing on them) or replica (--ledger sentinel "
    "only: WAIT for one replica; a killed master must lose nothing) [default: the "
    f"product's, {DEFAULT_DURABILITY}; replica with --ledger sentinel, whose failover "
    "disk does not cover].",
)
@click.option(
    "--crash-loss-s",
    type=click.FloatRange(0),
    default=1.0,
    show_default=True,
    help="What a machine crash cuts from the AOF under appendfsync everysec.",
)
@click.option(
    "--stall-s",
    type=click.FloatRange(0.1),
    default=8.0,
    show_default=True,
    help="How long a ledger stall lasts (the services' ledger timeout is 3 s).",
)
@click.option(
    "--freeze-s",
    type=click.FloatRange(0),
    default=0.0,
    help="How long an agent stays frozen [default: 0, twice its heartbeat TTL + 1 s].",
)
@click.option(
    "--quota-instances",
    type=click.IntRange(-1),
    default=12,
    show_default=True,
    help="Instances per project (finite, so that the quota invariant is exercised).",
)
@click.option(
    "--quota-cores",
    type=click.IntRange(-1),
    default=20,
    show_default=True,
    help="VCPUs per project (RAM: 2 GiB per VCPU).",
)
@click.option(
    "--ledger-signal",
    type=click.Choice(["term", "kill"]),
    default="term",
    show_default=True,
    help="How a ledger restart stops Redis: term (a clean shutdown) or kill (a crash of the "
    "process; Redis normally writes its AOF before it answers, so with appendfsync everysec "
    "it is a crash of the machine that loses the last second).",
)
@click.option(
    "--amqp-url",
    default=AMQP_URL,
    show_default=True,
    help="RabbitMQ for the amqp transport; restarted only if it is local.",
)
@click.option(
    "--extra-config",
    "extra_config",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="INI file added to every process's configuration (after the run's own).",
)
@click.option(
    "--drain/--no-drain",
    default=True,
    show_default=True,
    help="At the end, delete every server and expect an empty ledger.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where configs, logs and Redis data go [default: a new temporary directory, "
    "removed after a passing run].",
)
@click.option("--keep", is_flag=True, help="Keep the work directory even when the run passes.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def main(**options: Any) -> None:
    """Run real qsched stacks under load while breaking them, then check the ledger.

    Per transport: the API under gunicorn, --agents qsched-agent processes with
    fake nodes (their VMs kept in a file, as a hypervisor outlives its agent),
    the ledger on a redis-server of the run's own (AOF, fsync as --durability
    asks) or on a Sentinel set of the run's own (--ledger sentinel), the bus
    on RabbitMQ (amqp) or on a second redis-server of the run's
    own (redis), or the oslo.messaging bus on a RabbitMQ node of the run's own with
    deploy/rabbitmq-policies.sh applied (oslo), finite quotas; with --rabbit-cluster,
    amqp and oslo on a RabbitMQ cluster of the run's own, every node in the bus URL.
    Boots and deletes go through HTTP on 127.0.0.1 while agents are killed (SIGKILL,
    then restarted), stopped (SIGTERM, then restarted) and frozen past their heartbeat
    TTL (SIGSTOP, SIGCONT), API workers are killed with boots in flight, poison
    messages are published, the broker and the ledger are restarted (on a cluster:
    one node lost, then another once the cluster is whole again), the ledger stalls
    and its machine crashes (or, on a Sentinel set, its master is killed and a
    replica promoted). Then it waits for quiescence and checks, from the ledger's own keys,
    what the agents report and what their drivers run: nothing lost, nothing
    placed twice, no over-commit, quota never exceeded, no leaked allocation or
    quota, nothing left behind a 503, no boot held unpublished, every agent's
    index and driver back in line with the ledger, every poison message
    dead-lettered once and no valid request among the dead letters; on a cluster,
    every quorum queue of the run still replicated on every node.

    Progress goes to stderr; the table (or --json) to stdout. Exit status: 0 if
    every invariant held, 1 if one broke, 2 if the harness could not run.
    """
    _check_ledger(options)
    transports = TRANSPORTS.get(options["transport"], [options["transport"]])
    _check_cluster_options(options, transports)
    workdir = options["workdir"] or Path(tempfile.mkdtemp(prefix="qsched-chaos-"))
    reports = []
    try:
        for transport in transports:
            settings = _settings(transport, options)
            run = ChaosRun(settings, workdir / transport, _echo_err)
            reports.append(run.execute())
            (workdir / transport / "report.json").write_text(to_json(reports[-1]))
            if not options["as_json"]:
                click.echo(table(reports[-1]))
                click.echo("")
    except (ChaosError, RabbitFailed, RedisServerError, StackFailed) as exc:
        _echo_err(f"qsched-chaos: {exc}")
        _echo_err(f"qsched-chaos: files kept in {workdir}")
        sys.exit(2)
    ok = all(r["ok"] for r in reports)
    if options["as_json"]:
        click.echo(to_json({"ok": ok, "runs": reports}))
    if ok and not options["keep"] and options["workdir"] is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        _echo_err(f"qsched-chaos: logs and data kept in {workdir}")
    sys.exit(0 if ok else 1)


def _check_ledger(o: dict[str, Any]) -> None:
    """Fill in --durability; refuse what the ledger chosen cannot take."""
    sentinel = o["ledger"] == "sentinel"
    if o["durability"] is None:
        o["durability"] = "replica" if sentinel else DEFAULT_DURABILITY
    if o["durability"] == "replica" and not sentinel:
        raise click.UsageError("--durability replica needs replicas: add --ledger sentinel")
    given = [flag for option, flag in SERVER_OPTIONS.items() if o[option]]
    if sentinel and given:
        raise click.UsageError(f"{', '.join(given)}: those faults hit a one-server ledger; "
                               "with --ledger sentinel use --master-kills")  # fmt: skip
    if not sentinel and o["master_kills"]:
        raise click.UsageError("--master-kills needs --ledger sentinel")


def _check_cluster_options(o: dict[str, Any], transports: list[str]) -> None:
    """:raises click.UsageError: cluster options that the run could not honour."""
    nodes = o["rabbit_cluster"]
    if nodes and nodes < 3:
        raise click.UsageError(f"--rabbit-cluster {nodes}: a quorum queue keeps a majority "
                               "through a node loss from three nodes; give 3 or more")  # fmt: skip
    if nodes and "redis" in transports:
        raise click.UsageError("--rabbit-cluster serves the amqp and oslo transports: "
                               "use --transport amqp, oslo or rabbit")  # fmt: skip
    if not nodes and o["node_losses"]:
        raise click.UsageError("--node-losses needs a RabbitMQ cluster: add --rabbit-cluster 3")
    if nodes and o["broker_restarts"]:
        raise click.UsageError("--broker-restarts restarts a single broker; on a cluster "
                               "use --node-losses")  # fmt: skip


def _settings(transport: str, o: dict[str, Any]) -> RunSettings:
    spec = StackSpec(
        agents=o["agents"],
        nodes_per_agent=o["nodes_per_agent"],
        node_vcpus=o["node_vcpus"],
        node_ram_mb=o["node_vcpus"] * 2048,
        spawn_delay_s=o["spawn_delay_s"],
        failure_rate=o["failure_rate"],
        build_timeout_s=o["build_timeout_s"],
        seed=o["seed"],
        durability=o["durability"],
        quota_instances=o["quota_instances"],
        quota_cores=o["quota_cores"],
        extra_config=tuple(p.resolve() for p in o["extra_config"]),
    )
    counts = _counts(o)
    return RunSettings(
        transport=transport,
        duration_s=o["duration_s"],
        seed=o["seed"],
        rate=o["rate"],
        move_rate=o["move_rate"],
        lifetime_s=o["lifetime_s"],
        clients=o["clients"],
        outage_s=o["outage_s"],
        freeze_s=o["freeze_s"],
        stall_s=o["stall_s"],
        crash_loss_s=o["crash_loss_s"],
        fault_counts=counts,
        amqp_url=o["amqp_url"],
        spec=spec,
        drain=o["drain"],
        ledger_signal=signal.SIGKILL if o["ledger_signal"] == "kill" else signal.SIGTERM,
        ledger=o["ledger"],
        rabbit_cluster=o["rabbit_cluster"],
        node_loss=o["node_loss"],
        host_queues=o["host_queues"] or "",
    )


if __name__ == "__main__":
    main()
