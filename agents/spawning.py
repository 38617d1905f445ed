"""After the claim: spawn, settle, or give back. Runs in the agent's spawn workers.

=========  ==========================================================================
spawn      The virt driver builds the instance on the claimed node. Its VM starts
           only while the agent's lease holds (:mod:`agents.lease`): past it, the
           build waits for a heartbeat and goes on only if its claim is still its own.
settle     The record says ACTIVE and the build ends. If the ledger no longer lets
           it (deleted, past its deadline, taken back by a janitor while it
           spawned), the instance is destroyed, a claim of it held for this host
           released, and the node read again.
give back  The spawn failed: the claim is released and the request requeued as
           its next attempt (a reschedule), or ended in NoValidHost once
           ``max_attempts`` is used up.
=========  ==========================================================================

A worker holds a claim nobody else finishes, so each ledger write retries through
an outage (:meth:`~agents.steps.AgentParts.persist`) instead of giving up.

A move's build (docs/moves.rst) is the destination's part of the move: the driver
receives the server (:meth:`~agents.virt.base.VirtDriver.receive`), the settle is the
migration's finish (a resize or a cold migration then waits for a confirm), and a
failure gives the claim back to the migration, which waits for another destination
(never this one) while attempts are left, or ends with the server on its source.
"""

from __future__ import annotations

import functools
import logging
import time

from agents import move_notes
from agents.steps import AgentParts, Build
from agents.virt.base import SpawnFailed, SpawnFenced
from qsched import exception
from qsched.ledger.base import Instance, Migration, State
from qsched.notifications import payloads
from qsched.notifications.base import ERROR
from qsched.scheduling.message import MoveStep
from qsched.scheduling.records import details

LOG = logging.getLogger(__name__)

#: How often a build waiting for its agent's lease reads whether its claim was taken.
LEASE_POLL_S = 0.5


