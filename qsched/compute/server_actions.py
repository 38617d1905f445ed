"""Server actions (stop, start, reboot, rebuild, shelve, shelveOffload, the unshelve of
a server shelved on its host) and the instance actions that record them.

No HTTP here: :mod:`qsched.api.server_actions` parses and renders. An action is
checked and started in the ledger in one atomic step (the vm_state and task_state
rules are Nova's; two actions, or an action and a delete, never both go: see
:meth:`qsched.ledger.base.InstanceStore.start_action`), then published to the
queue of the instance's host, whose agent drives the virt driver and settles the
record (:mod:`agents.actions`). Each call costs O(1) ledger work: one record, one
script, one publish.

Where Nova casts to a compute service that may be down and leaves the instance in
its task_state, qsched refuses up front with 409 when the host's agent is down
(its heartbeat expired or its service is forced down): nothing would act on it.

Instance actions are read from the instance's own history (its events, trimmed
to the newest ``[ledger] max_events``), so listing them costs one record and one
list read, whatever the size of the cloud: ``create`` from the record and its
build events, ``stop``, ``start``, ``reboot`` and ``delete`` from the ``action``
events the API writes, each with the event its agent wrote when it finished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.bus.base import Publisher
from qsched.compute.keypairs import KeypairAPI
from qsched.compute.visible import visible
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.images.base import Image, ImageService, OpaqueImages
from qsched.ledger import Stores
from qsched.ledger.base import Event, Instance, State, TaskState
from qsched.ledger.records import PowerState
from qsched.policies import instance_actions as actions_policy
from qsched.policies import server_actions as server_policy
from qsched.policies import shelve as shelve_policy
from qsched.policy import Policy
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import ActionRequest
from qsched.scheduling.records import details

#: the task_state each action sets, to settle it again when its publish fails
_TASK_STATES = {
    "stop": TaskState.POWERING_OFF,
    "start": TaskState.POWERING_ON,
    "reboot_soft": TaskState.REBOOTING,
    "reboot_hard": TaskState.REBOOTING_HARD,
    "shelve": TaskState.SHELVING,
    "shelve_offload": TaskState.SHELVING_OFFLOADING,
    "unshelve": TaskState.UNSHELVING,
    "rebuild": TaskState.REBUILDING,
}
#: Nova's name of the event an agent records for each action
EVENT_NAMES = {
    "stop": "compute_stop_instance",
    "start": "compute_start_instance",
    "reboot": "compute_reboot_instance",
    "delete": "compute_terminate_instance",
    "shelve": "compute_shelve_instance",
    "shelveOffload": "compute_shelve_offload_instance",
    "unshelve": "compute_unshelve_instance",
    "rebuild": "compute_rebuild_instance",
}
#: Nova's instance action of each server action (its first word, where not named here)
ACTION_NAMES = {"shelve_offload": "shelveOffload"}
_SCHEDULE_EVENT = "conductor_schedule_and_build_instances"
_BUILD_EVENT = "compute__do_build_and_run_instance"


class AgentDown(exception.Conflict):
    """The agent of the instance's host is down: nothing would act on the request (409)."""

    msg_fmt = "Cannot '{action}' instance {instance}: the compute service of its host is down"


class ImageTraitsUnsatisfied(exception.Invalid):
    """Nova's 400 for a rebuild whose new image asks for traits its host lacks."""

    msg_fmt = ("Image {image} is unacceptable: Image traits cannot be satisfied by the "
               "current resource providers. Either specify a different image during "
               "rebuild or create a new server with the specified image.")  # fmt: skip


class PreserveEphemeralNotServed(exception.Invalid):
    msg_fmt = ("preserve_ephemeral: qsched's virt drivers keep no ephemeral disk apart from "
               "the server's own, so a rebuild cannot keep one; rebuild without it.")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rebuild:
    """What a rebuild asks besides its image: the fields it sets (None: kept as they
    are), Nova's names in :data:`REBUILD_FIELDS`."""

    name: str | None = None
    metadata: Mapping[str, str] | None = None
    server: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # ServerFields' names
    preserve_ephemeral: bool = False


