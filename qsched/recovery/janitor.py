"""Finish what dead agents left behind, and rebuild boot requests from records.

An agent acks a boot request once its claim is in the ledger, then spawns. If it
dies in between, nothing on the bus remembers the request: the claim is the only
trace. Every claimed, not yet ACTIVE instance is in its host's ``building`` set,
so once the host's heartbeat has expired the janitor finds those instances
without scanning, takes their claims and publishes their requests again.
A restarting agent does the same for itself (:mod:`agents.reconcile`).

A heartbeat that expired says the agent is silent, not that its VMs are gone: a
starved or cut-off agent may still be spawning. So a claim the janitor takes (or
the API, deleting locally) stays on the host's providers, held for it, until its
agent says the VM is gone; and that agent spawns nothing once its own heartbeat is
overdue (its lease, :mod:`agents.lease`), so that a build taken from it is not
started twice.

The janitor also empties the outbox (:mod:`qsched.recovery.outbox`): boot requests recorded
and never confirmed by the broker (a front door killed in between) are published
once they have waited ``[scheduler] outbox_grace_s``. With several cells behind one
API (``[cells]``), its tasks (the deadline reaper, the dead agents' pass and the
outbox) go through every cell in turn, passing over a cell whose ledger or bus does
not answer, and it runs their :class:`~qsched.cells.mover.QuotaMover` too.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from qsched import exception
from qsched.bus.base import BootPublisher
from qsched.ledger import Stores
from qsched.ledger.base import Migration, State
from qsched.recovery.outbox import RETRY_MAX_S, publish_stranded
from qsched.scheduling.records import move_request_for, request_for

LOG = logging.getLogger(__name__)

#: The ledger must answer this long after an outage before the outbox is published:
#: three times the longest pause of a front door's abandon retries.
OUTBOX_SETTLE_S = 3 * RETRY_MAX_S


@dataclasses.dataclass
class JanitorReport:
    dead_agents: list[str] = dataclasses.field(default_factory=list)
    requeued: list[str] = dataclasses.field(default_factory=list)
    deleted: list[str] = dataclasses.field(default_factory=list)  # deletes it left undone
    ended: list[str] = dataclasses.field(default_factory=list)  # deleted or ended meanwhile
    failed: list[str] = dataclasses.field(default_factory=list)  # republish failed
    published: list[str] = dataclasses.field(default_factory=list)  # stranded in the outbox
    moves: list[str] = dataclasses.field(default_factory=list)  # moves whose step it took
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def requeue_orphan(
    stores: Stores,
    bus: BootPublisher,
    uuid: str,
    host: str,
    reason: str,
    released: Callable[[], object] | None = None,
    take_over: bool = False,
) -> bool:
    """Release a claim nobody will finish and publish the request again.

    ``released`` is called once the ledger released the claim, before the request
    goes out (the agent that held it brings its view of the node up to date there,
    while no claim of that request can race with it).
    ``take_over`` (the janitor's): ``host`` is not the caller and is silent; its VM
    may still run, so its claim is held for it rather than released
    (:meth:`~qsched.ledger.base.InstanceStore.requeue`).
    Returns False when the instance had ended meanwhile (nothing to publish).
    :raises BusUnavailable: the request could not be published; the instance
        waits in BUILD and its deadline ends it if nobody publishes it again.
    :raises AgentAlive: ``take_over``, and ``host``'s agent beats again: nothing done.
    A record that cannot be rebuilt into a request (not made by a front door) is
    logged and left to its deadline, like one whose publish failed.
    """
    try:
        inst = stores.instances.requeue(uuid, host, reason, True, take_over)
    except (exception.InstanceNotWaiting, exception.InstanceNotFound):
        return False
    if released is not None:
        released()
    if inst.state != State.BUILD:
        return False
    try:
        request = request_for(inst)
    except exception.Invalid as exc:
        LOG.error("instance %s: claim of %s released, but %s; its deadline ends it", uuid,
                  host, exc)  # fmt: skip
        return False
    bus.publish_boot(request)
    stores.instances.outbox_done([(uuid, inst.outbox)])
    LOG.info("instance %s: claim of %s released (%s), request published again", uuid, host,
             reason)  # fmt: skip
    return True


def run(
    stores: Stores,
    bus: BootPublisher | None = None,
    now: float | None = None,
    dry_run: bool = False,
    grace_s: float = 0.0,
    suspects: dict[str, float] | None = None,
    outbox_grace_s: float | None = None,
) -> JanitorReport:
    """Finish the work of every agent whose heartbeat has been expired for ``grace_s``.

    Its unfinished builds are requeued and their requests published again; the
    deletes it was asked for are done here, as Nova does for a down compute. A silent
    agent may only be starved or cut off, its VMs still running: each take-over
    checks in the same atomic step that it is still silent (an agent that beats again
    keeps its work), and its claims are not released but held for its host until its
    agent says the VM is gone (:meth:`~qsched.ledger.base.Ledger.held_claims`).
    Reads the agents seen in the cell (an admin-sized list) and, per dead agent,
    only its building and deleting sets. ``dry_run`` (or no ``bus``) only reports.

    ``suspects`` (host -> when this janitor first saw it silent) makes the grace
    count from that moment: after a ledger outage every heartbeat has expired at
    once, and live agents must get the time to beat again before being judged.
    Without it the grace counts from the agent's last heartbeat.

    ``outbox_grace_s`` (not for a dry run): also publish the boot requests that
    have waited that long in the outbox.
    """
    now = time.time() if now is None else now
    report = JanitorReport(dry_run=dry_run or bus is None)
    if outbox_grace_s is not None and bus is not None and not report.dry_run:
        report.published = publish_stranded(stores, bus, outbox_grace_s)
    for agent in stores.agents.list():
        if agent.alive:
            if suspects is not None:
                suspects.pop(agent.host, None)
            continue
        since = agent.last_seen if suspects is None else suspects.setdefault(agent.host, now)
        if now - since < grace_s:
            continue
        building = sorted(stores.instances.building(agent.host))
        deleting = stores.instances.deleting(agent.host)
        moves = stores.migrations.on_host(agent.host)
        if not building and not deleting and not moves:
            continue
        report.dead_agents.append(agent.host)
        try:
            _take_over(stores, bus, report, agent.host, building, deleting)
            _take_over_moves(stores, bus, report, agent.host, moves)
        except exception.AgentAlive:
            LOG.info("janitor: agent %s beats again; it keeps the rest of its work",
                     agent.host)  # fmt: skip
    return report


def _take_over(
    stores: Stores,
    bus: BootPublisher | None,
    report: JanitorReport,
    host: str,
    building: list[str],
    deleting: list[str],
) -> None:
    """Requeue a silent host's builds and end its deletes, its claims held for it.

    :raises AgentAlive: its agent beats again (what was done before stays done).
    """
    for uuid in building:
        _requeue(stores, bus, report, uuid, host)
    for uuid in deleting:
        if not report.dry_run:
            stores.instances.delete(uuid, take_over=True)
        report.deleted.append(uuid)


def _take_over_moves(
    stores: Stores,
    bus: BootPublisher | None,
    report: JanitorReport,
    host: str,
    moves: list[Migration],
) -> None:
    """Take the steps a silent host owes its moves (docs/moves.rst), its side of each held
    for it: a destination's claim is given back to the migration (published again for
    another destination while attempts are left), a confirm or a revert it was asked
    for ends here. A live migration being sent waits for its hosts: only they know
    where the server runs.

    :raises AgentAlive: its agent beats again.
    """
    migrations = stores.migrations
    for move in moves:
        claimed = move.status in ("migrating", "preparing") and move.dest_compute == host
        confirming = move.status == "confirming" and move.source_compute == host
        reverting = move.status == "reverting" and move.dest_compute == host
        if not (claimed or confirming or reverting):
            continue
        report.moves.append(move.uuid)
        if report.dry_run or bus is None:
            continue
        try:
            if confirming:
                migrations.confirm(move.uuid, "take_over", host)
            elif reverting:
                migrations.revert(move.uuid, "take_over", host)
            elif migrations.fail(move.uuid, host, f"its destination {host} is down",
                                 retry=True, take_over=True):  # fmt: skip
                again = migrations.get(move.uuid)
                bus.publish_boot(move_request_for(stores.instances.get(again.instance_uuid), again))
        except (exception.MoveNotUnderWay, exception.MigrationNotFound):
            continue  # it moved on meanwhile


def _requeue(
    stores: Stores, bus: BootPublisher | None, report: JanitorReport, uuid: str, host: str
) -> None:
    if report.dry_run or bus is None:
        report.requeued.append(uuid)
        return
    try:
        done = requeue_orphan(stores, bus, uuid, host, f"agent {host} is down", take_over=True)
    except exception.BackendUnavailable as exc:
        LOG.error("janitor: could not publish %s again: %s", uuid, exc)
        report.failed.append(uuid)
        return
    (report.requeued if done else report.ended).append(uuid)


class OutboxPass:
    """The janitor's outbox pass, run only once the ledger has answered for ``settle_s``.

    After a ledger outage the front doors retry their abandons first (a client
    told 503 must not see its server boot): each retries at least every second,
    so waiting a few seconds of steady answers lets them land before this pass
    could publish what they abandon.
    """

    def __init__(self, stores: Stores, bus: BootPublisher, grace_s: float, settle_s: float) -> None:
        self.stores = stores
        self.bus = bus
        self.grace_s = grace_s
        self.settle_s = settle_s
        self._up_since: float | None = None

    def __call__(self) -> list[str]:
        now = time.monotonic()
        try:
            if self._up_since is not None and now - self._up_since >= self.settle_s:
                return publish_stranded(self.stores, self.bus, self.grace_s)
            self.stores.backend.ping()  # still settling: only see that it answers
        except exception.BackendUnavailable:
            self._up_since = None
            raise
        if self._up_since is None:
            self._up_since = now
        return []
