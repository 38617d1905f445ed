"""The steps of a move a host takes from its own queue: confirm at the source, revert
at the destination, a live migration's send at the source (docs/moves.rst).

The API asked the ledger for the step (``confirming``, ``reverting``), or a live
migration's destination said it is ready (``running``), and published a
:class:`~qsched.scheduling.message.MoveStep` to the host that acts:

=========  ==========================================================================
confirm    The source's copy is destroyed, then the ledger releases the source's side
           (the migration's consumer) and the move is ``confirmed``.
revert     The destination's copy is destroyed, then the ledger gives the server back
           its source's side, old flavor and quota, and the move is ``reverted``.
live       The source's driver sends the server to the destination
           (:meth:`~agents.virt.base.VirtDriver.live_migrate`), then the ledger
           releases the source's side and the move is ``completed``. If the driver
           could not, the server stays and the move ``failed`` (Nova's rollback):
           the destination's side is released, its copy left to its reconcile. The
           driver reads what an admin asked meanwhile (``force_complete``: it ends
           the copy now; ``abort``: it stops, and the move ends ``cancelled``).
=========  ==========================================================================

A resize in place has one copy, which stays: its revert gives the ledger back what the
server held before and touches nothing in the driver (its confirm ends at the API).
Each step is admitted by the migration's status and host, so a redelivery or a step
that moved on is dropped; the driver's destroy is idempotent. The node's view follows
the ledger: what the step released is released in the index too.

A step whose message never arrives (the API died between the ledger and the broker),
and a destination's claim whose build this agent no longer holds (a previous run of
it died while the server came up), would wait forever: :meth:`MoveSteps.finish_stuck`
(at start, then every ``STUCK_MOVE_S / 2``) reads this host's moves under way
(``host:<host>:migrations``, O(moves here)) and takes such a step again, or finishes
such a build if the driver runs the server, else gives it back to the migration for
another destination.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from agents import move_notes
from agents.steps import AgentParts
from agents.virt.base import MigrationFailed
from qsched import exception
from qsched.ledger.base import Migration
from qsched.scheduling.message import MoveStep
from qsched.scheduling.records import move_request_for

LOG = logging.getLogger(__name__)

#: A step of a move left this long without its message settling it is taken again.
STUCK_MOVE_S = 60.0
#: the statuses of a move a destination claimed and has not finished
_CLAIMED = frozenset({"migrating", "preparing", "post-migrating"})

#: the migration's status a step is taken from
_FROM = {"confirm": "confirming", "revert": "reverting", "live": "running"}


class MoveSteps:
    """The move steps of one agent's host; see the module docstring."""

    def __init__(self, parts: AgentParts) -> None:
        self.parts = parts

    def run(self, msg: MoveStep) -> str:
        """Take one step: ``done``, or ``dropped`` (the move is not at it on this host).

        :raises BackendUnavailable: the ledger does not answer (the delivery goes back to
            the broker; the step is safe to repeat).
        """
        parts = self.parts
        try:
            move = parts.stores.migrations.get(msg.migration)
        except exception.MigrationNotFound:
            return self._dropped(msg, "no such migration")
        confirm = msg.step == "confirm"
        host, node = (
            (move.dest_compute, move.dest_node or "") if msg.step == "revert"
            else (move.source_compute, move.source_node)
        )  # fmt: skip
        if (
            move.status != _FROM[msg.step]
            or host != parts.host
            or move.instance_uuid != (msg.instance_uuid)
        ):
            return self._dropped(msg, f"the move is {move.status}")
        if msg.step == "live":
            return self._send(move)
        in_place = move.source_compute == move.dest_compute
        consumer = move.uuid if confirm else move.instance_uuid
        held = parts.stores.ledger.get_allocations(consumer).allocations
        if not in_place and node in parts.index:
            parts.driver.destroy(move.instance_uuid, node)
        here = node in parts.index
        with parts.index.writing(node) if here else contextlib.nullcontext():
            settled = self._settle(move, confirm)
            if not in_place and node in parts.index:
                parts.index.release(node, held)
        if settled:
            move_notes.counted(parts, move.kind, "confirmed" if confirm else "reverted")
            name = "resize_confirm" if confirm else "resize_revert"
            move_notes.tell(parts, name, move.instance_uuid, msg.request_id)
        if in_place and node in parts.index:
            parts.reconciler.refresh_nodes([node])
        parts.counters[f"move_{msg.step}ed"] += 1
        LOG.info("agent %s: %s of move %s (%s) done", parts.host, msg.step, move.uuid,
                 move.instance_uuid)  # fmt: skip
        return "done"

    def _send(self, move: Migration) -> str:
        """A live migration's send at its source: ``done`` (completed) or ``failed``
        (rolled back: the server stays here)."""
        parts, uuid, node = self.parts, move.instance_uuid, move.source_node
        held = parts.stores.ledger.get_allocations(move.uuid).allocations
        here = node in parts.index
        if here and uuid in parts.driver.list_instances(node):
            try:
                parts.driver.live_migrate(uuid, node, move.dest_compute or "",
                                          move.block_migration, self._asked(move))  # fmt: skip
            except MigrationFailed as exc:
                LOG.warning("agent %s: live migration %s of %s failed: %s", parts.host,
                            move.uuid, uuid, exc)  # fmt: skip
                try:
                    parts.stores.migrations.fail(move.uuid, parts.host, str(exc), retry=False)
                except exception.MoveNotUnderWay:
                    pass
                else:
                    self._rolled_back(move)
                parts.counters["live_migrations_failed"] += 1
                return "failed"
        with parts.index.writing(node) if here else contextlib.nullcontext():
            try:
                parts.stores.migrations.finish(move.uuid, parts.host)
            except exception.MoveNotUnderWay:
                LOG.info("agent %s: move %s moved on meanwhile", parts.host, move.uuid)
                return "done"
            if here:
                parts.index.release(node, held)
        parts.counters["live_migrations"] += 1
        move_notes.counted(parts, move.kind, "sent")
        if parts.stores.migrations.get(move.uuid).asked == "force_complete":
            move_notes.tell(parts, "live_migration_force_complete", uuid, move.request_id)
        move_notes.tell(parts, "live_migration_post", uuid, move.request_id)
        return "done"

    def _rolled_back(self, move: Migration) -> None:
        """A live migration its source did not send: ``cancelled`` by an admin's abort,
        else rolled back."""
        parts = self.parts
        cancelled = parts.stores.migrations.get(move.uuid).status == "cancelled"
        move_notes.counted(parts, move.kind, "cancelled" if cancelled else "rolled_back")
        name = "live_migration_abort" if cancelled else "live_migration_rollback"
        move_notes.tell(parts, name, move.instance_uuid, move.request_id)

    def _asked(self, move: Migration) -> Callable[[], str]:
        """What an admin asked of a live migration since (``force_complete``, ``abort``),
        read from its record in the ledger; "" when the ledger does not answer (the copy
        goes on, and the next read may know)."""
        migrations = self.parts.stores.migrations

        def asked() -> str:
            try:
                return migrations.get(move.uuid).asked
            except exception.BackendUnavailable:
                return ""

        return asked

    def finish_stuck(self, before: float | None = None) -> int:
        """Take again the steps of this host's moves last changed before ``before`` (None:
        every one, at start) that no message settled; finish or give back its claims
        whose build it does not hold. Returns how many it took."""
        parts, done = self.parts, 0
        for move in parts.stores.migrations.on_host(parts.host):
            if before is not None and move.updated_at >= before:
                continue
            uuid = move.instance_uuid
            if move.status == "confirming" and move.source_compute == parts.host:
                step = MoveStep(move.request_id or f"req-{uuid}", uuid, parts.host,
                                move.source_node, move.uuid, "confirm")  # fmt: skip
            elif move.status == "reverting" and move.dest_compute == parts.host:
                step = MoveStep(move.request_id or f"req-{uuid}", uuid, parts.host,
                                move.dest_node or "", move.uuid, "revert")  # fmt: skip
            elif move.status == "running" and move.source_compute == parts.host:
                step = MoveStep(move.request_id or f"req-{uuid}", uuid, parts.host,
                                move.source_node, move.uuid, "live")  # fmt: skip
            elif move.status in _CLAIMED and move.dest_compute == parts.host:
                if uuid in parts.builds:
                    continue
                self._claimed_orphan(move)
                done += 1
                continue
            else:
                continue
            LOG.warning("agent %s: the %s of move %s did not arrive; doing it now",
                        parts.host, step.step, move.uuid)  # fmt: skip
            self.run(step)
            done += 1
        return done

    def _claimed_orphan(self, move: Migration) -> None:
        """A claim of this host as a move's destination that no build here holds: finish
        it if the driver runs the server on its node, else give it back to the migration
        and publish its request again (or it ends, attempts used up)."""
        parts, uuid, node = self.parts, move.instance_uuid, move.dest_node or ""
        runs = node in parts.index and uuid in parts.driver.list_instances(node)
        try:
            if runs:
                status = parts.stores.migrations.finish(move.uuid, parts.host)
                LOG.warning("agent %s: move %s of %s had come up here; finished", parts.host,
                            move.uuid, uuid)  # fmt: skip
                if status == "running":  # a live migration: its source sends it now
                    step = MoveStep(
                        move.request_id or f"req-{uuid}",
                        uuid,
                        move.source_compute,
                        move.source_node,
                        move.uuid,
                        "live",
                    )
                    parts.bus.publish_action(step.host, step)  # fmt: skip
                return
            why = f"its destination {parts.host} restarted before the server came up there"
            again = parts.stores.migrations.fail(move.uuid, parts.host, why, retry=True)
        except (exception.MoveNotUnderWay, exception.MigrationNotFound):
            return
        if node in parts.index:
            parts.reconciler.refresh_nodes([node])
        if again:
            moved = parts.stores.migrations.get(move.uuid)
            parts.bus.publish_boot(move_request_for(parts.stores.instances.get(uuid), moved))

    def _settle(self, move: Migration, confirm: bool) -> bool:
        """End a confirm or a revert; whether this call did (not: it moved on)."""
        migrations, host = self.parts.stores.migrations, self.parts.host
        step = migrations.confirm if confirm else migrations.revert
        try:
            result = step(move.uuid, "done", host)
        except exception.MoveNotUnderWay:
            LOG.info("agent %s: move %s moved on meanwhile", host, move.uuid)
            return False
        return not result.get("already")

    def _dropped(self, msg: MoveStep, why: str) -> str:
        self.parts.counters["move_steps_dropped"] += 1
        LOG.info("agent %s: %s of migration %s dropped: %s", self.parts.host, msg.step,
                 msg.migration, why)  # fmt: skip
        return "dropped"