class ActionNotFound(exception.NotFound):
    msg_fmt = "Action {request_id} not found"


@dataclasses.dataclass(frozen=True)
class ActionEvent:
    """One event of an instance action, as Nova's ``instance_actions_events``."""

    event: str
    start_time: float | None
    finish_time: float | None = None
    result: str | None = None  # Success or Error, None while it runs
    traceback: str | None = None
    host: str | None = None


@dataclasses.dataclass(frozen=True)
class Action:
    """One instance action, as Nova's ``instance_actions`` row, with its events."""

    action: str
    instance_uuid: str
    request_id: str
    user_id: str | None
    project_id: str | None
    start_time: float
    message: str | None = None
    events: tuple[ActionEvent, ...] = ()

    @property
    def updated_at(self) -> float:
        """When it last changed: its start, or its latest event's."""
        times = [self.start_time]
        for event in self.events:
            times += [t for t in (event.start_time, event.finish_time) if t is not None]
        return max(times)


@dataclasses.dataclass(frozen=True)
class ActionFilter:
    """Microversion 2.58's paging and 2.66's window of an instance action list."""

    limit: int | None = None
    marker: str | None = None
    changes_since: float | None = None
    changes_before: float | None = None


class ServerActions:
    """Stop, start and reboot servers; their instance actions. ``max_limit``: the most
    actions one list returns (``[api] max_limit``)."""

    def __init__(
        self,
        stores: Stores,
        bus: Publisher,
        policy: Policy,
        max_limit: int = 1000,
        images: ImageService | None = None,
        keypairs: KeypairAPI | None = None,
    ) -> None:
        self.stores = stores
        self.bus = bus
        self.policy = policy
        self.max_limit = max_limit
        self.images = images or OpaqueImages()
        self.keypairs = keypairs or KeypairAPI(stores, policy)

    def stop(self, context: RequestContext, uuid: str) -> None:
        """``os-stop``: power an ACTIVE server off; it keeps its host, claim and quota.

        :raises InstanceNotFound: as :meth:`qsched.compute.api.ComputeAPI.get`.
        :raises Forbidden: ``os_compute_api:servers:stop`` refuses the caller.
        :raises InstanceNotReady, InstanceInvalidState: its state refuses it (409).
        :raises AgentDown: its host's agent is down (409).
        :raises BusUnavailable: not published (503); the task_state is undone.
        """
        self._act(context, uuid, server_policy.STOP, "stop")

    def start(self, context: RequestContext, uuid: str) -> None:
        """``os-start``: power a stopped server on. Raises as :meth:`stop`."""
        self._act(context, uuid, server_policy.START, "start")

    def reboot(self, context: RequestContext, uuid: str, hard: bool) -> None:
        """``reboot``: soft (an ACTIVE server) or hard (ACTIVE or stopped, also over a
        reboot in progress). Raises as :meth:`stop`."""
        self._act(context, uuid, server_policy.REBOOT, "reboot_hard" if hard else "reboot_soft")

    def shelve(self, context: RequestContext, uuid: str) -> None:
        """``shelve``: power an ACTIVE or stopped server off and keep it on its host,
        SHELVED; with ``shelved_offload_time`` 0 (the default) its agent offloads it at
        once (SHELVED_OFFLOADED: its claim released, its quota kept). Raises as
        :meth:`stop` (``os_compute_api:os-shelve:shelve``)."""
        self._act(context, uuid, shelve_policy.SHELVE, "shelve")

    def shelve_offload(self, context: RequestContext, uuid: str) -> None:
        """``shelveOffload``: destroy a SHELVED server's VM on its host and release its
        claim (SHELVED_OFFLOADED). Raises as :meth:`stop`
        (``os_compute_api:os-shelve:shelve_offload``)."""
        self._act(context, uuid, shelve_policy.SHELVE_OFFLOAD, "shelve_offload")

    def unshelve_here(self, context: RequestContext, instance: Instance) -> None:
        """Power a server SHELVED on its host on again, there (the caller checked the
        ``unshelve`` rule). Raises as :meth:`stop`."""
        self._start(context, instance, "unshelve")

    def rebuild(
        self, context: RequestContext, uuid: str, image_ref: str, asked: Rebuild | None = None
    ) -> None:
        """``rebuild``: spawn an ACTIVE or stopped server again on its host from
        ``image_ref``, with what ``asked`` sets; it runs after. Its record takes the new
        image, its traits (its scheduling class, when they make another), name,
        metadata and fields in the step that starts the action; the host must have
        the image's traits (Nova checks them on the host, and moves nothing).

        :raises InstanceNotFound, Forbidden: as :meth:`stop`
            (``os_compute_api:servers:rebuild``).
        :raises ImageNotFound: no such image the caller may use (400).
        :raises FlavorMemoryTooSmall, FlavorDiskTooSmall: the image needs more (400).
        :raises ImageTraitsUnsatisfied: its host lacks a trait the image asks for (400).
        :raises InvalidKeyName: the caller has no keypair of that ``key_name`` (400).
        :raises PreserveEphemeralNotServed: ``preserve_ephemeral`` true (400).
        :raises InstanceNotReady, InstanceInvalidState, AgentDown, BusUnavailable: as
            :meth:`stop`.
        """
        asked = asked or Rebuild()
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, server_policy.REBUILD, _target(instance))
        if asked.preserve_ephemeral:
            raise PreserveEphemeralNotServed()
        image = self.images.get(context, image_ref)
        flavor = Flavor.from_dict(instance.flavor)
        image.check_fits(flavor)
        boot = details(instance)
        extra: dict[str, Any] = {"image_ref": image.id}
        scheduling_class = None
        if image.required_traits != boot.constraints.required_traits:
            self._check_traits(instance, image)
            constraints = dataclasses.replace(boot.constraints,
                                              required_traits=image.required_traits)  # fmt: skip
            made = SchedulingClass(flavor, constraints)
            scheduling_class = made.name, made.definition()
            extra.update(constraints.to_dict(), scheduling_class=made.name)
        if asked.metadata is not None:
            extra["metadata"] = dict(asked.metadata)
        if asked.server:
            fields = dataclasses.replace(boot.server, **asked.server)
            extra["server"] = self.keypairs.for_boot(context, fields).to_dict()
        self._start(context, instance, "rebuild", extra, asked.name, scheduling_class)

    def _check_traits(self, instance: Instance, image: Image) -> None:
        """The providers its allocation uses have every trait the image asks for."""
        held = self.stores.ledger.get_allocations(instance.uuid).allocations
        found = self.stores.ledger.get_providers(list(held))
        traits = frozenset().union(*(provider.traits for provider in found.values()))
        if not image.required_traits <= traits:
            raise ImageTraitsUnsatisfied(image=image.id)

    def _act(self, context: RequestContext, uuid: str, rule: str, action: str) -> None:
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, rule, _target(instance))
        self._start(context, instance, action)

    def _start(
        self,
        context: RequestContext,
        instance: Instance,
        action: str,
        extra: Mapping[str, Any] | None = None,
        new_name: str | None = None,
        scheduling_class: tuple[str, Mapping[str, Any]] | None = None,
    ) -> None:
        name = ACTION_NAMES.get(action, action.partition("_")[0])
        placed = instance.host and instance.state == State.ACTIVE
        if placed and not self.stores.agents.alive(instance.host or ""):
            raise AgentDown(action=name, instance=instance.uuid)
        host, node = self.stores.instances.start_action(
            instance.uuid, action, context.request_id, context.user_id, context.project_id,
            extra, new_name, scheduling_class,
        )  # fmt: skip
        msg = ActionRequest(context.request_id, instance.uuid, host, node, action)
        try:
            self.bus.publish_action(host, msg)
        except exception.BackendUnavailable as exc:
            task = _TASK_STATES[action]
            self.stores.instances.step_action(
                instance.uuid, host, task, TaskState.NONE, "", EVENT_NAMES[name],
                request_id=context.request_id, result="Error", start=None,
                message=f"not published: {exc}",
            )  # fmt: skip
            raise

    # -- instance actions --

    def list_actions(
        self,
        context: RequestContext,
        uuid: str,
        deleted: bool = False,
        filters: ActionFilter | None = None,
    ) -> tuple[Instance, list[Action]]:
        """A server's actions, newest first; ``deleted``: a deleted server's too (2.21).

        :raises InstanceNotFound: as :meth:`qsched.compute.api.ComputeAPI.get`.
        :raises Forbidden: ``os_compute_api:os-instance-actions:list`` refuses the caller.
        :raises MarkerCouldNotBeFound: ``filters.marker`` is none of them (400).
        """
        instance = visible(self.stores.instances, context, uuid, deleted)
        self.policy.authorize(context, actions_policy.LIST, {"project_id": instance.project_id})
        found = actions_of(instance, self.stores.instances.events(instance.uuid))
        return instance, self._filter(found, filters or ActionFilter())

    def get_action(
        self, context: RequestContext, uuid: str, request_id: str, deleted: bool = False
    ) -> tuple[Instance, Action]:
        """One action of a server by its request id.

        :raises InstanceNotFound, Forbidden: as :meth:`list_actions`
            (``os_compute_api:os-instance-actions:show``).
        :raises ActionNotFound: no action of it has that request id.
        """
        instance = visible(self.stores.instances, context, uuid, deleted)
        self.policy.authorize(context, actions_policy.SHOW, {"project_id": instance.project_id})
        for action in actions_of(instance, self.stores.instances.events(instance.uuid)):
            if action.request_id == request_id:
                return instance, action
        raise ActionNotFound(request_id=request_id)

    def shows_events(self, context: RequestContext, instance: Instance) -> bool:
        """``os_compute_api:os-instance-actions:events``: every event detail (traceback,
        host); others see the events without them from 2.51."""
        target = {"project_id": instance.project_id}
        return self.policy.allows(context, actions_policy.EVENTS, target)

    def _filter(self, found: list[Action], filters: ActionFilter) -> list[Action]:
        if filters.changes_since is not None:
            found = [a for a in found if a.updated_at >= filters.changes_since]
        if filters.changes_before is not None:
            found = [a for a in found if a.updated_at <= filters.changes_before]
        if filters.marker is not None:
            index = next((n for n, a in enumerate(found) if a.request_id == filters.marker), None)
            if index is None:
                raise exception.MarkerCouldNotBeFound(marker=filters.marker)
            found = found[index + 1 :]
        limit = self.max_limit if filters.limit is None else min(filters.limit, self.max_limit)
        return found[:limit]


