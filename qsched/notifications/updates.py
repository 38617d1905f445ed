"""``instance.update``: Nova's notification of an instance's state changes, on demand.

Nova sends ``instance.update`` when ``[notifications] notify_on_state_change`` says
so (its default, unset, sends none): ``vm_state`` on each change of the vm_state,
``vm_and_task_state`` on each change of either. qsched derives them from the
lifecycle notifications its services send anyway, each of which stands for one
state change of the instance:

==========================  ================================================
lifecycle notification      change of (vm_state, task_state)
==========================  ================================================
``instance.create.start``   (building, scheduling) to (building, spawning)
``instance.create.end``     (building, spawning) to (active, none)
``instance.create.error``   (building, scheduling) to (error, none); a failed
                            spawn given back: (building, spawning) to
                            (building, scheduling)
``instance.delete.start``   (state, none) to (state, deleting)
``instance.delete.end``     (state, deleting) to (deleted, none)
``instance.<action>.start`` (state, none) to (state, the action's task)
                            (``power_off``, ``power_on``, ``reboot``)
``instance.<action>.end``   (state, the action's task) to (state after,
                            none); also ``instance.reboot.error``
==========================  ================================================

:class:`StateChangeNotifier` wraps a service's notifier: after each of those it
sends the ``instance.update`` the change calls for, built from the same payload,
so the change costs no ledger read and is sent once exactly when the lifecycle
notification is (docs/notifications.rst, "Once per event").
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Mapping
from typing import Any

from qsched.notifications import payloads
from qsched.notifications.base import INFO, Notifier

VM_STATE, VM_AND_TASK_STATE = "vm_state", "vm_and_task_state"
UPDATE_VERSION = "2.1"
STATE_UPDATE_VERSION = "1.0"
AUDIT_PERIOD_VERSION = "1.0"
#: Fields of Nova's lifecycle payloads that ``InstanceUpdatePayload`` does not have.
NOT_IN_UPDATE = frozenset({"fault", "keypairs", "trusted_image_certificates", "instance_name"})
#: Instances whose delete or server action started here and did not end yet, kept
#: for their old state: at most this many of each, the oldest forgotten first.
MAX_UNDER_WAY = 10_000

BUILDING, ACTIVE, ERROR_STATE, DELETED = "building", "active", "error", "deleted"
SCHEDULING, SPAWNING, DELETING = "scheduling", "spawning", "deleting"
#: the server actions' notifications (agents/actions.py): ``<action>.start`` and ``.end``
ACTIONS = frozenset({"instance.power_off", "instance.power_on", "instance.reboot"})


class StateChangeNotifier(Notifier):
    """Sends what ``inner`` is told, and the ``instance.update`` each lifecycle
    notification implies under ``mode`` (``vm_state`` or ``vm_and_task_state``)."""

    def __init__(self, inner: Notifier, mode: str) -> None:
        if mode not in (VM_STATE, VM_AND_TASK_STATE):
            raise ValueError(f"notify_on_state_change {mode!r}: use {VM_STATE} or "
                             f"{VM_AND_TASK_STATE}")  # fmt: skip
        self.inner = inner
        self.mode = mode
        self._deleting: collections.OrderedDict[str, str] = collections.OrderedDict()
        # instances whose server action started here and did not end yet: (vm, task)
        self._acting: collections.OrderedDict[str, tuple[str, str | None]] = (
            collections.OrderedDict()
        )

    @property
    def enabled(self) -> bool:  # type: ignore[override]
        return self.inner.enabled

    def notify(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        priority: str = INFO,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        self.inner.notify(event_type, payload, priority, context)
        change = self._change(event_type, payload["nova_object.data"])
        if change is None:
            return
        (old_vm, old_task), (new_vm, new_task) = change
        if old_vm == new_vm and (self.mode == VM_STATE or old_task == new_task):
            return
        if self.mode == VM_STATE:  # Nova: both task fields carry the current task state
            old_task = new_task
        data = payload["nova_object.data"]
        update = update_payload(data, old_vm, new_vm, old_task, new_task)
        self.inner.notify("instance.update", update, INFO, context)

    def close(self) -> None:
        self.inner.close()

    def _change(
        self, event_type: str, data: Mapping[str, Any]
    ) -> tuple[tuple[str, str | None], tuple[str, str | None]] | None:
        """(old, new) (vm_state, task_state) that ``event_type`` tells of; None: none."""
        state = str(data.get("state"))
        if event_type == "instance.create.start":
            return (BUILDING, SCHEDULING), (BUILDING, SPAWNING)
        if event_type == "instance.create.end":
            return (BUILDING, SPAWNING), (ACTIVE, None)
        if event_type == "instance.create.error":
            if state == ERROR_STATE:
                return (BUILDING, SCHEDULING), (ERROR_STATE, None)
            return (BUILDING, SPAWNING), (BUILDING, SCHEDULING)  # given back, rescheduled
        if event_type == "instance.delete.start":
            _remember(self._deleting, str(data["uuid"]), state)
            return (state, None), (state, DELETING)
        if event_type == "instance.delete.end":
            before = self._deleting.pop(str(data["uuid"]), None) or state
            return (before, DELETING), (DELETED, None)
        action, _dot, phase = event_type.rpartition(".")
        if action in ACTIONS:
            return self._action_change(phase, str(data["uuid"]), state, data.get("task_state"))
        return None

    def _action_change(
        self, phase: str, uuid: str, state: str, task: str | None
    ) -> tuple[tuple[str, str | None], tuple[str, str | None]] | None:
        """A server action's: ``.start`` tells its task begun (the payload's task state),
        ``.end`` and ``.error`` its end, from the state ``.start`` told."""
        if phase == "start":
            _remember(self._acting, uuid, (state, task))
            return (state, None), (state, task)
        if phase in ("end", "error"):
            before = self._acting.pop(uuid, None) or (state, None)
            return before, (state, None)
        return None


def _remember(under_way: collections.OrderedDict[str, Any], uuid: str, state: Any) -> None:
    """Keep ``state`` for ``uuid`` until its end is told, forgetting the oldest past
    :data:`MAX_UNDER_WAY` (an end never told must not grow the process)."""
    under_way[uuid] = state
    while len(under_way) > MAX_UNDER_WAY:
        under_way.popitem(last=False)


def update_payload(
    data: Mapping[str, Any], old_vm: str, new_vm: str, old_task: str | None,
    new_task: str | None, now: datetime.datetime | None = None,
) -> dict:  # fmt: skip
    """``InstanceUpdatePayload`` 2.1 from a lifecycle payload's ``data`` and a change."""
    now = now or datetime.datetime.now(datetime.UTC)
    fields = {k: v for k, v in data.items() if k not in NOT_IN_UPDATE}
    fields.update(
        state=new_vm,
        task_state=new_task,
        old_display_name=None,
        tags=[],
        state_update=payloads.envelope(
            "InstanceStateUpdatePayload",
            STATE_UPDATE_VERSION,
            {
                "old_state": old_vm,
                "state": new_vm,
                "old_task_state": old_task,
                "new_task_state": new_task,
            },
        ),
        audit_period=payloads.envelope(
            "AuditPeriodPayload",
            AUDIT_PERIOD_VERSION,
            {
                # Nova's default [DEFAULT] instance_usage_audit_period: the month so far
                "audit_period_beginning": now.replace(
                    day=1, hour=0, minute=0, second=0, microsecond=0
                ).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "audit_period_ending": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        ),
    )
    return payloads.envelope("InstanceUpdatePayload", UPDATE_VERSION, fields)
