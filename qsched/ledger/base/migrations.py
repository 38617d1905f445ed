"""MigrationStore: moves of placed servers, each a migration record with Nova's statuses."""

from __future__ import annotations

import abc
import builtins
import dataclasses
from collections.abc import Mapping
from typing import Any

from qsched.ledger.records import Allocations, ClaimGuard

#: The kinds of move, as Nova's ``migration_type`` names them; and an unshelve of a
#: server shelved and offloaded, which Nova records no migration for (qsched's record
#: of it is the ledger's alone: no listing of migrations shows it).
RESIZE, MIGRATION, LIVE_MIGRATION, EVACUATION, UNSHELVE = (
    "resize", "migration", "live-migration", "evacuation", "unshelve",
)  # fmt: skip
KINDS = (RESIZE, MIGRATION, LIVE_MIGRATION, EVACUATION, UNSHELVE)
#: The kinds Nova's migration listings show.
LISTED_KINDS = (RESIZE, MIGRATION, LIVE_MIGRATION, EVACUATION)
#: The statuses a move waits in for a destination, and those it ends in.
WAITING = frozenset({"pre-migrating", "accepted"})
FINAL = frozenset({"confirmed", "reverted", "error", "failed", "completed", "done", "cancelled"})


@dataclasses.dataclass(frozen=True)
class Migration:
    """One move of a server (Nova's ``migrations`` row).

    ``dest_compute`` is the host asked for until a destination claims it, then that
    destination. ``old_flavor`` and ``new_flavor`` are the flavors as the instance
    record keeps them (the same for a migration); ``tried``: the destinations that
    could not take it, which it never goes back to.
    """

    id: int
    uuid: str
    instance_uuid: str
    kind: str
    status: str
    source_compute: str
    source_node: str
    dest_compute: str | None
    dest_node: str | None
    project_id: str
    user_id: str
    old_flavor: Mapping[str, Any]
    new_flavor: Mapping[str, Any]
    created_at: float
    updated_at: float
    request_id: str = ""
    new_class: str = ""
    same_host: bool = False
    attempts: int = 0
    max_attempts: int = 1
    tried: tuple[str, ...] = ()
    fault: str | None = None
    deadline: float | None = None
    caller_project_id: str = ""  # the project of who asked for it (Nova's project_id)
    block_migration: bool | None = None  # a live migration's, as asked (None: auto)
    #: what an admin asked of a live migration under way: "force_complete", "abort" or ""
    asked: str = ""

    @property
    def waiting(self) -> bool:
        """It waits for a destination to claim it."""
        return self.status in WAITING

    @property
    def final(self) -> bool:
        return self.status in FINAL


@dataclasses.dataclass(frozen=True)
class MoveClaim:
    """A destination's claim of a move: the status after, and whether the ledger held
    exactly this claim already (a redelivery)."""

    status: str
    already: bool = False


@dataclasses.dataclass(frozen=True)
class MoveRequest:
    """What the API asks of :meth:`MigrationStore.start`.

    ``new_flavor``, ``new_class`` (with ``class_definition`` for agents), ``cores`` and
    ``ram_mb``: a resize's new flavor as the record keeps it, its scheduling class and
    quota; None for the other kinds. ``host``: the destination an admin named.
    """

    instance_uuid: str
    uuid: str
    kind: str
    request_id: str
    user_id: str
    project_id: str
    deadline: float
    max_attempts: int = 3
    host: str | None = None
    same_host: bool = False
    new_flavor: Mapping[str, Any] | None = None
    new_class: str | None = None
    class_definition: Mapping[str, Any] | None = None
    cores: int = 0
    ram_mb: int = 0
    block_migration: bool | None = None  # a live migration's (None: the driver decides)


