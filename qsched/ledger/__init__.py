"""The ledger: providers and allocations, quota and instance records, on Redis.

:func:`open_stores` builds all three on one connection from the ``[ledger]``
and ``[quota]`` sections of a ConfigOpts.
"""

from __future__ import annotations

import dataclasses

from oslo_config import cfg

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


def open_stores(conf: cfg.ConfigOpts, url: str | None = None) -> Stores:
    """Open the stores at ``url`` (default ``[ledger] url``) with the configured defaults.

    :raises Invalid: the server cannot keep the ``[ledger] durability`` promise.
    :raises BackendUnavailable: it could not be asked (only for ``replica`` and ``disk``).
    """
    durability = Durability(
        conf.ledger.durability, conf.ledger.durability_replicas, conf.ledger.durability_timeout_ms
    )
    client = connect(url or conf.ledger.url, conf.ledger.connect_timeout_s, conf.ledger.timeout_s)
    store = RedisStore(client, conf.ledger.cell, conf.ledger.max_events, durability)
    store.check_durability()
    ratios = {
        VCPU: conf.ledger.cpu_allocation_ratio,
        MEMORY_MB: conf.ledger.ram_allocation_ratio,
        DISK_GB: conf.ledger.disk_allocation_ratio,
    }
    quota = RedisQuota(store, Usage(conf.quota.instances, conf.quota.cores, conf.quota.ram))
    return Stores(
        store,
        RedisLedger(store, ratios),
        quota,
        RedisInstances(store, quota),
        RedisAgents(store),
    )
