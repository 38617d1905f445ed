"""Server actions on this agent's host through the virt driver: stop, start, reboot,
rebuild, shelve, shelve_offload and the unshelve of a server shelved here.

The API checked the instance's states and set the action's task_state in the ledger
in one atomic step (:meth:`qsched.ledger.base.InstanceStore.start_action`), then
published an :class:`~qsched.scheduling.message.ActionRequest` to this host's queue. Here:

1. *admit*: the record must still be ACTIVE on this host in that task_state (a
   delete or a newer action took over otherwise: the request is dropped, nothing
   is undone). A reboot moves on to ``reboot_started`` (``reboot_started_hard``)
   first, as Nova's compute does; a redelivery finds it there and goes on.
2. *drive*: the driver powers the instance off, on, or reboots it. Idempotent, so
   a redelivery after a crash does it again harmlessly.
3. *settle*: task_state back to none and the power with it (off after a stop, on
   after a start or a reboot), with an event named as Nova's (``compute_stop_instance``,
   ``compute_start_instance``, ``compute_reboot_instance``, ``compute_shelve_instance``,
   ``compute_shelve_offload_instance``, ``compute_unshelve_instance``) and its result.
   A driver failure settles with ``Error`` and the power as it was, as Nova reverts
   the task_state of a failed action.

Shelving (docs/moves.rst, "Shelve"): a shelve powers the server off and marks it
shelved on this host; with ``[DEFAULT] shelved_offload_time`` 0 its settle goes on to
``shelving_offloading`` in the same step, and the offload runs at once: the driver
destroys the VM, then the ledger releases its claim and its host (the ``offload``
step, only while the record is still there in that task_state). A server shelved
longer than a positive ``shelved_offload_time`` is offloaded by the agent's sweep
(:meth:`ActionStep.offload_due`). An unshelve of a server shelved here powers it on.

Each step is a conditional write of one record (O(1)); the consumer thread does
them inline, so an instance's actions and deletes on one host keep their order.

A request that never arrives (the API died between the ledger and the broker, or
the broker lost it) would leave its task_state forever: the ledger keeps each
host's actions under way by when they began, and the agent's sweep
(:meth:`ActionStep.finish_stuck`, at start and every ``STUCK_ACTION_S / 2``) runs
those older than ``STUCK_ACTION_S`` again from the record, as nova-compute's
``_init_instance`` finishes a stop or reboot it finds interrupted. A request that
arrives after all finds the action settled and is dropped.
The reconcile never reads the power: a stopped instance is ACTIVE in the ledger
and listed by the driver, so nothing there undoes a stop.

Notifications (when a notifier is on): ``instance.power_off``, ``instance.power_on``,
``instance.reboot``, ``instance.shelve``, ``instance.shelve_offload`` and
``instance.unshelve``, ``.start`` then ``.end``, as Nova's compute sends them,
with ``InstanceActionPayload`` of the instance before and after. They are sent
when the settle's conditional step succeeds, so once per action however often its
request is delivered (``.start`` thus leaves with ``.end``, after the driver ran). A
failed reboot sends ``.start`` and ``instance.reboot.error`` with its fault; a
failed stop or start only ``.start``, as Nova sends no error notification for them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid as uuidlib
from collections import Counter

from agents.nodes import NodeIndex
from agents.virt.base import VirtDriver
from qsched import exception
from qsched.bus.base import describe
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.base import Instance, State, TaskState
from qsched.notifications import NULL, Notifier, payloads
from qsched.notifications.base import ERROR
from qsched.scheduling.message import ActionRequest

LOG = logging.getLogger(__name__)

#: An action under way longer than this without its request settling it is run again.
STUCK_ACTION_S = 60.0


@dataclasses.dataclass(frozen=True)
class _Plan:
    """One action: the task_state the API set, the one the agent sets while it runs
    (None: none of its own), the power after, Nova's event name, its notification
    (``instance.<notice>.start`` ...), the vm_state after, and whether it is shelved
    after (None: as it was)."""

    expect: TaskState
    started: TaskState | None
    power: str
    event: str
    notice: str
    after: str
    shelved: bool | None = None


_PLANS = {
    "stop": _Plan(TaskState.POWERING_OFF, None, "off", "compute_stop_instance", "power_off",
                  "stopped"),
    "start": _Plan(TaskState.POWERING_ON, None, "on", "compute_start_instance", "power_on",
                   "active"),
    "reboot_soft": _Plan(TaskState.REBOOTING, TaskState.REBOOT_STARTED, "on",
                         "compute_reboot_instance", "reboot", "active"),
    "reboot_hard": _Plan(TaskState.REBOOTING_HARD, TaskState.REBOOT_STARTED_HARD, "on",
                         "compute_reboot_instance", "reboot", "active"),
    "shelve": _Plan(TaskState.SHELVING, None, "off", "compute_shelve_instance", "shelve",
                    "shelved", True),
    "shelve_offload": _Plan(TaskState.SHELVING_OFFLOADING, None, "off",
                            "compute_shelve_offload_instance", "shelve_offload",
                            "shelved_offloaded"),
    "unshelve": _Plan(TaskState.UNSHELVING, None, "on", "compute_unshelve_instance",
                      "unshelve", "active", False),
    "rebuild": _Plan(TaskState.REBUILDING, TaskState.REBUILD_SPAWNING, "on",
                     "compute_rebuild_instance", "rebuild", "active"),
}  # fmt: skip
#: what a rebuild that failed leaves: its VM gone, the server ERROR (as Nova's)
REBUILD_FAILED = "The server could not be rebuilt on its host: {reason}"


#: what an action's task_state says it is (the sweep rebuilds the request from it)
_ACTION_OF = {plan.expect: action for action, plan in _PLANS.items()}
_ACTION_OF.update({plan.started: action for action, plan in _PLANS.items() if plan.started})


class ActionStep:
    """The server actions of one agent's host; see the module docstring."""

    def __init__(
        self,
        stores: Stores,
        driver: VirtDriver,
        host: str,
        counters: Counter[str],
        notifier: Notifier = NULL,
        shelved_offload_time: int = 0,
        index: NodeIndex | None = None,
    ) -> None:
        self.stores = stores
        self.driver = driver
        self.host = host
        self.counters = counters
        self.notifier = notifier
        #: Nova's: 0 offloads a shelved server at once, -1 never, else after that long
        self.shelved_offload_time = shelved_offload_time
        #: the agent's view of its nodes: what an offload releases leaves it too
        self.index = index

    def run(self, msg: ActionRequest) -> str:
        """Do one action: ``done``, ``failed`` (the driver refused), or ``dropped``
        (the instance moved on: deleted, another action, another host).

        :raises BackendUnavailable: the ledger does not answer (the delivery goes
            back to the broker; the steps are safe to repeat).
        """
        plan = _PLANS[msg.action]
        admitted = self._admit(msg, plan)
        if admitted is None:
            self.counters["actions_dropped"] += 1
            return "dropped"
        expect, inst = admitted
        if msg.action == "rebuild" and inst.stopped:  # as Nova's: it stays stopped after
            plan = dataclasses.replace(plan, power="off", after="stopped")
        started_s = time.time()
        try:
            self._drive(msg, inst)
        except Exception as exc:  # a hypervisor error: the action fails, the agent goes on
            LOG.warning("agent %s: %s of %s failed: %s", self.host, msg.action,
                        msg.instance_uuid, describe(exc))  # fmt: skip
            why = describe(exc)
            if self._settle(msg, plan, expect, "", "Error", started_s, why):
                self._tell(msg, plan, expect, inst, failed=(type(exc).__name__, why))
                if msg.action == "rebuild":
                    self._lost(msg, why)
            self.counters["actions_failed"] += 1
            return "failed"
        offload = msg.action == "shelve" and self.shelved_offload_time == 0
        if self._settle(msg, plan, expect, plan.power, "Success", started_s, None, offload):
            self._tell(msg, plan, expect, inst)
        self.counters["actions_done"] += 1
        if offload:  # Nova's shelved_offload_time 0: at once, as the same request
            return self.run(dataclasses.replace(msg, action="shelve_offload"))
        return "done"

    def offload_due(self, now: float | None = None) -> int:
        """Offload the servers shelved on this host longer than ``shelved_offload_time``
        (positive; Nova's periodic ``_poll_shelved_instances``); returns how many. Each
        starts as an admin's ``shelveOffload`` would, in one checked step, so one
        unshelved or deleted meanwhile is left alone."""
        if self.shelved_offload_time <= 0:
            return 0
        before = (time.time() if now is None else now) - self.shelved_offload_time
        done = 0
        for uuid in self.stores.instances.shelved_on(self.host, before):
            request_id = f"req-{uuidlib.uuid4()}"
            try:
                host, node = self.stores.instances.start_action(
                    uuid, "shelve_offload", request_id, "", ""
                )
            except (exception.InstanceNotFound, exception.InstanceInvalidState,
                    exception.InstanceNotReady):  # fmt: skip
                continue  # unshelved, offloaded or deleted meanwhile
            if host != self.host:
                continue
            self.run(ActionRequest(request_id, uuid, host, node, "shelve_offload"))
            done += 1
        return done

    def _tell(
        self,
        msg: ActionRequest,
        plan: _Plan,
        expect: TaskState,
        inst: Instance,
        failed: tuple[str, str] | None = None,
    ) -> None:
        """The action's notifications, built from the record read at admission: its
        state before, and after (``failed``: the exception's name and message)."""
        if not self.notifier.enabled:
            return
        name = f"instance.{plan.notice}"
        asked = {"request_id": msg.request_id}
        before = payloads.action_from_record(inst, task_state=expect.value, **asked)
        self.notifier.notify(f"{name}.start", before, context=asked)
        if failed is None:
            stopped = plan.power == "off"
            after = payloads.action_from_record(
                inst, task_state=None, state=plan.after,
                power_state="shutdown" if stopped else "running", **asked,
            )  # fmt: skip
            self.notifier.notify(f"{name}.end", after, context=asked)
        elif plan.notice in ("reboot", "rebuild"):
            fault = payloads.fault(failed[1], failed[0], type(self.driver).__module__)
            error = payloads.action_from_record(inst, task_state=None, fault=fault, **asked)
            self.notifier.notify(f"{name}.error", error, ERROR, context=asked)

    def finish_stuck(self, started_before: float | None = None) -> int:
        """Run again the actions of this host that began before ``started_before`` and
        were not settled (None: every one, at start); forget those that moved on.
        Reads only this host's actions under way. Returns how many ran."""
        done = 0
        for uuid in self.stores.instances.acting(self.host, started_before):
            msg = self._rebuilt(uuid)
            if msg is None:
                self.stores.instances.forget_action(self.host, uuid)
                continue
            LOG.warning("agent %s: the %s of %s did not arrive; doing it now", self.host,
                        msg.action, uuid)  # fmt: skip
            self.counters["actions_resumed"] += 1
            self.run(msg)
            done += 1
        return done

    def _rebuilt(self, uuid: str) -> ActionRequest | None:
        """The request of the action ``uuid`` has under way here, from its record and
        history (its request id is the ``action`` event's); None: no action is."""
        try:
            inst = self.stores.instances.get(uuid)
        except exception.InstanceNotFound:
            return None
        action = _ACTION_OF.get(inst.task_state)
        if inst.state != State.ACTIVE or inst.host != self.host or action is None:
            return None
        started = [e for e in self.stores.instances.events(uuid) if e.event == "action"]
        request_id = str(started[-1].detail.get("request_id")) if started else f"req-{uuid}"
        return ActionRequest(request_id, uuid, self.host, inst.node or "", action)

    def _admit(self, msg: ActionRequest, plan: _Plan) -> tuple[TaskState, Instance] | None:
        """The task_state the action holds now and the record read, or None when the
        action is not this one's."""
        try:
            inst = self.stores.instances.get(msg.instance_uuid)
        except exception.InstanceNotFound:
            return None
        if inst.state != State.ACTIVE or inst.host != self.host or inst.node != msg.node:
            return None
        if plan.started is not None and inst.task_state == plan.started:
            return plan.started, inst  # a redelivery of a reboot under way
        if inst.task_state != plan.expect:
            return None
        if plan.started is None:
            return plan.expect, inst
        moved_on = self.stores.instances.step_action(
            msg.instance_uuid, self.host, plan.expect, plan.started
        )
        return (plan.started, inst) if moved_on else None

    def _drive(self, msg: ActionRequest, inst: Instance) -> None:
        uuid, node = msg.instance_uuid, msg.node
        if msg.action == "rebuild":  # the record took the new image when it started
            image_ref = str(inst.extra.get("image_ref") or "")
            self.driver.rebuild(uuid, node, Flavor.from_dict(inst.flavor), image_ref)
            if inst.stopped:
                self.driver.power_off(uuid, node)
            return
        if msg.action in ("stop", "shelve"):
            self.driver.power_off(uuid, node)
        elif msg.action in ("start", "unshelve"):
            self.driver.power_on(uuid, node)
        elif msg.action == "shelve_offload":
            self.driver.destroy(uuid, node)  # idempotent: a redelivery finds it gone
        else:
            self.driver.reboot(uuid, node, hard=msg.action == "reboot_hard")

    def _lost(self, msg: ActionRequest, why: str) -> None:
        """A rebuild that failed left no VM: the server ends ERROR with its fault, and
        what it held is released, in the ledger and the index (as the reconcile's
        finding of a lost VM would, at once)."""
        uuid, node, index = msg.instance_uuid, msg.node, self.index
        details = {"host": self.host, "node": node, "reason": "rebuild failed"}
        lose = self.stores.instances.set_lost
        if index is None or node not in index:
            lose(uuid, self.host, node, REBUILD_FAILED.format(reason=why), details)
            return
        with index.writing(node):
            allocations = self.stores.ledger.get_allocations(uuid).allocations
            lost = lose(uuid, self.host, node, REBUILD_FAILED.format(reason=why), details)
            if lost and allocations:
                index.release(node, allocations)

    def _offload(self, msg: ActionRequest, event: str, detail: dict[str, object]) -> bool:
        """The ledger's offload, and the index releases what it released."""
        uuid, node, index = msg.instance_uuid, msg.node, self.index
        if index is None or node not in index:
            return self.stores.instances.offload(uuid, self.host, event, **detail)
        with index.writing(node):
            allocations = self.stores.ledger.get_allocations(uuid).allocations
            settled = self.stores.instances.offload(uuid, self.host, event, **detail)
            if settled and allocations:
                index.release(node, allocations)
        return settled

    def _settle(
        self,
        msg: ActionRequest,
        plan: _Plan,
        expect: TaskState,
        power: str,
        result: str,
        started_s: float,
        message: str | None,
        offload: bool = False,
    ) -> bool:
        """Settle the action (``offload``: on to the offload of a shelved server);
        whether this call did (not: it moved on meanwhile)."""
        detail = {"request_id": msg.request_id, "result": result, "start": started_s,
                  "message": message}  # fmt: skip
        uuid, ok = msg.instance_uuid, result == "Success"
        if msg.action == "shelve_offload" and ok:
            settled = self._offload(msg, plan.event, detail)
        else:
            to = TaskState.SHELVING_OFFLOADING if offload else TaskState.NONE
            shelved = plan.shelved if ok else None
            settled = self.stores.instances.step_action(
                uuid, self.host, expect, to, power, plan.event, shelved, **detail
            )
        if not settled:
            LOG.info("agent %s: %s of %s done, but the instance moved on meanwhile",
                     self.host, msg.action, msg.instance_uuid)  # fmt: skip
        return settled