# -- what a server shows --

#: the task states of a move that show in its status, whatever its power
_MOVE_STATUS = {
    TaskState.RESIZE_PREP: "RESIZE",
    TaskState.RESIZE_MIGRATING: "RESIZE",
    TaskState.RESIZE_REVERTING: "REVERT_RESIZE",
    TaskState.MIGRATING: "MIGRATING",
    TaskState.REBUILDING: "REBUILD",
    TaskState.REBUILD_SPAWNING: "REBUILD",
}
#: the task states of an ACTIVE server that show in its status (Nova's _STATE_MAP)
_ACTIVE_STATUS = {
    TaskState.REBOOTING: "REBOOT",
    TaskState.REBOOT_STARTED: "REBOOT",
    TaskState.REBOOTING_HARD: "HARD_REBOOT",
    TaskState.REBOOT_STARTED_HARD: "HARD_REBOOT",
    **_MOVE_STATUS,
}


def vm_state(instance: Instance, otherwise: str) -> str:
    """Nova's vm_state: ``resized`` for a server whose move waits for a confirm,
    ``shelved`` or ``shelved_offloaded`` for a shelved one, ``stopped`` for a server a
    stop powered off, else ``otherwise`` (what its state shows)."""
    if instance.state == State.ACTIVE and instance.resized:
        return "resized"
    if instance.state == State.ACTIVE and instance.shelved:
        return "shelved_offloaded" if instance.offloaded else "shelved"
    if instance.state == State.ACTIVE and instance.stopped:
        return "stopped"
    return otherwise


