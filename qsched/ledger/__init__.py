"""The ledger: providers and allocations, quota and instance records, on Redis.

:func:`open_stores` builds all three on one connection from the ``[ledger]`` and
``[quota]`` options (:class:`~qsched.conf.LedgerOptions`, ``QuotaOptions``).
"""

from __future__ import annotations

import dataclasses

from qsched.conf import LedgerOptions, QuotaOptions
from qsched.ledger.agents import RedisAgents
from qsched.ledger.base import Usage
from qsched.ledger.instances import RedisInstances
from qsched.ledger.placement import RedisLedger
from qsched.ledger.quota import RedisQuota
from qsched.ledger.redis import Durability, RedisStore, connect
from qsched.resources import DISK_GB, MEMORY_MB, VCPU


@dataclasses.dataclass
class Stores:
    """The three stores of one cell, sharing one Redis connection pool."""

    store: RedisStore
    ledger: RedisLedger
    quota: RedisQuota
    instances: RedisInstances
    agents: RedisAgents


def open_stores(
    options: LedgerOptions, quota: QuotaOptions | None = None, url: str | None = None
) -> Stores:
    """Open the stores at ``url`` (default ``[ledger] url``) with the configured defaults.

    ``quota``: the default limits (None: as shipped).

    :raises Invalid: the server cannot keep the ``[ledger] durability`` promise.
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
    quotas = RedisQuota(store, Usage(limits.instances, limits.cores, limits.ram))
    return Stores(
        store,
        RedisLedger(store, ratios),
        quotas,
        RedisInstances(store, quotas),
        RedisAgents(store),
    )
