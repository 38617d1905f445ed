"""What the ledger holds, as values: providers, consumers, instances, quota usage.

Plain frozen records with no I/O; the interfaces in :mod:`qsched.ledger.base`
take and return them (and export them under the same names).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

# {provider uuid: {resource class: amount}}
Allocations = Mapping[str, Mapping[str, int]]


@dataclasses.dataclass(frozen=True)
class Inventory:
    """Inventory of one resource class on one provider (Placement semantics)."""

    total: int
    reserved: int = 0
    min_unit: int = 1
    max_unit: int | None = None  # None: same as total
    step_size: int = 1
    allocation_ratio: float = 1.0

    @property
    def capacity(self) -> int:
        """What allocations may add up to: (total - reserved) * allocation_ratio."""
        return int((self.total - self.reserved) * self.allocation_ratio)

    @property
    def effective_max_unit(self) -> int:
        return self.total if self.max_unit is None else self.max_unit


@dataclasses.dataclass(frozen=True)
class Provider:
    """A resource provider as read from the ledger, usages included."""

    uuid: str
    name: str
    generation: int
    parent_uuid: str | None = None
    root_uuid: str | None = None
    inventories: Mapping[str, Inventory] = dataclasses.field(default_factory=dict)
    usages: Mapping[str, int] = dataclasses.field(default_factory=dict)
    traits: frozenset[str] = frozenset()
    aggregates: frozenset[str] = frozenset()
    host: str | None = None  # the compute host whose agent registered it (a root)

    def free(self, resource_class: str) -> int:
        inv = self.inventories.get(resource_class)
        if inv is None:
            return 0
        return inv.capacity - self.usages.get(resource_class, 0)


@dataclasses.dataclass(frozen=True)
class ProviderSpec:
    """What a provider should look like: registered as such by ``register_providers``."""

    uuid: str
    name: str
    inventories: Mapping[str, Inventory]
    traits: frozenset[str] = frozenset()
    aggregates: frozenset[str] = frozenset()
    parent_uuid: str | None = None
    #: The compute host whose agent registers it: a root provider of a host also
    #: carries the host's aggregates (the aggregate API's), besides ``aggregates``.
    host: str | None = None


@dataclasses.dataclass(frozen=True)
class ClaimGuard:
    """Aggregate rules a claim checks on the node's root provider (and on the sharing
    providers it takes from), in the same atomic step.

    An agent places by its view of its nodes; an aggregate change (a host leaving
    a tenant's aggregate) reaches that view later. The guard makes the claim itself
    refuse a node that no longer satisfies the request's aggregates.
    """

    root_uuid: str
    member_of: frozenset[str] = frozenset()
    member_of_any: tuple[frozenset[str], ...] = ()
    forbidden_aggregates: frozenset[str] = frozenset()
    #: Sharing providers the claim takes from: each must still share with the root (the
    #: trait ``MISC_SHARES_VIA_AGGREGATE``, an aggregate of the root) and pass the rules.
    sharing: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "root": self.root_uuid,
            "all": sorted(self.member_of),
            "any": [sorted(group) for group in self.member_of_any],
            "none": sorted(self.forbidden_aggregates),
        }
        if self.sharing:
            found["sharing"] = sorted(self.sharing)
        return found


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim in the ledger: the consumer generation, whether it was there already,
    and for a member of a multi-create whether its batch is complete."""

    generation: int
    already: bool = False
    # a member of a multi-create: its reservation id, and whether every member of it
    # holds its claim now (its spawn may start); a lone instance is always permitted
    batch: str | None = None
    permitted: bool = True


@dataclasses.dataclass(frozen=True)
class Consumer:
    """What holds allocations (an instance). generation None: it holds nothing yet."""

    uuid: str
    generation: int | None
    project_id: str | None = None
    user_id: str | None = None
    allocations: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)


class State(enum.StrEnum):
    BUILD = "BUILD"
    ACTIVE = "ACTIVE"
    ERROR = "ERROR"
    DELETED = "DELETED"


