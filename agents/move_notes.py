"""What the steps of a move tell, once each step happened in the ledger: Nova's versioned
notifications of moves (docs/notifications.rst) and the agent's counts of them
(``qsched_agent_moves_total``, docs/metrics.rst).

Each is sent by the caller whose ledger step succeeded (the finish, confirm, revert,
send or rollback it made), so a redelivered step tells nothing twice; ``.start`` and
``.end`` leave together after the step, as a server action's do (agents/actions.py).
With notifications off nothing is read: a count costs one increment.
"""

from __future__ import annotations

import dataclasses

from agents.steps import AgentParts
from qsched import exception
from qsched.notifications import payloads


@dataclasses.dataclass(frozen=True)
class _Note:
    """One notification of a move: the vm_state and task_state before and after it;
    ``single``: one event with no ``.start`` and ``.end`` (Nova's ``instance.evacuate``)."""

    before: tuple[str, str | None]
    after: tuple[str, str | None]
    single: bool = False


_MIGRATING = ("active", "migrating")
_ACTIVE = ("active", None)
NOTES = {
    "resize_finish": _Note(("active", "resize_finish"), ("resized", None)),
    "resize_confirm": _Note(("resized", None), _ACTIVE),
    "resize_revert": _Note(("resized", "resize_reverting"), _ACTIVE),
    "live_migration_pre": _Note(_MIGRATING, _MIGRATING),
    "live_migration_force_complete": _Note(_MIGRATING, _MIGRATING),
    "live_migration_post": _Note(_MIGRATING, _ACTIVE),
    "live_migration_rollback": _Note(_MIGRATING, _ACTIVE),
    "live_migration_abort": _Note(_MIGRATING, _ACTIVE),
    "evacuate": _Note(("active", "rebuild_spawning"), _ACTIVE, single=True),
    "unshelve": _Note(("shelved_offloaded", "spawning"), _ACTIVE),
}
#: what a destination's finish ends a move in, and its notification there
FINISHED = {"finished": "resize_finish", "running": "live_migration_pre", "done": "evacuate",
            "completed": "unshelve"}  # fmt: skip
#: the outcomes counted, by the step that counts them
OUTCOMES = ("in", "failed", "confirmed", "reverted", "sent", "rolled_back", "cancelled")


def counted(parts: AgentParts, kind: str, outcome: str) -> None:
    """Count one move step of ``kind`` with ``outcome`` (one of :data:`OUTCOMES`)."""
    parts.counters[f"move:{kind}:{outcome}"] += 1


def tell(parts: AgentParts, name: str, instance_uuid: str, request_id: str) -> None:
    """Send ``instance.<name>`` (``.start`` and ``.end``) of a move step that happened,
    with the server's record as it is now; nothing when notifications are off."""
    notifier = parts.notifier
    if not notifier.enabled:
        return
    try:
        inst = parts.stores.instances.get(instance_uuid)
    except exception.InstanceNotFound:
        return
    note, asked = NOTES[name], {"request_id": request_id}
    (state, task), (after, after_task) = note.before, note.after
    if note.single:
        payload = payloads.action_from_record(inst, task_state=after_task, state=after, **asked)
        notifier.notify(f"instance.{name}", payload, context=asked)
        return
    before = payloads.action_from_record(inst, task_state=task, state=state, **asked)
    notifier.notify(f"instance.{name}.start", before, context=asked)
    done = payloads.action_from_record(inst, task_state=after_task, state=after, **asked)
    notifier.notify(f"instance.{name}.end", done, context=asked)