def status(instance: Instance) -> str:
    """Nova's status from the vm_state and task_state: ``VERIFY_RESIZE`` while a move
    waits for a confirm, ``RESIZE``, ``REVERT_RESIZE``, ``MIGRATING`` while one runs,
    ``SHUTOFF`` when stopped (a hard reboot of it included), ``REBOOT`` and
    ``HARD_REBOOT`` while one runs."""
    if instance.state != State.ACTIVE:
        return instance.state.value
    if instance.resized:
        return _MOVE_STATUS.get(instance.task_state, "VERIFY_RESIZE")
    if instance.shelved:  # Nova's status shows no task of a shelved server
        return "SHELVED_OFFLOADED" if instance.offloaded else "SHELVED"
    if instance.stopped:
        return _MOVE_STATUS.get(instance.task_state, "SHUTOFF")
    return _ACTIVE_STATUS.get(instance.task_state, "ACTIVE")


def has_status(instance: Instance, wanted: str) -> bool:
    """Whether the list filter ``status=<wanted>`` finds the server, as Nova's
    (``task_and_vm_state_from_status``): a status names its vm_state, in any task_state
    for the vm_state's default (``ACTIVE`` finds a rebooting server too)."""
    wanted = wanted.upper()
    if status(instance) == wanted:
        return True
    plain = not (instance.stopped or instance.resized or instance.shelved)
    return wanted == "ACTIVE" and instance.state == State.ACTIVE and plain


