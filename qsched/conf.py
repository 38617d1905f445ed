"""Configuration options, registered per section on a ConfigOpts passed in.

Nothing here keeps a global: services build one ``cfg.ConfigOpts`` with
:func:`load` (or register the options on their own with :func:`register_opts`)
and hand it down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from oslo_config import cfg

default_opts = [
    cfg.StrOpt(
        "transport_url",
        default="memory://",
        secret=True,
        help="Bus URL. memory:// is the in-process embedded default; amqp://user:pass@host:5672// "
        "is RabbitMQ (the production path); redis://host:6379/0 uses kombu's Redis transport.",
    ),
]

ledger_opts = [
    cfg.StrOpt(
        "url",
        default="fakeredis://",
        secret=True,
        help="Where the ledger, quota and instance records live. redis://host:6379/0 (or "
        "rediss://, unix://) for a real Redis; fakeredis:// keeps everything in this process, "
        "for the embedded default and tests only.",
    ),
    cfg.StrOpt(
        "cell",
        default="cell1",
        help="Cell name. Every key of a cell carries the hash tag {<cell>}, so that a Redis "
        "Cluster would keep a whole cell in one slot (the ledger has no Cluster client yet).",
    ),
    cfg.FloatOpt(
        "cpu_allocation_ratio",
        default=4.0,
        min=0.0,
        help="Allocation ratio for VCPU when an inventory does not give one. 4.0 is Nova's "
        "initial_cpu_allocation_ratio; Placement's historical default was 16.0.",
    ),
    cfg.FloatOpt(
        "ram_allocation_ratio",
        default=1.0,
        min=0.0,
        help="Allocation ratio for MEMORY_MB when an inventory does not give one (Nova's "
        "initial_ram_allocation_ratio; historically 1.5).",
    ),
    cfg.FloatOpt(
        "disk_allocation_ratio",
        default=1.0,
        min=0.0,
        help="Allocation ratio for DISK_GB when an inventory does not give one.",
    ),
    cfg.IntOpt(
        "max_conflict_retries",
        default=10,
        min=1,
        help="How many times a client re-reads and retries after a generation conflict "
        "before it gives up.",
    ),
    cfg.FloatOpt(
        "connect_timeout_s",
        default=2.0,
        min=0.1,
        help="How long a connection to the ledger's Redis may take to open.",
    ),
    cfg.FloatOpt(
        "timeout_s",
        default=10.0,
        min=0.1,
        help="How long one ledger command may take. A stalled ledger then fails the call "
        "(the API answers 503, an agent gives its request back) instead of hanging; a "
        "create that ran late anyway is ended by the front door that gave up on it.",
    ),
    cfg.StrOpt(
        "durability",
        default="async",
        choices=[
            (
                "async",
                "acknowledged once Redis applied a write; a crash of the ledger's "
                "machine loses what its server had not written to disk (appendfsync everysec: "
                "about the last second)",
            ),
            (
                "replica",
                "acknowledged once durability_replicas replicas hold it (WAIT after "
                "every state change, in the same round trip); a failover to such a replica "
                "loses nothing acknowledged",
            ),
            (
                "disk",
                "acknowledged once on the ledger server's disk: needs the server to run "
                "appendonly yes with appendfsync always, checked at start",
            ),
        ],
        help="When the ledger counts a write as done, and so what an acknowledged boot, "
        "claim or delete can lose in a machine crash. docs/reliability.rst gives the cost "
        "of each in claims per second.",
    ),
    cfg.IntOpt(
        "durability_replicas",
        default=1,
        min=1,
        help="durability = replica: how many replicas must hold a write.",
    ),
    cfg.IntOpt(
        "durability_timeout_ms",
        default=1000,
        min=1,
        help="durability = replica: how long a write waits for its replicas. Past it the "
        "call fails as if the ledger were down (the API answers 503), although the master "
        "has the write.",
    ),
    cfg.IntOpt(
        "max_events",
        default=200,
        min=10,
        help="Events kept per instance history; older ones are trimmed, and the count of "
        "trimmed events is kept.",
    ),
]

bus_opts = [
    cfg.StrOpt(
        "prefix",
        default="qsched",
        help="Exchange and queue name prefix: <prefix>.boot.<class>, <prefix>.host.<host>, "
        "<prefix>.dead.",
    ),
    cfg.FloatOpt(
        "connect_timeout_s",
        default=5.0,
        min=0.1,
        help="Broker connect timeout; a publish fails (the API answers 503) after about "
        "twice this.",
    ),
    cfg.FloatOpt(
        "confirm_timeout_s",
        default=5.0,
        min=0.1,
        help="How long a publish waits for the broker's confirm (also the Redis socket timeout).",
    ),
    cfg.IntOpt("heartbeat_s", default=30, min=0, help="AMQP heartbeat of agent consumers; 0: off."),
    cfg.IntOpt(
        "delivery_limit",
        default=20,
        min=1,
        help="RabbitMQ boot queues: deliveries without an ack before a message is "
        "dead-lettered. Fixed when a queue is created; change it later with a policy.",
    ),
    cfg.FloatOpt(
        "visibility_timeout_s",
        default=3600.0,
        min=1.0,
        help="kombu Redis transport: a message held unacked this long is delivered again, "
        "even to a live consumer. Keep it far above any hold.",
    ),
    cfg.FloatOpt(
        "poll_interval_s",
        default=0.1,
        min=0.01,
        help="How often a consumer applies class changes and settles from other threads.",
    ),
    cfg.FloatOpt(
        "settle_timeout_s",
        default=30.0,
        min=0.1,
        help="How long an ack, requeue or reject from another thread waits for the "
        "consumer thread.",
    ),
    cfg.FloatOpt(
        "reconnect_max_delay_s",
        default=5.0,
        min=0.1,
        help="Upper bound of the consumer reconnect backoff.",
    ),
    cfg.IntOpt(
        "publisher_pool_size",
        default=32,
        min=0,
        help="Idle publishing connections kept per process. Keep it at least the number "
        "of threads that publish at once (gunicorn's threads in the API): a connection "
        "beyond it is opened and closed for every message.",
    ),
]

quota_opts = [
    cfg.IntOpt("instances", default=10, min=-1, help="Instances per project; -1: no limit."),
    cfg.IntOpt("cores", default=20, min=-1, help="VCPUs per project; -1: no limit."),
    cfg.IntOpt("ram", default=51200, min=-1, help="MiB of RAM per project; -1: no limit."),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register every qsched option on ``conf``, one group per section."""
    for group, opts in list_opts():
        conf.register_opts(opts, group=group)


def list_opts() -> list[tuple[str | None, list[Any]]]:
    """The options by section, for oslo-config-generator and :func:`register_opts`."""
    from agents import opts as agent_opts  # the agent's section lives with the agent
    from qsched.api import opts as api_opts

    return [
        (None, default_opts),
        ("bus", bus_opts),
        ("ledger", ledger_opts),
        ("quota", quota_opts),
        *api_opts.list_opts(),
        *agent_opts.list_opts(),
    ]


def load(args: Sequence[str] = (), config_files: Sequence[str] = ()) -> cfg.ConfigOpts:
    """Return a new ConfigOpts with qsched's options, parsed from ``args`` and files."""
    conf = cfg.ConfigOpts()
    register_opts(conf)
    conf(list(args), project="qsched", default_config_files=list(config_files))
    return conf