class TaskState(enum.StrEnum):
    SCHEDULING = "scheduling"
    SPAWNING = "spawning"
    DELETING = "deleting"
    # the server actions (qsched/compute/server_actions.py), in Nova's words
    POWERING_OFF = "powering-off"
    POWERING_ON = "powering-on"
    REBOOTING = "rebooting"
    REBOOT_STARTED = "reboot_started"
    REBOOTING_HARD = "rebooting_hard"
    REBOOT_STARTED_HARD = "reboot_started_hard"
    # moves (docs/moves.rst), in Nova's words
    RESIZE_PREP = "resize_prep"
    RESIZE_MIGRATING = "resize_migrating"
    RESIZE_REVERTING = "resize_reverting"
    MIGRATING = "migrating"
    REBUILDING = "rebuilding"
    REBUILD_SPAWNING = "rebuild_spawning"
    # shelving (docs/moves.rst, "Shelve"), in Nova's words
    SHELVING = "shelving"
    SHELVING_OFFLOADING = "shelving_offloading"
    UNSHELVING = "unshelving"
    NONE = ""


class PowerState(enum.IntEnum):
    """Nova's power states of a placed instance (what its hypervisor says it does)."""

    NOSTATE = 0
    RUNNING = 1
    SHUTDOWN = 4


@dataclasses.dataclass(frozen=True)
class Usage:
    """A project's quota usage (what it holds) and limits (-1: no limit)."""

    instances: int
    cores: int
    ram_mb: int


@dataclasses.dataclass(frozen=True)
class Event:
    """One line of an instance's history: published, refused, claimed, spawned, failed..."""

    time: float
    event: str
    host: str | None = None
    node: str | None = None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where an instance is, as its record says, and what is under way there: a few
    fields, cheap to read in bulk. ``moving``: the other (host, node) pairs it is on
    while a move of it is under way (its source, its destination once claimed)."""

    state: State
    host: str | None = None
    node: str | None = None
    task_state: TaskState = TaskState.NONE
    moving: tuple[tuple[str, str], ...] = ()

    def on(self, host: str, node: str | None = None) -> bool:
        """Whether the record has it on ``host`` (and ``node``, when given): its own
        host, or one end of its move under way."""
        pairs = ((self.host, self.node), *self.moving)
        return any(h == host and (node is None or n == node) for h, n in pairs)


@dataclasses.dataclass(frozen=True)
class HostRule:
    """Where one boot may land by host name, kept in its record and held by the claim
    (docs/server-groups.rst, "Host rules"): Nova's ``same_host`` and ``different_host``
    scheduler hints and the host and node an admin asks for (2.74).

    ``only``: when not empty, the claim must be on one of these hosts; ``never``: it must
    be on none of them; ``node``: it must be on this node (``hypervisor_hostname``).
    Names are kept sorted, so equal rules compare and encode equal.
    """

    only: tuple[str, ...] = ()
    never: tuple[str, ...] = ()
    node: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "only", tuple(sorted(set(self.only))))
        object.__setattr__(self, "never", tuple(sorted(set(self.never))))

    def __bool__(self) -> bool:
        return bool(self.only or self.never or self.node)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form the record keeps (``hosts``) and the claim script reads."""
        return {"only": list(self.only), "never": list(self.never), "node": self.node}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> HostRule:
        """Read :meth:`to_dict` back."""
        return cls(tuple(raw.get("only") or ()), tuple(raw.get("never") or ()),
                   raw.get("node") or None)  # fmt: skip

    def refuses(self, host: str, node: str | None = None) -> str | None:
        """Why a claim on ``host`` (and ``node``, when known) would break the rule, or
        None; the claim script says the same."""
        if self.only and host not in self.only:
            return f"not one of the hosts it may run on ({', '.join(self.only)})"
        if host in self.never:
            return "one of the hosts it must not run on"
        if self.node is not None and node is not None and node != self.node:
            return f"not the node {self.node} it was asked to run on"
        return None

    def next_host(self, after: str) -> str | None:
        """The first host of ``only`` after ``after`` in name order, or None: the order in
        which a request that no host of ``only`` has room for walks them, once each."""
        return next((h for h in self.only if h > after), None)


