"""Empty a disabled host by moving its servers away (``qsched-admin service drain``).

Each server of the host goes by live migration when it runs, by cold migration
(confirmed here once it is up on its new host) when it is stopped, through the queues
as any move (docs/moves.rst): so many at a time, each waited for until its move ends
or the time given runs out. What could not move says why: the API's refusal (a task
under way, a server in ERROR), the move's fault (no host could take it), or that it
was still moving when the time ran out. novaclient's ``host-evacuate-live`` is a
client loop with no such report.

The host's servers are read from its hypervisors (an admin view: it scans the cell's
hypervisors once); each move then costs what the API's move costs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from qsched import exception
from qsched.compute.cell import Cell
from qsched.compute.hypervisors import HypervisorAPI
from qsched.context import RequestContext
from qsched.ledger.base import Instance, Migration, State

#: how often a move is read while it is waited for
POLL_S = 0.5


class HostNotDisabled(exception.Invalid):
    msg_fmt = (
        "Host {host}'s compute service is enabled: new boots would land on it while it "
        "drains. Disable it first: qsched-admin service set {host} --disable "
        "--disable-reason 'draining'."
    )


@dataclasses.dataclass(frozen=True)
class Drained:
    """What became of one server: ``moved`` (to ``host``), ``failed`` (its move ended
    without moving it), ``refused`` (the API would not move it), ``timeout`` (still
    moving when the time ran out); ``kind``: live or cold; ``why``: the reason."""

    uuid: str
    name: str
    outcome: str
    kind: str
    host: str | None
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Drain:
    """The moves that empty one host of one cell, as ``context`` (an admin) asks them."""

    def __init__(
        self,
        cell: Cell,
        context: RequestContext,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cell = cell
        self.context = context
        self.clock = clock
        self.sleep = sleep

    def servers(self, host: str) -> list[Instance]:
        """The servers whose claims are on ``host``'s nodes, by name.

        :raises ComputeHostNotFound: the host has no compute service.
        :raises HostNotDisabled: its service takes new boots.
        """
        if not self.cell.stores.agents.service(host).disabled:
            raise HostNotDisabled(host=host)
        hypervisors = HypervisorAPI(self.cell.stores, self.cell.policy)
        try:
            found = hypervisors.search(host, with_servers=True)
        except exception.NotFound:
            return []
        uuids = sorted({s.uuid for v in found if v.provider.host == host for s in v.servers or ()})
        records = self.cell.stores.instances.get_many(uuids)
        placed = [r for r in records.values() if r.host == host and r.state != State.DELETED]
        return sorted(placed, key=lambda r: (r.name, r.uuid))

    def run(
        self,
        servers: list[Instance],
        concurrency: int,
        timeout_s: float,
        on_done: Callable[[Drained], None] | None = None,
    ) -> list[Drained]:
        """Move ``servers`` away, ``concurrency`` at a time; each result as it ends."""
        deadline = self.clock() + timeout_s
        results = []
        with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as pool:
            futures = [pool.submit(self.move, server, deadline) for server in servers]
            for future in concurrent.futures.as_completed(futures):
                result = future.result()
                results.append(result)
                if on_done is not None:
                    on_done(result)
        return sorted(results, key=lambda r: (r.name, r.uuid))

    def move(self, server: Instance, deadline: float) -> Drained:
        """Move one server away and wait for its move to end (or ``deadline``)."""
        moves = self.cell.moves
        kind = "cold" if server.stopped else "live"
        try:
            if kind == "live":
                migration = moves.live_migrate(self.context, server.uuid)
            else:
                migration = moves.migrate(self.context, server.uuid)
            migration = self._wait(migration.uuid, deadline, confirmed=False)
            if migration.status == "finished":  # a cold migration waits for its confirm
                moves.confirm(self.context, server.uuid)
                migration = self._wait(migration.uuid, deadline, confirmed=True)
        except exception.QschedError as exc:
            return Drained(server.uuid, server.name, "refused", kind, server.host, str(exc))
        if not migration.final:
            why = f"migration {migration.uuid} still {migration.status}"
            return Drained(server.uuid, server.name, "timeout", kind, server.host, why)
        if migration.status in ("completed", "confirmed"):
            return Drained(server.uuid, server.name, "moved", kind, migration.dest_compute)
        why = migration.fault or f"migration {migration.uuid} {migration.status}"
        return Drained(server.uuid, server.name, "failed", kind, server.host, why)

    def _wait(self, uuid: str, deadline: float, confirmed: bool) -> Migration:
        """The migration once it ended (or, unless ``confirmed``, waits for a confirm), or
        as it is at ``deadline``."""
        while True:
            migration = self.cell.stores.migrations.get(uuid)
            done = migration.final or (not confirmed and migration.status == "finished")
            if done or self.clock() >= deadline:
                return migration
            self.sleep(POLL_S)
