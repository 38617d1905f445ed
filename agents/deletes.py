"""Deletes at an agent: destroy what the ledger says was asked, then end it there.

A delete request only says which instance to look at: the record says whether its
delete was asked (its task_state ``deleting``, on this host and node). The step
destroys the VM with the virt driver, then ends the instance in the ledger, which
releases its claim and quota; the node index gives the resources back in the same
breath. A delete the ledger does not back is dead-lettered with the reason, touching
nothing; one done already is dropped.

A delete whose request was lost on the bus (or with a previous run of this agent) is
finished by :meth:`DeleteStep.finish`, which reads only this host's deleting set:
at start, and every half :data:`STUCK_DELETE_S` (no more often than the heartbeat).

Imports: the steps' shared parts (:mod:`agents.steps`), :mod:`agents.outcome`, the
ledger's values and the notifications.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from collections.abc import Iterator

from agents.outcome import DROP, ENDED, Outcome
from agents.steps import AgentParts
from qsched import exception
from qsched.ledger.base import Instance, Placement, State, TaskState
from qsched.notifications import payloads
from qsched.scheduling import message

#: A delete marked longer ago than this without its request arriving is done anyway.
STUCK_DELETE_S = 10.0


class Deletes:
    """The instances this agent is destroying now, from the driver's destroy to the
    ledger's end; thread-safe (a delete request and the sweep may meet), O(1) per call.

    Between the two the VM is gone while the record still says ACTIVE: a reconcile
    must not take that for an instance the driver lost.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uuids: Counter[str] = Counter()

    @contextlib.contextmanager
    def destroying(self, uuid: str) -> Iterator[None]:
        with self._lock:
            self._uuids[uuid] += 1
        try:
            yield
        finally:
            with self._lock:
                self._uuids[uuid] -= 1
                if not self._uuids[uuid]:
                    del self._uuids[uuid]

    def __contains__(self, uuid: object) -> bool:
        with self._lock:
            return uuid in self._uuids


class DeleteStep:
    """An agent's deletes (see the module docstring); ``in_flight``: those it is
    destroying now."""

    def __init__(self, parts: AgentParts) -> None:
        self.parts = parts
        self.in_flight = Deletes()

    def delete(self, msg: message.DeleteRequest) -> Outcome:
        """Destroy the instance a delete request names, if the ledger records that its
        delete was asked: ENDED; DROP one done already; DEAD_LETTER any other with the
        reason, touching nothing.

        One small read of the record (its state, host, node and task_state): the
        message only says which instance to look at.
        """
        host, uuid = self.parts.host, msg.instance_uuid
        inst = self.parts.stores.instances.placements([uuid]).get(uuid)
        if inst is not None and inst.state == State.DELETED and inst.host == host:
            # done (a redelivery), or ended while this agent was silent (a claim held for
            # it here): whatever of it still runs here goes now, and that claim with it
            self.destroy(uuid, inst.node or msg.node)
            return ENDED
        if inst is None or inst.state == State.DELETED:
            return DROP  # archived since, or ended on another host
        why = _not_asked(msg, inst, host)
        if why is not None:
            return Outcome.dead_letter("not_its_request", why)
        self.destroy(uuid, msg.node)
        return ENDED

    def destroy(self, uuid: str, node: str) -> None:
        """Destroy an instance of this host, then release its claim and quota."""
        before = self._deleting(uuid)
        with self.in_flight.destroying(uuid):
            ended = self._destroy_and_end(uuid, node)
        self.parts.counters["deleted"] += 1
        if before is not None and ended is not None:
            self.parts.notifier.notify("instance.delete.end", payloads.deleted(ended))

    def _destroy_and_end(self, uuid: str, node: str) -> Instance | None:
        """The driver's destroy, then the ledger's end: the record after (None: gone).

        The end also releases a claim of it held for this host (taken while this agent
        was silent: the API deleted it locally, or a janitor): its VM is gone now. The
        node is then read again, as the index did not hold that claim as the
        instance's.
        """
        parts = self.parts
        ended: Instance | None = None
        end = functools.partial(parts.stores.instances.delete, uuid, destroyed_on=parts.host)
        if node not in parts.index:
            with contextlib.suppress(exception.InstanceNotFound):
                ended = end()
            return ended
        parts.driver.destroy(uuid, node)
        with parts.index.writing(node):
            allocations = parts.stores.ledger.get_allocations(uuid).allocations
            with contextlib.suppress(exception.InstanceNotFound):
                ended = end()
            # a move under way: the instance's consumer may hold the other host's side,
            # and the end releases this host's from the migration's (move_end)
            shared = {provider.uuid for provider in parts.index.sharing()}
            here = set(allocations) <= parts.index.node(node).uuids | shared
            if allocations and here:
                parts.index.release(node, allocations)
        if not allocations or not here:  # released before, held until now, or moving
            parts.reconciler.refresh_nodes([node])
        return ended

    def _deleting(self, uuid: str) -> Instance | None:
        """With notifications on: read the record and send ``instance.delete.start``,
        unless it is DELETED already (a delete request delivered again); the record
        read, or None. With them off: nothing read, None."""
        notifier = self.parts.notifier
        if not notifier.enabled:
            return None
        try:
            inst = self.parts.stores.instances.get(uuid)
        except exception.InstanceNotFound:
            return None
        if inst.state == State.DELETED:
            return None
        notifier.notify("instance.delete.start", payloads.action_from_record(inst))
        return inst

    def finish(self, marked_before: float | None = None) -> int:
        """Finish deletes of this host's instances marked before ``marked_before``.

        Catches a delete request lost on the bus (or with a previous run of this
        agent): reads only this host's deleting set, and where those instances are
        in one round trip.
        """
        parts, done = self.parts, 0
        marked = [
            u
            for u in parts.stores.instances.deleting(parts.host, marked_before)
            if u not in parts.builds
        ]  # a spawn ends first; its delete is still due
        for uuid, inst in parts.stores.instances.placements(marked).items():
            self.destroy(uuid, inst.node or "")
            done += 1
        return done


def _not_asked(msg: message.DeleteRequest, inst: Placement, host: str) -> str | None:
    """Why the ledger does not back a delete request of an instance placed as ``inst``
    on ``host``, or None."""
    uuid = msg.instance_uuid
    if inst.host != host or inst.node != msg.node:
        where = f"{inst.host or 'no host'}, node {inst.node or 'none'}"
        return (f"a delete of {uuid} for host {msg.host}, node {msg.node} reached "
                f"{host}, but its record places it on {where}")  # fmt: skip
    if inst.task_state != TaskState.DELETING:
        task = inst.task_state.value or "none"
        return (f"the ledger records no delete of {uuid}: it is {inst.state.value} with "
                f"task_state {task}")  # fmt: skip
    return None