def power_state(instance: Instance) -> int:
    """Nova's power_state: RUNNING (1) once ACTIVE, SHUTDOWN (4) when stopped or shelved
    on its host, else 0 (offloaded: no hypervisor holds it)."""
    if instance.state != State.ACTIVE or instance.offloaded:
        return PowerState.NOSTATE.value
    return (PowerState.SHUTDOWN if instance.stopped else PowerState.RUNNING).value


# -- instance actions --


def actions_of(instance: Instance, history: Sequence[Event]) -> list[Action]:
    """An instance's actions from its record and history, newest first (pure).

    ``create`` is always there (its request id is the boot's); each ``action`` event
    starts one more, and the agent's event carrying its request id finishes it. A
    delete finishes when the history says the instance ended DELETED.
    """
    actions = [_create(instance, history)]
    for n, entry in enumerate(history):
        if entry.event != "action":
            continue
        detail = entry.detail
        name, request_id = str(detail.get("action", "")), str(detail.get("request_id", ""))
        if name == "delete":
            events = _delete_events(entry, history)
        elif name in MOVE_EVENTS and "migration" in detail:  # an unshelve here has none
            events = _move_events(name, entry, history)
        else:
            events = _agent_events(name, request_id, entry, history[n + 1 :])
        message = "Error" if any(e.result == "Error" for e in events) else None
        actions.append(Action(
            name, instance.uuid, request_id, detail.get("user_id"), detail.get("project_id"),
            entry.time, message, events,
        ))  # fmt: skip
    actions.sort(key=lambda a: a.start_time, reverse=True)
    return actions


def _create(instance: Instance, history: Sequence[Event]) -> Action:
    """The boot: scheduling until a claim, then the build on the host until ACTIVE."""
    claimed = [e for e in history if e.event == "claimed"]
    active = next((e for e in history if e.event == "active"), None)
    failed = next((e for e in history if e.event == "error"), None)
    schedule_end = claimed[0].time if claimed else (failed.time if failed else None)
    schedule_result = "Success" if claimed else ("Error" if failed else None)
    events = [ActionEvent(_SCHEDULE_EVENT, instance.created_at, schedule_end, schedule_result)]
    if claimed:
        build = claimed[-1]
        end = active or failed
        result = None if end is None else ("Success" if end is active else "Error")
        events.append(ActionEvent(_BUILD_EVENT, build.time, end.time if end else None, result,
                                  host=build.host))  # fmt: skip
    message = "Error" if failed is not None else None
    return Action("create", instance.uuid, details(instance).request_id, instance.user_id,
                  instance.project_id, instance.created_at, message, tuple(events))  # fmt: skip


