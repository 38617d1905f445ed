"""The ledger's roles, one small interface each, and the records they speak.

Ledger, QuotaStore and InstanceStore share one store so that the operations
that must be atomic across them (reserve quota and record an instance; claim
resources only for an instance still waiting) can be one atomic step where the
state lives. AgentRegistry and FlavorStore sit next to them on the same store;
:class:`Backend` is the connection they share, and :class:`Inspector` reads a
whole cell for admin views. Every method may also raise
:class:`~qsched.exception.BackendUnavailable`: the backend did not answer.

One module per role. A store's Redis implementation is the module of the same
name one level up (``base/placement.py``: :class:`Ledger`; ``placement.py``:
``RedisLedger``), except where the table says:

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
``migrations``    :class:`MigrationStore`: moves of placed servers, :class:`Migration`
``archive``       :class:`ArchiveStore`: DELETED instances taken out (``archiver.py``)
``backend``       :class:`Backend`: the connection the stores share (in ``redis.py``)
``inspection``    :class:`Inspector`: scans of a whole cell (``scan.py``)
================  ===================================================================

The rest of the code imports from this package (``from qsched.ledger.base import
Instance, Ledger, State``), which names every interface, the records of
:mod:`qsched.ledger.records` the interfaces take and return, and the few records
kept beside their one interface (:class:`Keypair`, :class:`ArchiveStep`).

What it may import: the standard library, :mod:`qsched.exception`, and the values
of :mod:`qsched.ledger.records`, :mod:`qsched.flavors` and :mod:`qsched.aggregates`;
never a client nor an implementation (``tests/test_layers.py``: the floor of the
ledger's interfaces and values).
"""

from __future__ import annotations

from qsched.aggregates import Aggregate
from qsched.ledger.base.agents import AgentRegistry
from qsched.ledger.base.aggregates import AggregateStore
from qsched.ledger.base.archive import ArchiveStep, ArchiveStore
from qsched.ledger.base.backend import Backend, LedgerUnavailable
from qsched.ledger.base.flavors import FlavorStore
from qsched.ledger.base.groups import GroupStore
from qsched.ledger.base.inspection import Inspector
from qsched.ledger.base.instances import InstanceStore
from qsched.ledger.base.keypairs import SSH, X509, Keypair, KeypairStore
from qsched.ledger.base.migrations import Migration, MigrationStore, MoveClaim, MoveRequest
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
    "ArchiveStep",
    "ArchiveStore",
    "Backend",
    "Claim",
    "ClaimGuard",
    "Consumer",
    "Event",
    "FlavorStore",
    "GroupStore",
    "HostRule",
    "Inspector",
    "Instance",
    "InstanceStore",
    "Inventory",
    "Keypair",
    "KeypairStore",
    "Ledger",
    "LedgerUnavailable",
    "MapChange",
    "Migration",
    "MigrationStore",
    "MoveClaim",
    "MoveRequest",
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
