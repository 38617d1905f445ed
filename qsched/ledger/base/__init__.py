"""The ledger's roles, one small interface each, and the records they speak.

Ledger, QuotaStore and InstanceStore share one store so that the operations
that must be atomic across them (reserve quota and record an instance; claim
resources only for an instance still waiting) can be one atomic step where the
state lives. AgentRegistry and FlavorStore sit next to them on the same store;
:class:`~qsched.ledger.backend.Backend` is the connection they share, and
:class:`~qsched.ledger.inspection.Inspector` reads a whole cell for admin views.
Every method may also raise :class:`~qsched.exception.BackendUnavailable`: the
backend did not answer.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from qsched.aggregates import Aggregate
from qsched.flavors import Flavor
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

#: Hand-backs of one request by hosts that already tried it before one of them may
#: claim it again (``[agent] max_handbacks``).
DEFAULT_MAX_HANDBACKS = 10

#: What a project's quota limits, by the ledger's names (Nova's, but ``ram_mb``): the
#: first three the reservation counts, the groups the group scripts, the rest are
#: limits that the API checks against what one request asks (keypairs per user,
#: metadata items and injected files per server).
QUOTA_LIMITS = (
    "instances", "cores", "ram_mb", "server_groups", "server_group_members", "key_pairs",
    "metadata_items", "injected_files", "injected_file_content_bytes",
    "injected_file_path_bytes",
)  # fmt: skip

__all__ = [
    "DEFAULT_MAX_HANDBACKS",
    "QUOTA_LIMITS",
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


class Ledger(abc.ABC):
    """Resource providers, inventories and allocations with generations."""

    @abc.abstractmethod
    def create_provider(self, uuid: str, name: str, parent_uuid: str | None = None) -> Provider:
        """Create a provider at generation 0.

        :raises ProviderExists: the uuid or the name is taken.
        :raises ProviderNotFound: ``parent_uuid`` does not exist.
        :raises InvalidUUID: a uuid is malformed.
        """

    @abc.abstractmethod
    def get_provider(self, uuid: str) -> Provider:
        """Read one provider with inventories, usages, traits and aggregates (O(1)).

        :raises ProviderNotFound:
        """

    @abc.abstractmethod
    def find_provider(self, name: str) -> Provider | None:
        """The provider named ``name`` (names are unique), or None; O(1)."""

    @abc.abstractmethod
    def delete_provider(self, uuid: str, generation: int) -> None:
        """Delete a provider that has no allocations and no children.

        :raises ProviderGenerationConflict: ``generation`` is stale.
        :raises ProviderInUse: it still has allocations or children.
        """

    @abc.abstractmethod
    def set_inventory(
        self, uuid: str, generation: int, inventories: Mapping[str, Inventory]
    ) -> int:
        """Replace all inventories; return the new generation.

        :raises ProviderGenerationConflict: carries the current generation.
        :raises InvalidInventory, InvalidResourceClass: bad input; nothing written.
        :raises InventoryInUse: capacity would drop below usage.
        """

    @abc.abstractmethod
    def set_traits(self, uuid: str, generation: int, traits: Iterable[str]) -> int:
        """Replace all traits; return the new generation. Raises as set_inventory."""

    @abc.abstractmethod
    def set_aggregates(self, uuid: str, generation: int, aggregates: Iterable[str]) -> int:
        """Replace the aggregate UUIDs; return the new generation."""

    @abc.abstractmethod
    def register_providers(self, specs: Sequence[ProviderSpec]) -> list[Provider]:
        """Create or update providers to match ``specs`` in one atomic step; read them back.

        Idempotent: a provider already as specified keeps its generation; one that
        changes gets it bumped once. Usages are kept. Parents come before children.

        :raises ProviderExists: a name belongs to another provider.
        :raises ProviderNotFound: a parent neither exists nor comes earlier.
        :raises InventoryInUse: an inventory would drop below its usage.
        :raises Invalid: a malformed spec; nothing is written.
        """

    @abc.abstractmethod
    def get_providers(self, uuids: Sequence[str]) -> dict[str, Provider]:
        """Those of ``uuids`` that exist, in few round trips (a thousand per trip)."""

    @abc.abstractmethod
    def sharing_providers(self, aggregates: Iterable[str] | None = None) -> dict[str, Provider]:
        """The sharing providers (trait ``MISC_SHARES_VIA_AGGREGATE``) in at least one of
        ``aggregates`` (None: every one), read from the cell's index of them: O(sharing
        providers), never O(providers) or O(hosts).
        """

    @abc.abstractmethod
    def list_providers(self) -> list[Provider]:
        """Every provider of the cell. An admin view: it scans."""

    @abc.abstractmethod
    def hypervisors(self, after: int = 0, limit: int | None = None) -> list[tuple[int, str]]:
        """The hosts' root providers (Nova's hypervisors) as (integer id, uuid), by id,
        those with an id above ``after``, at most ``limit`` (None: all; admin view).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def hypervisor_ids(self, uuids: Sequence[str]) -> dict[str, int]:
        """The integer ids of those of ``uuids`` that are hypervisors (O(len(uuids))).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def hypervisor_uuid(self, hypervisor_id: int) -> str | None:
        """The uuid of the hypervisor with that integer id; None if there is none (O(log n)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def get_allocations(self, consumer_uuid: str) -> Consumer:
        """Read a consumer's allocations (generation None if it holds nothing)."""

    @abc.abstractmethod
    def provider_consumers(self, uuid: str) -> set[str]:
        """UUIDs of the consumers holding allocations on one provider."""

    @abc.abstractmethod
    def providers_consumers(self, uuids: Sequence[str]) -> dict[str, set[str]]:
        """:meth:`provider_consumers` of many providers, in few round trips."""

    @abc.abstractmethod
    def project_usages(self, project_id: str) -> dict[str, int]:
        """Sum of a project's allocations per resource class (O(1))."""

    @abc.abstractmethod
    def put_allocations(
        self,
        consumer_uuid: str,
        allocations: Allocations,
        consumer_generation: int | None,
        project_id: str,
        user_id: str,
        provider_generations: Mapping[str, int] | None = None,
    ) -> int:
        """Replace a consumer's allocations as one unit; return its new generation.

        Every provider touched (before or after) gets its generation bumped once.
        An empty ``allocations`` releases everything.

        :raises ConsumerGenerationConflict: ``consumer_generation`` does not match
            (None means "a new consumer").
        :raises ProviderGenerationConflict: a generation in ``provider_generations``
            is stale.
        :raises CapacityExceeded: with the provider and class that did not fit.
        :raises InvalidAmount, InvalidResourceClass, ProviderNotFound: bad input.
        """

    @abc.abstractmethod
    def claim(
        self,
        instance_uuid: str,
        allocations: Allocations,
        host: str,
        node: str,
        consumer_generation: int | None = None,
        provider_generations: Mapping[str, int] | None = None,
        max_handbacks: int = DEFAULT_MAX_HANDBACKS,
        guard: ClaimGuard | None = None,
        scheduling_class: str | None = None,
    ) -> Claim:
        """Allocate for an instance that is still waiting to be placed, and mark it claimed.

        Atomic with the instance record: the instance must exist in BUILD with no
        host. A repeated claim with the same host, node and allocations changes
        nothing and returns ``already=True``, so a redelivered request cannot place
        twice. ``guard``: aggregate rules checked on the node's root in the same step.
        ``scheduling_class``: the class the allocations were fitted for; the record's
        must be the same (None: not checked, for callers that place no boot request).

        Alternates: a ``host`` among the record's ``tried_hosts`` is refused while
        another live agent that has not tried it consumes its scheduling class
        (:meth:`AgentRegistry.set_classes`), until the instance was handed back
        ``max_handbacks`` times (0: never refused). The refusal counts a hand-back
        in the record and its history. O(tried hosts), whatever the number of hosts.

        :raises InstanceNotFound:
        :raises InstanceNotWaiting: deleted, in error, or claimed by another host.
        :raises ServiceDisabled: ``host``'s service is disabled or forced down
            (:meth:`AgentRegistry.update_service`): it takes no new boot.
        :raises TriedHost: ``host`` must hand the request back (``alternate`` names a
            host that can take it, ``handbacks`` how many hand-backs so far).
        :raises ClaimRuleBroken: the guard failed; nothing written.
        :raises NotItsRequest: ``scheduling_class`` is not the one the front door
            recorded for the instance; nothing written.
        :raises: everything :meth:`put_allocations` raises.
        """

    @abc.abstractmethod
    def release_unexplained(self, consumer_uuid: str, host: str, provider_uuid: str) -> bool:
        """Release a consumer's allocations found on ``host``'s provider, in one atomic
        step with the check that no live instance of ``host`` explains them (its record
        is gone, ended, or names another host). False if they are explained or moved,
        or are a claim held for a host (:meth:`release_held` ends those).
        """

    @abc.abstractmethod
    def held_claims(self, host: str) -> dict[str, str]:
        """The claims taken from ``host`` while its agent was silent and held for it
        (:meth:`InstanceStore.requeue` and :meth:`InstanceStore.delete` with
        ``take_over``): instance uuid -> the consumer holding them on the same
        providers. O(claims held for the host)."""

    @abc.abstractmethod
    def release_held(self, host: str, instance_uuid: str) -> bool:
        """Release the claim held for ``host`` of an instance: its agent says the
        instance no longer runs there. False if none was held. Idempotent."""

    @abc.abstractmethod
    def release(self, instance_uuid: str, host: str | None = None, reason: str = "") -> bool:
        """Drop the claim of an instance in BUILD, so it can be placed again.

        With ``host`` given, only if the instance is claimed by that host. An
        ACTIVE, ERROR or DELETED instance is left alone. Returns False when there
        was nothing to release. Idempotent.
        """

    @abc.abstractmethod
    def default_inventory(self, resource_class: str, total: int, **fields: Any) -> Inventory:
        """An Inventory of ``total`` with the configured allocation ratio of its class
        (``fields`` override any other field). Pure: nothing is read or written.

        :raises: nothing; a bad value fails when the inventory is set.
        """


class QuotaStore(abc.ABC):
    """Per-project limits on instances, cores and RAM, reserved per instance."""

    @abc.abstractmethod
    def get_limits(self, project_id: str) -> Usage:
        """The project's limits: its overrides over the configured defaults."""

    @abc.abstractmethod
    def set_limits(
        self,
        project_id: str,
        instances: int | None = None,
        cores: int | None = None,
        ram_mb: int | None = None,
    ) -> Usage:
        """Override some limits for one project (-1: no limit); return the new limits."""

    @abc.abstractmethod
    def get_usage(self, project_id: str) -> Usage:
        """What the project holds now (O(1))."""

    @abc.abstractmethod
    def reserve(self, project_id: str, holder: str, cores: int, ram_mb: int) -> Usage:
        """Reserve one instance with ``cores`` and ``ram_mb`` for ``holder``, atomically.

        Idempotent per holder. Returns the usage after.

        :raises QuotaExceeded: naming the first resource over its limit, with
            what was requested, used and allowed; nothing is reserved.
        """

    @abc.abstractmethod
    def release(self, project_id: str, holder: str) -> bool:
        """Return what ``holder`` reserved. False if it held nothing. Idempotent."""

    @abc.abstractmethod
    def default_limits(self) -> dict[str, int]:
        """Every limit of :data:`QUOTA_LIMITS` for a project without its own: the
        default quota class's over the ``[quota]`` options (-1: none)."""

    @abc.abstractmethod
    def update_default_limits(self, changes: Mapping[str, int]) -> dict[str, int]:
        """Set some limits of the default quota class (names of :data:`QUOTA_LIMITS`,
        values -1 and up), for every project without its own; return the defaults after.
        Nothing is checked against usage (as Nova's quota classes).

        :raises Invalid: an unknown name or a value below -1.
        """

    @abc.abstractmethod
    def limits(self, project_id: str) -> dict[str, int]:
        """Every limit of :data:`QUOTA_LIMITS` for one project: its own over the
        defaults (:meth:`default_limits`), in one round trip, O(1)."""

    @abc.abstractmethod
    def in_use(self, project_id: str) -> dict[str, int]:
        """What the project holds of what the ledger counts: ``instances``, ``cores``,
        ``ram_mb`` and ``server_groups`` (one round trip, O(1))."""

    @abc.abstractmethod
    def update_limits(
        self, project_id: str, changes: Mapping[str, int], force: bool = False
    ) -> dict[str, int]:
        """Override some limits of one project (names of :data:`QUOTA_LIMITS`, values
        -1 and up), all or none, atomically with the check; return every limit after.

        :raises QuotaBelowUsage: unless ``force``, a limit under what the project holds
            now (instances, cores, ram_mb, server_groups); nothing is written.
        :raises Invalid: an unknown name or a value below -1.
        """

    @abc.abstractmethod
    def clear_limits(self, project_id: str) -> None:
        """Drop every override of one project: its limits are the defaults again."""


class InstanceStore(abc.ABC):
    """Instance records with state, fault and an append-only history."""

    @abc.abstractmethod
    def create(
        self,
        instance: Instance,
        deadline: float,
        expect_flavor: tuple[str, str] | None = None,
        scheduling_class: tuple[str, Mapping[str, Any]] | None = None,
        members_limit: int | None = None,
    ) -> Instance:
        """Reserve quota for ``instance`` and record it in BUILD, as one atomic step.

        The instance enters the deadline index; its quota is what its flavor asks
        (one instance, flavor vcpus and ram_mb). Returns the record as written,
        without reading it back.

        ``expect_flavor``, a flavor id and the form the catalog stored it in when
        the caller read it, makes the step fail unless the catalog still holds
        exactly that: a caller may then keep flavors in memory.
        ``scheduling_class``, a class name and its definition (a JSON-able map,
        :meth:`qsched.scheduling.classes.SchedulingClass.definition`), is published
        for agents in the same step unless the class is known.

        The instance enters the outbox as well, until its boot request is published
        (:meth:`outbox_done` with the returned ``outbox``); the janitor publishes
        what stays there too long (:meth:`outbox_take`).

        A member of a server group (``Instance.group``) is refused when the group holds
        its member limit already: ``members_limit`` when given (the deployment's, which
        the front door of several cells reads in the API keyspace), else the project's
        ``server_group_members`` in this keyspace.

        :raises QuotaExceeded: nothing recorded.
        :raises InstanceExists: the uuid is taken.
        :raises FlavorChanged: ``expect_flavor`` is out of date; nothing recorded.
        :raises InstanceAbandoned: the caller already gave up on this uuid
            (:meth:`abandon`); nothing recorded.
        """

    @abc.abstractmethod
    def create_batch(
        self,
        instances: Sequence[Instance],
        min_count: int,
        reservation_id: str,
        deadline: float,
        expect_flavor: tuple[str, str] | None = None,
        scheduling_class: tuple[str, Mapping[str, Any]] | None = None,
        lone_name: str | None = None,
        members_limit: int | None = None,
    ) -> list[Instance]:
        """A multi-create: as many of ``instances`` as the quota allows, at least
        ``min_count``, each reserved and recorded as :meth:`create` does (``members_limit``
        as there), in one atomic step; returns those recorded, in order (Nova's count).

        All share a flavor, project, group and deadline. With more than one, they form
        the batch ``reservation_id``: a claim says whether every member holds one
        (``Claim.permitted``); one that ends in ERROR before that ends every other in
        ERROR, releasing their claims; a DELETED one leaves the batch. A lone member
        is named ``lone_name`` (Nova's names: ``<name>-<n>`` only when there are more).

        :raises QuotaExceeded: not even ``min_count`` fit (the requested count is
            ``min-max``, as Nova says it); nothing recorded.
        :raises GroupMemberLimitExceeded, GroupNotFound: the group has no room for
            them, or is gone; nothing recorded.
        :raises InstanceExists, FlavorChanged, InstanceAbandoned: as :meth:`create`.
        :raises Conflict: the reservation id is taken.
        """

    @abc.abstractmethod
    def batches(self, reservation_ids: Sequence[str]) -> dict[str, str]:
        """The state of each batch still kept: ``waiting`` (for claims), ``permitted``
        or ``failed``; one no longer kept (a day after its deadline) is absent."""

    @abc.abstractmethod
    def get(self, uuid: str) -> Instance:
        """:raises InstanceNotFound:"""

    @abc.abstractmethod
    def get_many(self, uuids: Sequence[str]) -> dict[str, Instance]:
        """The records of those that exist, in few round trips."""

    @abc.abstractmethod
    def placements(self, uuids: Sequence[str]) -> dict[str, Placement]:
        """State, host and node of those that exist, in few round trips: what a
        periodic check of thousands of instances needs, without whole records."""

    @abc.abstractmethod
    def list_project(self, project_id: str) -> list[Instance]:
        """A project's instances, DELETED ones excluded."""

    @abc.abstractmethod
    def newest(self, count: int, after: str | None = None) -> list[str] | None:
        """Up to ``count`` instances of the cell that are not DELETED, newest first
        (created_at, then uuid, descending), after ``after`` (None: from the newest):
        an admin's page, one ZREVRANK and one ZREVRANGE. None when ``after`` is not
        among them."""

    @abc.abstractmethod
    def deleted_since(self, since: float, project_id: str | None = None) -> list[str]:
        """Instances DELETED at ``since`` or later and not archived, newest first: a
        project's (its last 1000 deletions are kept) or the cell's (its newest 100,000
        read)."""

    @abc.abstractmethod
    def update(
        self, uuid: str, name: str | None = None, extra: Mapping[str, MapChange] | None = None
    ) -> Instance:
        """Change a record's ``name`` (None: kept as it is), maps of its ``extra`` (the
        boot details; each by its key there, a missing one starting empty) and its
        ``updated_at``, in one step on the record as it is; return the record after.
        What no change names stays as it is then: concurrent changes of other items,
        other maps or the name all land.

        :raises InstanceNotFound: no such record, or it is DELETED.
        :raises ItemLimitExceeded: a map would hold more items than its change's
            ``limit``; nothing is written.
        """

    @abc.abstractmethod
    def add_event(
        self, uuid: str, event: str, host: str | None = None, node: str | None = None, **detail: Any
    ) -> None:
        """Append one event to the instance's history (trimmed to the newest N); nothing
        when the instance has no record (archived: no history outlives its record)."""

    @abc.abstractmethod
    def events(self, uuid: str) -> list[Event]:
        """The history, oldest first."""

    @abc.abstractmethod
    def set_active(self, uuid: str, host: str, node: str) -> bool:
        """Mark a claimed instance ACTIVE; it leaves the deadline index. True if it went
        ACTIVE now, False if it was ACTIVE on ``host``/``node`` already (a retry).

        :raises InstanceNotWaiting: not claimed by ``host``/``node`` any more
            (deleted meanwhile, for instance).
        """

    @abc.abstractmethod
    def requeue(
        self,
        uuid: str,
        host: str | None,
        reason: str,
        claimed_only: bool = False,
        take_over: bool = False,
    ) -> Instance:
        """Count one attempt and put the instance back to waiting (no host).

        Releases any allocation the instance holds. An instance marked deleting
        ends DELETED instead, with its quota returned. Returns the record after.

        ``take_over`` (the janitor's, with ``claimed_only``): ``host``'s agent is
        silent and did not give the claim up, so its VM may still run there: the
        allocations are not released but held for ``host`` (:meth:`Ledger.held_claims`)
        until its agent says the VM is gone.

        :raises InstanceNotWaiting: not BUILD, claimed by another host than
            ``host``, or (``claimed_only``) not claimed by ``host`` at all: two
            janitors taking back the same orphan requeue it once.
        :raises AgentAlive: ``take_over``, and ``host``'s agent beats again (checked
            in the same atomic step); nothing is done.
        """

    @abc.abstractmethod
    def park(self, uuid: str, host: str, reason: str) -> bool:
        """Leave a waiting instance's request to the janitor for a while: it enters the
        outbox, which publishes it again after ``[scheduler] outbox_grace_s``.

        For a request every host it met refused for a reason that a wait may change
        (a server group's hard policy): it then waits instead of going round. False
        (nothing done) if the instance no longer waits (placed, ended, gone).
        """

    @abc.abstractmethod
    def set_error(
        self, uuid: str, message: str, details: Mapping[str, Any], due_only: bool = False
    ) -> bool:
        """End a BUILD instance in ERROR with a fault; release its allocations and quota.

        Returns False (and changes nothing) for an instance already ACTIVE, ERROR
        or DELETED. ``due_only``: only once the record's own deadline has passed (a
        caller that learned of the deadline from a message, not from the record).

        :raises InstanceNotFound:
        :raises NotItsRequest: ``due_only`` and the record's deadline has not passed.
        """

    @abc.abstractmethod
    def set_lost(
        self, uuid: str, host: str, node: str, message: str, details: Mapping[str, Any]
    ) -> bool:
        """End in ERROR, with a fault, an ACTIVE instance whose VM ``host``'s driver no
        longer runs on ``node``; release its allocations and quota.

        Only while the record still places it there with no task under way (a delete,
        a server action): False, and nothing changed, otherwise.

        :raises InstanceNotFound:
        """

    @abc.abstractmethod
    def delete(
        self, uuid: str, destroyed_on: str | None = None, take_over: bool = False
    ) -> Instance:
        """Mark DELETED and release its allocations and quota. Idempotent.

        ``destroyed_on``: the host whose agent destroyed the VM; a claim held for that
        host of the instance is released too (even if the instance was DELETED
        already). ``take_over``: the instance's host is silent and its VM may still run
        there (the API's local delete, the janitor): the allocations are held for that
        host (:meth:`Ledger.held_claims`) instead of released.

        :raises InstanceNotFound:
        :raises AgentAlive: ``take_over``, and the host's agent beats again (checked
            in the same atomic step); nothing is done.
        """

    @abc.abstractmethod
    def mark_deleting(self, uuid: str) -> Instance:
        """Set task_state deleting on a placed instance (BUILD with a host, or ACTIVE).

        Its host's agent then destroys it and ends it DELETED. Idempotent; the
        record returned names the host to ask.

        :raises InstanceNotFound:
        :raises InstanceNotWaiting: not placed (no host) or already ended.
        """

    @abc.abstractmethod
    def start_action(
        self, uuid: str, action: str, request_id: str, user_id: str, project_id: str
    ) -> tuple[str, str]:
        """Start a server action on a placed instance: check its states and set the
        action's task_state in one atomic step; the history gets an ``action`` event
        (action, request_id, user_id, project_id) and the host's actions under way
        (:meth:`acting`) the instance. Returns its host and node.

        ``action``: ``stop`` (from vm_state active), ``start`` (from stopped),
        ``reboot_soft`` (from active) or ``reboot_hard`` (from active or stopped, also
        over a reboot in progress); each only with no task_state, as Nova's.

        :raises InstanceNotFound: unknown or DELETED.
        :raises InstanceNotReady: no host holds it.
        :raises InstanceInvalidState: its vm_state or task_state refuses the action.
        """

    @abc.abstractmethod
    def step_action(
        self,
        uuid: str,
        host: str,
        expect: TaskState,
        to: TaskState,
        power: str = "",
        event: str = "",
        **detail: Any,
    ) -> bool:
        """Move an action's task_state from ``expect`` to ``to`` (and ``power`` to
        ``on`` or ``off``; "" keeps it), with an ``event`` in the history, if the
        instance is still ACTIVE on ``host`` in ``expect``; to none, it leaves the
        host's actions under way. False when it is not (a delete or another action
        took over): nothing changes.

        :raises InstanceNotFound:
        """

    @abc.abstractmethod
    def acting(self, host: str, started_before: float | None = None) -> list[str]:
        """Instances of ``host`` whose server action began before ``started_before`` and
        was not settled (or ended) since, oldest first; some may have moved on since."""

    @abc.abstractmethod
    def forget_action(self, host: str, uuid: str) -> bool:
        """Drop ``uuid`` from :meth:`acting` unless an action of it is under way on
        ``host`` (checked in the same step); True if dropped."""

    @abc.abstractmethod
    def deleting(self, host: str, marked_before: float | None = None) -> list[str]:
        """Instances of ``host`` marked deleting (before ``marked_before``), oldest first."""

    @abc.abstractmethod
    def building(self, host: str) -> set[str]:
        """Instances ``host`` has claimed and not made ACTIVE yet (O(that many))."""

    @abc.abstractmethod
    def expired(self, now: float, limit: int = 100) -> list[str]:
        """UUIDs of instances still waiting whose deadline is past, oldest first."""

    @abc.abstractmethod
    def forget_deadline(self, uuid: str) -> None:
        """Drop an instance from the deadline index (its record is gone)."""

    @abc.abstractmethod
    def abandon(self, uuid: str, reason: str) -> tuple[State | None, str | None]:
        """Make sure a boot whose client was told it failed never runs.

        For a create whose outcome the caller does not know (a timeout): with no
        record yet, a mark makes a create arriving later refuse; a waiting,
        unclaimed instance ends DELETED with its quota back. Returns the state
        after (None: no record) and, for a placed instance, its host: the caller
        then deletes it as a client would. Idempotent.
        """

    @abc.abstractmethod
    def outbox_take(self, grace_s: float, limit: int = 100) -> list[tuple[str, str]]:
        """Instances whose boot request has waited over ``grace_s`` (server time) to be
        published, with the new outbox entry each now has: publish each, then
        :meth:`outbox_done`. Two callers never take the same one within ``grace_s``.
        """

    @abc.abstractmethod
    def outbox_done(self, entries: Sequence[tuple[str, str | None]]) -> int:
        """Clear outbox entries ``(uuid, outbox)`` whose request the broker confirmed;
        an entry made since (a requeue) stays, one with no outbox is skipped. Returns
        how many were cleared."""

    @abc.abstractmethod
    def unpublished(self, limit: int = 100) -> list[tuple[str, float]]:
        """The oldest outbox entries: (uuid, seconds waiting), oldest first."""


class AgentRegistry(abc.ABC):
    """Which agents are alive, and the scheduling classes and zones they consume."""

    @abc.abstractmethod
    def heartbeat(
        self,
        host: str,
        ttl_s: float,
        free: Mapping[str, int] | None = None,
        **detail: Any,
    ) -> Service | None:
        """Say ``host`` is alive for ``ttl_s`` seconds more; ``detail`` is shown to admins.
        ``free``: what its nodes have free, by resource class, counted in the cell's
        free capacity (:meth:`free`) until its heartbeat expires, its service stops
        taking boots, it beats again or it stops (None: it counts nothing).

        Returns the host's service record as operators left it (None: it has none),
        so that an agent learns it is disabled without another round trip.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def alive(self, host: str) -> bool:
        """True while the host's last heartbeat has not expired and its service is not
        forced down: Nova's service state "up" (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def last_seen(self, host: str) -> float | None:
        """When ``host`` last beat, expired or not; None if it never did (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def forget(self, host: str) -> None:
        """An agent that stops cleanly says so at once instead of waiting for its TTL;
        its free capacity no longer counts.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def free(self) -> dict[str, int]:
        """The cell's free capacity by resource class: what its live agents whose
        services take boots said they have free at their last heartbeat, summed (O(1)
        in hosts: one read). An agent that died counts until the next heartbeat of
        another after its own expired.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def list(self) -> builtins.list[AgentInfo]:
        """Every agent ever seen in the cell, alive or not (admin view: it scans).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def register_service(self, host: str, availability_zone: str | None = None) -> Service:
        """Make sure ``host`` has a compute service record, and return it: a new one is
        enabled, not forced down, with a new UUID and the next integer id; every one is
        in the zone given now (None: none). O(1).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def update_service(
        self,
        host: str,
        disabled: bool | None = None,
        disabled_reason: str | None = None,
        forced_down: bool | None = None,
    ) -> Service:
        """Enable or disable ``host``'s service (a reason with a disable; enabling
        clears it), force it down or up; None leaves a field as it is. Atomic: once
        it returns, no claim of the host succeeds while it is disabled or forced down.

        :raises ComputeHostNotFound: the host has no service.
        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def service(self, host: str) -> Service:
        """The service of ``host`` (O(1)).

        :raises ComputeHostNotFound:
        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def service_host(self, service_id: str) -> str:
        """The host of the service whose UUID is ``service_id`` (O(1)).

        :raises ServiceNotFound:
        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def services(self) -> builtins.list[Service]:
        """Every service, by integer id (admin view: it scans).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def add_class(self, name: str, definition: Mapping[str, Any]) -> bool:
        """Publish a scheduling class for agents to consider; False if it was known.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def classes(self) -> dict[str, dict[str, Any]]:
        """Every live class: O(number of classes), never O(number of hosts).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def set_classes(self, host: str, classes: Iterable[str]) -> None:
        """Say that ``host`` has room for exactly ``classes`` now (none: it consumes
        nothing), replacing what it said before. O(its classes).

        A claim reads the consumers of a class to decide whether a host that already
        tried a request must hand it back; a consumer whose heartbeat has expired
        does not count.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def class_consumers(self, name: str) -> set[str]:
        """The hosts that said they have room for class ``name``, alive or not (admin
        view: O(its consumers)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def add_zone(self, zone: str) -> None:
        """Make ``zone`` bootable. Never removed: a zone outlives its hosts being down.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def zones(self) -> set[str]:
        """Every known availability zone (admin view).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def has_zone(self, zone: str) -> bool:
        """Whether a boot may name ``zone``: O(1).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def zones_available(self, zones: Iterable[str]) -> dict[str, bool]:
        """Per zone, whether one of the hosts serving it (through its agent's own zone
        or its aggregate's) is up and its service enabled and not forced down: Nova's
        ``zoneState.available``. O(number of zones), never O(number of hosts): every
        heartbeat keeps its host in its zones' sets until it expires, and a service
        update takes it out or puts it back at once. Joining or leaving an aggregate
        zone shows at the host's next heartbeat or when the last one expires.

        :raises BackendUnavailable:
        """


