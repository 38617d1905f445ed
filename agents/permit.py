"""Permit: the spawns of a multi-create wait until every member holds its claim.

kube-scheduler calls this step Permit, and coscheduling plug-ins use it to hold a
gang. Here the claim script counts the claimed members of a batch and says, with
each claim, whether the batch is complete (``Claim.permitted``). A build whose batch
is not complete waits in :class:`Permit` instead of going to a spawn worker; every
:data:`POLL_S` the agent reads, in two pipelined round trips, where its waiting
builds are and the state of their batches:

* permitted (the last member was claimed, here or on another host): spawn;
* the instance ended, or the claim is gone (the batch failed: one member ended in
  ERROR, and the ledger ended every other one with it, claims released; or it was
  deleted, or a janitor took the claim back): forget it, and the index gives the
  node's resources back.

The deadline bounds the wait: a member nobody can place ends in ERROR at its deadline,
and with it every member of its batch, so no claim is kept for a batch that cannot be
whole. The cost is O(builds waiting on this agent) per poll, whatever the cloud's size.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agents.steps import AgentParts
from qsched.ledger.base import State

LOG = logging.getLogger(__name__)

#: How often an agent looks whether the batches of its waiting builds are complete.
POLL_S = 0.2


class Permit:
    """The builds of this agent whose batch is not complete yet (thread-safe)."""

    def __init__(self, parts: AgentParts, spawn: Callable[[str], object]) -> None:
        self.parts = parts
        self.spawn = spawn  # hands a build to a spawn worker
        self._waiting: dict[str, str] = {}  # instance uuid -> reservation id
        self._lock = threading.Lock()

    def spawn_or_wait(self, uuid: str) -> None:
        """Spawn a build just claimed, or hold it until its batch is complete."""
        build = self.parts.builds.get(uuid)
        if build is None or build.permitted or build.batch is None:
            self.spawn(uuid)
            return
        with self._lock:
            self._waiting[uuid] = build.batch
        self.parts.counters["permit_waiting"] += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    def check(self) -> None:
        """Spawn the waiting builds whose batch is complete; forget those that ended."""
        with self._lock:
            waiting = dict(self._waiting)
        if not waiting:
            return
        stores, host = self.parts.stores, self.parts.host
        where = stores.instances.placements(list(waiting))
        states = stores.instances.batches(sorted(set(waiting.values())))
        for uuid, batch in waiting.items():
            placed = where.get(uuid)
            if placed is None or placed.state != State.BUILD or placed.host != host:
                self._forget(uuid, "ended or taken back while its batch waited")
            elif states.get(batch, "permitted") == "permitted":  # not kept: on its own
                self._release(uuid)

    def _release(self, uuid: str) -> None:
        with self._lock:
            if self._waiting.pop(uuid, None) is None:
                return
        self.parts.counters["permitted"] += 1
        self.spawn(uuid)

    def _forget(self, uuid: str, why: str) -> None:
        with self._lock:
            if self._waiting.pop(uuid, None) is None:
                return
        build = self.parts.builds.pop(uuid)
        if build is not None:  # the ledger released its claim: so does the index
            self.parts.index.release(build.pick.node, build.pick.allocations)
        LOG.info("agent %s: build %s %s", self.parts.host, uuid, why)
