"""InstanceStore: instance records, their states, history, deadlines and outbox."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from qsched.ledger.records import Event, Instance, MapChange, Placement, State, TaskState


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
        """State, host, node and task_state of those that exist, in few round trips:
        what a periodic check of thousands of instances, or a delete request's check,
        needs, without whole records."""

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
        self,
        uuid: str,
        action: str,
        request_id: str,
        user_id: str,
        project_id: str,
        extra: Mapping[str, Any] | None = None,
        name: str | None = None,
        scheduling_class: tuple[str, Mapping[str, Any]] | None = None,
    ) -> tuple[str, str]:
        """Start a server action on a placed instance: check its states and set the
        action's task_state in one atomic step; the history gets an ``action`` event
        (action, request_id, user_id, project_id) and the host's actions under way
        (:meth:`acting`) the instance. Returns its host and node.

        ``action``: ``stop`` (from vm_state active), ``start`` (from stopped),
        ``reboot_soft`` (from active) or ``reboot_hard`` (from active or stopped, also
        over a reboot in progress), ``shelve`` (from active or stopped),
        ``shelve_offload`` and ``unshelve`` (from shelved, on its host), ``rebuild``
        (from active or stopped); each only with no task_state, as Nova's.

        A rebuild changes the record in the same step: ``extra``, items of the boot
        details to set (the image, its traits, the server's fields); ``name``; and
        ``scheduling_class``, a class name and its definition, when the new image's
        traits make another (published for agents unless known).

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
        shelved: bool | None = None,
        **detail: Any,
    ) -> bool:
        """Move an action's task_state from ``expect`` to ``to`` (and ``power`` to
        ``on`` or ``off``; "" keeps it; ``shelved``: shelved on its host from now on,
        or no longer; None keeps it), with an ``event`` in the history, if the
        instance is still ACTIVE on ``host`` in ``expect``; to none, it leaves the
        host's actions under way. False when it is not (a delete or another action
        took over): nothing changes.

        :raises InstanceNotFound:
        """

    @abc.abstractmethod
    def offload(self, uuid: str, host: str, event: str, **detail: Any) -> bool:
        """A server shelved on ``host`` whose VM its agent destroyed there is offloaded:
        its allocations released, its server group's count on that host dropped, no
        host any more (``shelved_offloaded``), its quota kept; with an ``event`` in the
        history. Only while the offload is under way there (``shelving_offloading``);
        False when it is not (a delete took over): nothing changes.

        :raises InstanceNotFound:
        """

    @abc.abstractmethod
    def shelved_on(self, host: str, before: float) -> list[str]:
        """Servers shelved on ``host`` since before ``before`` (and not offloaded or
        unshelved since), oldest first: those its agent offloads after
        ``shelved_offload_time`` (O(log n + found))."""

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
