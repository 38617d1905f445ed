"""The ledger: providers and allocations, quota and instance records, on Redis.

:func:`open_stores` builds every store of a cell on one connection from the
``[ledger]`` and ``[quota]`` options. Callers see the interfaces of
:mod:`qsched.ledger.base` only: no Redis client, no key. Harnesses also use
:mod:`qsched.ledger.server` (redis-server processes of their own) and
:mod:`qsched.ledger.embedded` (the in-process ledger served over TCP).
"""

from __future__ import annotations

import dataclasses

from qsched.conf import LedgerOptions, QuotaOptions
from qsched.ledger.agents import RedisAgents
from qsched.ledger.aggregates import RedisAggregates
from qsched.ledger.archiver import RedisArchive
from qsched.ledger.base import (
    QUOTA_LIMITS,
    AgentRegistry,
    AggregateStore,
    ArchiveStore,
    Backend,
    FlavorStore,
    GroupStore,
    Inspector,
    InstanceStore,
    KeypairStore,
    Ledger,
    MigrationStore,
    QuotaStore,
    Usage,
)
from qsched.ledger.flavors import RedisFlavors
from qsched.ledger.groups import GroupLimits, RedisGroups
from qsched.ledger.instances import RedisInstances
from qsched.ledger.keypairs import RedisKeypairs
from qsched.ledger.migrations import RedisMigrations
from qsched.ledger.placement import RedisLedger
from qsched.ledger.quota import RedisQuota
from qsched.ledger.redis import Durability, RedisBackend, RedisStore, connect
from qsched.ledger.scan import RedisInspector
from qsched.resources import DISK_GB, MEMORY_MB, VCPU


@dataclasses.dataclass
class Stores:
    """The stores of one cell, sharing one connection (``backend``)."""

    ledger: Ledger
    quota: QuotaStore
    instances: InstanceStore
    agents: AgentRegistry
    flavors: FlavorStore
    inspector: Inspector
    backend: Backend
    aggregates: AggregateStore
    groups: GroupStore
    keypairs: KeypairStore
    archive: ArchiveStore
    migrations: MigrationStore


def open_stores(
    options: LedgerOptions, quota: QuotaOptions | None = None, url: str | None = None
) -> Stores:
    """Open the stores at ``url`` (default ``[ledger] url``) with the configured defaults.

    ``quota``: the default limits (None: as shipped).

    :raises DurabilityRefused: the server cannot keep the ``[ledger] durability``
        promise (the default, ``disk``, needs its AOF fsynced before each answer;
        the embedded ledger takes ``async`` only); the message says what to set.
    :raises BackendUnavailable: it could not be asked (only for ``replica`` and ``disk``).
    """
    durability = Durability(
        options.durability, options.durability_replicas, options.durability_timeout_ms
    )
    client = connect(url or options.url, options.connect_timeout_s, options.timeout_s)
    store = RedisStore(client, options.cell, options.max_events, durability)
    store.check_durability()
    ratios = {
        VCPU: options.cpu_allocation_ratio,
        MEMORY_MB: options.ram_allocation_ratio,
        DISK_GB: options.disk_allocation_ratio,
    }
    limits = quota or QuotaOptions.defaults()
    others = {name: getattr(limits, name) for name in QUOTA_LIMITS[3:]}
    quotas = RedisQuota(store, Usage(limits.instances, limits.cores, limits.ram), others)
    groups = GroupLimits(limits.server_groups, limits.server_group_members)
    return _redis_stores(store, RedisLedger(store, ratios), quotas, groups, limits.key_pairs)


def _redis_stores(
    store: RedisStore,
    ledger: RedisLedger,
    quota: RedisQuota,
    groups: GroupLimits,
    key_pairs: int = 100,
) -> Stores:
    return Stores(
        ledger,
        quota,
        RedisInstances(store, quota, groups.server_group_members),
        RedisAgents(store),
        RedisFlavors(store),
        RedisInspector(store),
        RedisBackend(store),
        RedisAggregates(store),
        RedisGroups(store, groups),
        RedisKeypairs(store, key_pairs),
        RedisArchive(store),
        RedisMigrations(store, quota.default_args()),
    )
