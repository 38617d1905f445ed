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
        help="Cell name. Every key of a cell carries the hash tag {<cell>} so that Redis "
        "Cluster keeps a whole cell in one slot and no claim spans shards.",
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
    cfg.IntOpt(
        "max_events",
        default=200,
        min=10,
        help="Events kept per instance history; older ones are trimmed, and the count of "
        "trimmed events is kept.",
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
    return [
        (None, default_opts),
        ("ledger", ledger_opts),
        ("quota", quota_opts),
    ]


def load(args: Sequence[str] = (), config_files: Sequence[str] = ()) -> cfg.ConfigOpts:
    """Return a new ConfigOpts with qsched's options, parsed from ``args`` and files."""
    conf = cfg.ConfigOpts()
    register_opts(conf)
    conf(list(args), project="qsched", default_config_files=list(config_files))
    return conf
