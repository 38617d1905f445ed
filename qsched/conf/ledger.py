"""The [ledger] section: where the ledger, quota and instance records live."""

from __future__ import annotations

import dataclasses

from oslo_config import cfg

from qsched.conf.base import Section

DURABILITY_MODES = ("async", "replica", "disk")
#: What the ledger promises unless told otherwise: nothing acknowledged is lost when its
#: machine crashes, as a database promises. ``replica`` would fail every write of a
#: Redis without replicas, so ``disk`` is the one that keeps that promise on a plain
#: Redis (docs/reliability.rst gives its price).
DEFAULT_DURABILITY = "disk"

ledger_opts = [
    cfg.StrOpt(
        "url",
        default="fakeredis://",
        secret=True,
        help="Where the ledger, quota and instance records live. redis://host:6379/0 (or "
        "rediss://, unix://) for one real Redis; "
        "redis+cluster://host:port[,host:port...] (or rediss+cluster://) for a Redis Cluster, "
        "where a cell is one hash slot (durability disk or async); "
        "redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name/db for the "
        "master a Redis Sentinel set names, followed across failovers: the sentinels (port "
        "26379 if none), the name they monitor the master under, the database; the password "
        "(percent-encoded) is the master's. Its options, any other refused: "
        "sentinel_password and sentinel_username (the sentinels' own credentials), "
        "sentinel_timeout_s (one question to a sentinel; default connect_timeout_s), "
        "min_other_sentinels (believe a sentinel only if it sees that many others; default "
        "0). Example: redis+sentinel://:secret@10.0.0.1:26379,10.0.0.2:26379,"
        "10.0.0.3:26379/qsched/0?sentinel_password=other. fakeredis:// keeps everything in "
        "this process, for the embedded default and tests only, with durability = async "
        "(it needs the embedded extra: pip install 'qsched[embedded]').",
    ),
    cfg.StrOpt(
        "cell",
        default="cell1",
        help="Cell name. Every key of a cell carries the hash tag {<cell>}, so that a Redis "
        "Cluster keeps a whole cell in one slot, on one master: a claim never spans shards. "
        "Several cells may share one Redis or one cluster; give each its own [bus] prefix, "
        "so that its agents consume only its boots.",
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
        default=DEFAULT_DURABILITY,
        choices=[
            (
                "disk",
                "the default: acknowledged once on the ledger server's disk, so a crash "
                "of its machine loses nothing acknowledged. Needs the server (every node "
                "of a cluster) to run appendonly yes, appendfsync always and "
                "no-appendfsync-on-rewrite no (deploy/redis-ledger.conf), checked at start; "
                "a service refuses to start on a server without them and says what to set. "
                "A Sentinel failover promotes a replica that may lack the newest writes: "
                "there, choose replica",
            ),
            (
                "replica",
                "acknowledged once durability_replicas replicas hold it (WAIT after "
                "every state change, in the same round trip); every write fails on a Redis "
                "without replicas. When the master dies, Sentinel promotes the replica that "
                "holds the most, so nothing acknowledged is lost; a failover while the old "
                "master still runs (SENTINEL FAILOVER, a network cut) loses nothing "
                "acknowledged only if durability_replicas counts every replica. A single "
                "Redis or a Sentinel set only, not a cluster",
            ),
            (
                "async",
                "an opt-in: acknowledged once Redis applied a write; a crash of the "
                "ledger's machine loses what its server had not written to disk "
                "(appendfsync everysec: about the last second: boots answered 202 vanish, "
                "deletes answered 204 come back). Needs nothing of the server; the "
                "embedded ledger (fakeredis://), which keeps nothing past its process, "
                "takes only this",
            ),
        ],
        help="When the ledger counts a write as done, and so what an acknowledged boot, "
        "claim or delete can lose in a machine crash. The default, disk, loses none on a "
        "plain Redis (replica would fail every write there); docs/reliability.rst gives "
        "what each costs a placement and a claim.",
    ),
    cfg.IntOpt(
        "durability_replicas",
        default=1,
        min=1,
        help="durability = replica: how many replicas must hold a write. With every "
        "replica counted, no failover loses an acknowledged write, but writes fail (the API "
        "answers 503) while any replica is down; with fewer, see durability = replica.",
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


@dataclasses.dataclass(frozen=True)
class LedgerOptions(Section):
    """The ``[ledger]`` options."""

    GROUPS = (("ledger", ledger_opts),)

    url: str
    cell: str
    cpu_allocation_ratio: float
    ram_allocation_ratio: float
    disk_allocation_ratio: float
    max_conflict_retries: int
    connect_timeout_s: float
    timeout_s: float
    durability: str
    durability_replicas: int
    durability_timeout_ms: int
    max_events: int