@dataclasses.dataclass(frozen=True)
class Instance:
    """An instance record. ``fault`` keeps admin-only details under ``details``."""

    uuid: str
    project_id: str
    user_id: str
    name: str
    flavor: Mapping[str, Any]
    state: State
    task_state: TaskState = TaskState.NONE
    host: str | None = None
    node: str | None = None
    fault: Mapping[str, Any] | None = None
    attempts: int = 0
    tried_hosts: tuple[str, ...] = ()  # hosts a requeue took its claim from, in order
    handbacks: int = 0  # claims refused to tried hosts while another could take it
    created_at: float = 0.0
    updated_at: float = 0.0
    deadline: float | None = None
    launched_at: float | None = None  # when it went ACTIVE
    quota: Usage | None = None  # what it holds against its project's quota, if anything
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    group: str | None = None  # the server group it is a member of (its uuid)
    hosts: HostRule | None = None  # the hosts it may or may not run on, if it asked
    batch: str | None = None  # the multi-create it was placed with (its reservation id)
    #: Powered off by a stop: it keeps its host, claim and quota (still ACTIVE in the
    #: ledger's sense), its vm_state is ``stopped``. Only the server actions set it.
    stopped: bool = False
    #: The move under way (its migration's uuid), if any; ``resized``: a resize or cold
    #: migration that finished on its new host waits for a confirm (VERIFY_RESIZE).
    migration: str | None = None
    resized: bool = False
    #: Shelved: powered off (``stopped`` too), vm_state ``shelved``; ``offloaded`` as
    #: well: its VM destroyed and its claim released, it has no host
    #: (``shelved_offloaded``) until an unshelve places it again. Its quota stays held.
    shelved: bool = False
    offloaded: bool = False
    # The outbox entry that create or requeue just made (not stored in the record):
    # give it to InstanceStore.outbox_done once the boot request is published.
    outbox: str | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class MapChange:
    """A change of one map (a JSON object) in a record, made to the map as the record
    holds it when the change runs: items it does not name stay as they are then, so
    concurrent changes of other items all land.

    ``items``: added or changed (values JSON-able); ``removed``: keys taken out (an
    absent one is no error); ``replace``: the map becomes ``items`` alone; ``limit``:
    the most items it may hold after (-1: no limit), else nothing is written.
    """

    items: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    removed: tuple[str, ...] = ()
    replace: bool = False
    limit: int = -1


@dataclasses.dataclass(frozen=True)
class AgentInfo:
    """An agent as its last heartbeat left it; ``alive`` until that heartbeat expires or
    an operator forces its service down (Nova's service state "up")."""

    host: str
    last_seen: float
    alive: bool
    detail: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Service:
    """An agent's compute service as operators set it (Nova's ``os-services``).

    ``id`` is its UUID (what microversion 2.53 names it by), ``seq`` the integer id
    shown before that. A disabled or forced-down service takes no new boot: its
    agent stops consuming boot requests and the claim refuses it. Forced down, it
    counts as down whatever its heartbeat says.
    """

    host: str
    id: str
    seq: int
    disabled: bool = False
    disabled_reason: str | None = None
    forced_down: bool = False
    created_at: float = 0.0
    updated_at: float | None = None  # when an operator last changed it
    zone: str | None = None  # the agent's availability zone when it last started

    @property
    def schedulable(self) -> bool:
        """Whether it may take new boots."""
        return not (self.disabled or self.forced_down)


#: Server group policies, in Nova's words. Hard ones are checked inside the claim.
AFFINITY = "affinity"
ANTI_AFFINITY = "anti-affinity"
SOFT_AFFINITY = "soft-affinity"
SOFT_ANTI_AFFINITY = "soft-anti-affinity"
GROUP_POLICIES = (AFFINITY, ANTI_AFFINITY, SOFT_AFFINITY, SOFT_ANTI_AFFINITY)
HARD_POLICIES = frozenset({AFFINITY, ANTI_AFFINITY})


@dataclasses.dataclass(frozen=True)
class ServerGroup:
    """A server group (Nova's instance group): servers kept together or apart.

    ``max_server_per_host`` is the rule of an anti-affinity group (Nova's 2.64
    ``rules``); None is the default of one. ``members``: its servers not DELETED.
    """

    uuid: str
    name: str
    project_id: str
    user_id: str
    policy: str
    max_server_per_host: int | None = None
    created_at: float = 0.0
    members: tuple[str, ...] = ()

    @property
    def hard(self) -> bool:
        """True when the claim refuses a host that would break the policy."""
        return self.policy in HARD_POLICIES

    @property
    def rules(self) -> dict[str, int]:
        """Nova's ``rules`` map: ``{"max_server_per_host": n}`` when the rule is set."""
        if self.max_server_per_host is None:
            return {}
        return {"max_server_per_host": self.max_server_per_host}
