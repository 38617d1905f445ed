"""The ledger's roles, one small interface each, and the records they speak.

Ledger, QuotaStore and InstanceStore share one store so that the operations
that must be atomic across them (reserve quota and record an instance; claim
resources only for an instance still waiting) can be one atomic step where the
state lives. AgentRegistry and FlavorStore sit next to them on the same store;
:class:`~qsched.ledger.backend.Backend` is the connection they share, and
:class:`~qsched.ledger.inspection.Inspector` reads a whole cell for admin views.
Every method may also raise :class:`~qsched.exception.BackendUnavailable`: the
backend did not answer.

One module per store, each pairing with the Redis implementation of the same name
one level up (``base/placement.py``: :class:`Ledger`; ``placement.py``:
``RedisLedger``):

================  ===================================================================
module            interface
================  ===================================================================
``placement``     :class:`Ledger`: providers, inventories, allocations, the claim
``instances``     :class:`InstanceStore`: records, states, history, deadlines, outbox
``quota``         :class:`QuotaStore` and :data:`QUOTA_LIMITS`
``agents``        :class:`AgentRegistry`: live agents, services, classes, zones
``flavors``       :class:`FlavorStore`: the flavor catalog
``aggregates``    :class:`AggregateStore`: host aggregates
``groups``        :class:`GroupStore`: server groups
``keypairs``      :class:`KeypairStore`: each user's keypairs, and :class:`Keypair`
================  ===================================================================

The rest of the code imports from this package (``from qsched.ledger.base import
Instance, Ledger, State``), which names every interface and every record of
:mod:`qsched.ledger.records` the interfaces take and return.

What it may import: the standard library, :mod:`qsched.exception`, and the values
of :mod:`qsched.ledger.records`, :mod:`qsched.flavors` and :mod:`qsched.aggregates`;
never a Redis client nor an implementation (``tests/test_layers.py``: the floor of
the ledger's interfaces and values).
"""

from __future__ import annotations

from qsched.aggregates import Aggregate
from qsched.ledger.base.agents import AgentRegistry
from qsched.ledger.base.aggregates import AggregateStore
from qsched.ledger.base.flavors import FlavorStore
from qsched.ledger.base.groups import GroupStore
from qsched.ledger.base.instances import InstanceStore
from qsched.ledger.base.keypairs import SSH, X509, Keypair, KeypairStore
from qsched.ledger.base.placement import DEFAULT_MAX_HANDBACKS, Ledger
from qsched.ledger.base.quota import QUOTA_LIMITS, QuotaStore
from qsched.ledger.records import (
    AgentInfo,
    Allocations,
    Claim,
    ClaimGuard,
    Consumer,
    Event,
    HostRule,
    Instance,
    Inventory,
    MapChange,
    Placement,
    Provider,
    ProviderSpec,
    ServerGroup,
    Service,
    State,
    TaskState,
    Usage,
)

__all__ = [
    "DEFAULT_MAX_HANDBACKS",
    "QUOTA_LIMITS",
    "SSH",
    "X509",
    "AgentInfo",
    "AgentRegistry",
    "Aggregate",
    "AggregateStore",
    "Allocations",
    "Claim",
    "ClaimGuard",
    "Consumer",
    "Event",
    "FlavorStore",
    "GroupStore",
    "HostRule",
    "Instance",
    "InstanceStore",
    "Inventory",
    "Keypair",
    "KeypairStore",
    "Ledger",
    "MapChange",
    "Placement",
    "Provider",
    "ProviderSpec",
    "QuotaStore",
    "ServerGroup",
    "Service",
    "State",
    "TaskState",
    "Usage",
]