class Spawner:
    """A spawn worker's steps for one claimed build (see the module docstring)."""

    def __init__(self, parts: AgentParts) -> None:
        self.parts = parts

    def spawn(self, uuid: str) -> None:
        """Spawn a held build, then settle it or give it back.

        The VM starts only while the agent's lease has held without a lapse since the
        claim was known to be this host's (the driver's ``fence``): after a lapse, the
        build waits for a heartbeat to renew the lease, and goes on only if the ledger
        says its claim is still this host's (:meth:`leased`).
        """
        build = self.parts.builds.get(uuid)
        if build is None:
            return
        parts, node, term, msg = self.parts, build.pick.node, build.term, build.request
        while (term := self.leased(build, term)) is not None:
            fence = functools.partial(parts.lease.holds, term)
            try:
                if msg.moves:
                    parts.driver.receive(uuid, node, msg.to_flavor(), msg.source_host or "",
                                         fence=fence)  # fmt: skip
                else:
                    parts.driver.spawn(uuid, node, msg.to_flavor(), fence=fence)
            except SpawnFenced:
                parts.counters["spawn_fenced"] += 1  # nothing started: again, if still ours
                continue
            except SpawnFailed as exc:
                self.give_back(build, str(exc))
            except Exception as exc:  # a driver bug must not leak the claim
                LOG.exception("agent %s: spawn of %s crashed", parts.host, uuid)
                self.give_back(build, f"spawn crashed: {exc}")
            else:
                self.settle(build)
            return

    def leased(self, build: Build, term: int | None) -> int | None:
        """The lease term under which the build's claim is known to be this host's, or
        None: let go (the claim was taken; nothing of it runs here, :meth:`let_go`) or
        left to the ledger (the agent stops: its next start, or a janitor).

        While the lease has held since ``term`` (the claim's), at once, nothing read.
        After a lapse (a heartbeat overdue, the service forced down) a janitor may
        have taken the claim: the build waits, reading its record every
        :data:`LEASE_POLL_S` (this path only), until the lease holds again with the
        claim still this host's, read after the renewal.
        """
        parts, uuid = self.parts, build.request.instance_uuid
        if parts.lease.holds(term):
            return term
        LOG.warning("agent %s: its lease lapsed (heartbeat overdue or service forced "
                    "down); the spawn of %s waits", parts.host, uuid)  # fmt: skip
        while True:
            parts.lease.wait(LEASE_POLL_S)
            renewed = parts.lease.current()  # before the read: the read must come after
            if parts.stopped.is_set():
                self.forget(uuid)
                return None
            try:
                ours = self._still_ours(build)
            except exception.BackendUnavailable:
                continue
            if not ours:
                LOG.warning("agent %s: the claim of %s was taken while its lease lapsed; "
                            "nothing of it was started here", parts.host, uuid)  # fmt: skip
                parts.counters["spawn_taken"] += 1
                self.let_go(uuid, build.pick.node)
                return None
            if renewed is not None and parts.lease.holds(renewed):
                return renewed

    def _still_ours(self, build: Build) -> bool:
        """Whether the ledger has the build claimed by this host on its node still."""
        parts, uuid, migration = self.parts, build.request.instance_uuid, build.request.migration
        if migration is not None:
            try:
                move = parts.stores.migrations.get(migration)
            except exception.MigrationNotFound:
                return False
            mine = (move.dest_compute, move.dest_node) == (parts.host, build.pick.node)
            return mine and not move.waiting and not move.final
        inst = parts.stores.instances.placements([uuid]).get(uuid)
        if inst is None:
            return False
        return (inst.state, inst.host, inst.node) == (State.BUILD, parts.host, build.pick.node)

    def settle(self, build: Build) -> None:
        """Record the spawned instance ACTIVE (a move: finished here) and end the build."""
        parts, msg, node = self.parts, build.request, build.pick.node
        uuid = msg.instance_uuid
        if msg.migration is not None:
            self._finish_move(build, msg.migration)
            return
        try:
            went = parts.persist(
                msg, lambda: parts.stores.instances.set_active(uuid, parts.host, node)
            )
            parts.counters["active"] += 1
            if went:
                self._notify_active(build)
            LOG.info("[%s global %s] instance %s ACTIVE on %s", msg.request_id,
                     msg.global_request_id or "-", uuid, node)  # fmt: skip
        except (exception.InstanceNotWaiting, exception.InstanceNotFound):
            # The ledger took its claim (deleted, past its deadline, taken while this
            # agent was silent): the VM goes, then a claim held for it here.
            parts.driver.destroy(uuid, node)
            self.let_go(uuid, node)
            parts.republish_if_waiting(uuid, f"the ledger no longer held the claim of "
                                       f"{parts.host} when its spawn ended")  # fmt: skip
            return
        self.forget(uuid)

    def _finish_move(self, build: Build, migration: str) -> None:
        """The server runs here: the move's finish in the ledger. A move that ended
        meanwhile (the server deleted) leaves nothing of it here."""
        parts, msg, node = self.parts, build.request, build.pick.node
        uuid = msg.instance_uuid
        try:
            status = parts.persist(
                msg, lambda: parts.stores.migrations.finish(migration, parts.host)
            )
        except exception.MoveAborted:  # an admin aborted the live migration: give it back
            parts.driver.destroy(uuid, node)
            self._give_back_move(build, migration, "aborted by an admin")
            return
        except (exception.MoveNotUnderWay, exception.MigrationNotFound):
            if (msg.source_host or "") != parts.host:  # a resize in place is the server
                parts.driver.destroy(uuid, node)
            self.let_go(uuid, node)
            return
        move = parts.stores.migrations.get(migration)
        move_notes.counted(parts, move.kind, "in")
        move_notes.tell(parts, move_notes.FINISHED[status], uuid, msg.request_id)
        if status == "running":  # a live migration: its source sends the server now
            self._send_for(build, move)
        parts.counters["moved_in"] += 1
        LOG.info("[%s] instance %s moved to %s (%s, migration %s)", msg.request_id, uuid, node,
                 status, migration)  # fmt: skip
        self.forget(uuid)

    def _send_for(self, build: Build, move: Migration) -> None:
        """A live migration whose destination is ready here: its source's agent sends the
        server (a ``live`` move step to its queue); if the broker does not take it, the
        source's sweep of its moves does it."""
        parts, msg = self.parts, build.request
        source, migration = msg.source_host or "", move.uuid
        step = MoveStep(msg.request_id, msg.instance_uuid, source, move.source_node, migration,
                        "live")  # fmt: skip
        try:
            parts.bus.publish_action(source, step)
        except exception.BackendUnavailable:
            LOG.warning("agent %s: the send of move %s was not published; %s's sweep of its "
                        "moves sends it", parts.host, migration, source)  # fmt: skip

    def give_back(self, build: Build, reason: str) -> None:
        """Release the claim of a failed spawn and reschedule the request."""
        if build.request.migration is not None:
            self._give_back_move(build, build.request.migration, reason)
            return
        parts, msg, node = self.parts, build.request, build.pick.node
        uuid = msg.instance_uuid
        parts.counters["spawn_failed"] += 1
        try:
            with parts.index.writing(node):
                inst = parts.persist(
                    msg, lambda: parts.stores.instances.requeue(uuid, parts.host, reason)
                )
                self.forget(uuid, release=True)
        except (exception.InstanceNotWaiting, exception.InstanceNotFound):
            self.let_go(uuid, node)  # its claim was taken under it; nothing of it runs
            parts.republish_if_waiting(uuid, f"the ledger no longer held the claim of "
                                       f"{parts.host} when its spawn failed")  # fmt: skip
            return
        self._notify_failed(build, inst, reason)
        if inst.state != State.BUILD:
            return  # it was being deleted: the ledger ended it
        if inst.attempts >= _max_attempts(inst, msg.max_attempts):
            # The requeue put it in the outbox, but it goes out no more: out of the outbox
            # first, or its end would read as a request never published.
            parts.persist(msg, lambda: parts.stores.instances.outbox_done([(uuid, inst.outbox)]))
            parts.no_valid_host(uuid, "max_attempts")
            return
        try:
            parts.persist(msg, lambda: parts.bus.publish_boot(msg.next_attempt(parts.host)))
            parts.stores.instances.outbox_done([(uuid, inst.outbox)])
        except exception.BackendUnavailable:
            LOG.error("agent %s: could not reschedule %s; the janitor publishes it from the "
                      "outbox", parts.host, uuid)  # fmt: skip

    def _give_back_move(self, build: Build, migration: str, reason: str) -> None:
        """A move that could not come up here: the claim goes back to the migration,
        which waits for another destination (published again) or ended (attempts used
        up: the server stays on its source)."""
        parts, msg, node = self.parts, build.request, build.pick.node
        parts.counters["move_failed"] += 1
        try:
            with parts.index.writing(node):
                again = parts.persist(
                    msg, lambda: parts.stores.migrations.fail(migration, parts.host, reason, True)
                )
                self.forget(msg.instance_uuid, release=(msg.source_host or "") != parts.host)
        except (exception.MoveNotUnderWay, exception.MigrationNotFound):
            self.let_go(msg.instance_uuid, node)
            return
        move = parts.stores.migrations.get(migration)
        move_notes.counted(
            parts, move.kind, "cancelled" if move.status == "cancelled" else "failed"
        )
        if (msg.source_host or "") == parts.host:
            parts.reconciler.refresh_nodes([node])
        if not again:
            LOG.warning("agent %s: move %s of %s ended: %s", parts.host, migration,
                        msg.instance_uuid, reason)  # fmt: skip
            return
        try:
            parts.persist(msg, lambda: parts.bus.publish_boot(msg.next_attempt(parts.host)))
        except exception.BackendUnavailable:
            LOG.error("agent %s: could not publish move %s again; it ends at its deadline",
                      parts.host, migration)  # fmt: skip

    def _notify_active(self, build: Build) -> None:
        """``instance.create.end``: from the claim's ``.start`` when it was sent here,
        else from the request; no ledger read."""
        notifier = self.parts.notifier
        if notifier.enabled:
            msg, now = build.request, time.time()
            started = build.told.get("instance.create.start")
            if started is not None:
                payload = payloads.create_ended(started, now)
            else:  # claimed with notifications off, or by a redelivery
                payload = payloads.create_from_request(
                    msg, self.parts.host, build.pick.node, "active", None, "running", now
                )  # fmt: skip
            notifier.notify("instance.create.end", payload, context=payloads.context(msg))

    def _notify_failed(self, build: Build, inst: Instance, reason: str) -> None:
        """``instance.create.error`` of a failed spawn, as Nova's compute sends before a
        reschedule: the fault is the spawn's, the record the one the requeue returned."""
        notifier = self.parts.notifier
        if notifier.enabled:
            fault = payloads.fault(reason, "RescheduledException", __name__, "spawn")
            payload = payloads.create_from_record(inst, fault)
            payload["nova_object.data"].update(host=self.parts.host, node=build.pick.node)
            notifier.notify("instance.create.error", payload, ERROR,
                            payloads.context(build.request))  # fmt: skip

    def let_go(self, uuid: str, node: str) -> None:
        """End a build whose claim the ledger took while nothing of it runs here (any
        more): a claim held for this host of it is released (one script, on this path
        only; if the ledger does not answer, the next reconcile does it), and the node
        is read again; the build ends last, so that whoever sees it gone sees the node
        as the ledger has it."""
        parts = self.parts
        try:
            parts.stores.ledger.release_held(parts.host, uuid)
        except exception.BackendUnavailable:
            LOG.warning("agent %s: the claim held for it of %s stays until a reconcile",
                        parts.host, uuid)  # fmt: skip
        parts.reconciler.refresh_nodes([node])
        self.forget(uuid)

    def forget(self, uuid: str, release: bool = False) -> None:
        """End a build; ``release``: the agent released its claim, free it here too."""
        build = self.parts.builds.pop(uuid)
        if build is not None and release:
            self.parts.index.release(build.pick.node, build.pick.allocations)


def _max_attempts(inst: Instance, asked: int) -> int:
    """The attempts its record allows (the front door's ``[scheduler] max_attempts`` when
    it booted), not the message's; ``asked`` for a record no front door made."""
    try:
        return details(inst).max_attempts
    except exception.Invalid:
        return asked