class FlavorStore(abc.ABC):
    """The flavors instances may be booted with."""

    @abc.abstractmethod
    def get(self, flavor_id: str) -> Flavor:
        """One flavor by id (O(1)).

        :raises FlavorNotFound:
        """

    @abc.abstractmethod
    def get_stored(self, flavor_id: str) -> tuple[Flavor, str]:
        """One flavor and the exact form it is stored in, for ``expect_flavor`` checks.

        :raises FlavorNotFound:
        """

    @abc.abstractmethod
    def list(self) -> builtins.list[Flavor]:
        """Every flavor, sorted by id.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def create(self, flavor: Flavor) -> Flavor:
        """Add a flavor.

        :raises FlavorExists: its id or its name is taken.
        :raises Invalid: the flavor does not pass :func:`~qsched.flavors.check_flavor`.
        """

    @abc.abstractmethod
    def put(self, flavor: Flavor) -> bool:
        """Create the flavor or replace the one with its id; False if it was already so.
        A replaced flavor keeps the projects granted it and, unless ``flavor`` has one,
        its description: the API manages those, the configuration does not.

        :raises FlavorExists: another flavor has its name.
        :raises Invalid: the flavor does not pass :func:`~qsched.flavors.check_flavor`.
        """

    @abc.abstractmethod
    def update(self, flavor_id: str, change: Callable[[Flavor], Flavor]) -> Flavor:
        """Replace a flavor by ``change(current)``, atomically; return the new one.

        :raises FlavorNotFound:
        :raises Invalid: the changed flavor does not pass :func:`~qsched.flavors.check_flavor`.
        :raises Conflict: the catalog kept changing under the update.
        """

    @abc.abstractmethod
    def delete(self, flavor_id: str) -> Flavor:
        """Remove a flavor (instances keep their own copy); return what was removed.

        :raises FlavorNotFound:
        """


class AggregateStore(abc.ABC):
    """Host aggregates, mirrored into the providers of their hosts (Nova's, into Placement).

    A host's root providers carry the aggregates of the host in their aggregate sets
    (each change bumps the provider's generation, so a claim made on a view from
    before it conflicts), merged with the aggregates its agent registers itself.
    """

    @abc.abstractmethod
    def create(
        self,
        name: str,
        availability_zone: str | None = None,
        aggregate_id: int | None = None,
        uuid: str | None = None,
    ) -> Aggregate:
        """A new aggregate, with the next integer id and a new UUID, or with those given
        (the front door of several cells gives every cell the same; the cell's next id
        is then past the given one). An id and UUID given that this cell holds together
        already return that aggregate as it is (a create that meets a copy of it). A copy
        of another cell's aggregate, its metadata with it, is :meth:`put`.

        :raises AggregateNameExists: the name is taken.
        :raises Conflict: the given id is taken.
        """

    @abc.abstractmethod
    def put(self, aggregate: Aggregate) -> bool:
        """Write ``aggregate`` as it is: its id, uuid, name, metadata (its zone too) and
        creation time, none of its hosts (the front door of several cells copies every
        aggregate so into a cell joined late). Idempotent: False when this keyspace holds
        the very aggregate already (its id, uuid, name and metadata), True when written.

        :raises Conflict: another aggregate holds its id or name here
            (:class:`AggregateNameExists` for its name), or one of its id and uuid with
            another name or metadata; nothing is written.
        """

    @abc.abstractmethod
    def last_id(self) -> int:
        """The highest id given in this keyspace so far (0: none; O(1))."""

    @abc.abstractmethod
    def get(self, aggregate_id: int) -> Aggregate:
        """One aggregate by its integer id (O(1) in hosts' number: it reads its own host set).

        :raises AggregateNotFound:
        """

    @abc.abstractmethod
    def list(self) -> builtins.list[Aggregate]:
        """Every aggregate, by id (O(number of aggregates))."""

    @abc.abstractmethod
    def update(self, aggregate_id: int, changes: Mapping[str, str | None]) -> Aggregate:
        """Rename it (``name``) or move it to a zone (``availability_zone``; None takes
        it out of any); keys left out are unchanged.

        :raises AggregateNotFound, AggregateNameExists:
        :raises InvalidAggregateAction: a host of it is in another zone already.
        """

    @abc.abstractmethod
    def delete(self, aggregate_id: int) -> None:
        """Delete an aggregate that has no host.

        :raises AggregateNotFound:
        :raises InvalidAggregateAction: it still has hosts.
        """

    @abc.abstractmethod
    def set_metadata(self, aggregate_id: int, changes: Mapping[str, str | None]) -> Aggregate:
        """Set keys (a value) and remove keys (None) of its metadata, in one step.

        :raises AggregateNotFound:
        :raises InvalidAggregateAction: an empty zone, or a zone some host of it
            cannot join (it is in another zone already).
        """

    @abc.abstractmethod
    def add_host(self, aggregate_id: int, host: str) -> Aggregate:
        """Put ``host`` in the aggregate, then the aggregate in its root providers.

        :raises AggregateNotFound:
        :raises ComputeHostNotFound: no agent ever registered ``host``.
        :raises AggregateHostExists:
        :raises InvalidAggregateAction: the host is in another zone already.
        """

    @abc.abstractmethod
    def remove_host(self, aggregate_id: int, host: str) -> Aggregate:
        """Take ``host`` out of the aggregate, then the aggregate out of its providers.

        :raises AggregateNotFound, AggregateHostNotFound:
        """

    @abc.abstractmethod
    def version(self) -> int:
        """A number every aggregate change bumps (O(1)): readers rebuild what they
        derived from :meth:`list` when it moves."""

    @abc.abstractmethod
    def host_aggregates(self, host: str) -> set[str]:
        """The UUIDs of the aggregates ``host`` is in (O(1))."""


class GroupStore(abc.ABC):
    """Server groups (Nova's instance groups) and where their members hold claims.

    Membership is written with the instance (:meth:`InstanceStore.create` with
    ``Instance.group``), the hosts by the claim, which refuses a host that would
    break a hard policy (:class:`~qsched.exception.GroupPolicyRefused`).
    """

    @abc.abstractmethod
    def create(self, group: ServerGroup) -> ServerGroup:
        """Record a new group, within its project's limit; return it as written.

        :raises ServerGroupLimitExceeded: the project holds ``[quota] server_groups``.
        :raises Conflict: the uuid is taken, or was abandoned (:meth:`abandon`).
        """

    @abc.abstractmethod
    def get(self, uuid: str, members: bool = True) -> ServerGroup:
        """One group (O(1)), with its members unless ``members`` is False (O(members)).

        :raises GroupNotFound:
        """

    @abc.abstractmethod
    def list_project(self, project_id: str) -> builtins.list[ServerGroup]:
        """A project's groups with their members (at most ``[quota] server_groups``)."""

    @abc.abstractmethod
    def list_all(self) -> builtins.list[ServerGroup]:
        """Every group of the cell (an admin view: it scans)."""

    @abc.abstractmethod
    def delete(self, uuid: str) -> None:
        """Forget a group; its servers live on in no group, as in Nova.

        :raises GroupNotFound:
        """

    @abc.abstractmethod
    def abandon(self, uuid: str) -> bool:
        """Give up on a group whose create may not have run here (the front door of
        several cells, :mod:`qsched.cells`): True if the group is here (it is kept); else
        a mark is left, in the same step, so that a :meth:`create` arriving late refuses
        (:class:`~qsched.exception.Conflict`), and False."""

    @abc.abstractmethod
    def hosts(self, uuid: str) -> dict[str, int]:
        """Host -> how many of the group's members hold a claim there (O(hosts of the
        group), which its member limit bounds)."""

    @abc.abstractmethod
    def members_on(self, uuid: str, host: str) -> int:
        """How many of the group's members hold a claim on ``host`` (O(1))."""