def _agent_events(
    name: str, request_id: str, started: Event, later: Sequence[Event]
) -> tuple[ActionEvent, ...]:
    """The event an agent wrote for this request (none while it runs)."""
    wanted = EVENT_NAMES.get(name)
    for entry in later:
        if entry.event == wanted and entry.detail.get("request_id") == request_id:
            start = entry.detail.get("start")
            return (ActionEvent(
                entry.event, float(start) if start is not None else started.time, entry.time,
                entry.detail.get("result"), entry.detail.get("message"), entry.host,
            ),)  # fmt: skip
    return ()


#: a move's instance action -> Nova's events for it, each (name, the ledger's event that
#: starts it, "" for the action's own, and the events that end it: Success, Error)
MOVE_EVENTS: dict[str, tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...]] = {
    "resize": (
        ("compute_prep_resize", "", ("move_claimed",), ("move_failed",)),
        ("compute_finish_resize", "move_claimed", ("move_finished",), ("move_failed",
                                                                         "move_retried")),
    ),
    "live-migration": (
        ("compute_live_migration", "move_claimed", ("move_finished",), ("move_failed",)),
    ),
    "evacuate": (
        ("compute_rebuild_instance", "move_claimed", ("move_finished",), ("move_failed",)),
    ),
    "unshelve": (  # of a server offloaded: placed again as a move from no host
        ("conductor_unshelve_instance", "", ("move_claimed",), ("move_failed",)),
        ("compute_unshelve_instance", "move_claimed", ("move_finished",), ("move_failed",
                                                                           "move_retried")),
    ),
    "live_migration_force_complete": (
        ("compute_live_migration_force_complete", "", ("move_finished",),
         ("move_failed", "move_cancelled")),
    ),
    "live_migration_cancel": (
        ("compute_live_migration_abort", "", ("move_cancelled",), ("move_finished",)),
    ),
    "confirmResize": (("compute_confirm_resize", "", ("move_confirmed",), ()),),
    "revertResize": (("compute_revert_resize", "", ("move_reverted",), ()),),
}  # fmt: skip
MOVE_EVENTS["migrate"] = MOVE_EVENTS["resize"]


def _move_events(name: str, started: Event, history: Sequence[Event]) -> tuple[ActionEvent, ...]:
    """A move's events from the ledger's history of its migration (the ``action``
    event names it): each starts at its starting event (the last one: a destination
    that failed is followed by another) or at the action, and finishes at the first
    event that ends it, after its start, ``Success`` or ``Error`` (none yet: running).
    An event the action starts ends anywhere in the migration's history: a confirm on
    the server's own host ends before its action is written."""
    migration = started.detail.get("migration")
    mine = [e for e in history if e.detail.get("migration") == migration and e is not started]
    events = []
    for event, begins, succeeds, fails in MOVE_EVENTS[name]:
        starts = [e for e in mine if e.event == begins]
        start = started if not begins else (starts[-1] if starts else None)
        if start is None:
            break
        after = start.time if begins else float("-inf")
        end = next((e for e in mine if e.time >= after and e.event in succeeds + fails), None)
        result = None if end is None else ("Success" if end.event in succeeds else "Error")
        why = end.detail.get("reason") if end is not None and result == "Error" else None
        host = (end or start).host or started.host
        events.append(ActionEvent(event, start.time, end.time if end else None, result,
                                  str(why) if why else None, host))  # fmt: skip
        if result != "Success":
            break
    return tuple(events)


def _delete_events(started: Event, history: Sequence[Event]) -> tuple[ActionEvent, ...]:
    """The end of the instance, before its action was written when nothing had to run
    on a host (written after the delete, so that a refused one leaves no trace)."""
    ended = next((e for e in history if e.event == "deleted"), None)
    if ended is None:
        return ()
    host = ended.host or started.host
    start = min(started.time, ended.time)
    return (ActionEvent(EVENT_NAMES["delete"], start, ended.time, "Success", host=host),)


def _target(instance: Instance) -> dict[str, str]:
    return {"project_id": instance.project_id, "user_id": instance.user_id}


def record_delete(stores: Stores, context: RequestContext, uuid: str) -> None:
    """Write the ``delete`` instance action of a server just deleted (or marked
    deleting: its agent ends it)."""
    stores.instances.add_event(
        uuid, "action", action="delete", request_id=context.request_id,
        user_id=context.user_id, project_id=context.project_id,
    )  # fmt: skip
