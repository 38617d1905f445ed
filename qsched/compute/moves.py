"""Moves of placed servers in one cell: resize, its confirm and revert, cold and live
migration, evacuation, and the unshelve of a server shelved and offloaded (docs/moves.rst).

No HTTP here: :mod:`qsched.api.server_actions` parses and renders. A move is checked
and started in the ledger in one step (:meth:`~qsched.ledger.base.MigrationStore.start`:
Nova's vm_state and task_state rules, the quota a larger flavor adds), then its request
is published on the queue of its class (the new flavor's, for a resize), carrying
every constraint of the server's boot, for a destination to claim. A confirm or a
revert is asked of the ledger, then published to the host whose copy goes. Each call
costs O(1) ledger work, whatever the size of the cloud.

As for the server actions, a move whose source host's agent is down is refused up
front (409): nothing would let go of the source. An evacuation is the other way round:
only from a host whose compute service is down (Nova's 400 otherwise). A move never
published (the broker did not confirm) is ended at once, with the server back as it
was, and the caller gets 503.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid as uuidlib
from collections.abc import Callable

from qsched import exception
from qsched.bus.base import Publisher
from qsched.compute.migrations import MigrationNotFoundForInstance
from qsched.compute.server_actions import AgentDown, ServerActions, vm_state
from qsched.compute.visible import visible
from qsched.conf import SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.base import Instance, Migration, MoveRequest
from qsched.ledger.base.migrations import EVACUATION, LIVE_MIGRATION, MIGRATION, RESIZE, UNSHELVE
from qsched.policies import migrations as migrations_policy
from qsched.policies import moves as moves_policy
from qsched.policies import shelve as shelve_policy
from qsched.policy import Policy
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import MoveStep
from qsched.scheduling.records import details, move_request_for

#: Nova's instance action of each move
ACTIONS = {RESIZE: "resize", MIGRATION: "migrate", LIVE_MIGRATION: "live-migration",
           EVACUATION: "evacuate", UNSHELVE: "unshelve"}  # fmt: skip
#: an unshelve's ``availability_zone`` not given (None unpins the server from its zone)
NOT_GIVEN = object()


class CannotResizeToSameFlavor(exception.Invalid):
    msg_fmt = "When resizing, instances must change flavor!"


class CannotResizeDisk(exception.Invalid):
    msg_fmt = "Resizing to a smaller disk flavor is not allowed."


class SameHost(exception.Invalid):
    msg_fmt = "The target host can't be the same one."


class CannotMigrateToSameHost(exception.Invalid):
    msg_fmt = "Cannot migrate to the host where the server exists."


class ComputeServiceUnavailable(exception.Invalid):
    msg_fmt = "Compute service of {host} is unavailable at this time."


class UnableToMigrateToSelf(exception.Invalid):
    msg_fmt = "Unable to migrate instance ({instance}) to current host ({host})."


class UnshelveInstanceInvalidState(exception.Conflict):
    msg_fmt = ("Specifying an availability zone or a host when unshelving server "
               '"{instance}" with status "{state}" is not supported. The server status '
               "must be SHELVED_OFFLOADED.")  # fmt: skip


class UnshelveHostNotInAZ(exception.Conflict):
    msg_fmt = 'Host "{host}" is not in the availability zone "{zone}".'


class UnshelveToZoneNotServed(exception.Conflict):
    msg_fmt = (
        "qsched does not move a shelved server to another availability zone yet: server "
        "{instance} keeps the zone {zone}; unshelve it without availability_zone (or with "
        "its own), optionally with a host of that zone."
    )


class ServerMoves:
    """Resize (confirm, revert), cold- and live-migrate, and evacuate the servers of
    one cell."""

    def __init__(
        self,
        stores: Stores,
        bus: Publisher,
        policy: Policy,
        scheduler: SchedulerOptions | None = None,
        actions: ServerActions | None = None,
    ) -> None:
        self.stores = stores
        self.bus = bus
        self.policy = policy
        self.scheduler = scheduler or SchedulerOptions.defaults()
        self.actions = actions or ServerActions(stores, bus, policy)

    def resize(
        self,
        context: RequestContext,
        uuid: str,
        flavor_ref: str,
        get_flavor: Callable[[str, RequestContext], Flavor],
    ) -> Migration:
        """``resize``: place the server again with the flavor ``flavor_ref``, which
        ``get_flavor`` finds among those the caller may see.

        :raises InstanceNotFound: the caller cannot see it.
        :raises Forbidden: ``os_compute_api:servers:resize`` refuses the caller.
        :raises Invalid: no such flavor (Nova's 400 "Unable to locate requested flavor.").
        :raises CannotResizeToSameFlavor, CannotResizeDisk: Nova's 400s.
        :raises InstanceInvalidState: its states refuse a move (409).
        :raises AgentDown: its host's agent is down (409).
        :raises QuotaExceeded: the larger flavor passes the project's limits (403).
        :raises BusUnavailable: not published (503); the move ended, nothing changed.
        """
        instance = self._placed(context, uuid, moves_policy.RESIZE, "resize")
        try:
            flavor = get_flavor(flavor_ref, context)
        except exception.FlavorNotFound:
            raise exception.Invalid(message="Unable to locate requested flavor.") from None
        old = Flavor.from_dict(instance.flavor)
        if flavor.flavor_id == old.flavor_id:
            raise CannotResizeToSameFlavor()
        if flavor.disk_gb < old.disk_gb:
            raise CannotResizeDisk()
        scheduling_class = SchedulingClass(flavor, details(instance).constraints)
        request = self._move(context, instance, RESIZE)
        request = dataclasses.replace(
            request, new_flavor=flavor.to_dict(), new_class=scheduling_class.name,
            class_definition=scheduling_class.definition(), cores=flavor.vcpus,
            ram_mb=flavor.ram_mb, same_host=self.scheduler.allow_resize_to_same_host,
        )  # fmt: skip
        return self._start(instance, request)

    def migrate(self, context: RequestContext, uuid: str, host: str | None = None) -> Migration:
        """``migrate``: place the server on another host (``host``: that one, 2.56).
        Raises as :meth:`resize` (``os_compute_api:os-migrate-server:migrate``),
        ComputeHostNotFound for a host with no compute service (404) and
        CannotMigrateToSameHost for its own (400)."""
        instance = self._placed(context, uuid, moves_policy.MIGRATE, "migrate")
        if host is not None:
            if host == instance.host:
                raise CannotMigrateToSameHost()
            self._check_target(host)
        request = dataclasses.replace(self._move(context, instance, MIGRATION), host=host)
        return self._start(instance, request)

    def live_migrate(
        self,
        context: RequestContext,
        uuid: str,
        host: str | None = None,
        block_migration: bool | None = None,
    ) -> Migration:
        """``os-migrateLive``: send a running server to another host without stopping it
        (``host``: that one); ``block_migration``: its disks go along (None: Nova's
        ``auto``, as the driver finds best). Raises as :meth:`migrate`
        (``os_compute_api:os-migrate-server:migrate_live``), and UnableToMigrateToSelf
        for its own host (400)."""
        instance = self._placed(context, uuid, moves_policy.MIGRATE_LIVE, "os-migrateLive")
        if host is not None:
            if host == instance.host:
                raise UnableToMigrateToSelf(instance=instance.uuid, host=host)
            self._check_target(host)
        request = dataclasses.replace(
            self._move(context, instance, LIVE_MIGRATION), host=host,
            block_migration=block_migration,
        )  # fmt: skip
        return self._start(instance, request)

    def evacuate(self, context: RequestContext, uuid: str, host: str | None = None) -> Migration:
        """``evacuate``: rebuild the server of a host whose compute service is down
        (its heartbeat expired, or forced down) on another host (``host``: that one).
        The source's side stays held for its host until its agent, back, says the VM is
        gone there.

        :raises InstanceNotFound, Forbidden: as :meth:`resize` (``os_compute_api:os-evacuate``).
        :raises ComputeServiceInUse: its host's service is up (400).
        :raises ComputeHostNotFound: ``host`` has no compute service (404).
        :raises SameHost: ``host`` is its own (400).
        :raises InstanceInvalidState: its states refuse a move (409).
        :raises BusUnavailable: not published (503); the move ended, nothing changed.
        """
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, moves_policy.EVACUATE, _target(instance))
        if host is not None:
            if host == instance.host:
                raise SameHost()
            self._check_target(host)
        request = dataclasses.replace(self._move(context, instance, EVACUATION), host=host)
        return self._start(instance, request)

    def unshelve(
        self, context: RequestContext, uuid: str, zone: object = NOT_GIVEN, host: str | None = None
    ) -> None:
        """``unshelve``: a server SHELVED on its host is powered on there; one
        SHELVED_OFFLOADED is placed again through the queues of its class, as a move from
        no host (to ``host``, 2.91), and runs wherever a destination claims it. Nova's
        ``zone`` (2.77; None unpins it): only its own zone is served yet.

        :raises InstanceNotFound: the caller cannot see it.
        :raises Forbidden: ``os_compute_api:os-shelve:unshelve`` refuses the caller (or
            ``unshelve_to_host``, with a ``host``).
        :raises UnshelveInstanceInvalidState: a zone or a host for a server that is not
            offloaded (409).
        :raises UnshelveToZoneNotServed: another zone (409).
        :raises Invalid: ``host`` has no compute service (Nova's 400 here), or takes no
            new work (400).
        :raises UnshelveHostNotInAZ: ``host`` is not in the server's zone (409).
        :raises InstanceInvalidState: its states refuse it (409).
        :raises AgentDown: a server shelved on a host whose agent is down (409).
        :raises BusUnavailable: not published (503); nothing changed.
        """
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, shelve_policy.UNSHELVE, {"project_id": instance.project_id})
        if host is not None:
            self.policy.authorize(context, shelve_policy.UNSHELVE_TO_HOST, _target(instance))
        if (zone is not NOT_GIVEN or host is not None) and not instance.offloaded:
            state = vm_state(instance, instance.state.value.lower())
            raise UnshelveInstanceInvalidState(instance=instance.uuid, state=state)
        own_zone = details(instance).availability_zone
        if zone is not NOT_GIVEN and zone != own_zone:
            raise UnshelveToZoneNotServed(instance=instance.uuid, zone=own_zone or "(none)")
        if not instance.offloaded:
            self.actions.unshelve_here(context, instance)
            return
        if host is not None:
            try:
                service = self.stores.agents.service(host)
            except exception.ComputeHostNotFound as exc:
                raise exception.Invalid(message=str(exc)) from None  # Nova's 400 here
            if own_zone is not None and service.zone != own_zone:
                raise UnshelveHostNotInAZ(host=host, zone=own_zone)
            self._check_target(host)
        self._start(
            instance, dataclasses.replace(self._move(context, instance, UNSHELVE), host=host)
        )

    def force_complete(self, context: RequestContext, uuid: str, migration_id: str) -> None:
        """``force_complete`` (2.22): a live migration being sent completes now; its
        source's driver pauses the server so that the copy ends (it reads what was
        asked while it copies).

        :raises InstanceNotFound: the caller cannot see the server.
        :raises Forbidden: ``os_compute_api:servers:migrations:force_complete``.
        :raises Invalid: no live migration of the server has that id (Nova's 400 here).
        :raises InvalidMigrationState: it is not ``running`` (400).
        :raises InstanceInvalidState: the server is not live-migrating (409).
        """
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, migrations_policy.FORCE_COMPLETE,
                              {"project_id": instance.project_id})  # fmt: skip
        try:
            self._ask(context, instance, migration_id, "force_complete", ["running"])
        except MigrationNotFoundForInstance as exc:
            raise exception.Invalid(message=str(exc)) from None

    def abort(
        self, context: RequestContext, uuid: str, migration_id: str, in_queue: bool = True
    ) -> None:
        """Abort a live migration (2.24): it rolls back, the server stays on its source,
        the migration ends ``cancelled``. ``in_queue`` (2.65): one waiting for a
        destination (ended here) or whose destination prepares (it gives its claim back
        when ready) too, else only one being sent (its source's driver stops).

        :raises InstanceNotFound, InstanceInvalidState: as :meth:`force_complete`.
        :raises Forbidden: ``os_compute_api:servers:migrations:delete``.
        :raises MigrationNotFoundForInstance: no live migration of it has that id (404).
        :raises InvalidMigrationState: its status allows no abort (400).
        """
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, migrations_policy.ABORT,
                              {"project_id": instance.project_id})  # fmt: skip
        allowed = ["running", "accepted", "preparing"] if in_queue else ["running"]
        move = self._ask(context, instance, migration_id, "abort", allowed)
        if move.waiting:  # no destination holds it: it ends here
            with contextlib.suppress(exception.MoveNotUnderWay):  # claimed meanwhile
                self.stores.migrations.fail(move.uuid, "", "aborted by an admin", False)

    def _ask(
        self,
        context: RequestContext,
        instance: Instance,
        migration_id: str,
        asked: str,
        allowed: list[str],
    ) -> Migration:
        """Ask the live migration ``migration_id`` (Nova's integer id) of ``instance``."""
        wanted = int(migration_id) if migration_id.isascii() and migration_id.isdigit() else None
        moves = self.stores.migrations.of_instance(instance.uuid)
        move = next((m for m in moves if m.id == wanted and m.kind == LIVE_MIGRATION), None)
        if move is None:
            raise MigrationNotFoundForInstance(id=migration_id, uuid=instance.uuid)
        action = "live_migration_force_complete" if asked == "force_complete" else (
            "live_migration_cancel")  # fmt: skip
        try:
            self.stores.migrations.ask(move.uuid, instance.uuid, asked, allowed, action,
                                       context.request_id, context.user_id,
                                       context.project_id)  # fmt: skip
        except exception.MigrationNotFound:
            raise MigrationNotFoundForInstance(id=migration_id, uuid=instance.uuid) from None
        return self.stores.migrations.get(move.uuid)

    def confirm(self, context: RequestContext, uuid: str) -> None:
        """``confirmResize``: keep a resized or migrated server where it is now; its
        source's copy goes.

        :raises InstanceNotFound, Forbidden: as :meth:`resize`
            (``os_compute_api:servers:confirm_resize``).
        :raises InstanceInvalidState: no move of it waits for a confirm (409).
        :raises BusUnavailable: not published (503); the source's agent finishes it
            when it sweeps its moves.
        """
        self._settle(context, uuid, moves_policy.CONFIRM_RESIZE, "confirmResize", "confirm")

    def revert(self, context: RequestContext, uuid: str) -> None:
        """``revertResize``: put a resized or migrated server back as it was, where it
        was; its new copy goes. Raises as :meth:`confirm`
        (``os_compute_api:servers:revert_resize``)."""
        self._settle(context, uuid, moves_policy.REVERT_RESIZE, "revertResize", "revert")

    # -- the steps --

    def _settle(
        self, context: RequestContext, uuid: str, rule: str, action: str, step: str
    ) -> None:
        """Ask the ledger to confirm or revert (``step``) the server's move that waits
        for it; when a host's copy must go first (the source's for a confirm, the
        destination's for a revert), publish the step to that host."""
        instance, migration = self._resized(context, uuid, rule, action)
        confirm = step == "confirm"
        ask = self.stores.migrations.confirm if confirm else self.stores.migrations.revert
        asked = ask(migration, "ask")
        self.stores.instances.add_event(  # once asked: a refused one leaves no trace
            instance.uuid, "action", action=action, request_id=context.request_id,
            user_id=context.user_id, project_id=context.project_id, migration=migration,
        )  # fmt: skip
        if asked["status"] in ("confirming", "reverting"):
            end = "source" if confirm else "dest"
            message = MoveStep(context.request_id, instance.uuid, asked[f"{end}_compute"],
                               asked[f"{end}_node"], migration, step)  # fmt: skip
            self.bus.publish_action(message.host, message)

    def _placed(self, context: RequestContext, uuid: str, rule: str, action: str) -> Instance:
        """The server, the caller allowed, its host's agent up."""
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, rule, _target(instance))
        if instance.host and not self.stores.agents.alive(instance.host):
            raise AgentDown(action=action, instance=instance.uuid)
        return instance

    def _resized(
        self, context: RequestContext, uuid: str, rule: str, action: str
    ) -> tuple[Instance, str]:
        """The server and its move that waits for a confirm or a revert."""
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, rule, _target(instance))
        if not instance.resized or instance.migration is None:
            state = "stopped" if instance.stopped else instance.state.value.lower()
            raise exception.InstanceInvalidState(
                action=action, instance=instance.uuid, attr="vm_state", state=state
            )
        return instance, instance.migration

    def _check_target(self, host: str) -> None:
        """A host asked for must take new work now, or the move could go nowhere.

        :raises ComputeHostNotFound: it has no compute service (404).
        :raises ComputeServiceUnavailable: its service is disabled, forced down, or its
            agent silent (Nova's 400).
        """
        service = self.stores.agents.service(host)
        if not service.schedulable or not self.stores.agents.alive(host):
            raise ComputeServiceUnavailable(host=host)

    def _move(self, context: RequestContext, instance: Instance, kind: str) -> MoveRequest:
        return MoveRequest(
            instance.uuid, str(uuidlib.uuid4()), kind, context.request_id, context.user_id,
            context.project_id, time.time() + self.scheduler.build_timeout_s,
            max_attempts=self.scheduler.max_attempts,
        )  # fmt: skip

    def _start(self, instance: Instance, request: MoveRequest) -> Migration:
        """Start the move in the ledger and publish its request: to the host asked for,
        else the queue of its class."""
        migration = self.stores.migrations.start(request)
        message = move_request_for(instance, migration)
        try:
            if request.host is not None:
                self.bus.publish_to_host(request.host, message)
            else:
                self.bus.publish_boot(message)
        except exception.BackendUnavailable as exc:
            self.stores.migrations.fail(migration.uuid, "", f"not published: {exc}", False)
            raise
        self.stores.instances.add_event(
            instance.uuid, "action", action=ACTIONS[request.kind], request_id=request.request_id,
            user_id=request.user_id, project_id=request.project_id,
            migration=migration.uuid,
        )  # fmt: skip
        return migration


def _target(instance: Instance) -> dict[str, str]:
    return {"project_id": instance.project_id, "user_id": instance.user_id}