class MigrationStore(abc.ABC):
    """Moves of placed servers (docs/moves.rst). Each step is one atomic step of the
    ledger, O(1) in the size of the cloud; each is safe to repeat."""

    @abc.abstractmethod
    def start(self, request: MoveRequest) -> Migration:
        """Record a move waiting for a destination, if the server's states allow it
        (Nova's rules) and its project's quota holds what a larger flavor adds.

        :raises InstanceNotFound:
        :raises InstanceInvalidState: its vm_state or task_state refuses the move, or
            (an evacuation) the compute service of its host is up (409).
        :raises QuotaExceeded: a larger flavor would pass the project's limits.
        :raises Conflict: a resize that changes cores or RAM in a cell whose quota the
            API keyspace of several cells holds (not served yet).
        """

    @abc.abstractmethod
    def claim(
        self,
        migration_uuid: str,
        allocations: Allocations,
        host: str,
        node: str,
        provider_generations: Mapping[str, int] | None = None,
        guard: ClaimGuard | None = None,
        scheduling_class: str | None = None,
    ) -> MoveClaim:
        """A destination's claim: the server's new resources there, its source's held by
        the migration, checked as a boot's claim is, in one step.

        :raises HostRuleRefused: another host was asked for, its own host (unless a
            resize may stay), or its boot's host rule refuses this one.
        :raises TriedHost: this destination tried it already.
        :raises GroupPolicyRefused, CapacityExceeded, ProviderGenerationConflict,
            ServiceDisabled, ClaimRuleBroken, NotItsRequest: as a boot's claim.
        :raises InstanceNotWaiting: the move waits for no destination (claimed, ended).
        :raises MigrationNotFound:
        """

    @abc.abstractmethod
    def finish(self, migration_uuid: str, host: str) -> str:
        """The host doing a move's part says it is done: the destination (a live
        migration's: it is ready, ``running``; then its source: the VM left it,
        ``completed``). Returns the status after.

        :raises MoveNotUnderWay: the move is not at that step, or not that host's.
        :raises MigrationNotFound:
        """

    @abc.abstractmethod
    def confirm(self, migration_uuid: str, phase: str, host: str = "") -> dict[str, Any]:
        """Confirm a move that waits for it: ``ask`` (the API), then ``done`` (its
        source's agent, its copy destroyed) or ``take_over`` (a janitor: the source's
        agent fell silent; its side stays held for it). Returns the status and the
        source.

        :raises MoveNotUnderWay, MigrationNotFound:
        :raises AgentAlive: ``take_over`` of a source that beats again.
        """

    @abc.abstractmethod
    def revert(self, migration_uuid: str, phase: str, host: str = "") -> dict[str, Any]:
        """Revert a move that waits for a confirm: ``ask`` (the API), then ``done`` (its
        destination's agent, its copy destroyed) or ``take_over`` (as for
        :meth:`confirm`). Returns the status and the destination.

        :raises MoveNotUnderWay, MigrationNotFound:
        :raises AgentAlive: ``take_over`` of a destination that beats again.
        """

    @abc.abstractmethod
    def ask(
        self,
        migration_uuid: str,
        instance_uuid: str,
        asked: str,
        allowed: builtins.list[str],
        action: str,
        request_id: str,
        user_id: str,
        project_id: str,
    ) -> str:
        """Ask a live migration of ``instance_uuid`` under way to ``force_complete`` or
        ``abort`` (``asked``), if its status is one of ``allowed``; the instance action
        ``action`` is recorded with it. An abort stays asked. Returns the status.

        :raises MigrationNotFound: no live migration of that server has that uuid.
        :raises InstanceInvalidState: the server is not live-migrating (409).
        :raises InvalidMigrationState: its status is not one of ``allowed`` (400).
        """

    @abc.abstractmethod
    def fail(
        self, migration_uuid: str, host: str, reason: str, retry: bool, take_over: bool = False
    ) -> bool:
        """A destination could not take the move (``host``; "" for the API giving up on
        one that waits; a live migration's source that could not send it, which ends
        it): its claim is given back. True when the move waits again for another
        destination, False when it ended. ``take_over``: a janitor's, for a destination
        whose agent fell silent: its side stays held for it (its VM may run there).

        :raises MoveNotUnderWay, MigrationNotFound:
        :raises AgentAlive: ``take_over`` of a destination that beats again.
        """

    @abc.abstractmethod
    def expired(self, now: float, limit: int = 100) -> builtins.list[str]:
        """Moves under way whose deadline is before ``now``, oldest first (O(log n + limit))."""

    @abc.abstractmethod
    def finished_before(self, before: float, limit: int = 100) -> builtins.list[str]:
        """Moves that wait for a confirm since before ``before``, oldest first
        (O(log n + limit))."""

    @abc.abstractmethod
    def forget_deadline(self, migration_uuid: str) -> None:
        """Take a move out of the deadline index (a destination holds it)."""

    @abc.abstractmethod
    def get(self, migration_uuid: str) -> Migration:
        """:raises MigrationNotFound:"""

    @abc.abstractmethod
    def of_instance(self, instance_uuid: str) -> builtins.list[Migration]:
        """A server's moves, newest first (O(its moves))."""

    @abc.abstractmethod
    def on_host(self, host: str) -> builtins.list[Migration]:
        """The moves under way from or to a host (O(those moves))."""

    @abc.abstractmethod
    def list(self, after: int = 0, limit: int | None = None) -> builtins.list[Migration]:
        """The cell's moves by id after ``after`` (an admin view, paged)."""

    @abc.abstractmethod
    def newest(self, below: int | None = None, limit: int = 100) -> builtins.list[Migration]:
        """The cell's moves by id, newest first: those whose id is below ``below`` (None:
        from the newest), at most ``limit`` (an admin view, paged: O(log n + limit))."""
