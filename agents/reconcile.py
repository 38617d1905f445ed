"""The agent and its nodes made to agree with the ledger: at start, and all the time after.

The ledger is the truth. An agent's view of its nodes (its node index) and what its
driver runs can drift from it through faults the agent never hears about: the API
deletes instances of an agent it thinks is down, a janitor or the deadline reaper
ends claims, a ledger failover or rollback loses writes. Convergence is the agent's
job, within a bounded time and without a restart.

At start (:func:`reconcile`), before it consumes, the agent runs every slice of
:class:`Reconciler` at once.

Periodically (:class:`Reconciler`, every ``[agent] reconcile_interval_s``), on a slice
of ``reconcile_batch`` nodes in turn, so that every node is seen within
``ceil(nodes / reconcile_batch)`` passes (and every slice at once when the agent finds
it was silent past its heartbeat TTL):

* allocations on its providers that no live instance of this host explains (a record
  gone, ended, or placed elsewhere) are released, in one atomic step with that check
  (``[agent] release_leaked_allocations``; off: only reported);
* instances the driver runs that the ledger has deleted or ended, places on another
  host, or does not know are reaped, logged or left (``running_deleted_instance_action``,
  as Nova's periodic task of that name), unless a spawn or a delete of them is in flight
  here; one reaped whose record waits for a host again (a crash of the ledger lost this
  host's claim, after the agent had acked its request) has its request left to the
  outbox, since nothing else on the bus holds it;
* ACTIVE instances of this host that the driver does not run are set ERROR with a fault
  that says so, their allocations and quota freed, in one atomic step that checks the
  record still places them there with no task under way (``[agent]
  lost_instance_action = error``; ``log``: reported only, as Nova's power-state sync
  leaves such an instance). A hypervisor lost the VM, or a crash of the ledger brought
  back a server whose delete the agent had done: either way nothing runs, and the owner
  sees why. A delete in flight here (the driver destroys before the ledger ends the
  instance) is none of them;
* either finding is the driver's listing against records read after it, so each is
  checked again (a new listing, and a new read of a missing one's record) before it
  counts: a delete or a spawn that ended between the two reads is no finding (a pass
  of many nodes on a starved process leaves seconds between them);
* the node views are read again and replace the index's where they differ, unless the
  agent wrote to that node meanwhile (see :mod:`agents.nodes`, "Convergence");
* the sharing providers the nodes reach are read again (one read of the cell's index of
  them, O(sharing providers)): their usage moves with every agent's claims;
* and on every pass, builds the ledger says this host claimed that no spawn of this
  agent holds (a previous run of it died, or a rolled-back ledger forgot that one
  ended): ACTIVE if the driver runs them, otherwise the claim is released and the
  request published again.

Cost per pass, for b nodes with p providers and i instances: two read-only scripts
over the p providers (their consumers, then their records whole: one round trip each
per 200 providers, ``providers_consumers.lua`` and ``providers_read.lua``), one small
read (state, host, node) per instance, pipelined, and b driver listings, done a
hundred nodes at a time with a short pause in between so that the consumer thread is
not kept waiting for the interpreter. A hundred nodes of two providers cost 5 to
12 ms of the agent's CPU and 2 to 4 ms of Redis's, on a 2-core machine in use
(``python -m qsched.bench.reconcile``; docs/benchmarks.rst, "What a reconcile pass
costs"). Nothing on a request's path; nothing grows with the hosts of the cloud.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from agents.nodes import NodeIndex
from agents.virt.base import VirtDriver
from qsched import exception
from qsched.bus.base import Bus
from qsched.ledger import Stores
from qsched.ledger.base import Placement, State
from qsched.notifications import NULL, Notifier, payloads
from qsched.recovery.janitor import requeue_orphan
from qsched.scheduling.views import NodeView, ProviderView, same_usage

LOG = logging.getLogger(__name__)

ACTIONS = ("reap", "log", "noop")
LOST_ACTIONS = ("error", "log")
#: The fault of an ACTIVE instance whose VM its host's driver no longer runs.
LOST_MESSAGE = "The server's VM was lost: its host's hypervisor no longer runs it."
CHUNK_NODES = 100  # nodes read and checked in one go within a pass
PAUSE_S = 0.005  # between two chunks: the consumer thread gets the interpreter meanwhile


@dataclasses.dataclass
class ReconcileReport:
    """What one reconcile found and did (instance uuids, node names)."""

    activated: list[str] = dataclasses.field(default_factory=list)
    requeued: list[str] = dataclasses.field(default_factory=list)
    leaked: list[str] = dataclasses.field(default_factory=list)
    released: list[str] = dataclasses.field(default_factory=list)
    running_deleted: list[str] = dataclasses.field(default_factory=list)
    reaped: list[str] = dataclasses.field(default_factory=list)
    republished: list[str] = dataclasses.field(default_factory=list)  # reaped, waiting again
    missing: list[str] = dataclasses.field(default_factory=list)
    lost: list[str] = dataclasses.field(default_factory=list)  # missing, set ERROR
    unheld: list[str] = dataclasses.field(default_factory=list)  # claims held for it, released
    refreshed: list[str] = dataclasses.field(default_factory=list)  # nodes whose view was off
    nodes: int = 0  # nodes looked at

    def add(self, other: ReconcileReport) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def found_anything(self) -> bool:
        return any(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "nodes")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reconcile(reconciler: Reconciler) -> ReconcileReport:
    """At start, before the agent consumes: every slice at once.

    A function of its own so that ``qsched-bench`` can time the start's phases by
    name (:mod:`qsched.bench.timing`).
    """
    return reconciler.run_all()


@dataclasses.dataclass(frozen=True)
class _Slice:
    """What the ledger and the driver hold for some nodes, read in few round trips."""

    views: dict[str, NodeView]
    tokens: dict[str, int | None]
    consumers: dict[str, set[str]]  # provider uuid -> consumers
    running: dict[str, list[str]]  # node -> instances the driver runs there
    records: dict[str, Placement]
    held: dict[str, str]  # held consumer -> its instance: claims taken from this host

    @classmethod
    def read(
        cls, stores: Stores, driver: VirtDriver, index: NodeIndex, host: str, names: list[str]
    ) -> _Slice:
        tokens = {name: index.sync_token(name) for name in names}  # before any read
        views = {name: index.node(name) for name in names}
        # before the consumers: a claim held after this read is one release_unexplained
        # leaves alone, never one taken for a leak
        held = {consumer: uuid for uuid, consumer in stores.ledger.held_claims(host).items()}
        uuids = [p.uuid for v in views.values() for p in v.providers]
        consumers = stores.ledger.providers_consumers(uuids)
        running = {name: _running(driver, name) for name in names}
        wanted = set().union(*consumers.values(), *running.values()) - set(held)
        records = stores.instances.placements(sorted(wanted))
        return cls(views, tokens, consumers, running, records, held)


class Reconciler:
    """The periodic reconcile of one agent's nodes; see the module docstring.

    :param busy: whether a spawn or a delete of an instance is in flight on this agent.
    :param release_leaked: release unexplained allocations (else only report them).
    :param action: ``reap``, ``log`` or ``noop`` for instances running while deleted.
    :param lost_action: ``error`` or ``log`` for ACTIVE instances the driver does not run.
    """

    def __init__(
        self,
        stores: Stores,
        bus: Bus,
        driver: VirtDriver,
        host: str,
        index: NodeIndex,
        busy: Callable[[str], bool],
        batch: int = 1000,
        release_leaked: bool = True,
        action: str = "reap",
        notifier: Notifier = NULL,
        lost_action: str = "error",
    ) -> None:
        if action not in ACTIONS:
            raise exception.Invalid(reason=f"action {action!r}: use one of {', '.join(ACTIONS)}")
        if lost_action not in LOST_ACTIONS:
            raise exception.Invalid(
                reason=f"lost_action {lost_action!r}: use one of {', '.join(LOST_ACTIONS)}"
            )
        self.stores = stores
        self.bus = bus
        self.driver = driver
        self.host = host
        self.index = index
        self.busy = busy
        self.batch = batch
        self.release_leaked = release_leaked
        self.action = action
        self.lost_action = lost_action
        self.notifier = notifier
        self.pause: Callable[[float], None] = time.sleep
        self._cursor = 0

    def _activate(self, uuid: str, node: str) -> None:
        """Record ACTIVE a spawn the driver runs and the ledger had not heard of; if this
        call made it so, tell ``instance.create.end`` (its spawn's own was never sent)."""
        if self.stores.instances.set_active(uuid, self.host, node) and self.notifier.enabled:
            inst = self.stores.instances.get(uuid)  # rare: a read to tell it whole
            self.notifier.notify("instance.create.end", payloads.create_from_record(inst))

    def run_pass(self) -> ReconcileReport:
        """Reconcile the next slice of nodes, and the builds of this host."""
        names, self._cursor = self.index.names(self._cursor, self.batch)
        return self._run(names)

    def run_all(self) -> ReconcileReport:
        """Reconcile every node, and the builds of this host."""
        return self._run(self.index.names(0)[0])

    def _run(self, names: list[str]) -> ReconcileReport:
        """The builds, then ``names`` a chunk at a time with a pause in between (a pass
        shares the interpreter with the consumer thread, which must not wait behind
        it); what it found is logged once."""
        report = self.finish_builds()
        for start in range(0, len(names), CHUNK_NODES):
            if start:
                self.pause(PAUSE_S)
            report.add(self.reconcile_nodes(names[start : start + CHUNK_NODES]))
        self.refresh_sharing()  # after the nodes: their aggregates say which to read
        if report.found_anything():
            _log(self.host, report)
        return report

    def finish_builds(self) -> ReconcileReport:
        """Builds the ledger says this host claimed and no spawn of this agent holds.

        ACTIVE if the driver runs them, else released and published again. A claim
        being written now is left alone: its node is being written to (the index
        says so) or its spawn is known by the time the node is free again.
        """
        report = ReconcileReport()
        orphans = [u for u in sorted(self.stores.instances.building(self.host))
                   if not self.busy(u)]  # fmt: skip
        for uuid, inst in self.stores.instances.placements(orphans).items():
            node = inst.node or ""
            if node in self.index and self.index.sync_token(node) is None:
                continue  # a claim on that node is in flight
            if self.busy(uuid):
                continue
            if inst.state == State.BUILD and node and uuid in _running(self.driver, node):
                self._activate(uuid, node)
                report.activated.append(uuid)
                continue
            # the node is read again before the request goes out, so no claim races it
            refresh = functools.partial(self.refresh_nodes, [node])
            why = f"agent {self.host} holds no spawn of it"
            if requeue_orphan(self.stores, self.bus, uuid, self.host, why, released=refresh):
                report.requeued.append(uuid)
        return report

    def reconcile_nodes(self, names: list[str]) -> ReconcileReport:
        """Reconcile these nodes now (see the module docstring)."""
        report = ReconcileReport(nodes=len(names))
        if not names:
            return report
        found = _Slice.read(self.stores, self.driver, self.index, self.host, names)
        self._check_allocations(found, report)
        self._check_running(found, report)
        report.refreshed += self._apply(found.views, found.tokens)
        return report

    def refresh_nodes(self, names: Iterable[str]) -> list[str]:
        """Read these nodes again and refresh the index where it is off: the nodes fixed.

        For a node whose usage the ledger changed under the agent (a claim taken back).
        """
        wanted = [name for name in names if name in self.index]
        tokens = {name: self.index.sync_token(name) for name in wanted}
        views = {name: self.index.node(name) for name in wanted}
        return self._apply(views, tokens)

    def reread_roots(self) -> list[str]:
        """After the host moved into or out of an aggregate: read every node's root
        provider again, a chunk at a time, then the sharing providers; the nodes whose
        view changed.

        The aggregate API mirrors a host's aggregates into its root providers only
        (``provider_mirror.lua``), and a move changes no allocation, so the children,
        the consumers and the records are not read: a third of a pass's reads or less,
        for a change that wakes every host in the aggregate at once.
        """
        names = self.index.names(0)[0]
        fixed: list[str] = []
        for start in range(0, len(names), CHUNK_NODES):
            if start:
                self.pause(PAUSE_S)
            chunk = names[start : start + CHUNK_NODES]
            tokens = {name: self.index.sync_token(name) for name in chunk}
            views = {name: self.index.node(name) for name in chunk}
            fixed += self._apply(views, tokens, roots_only=True)
        self.refresh_sharing()
        return fixed

    def refresh_sharing(self) -> None:
        """Read the sharing providers in the aggregates of the nodes again: which they
        are, and their usage (a claim found one fuller than the index thought)."""
        aggregates = self.index.root_aggregates()
        found = self.stores.ledger.sharing_providers(aggregates) if aggregates else {}
        self.index.set_sharing(found)

    # -- the checks --

    def _check_allocations(self, found: _Slice, report: ReconcileReport) -> None:
        """Unexplained allocations; released ones are those the atomic re-check confirmed
        (a claim or a requeue between the two reads is no leak). A claim held for this
        host (taken while it was silent) is released once the driver does not run its
        instance, or runs it as the ledger's ACTIVE instance of this node (whose own
        claim covers it), and nothing of it is in flight here."""
        for view in found.views.values():
            for provider in view.providers:
                for consumer in sorted(found.consumers.get(provider.uuid, ())):
                    held = found.held.get(consumer)
                    if held is not None:
                        mine = _runs_here(found.records.get(held), self.host, view.name)
                        gone = held not in found.running[view.name] or mine
                        if gone and not self.busy(held):
                            self._release_held(held, report)
                        continue
                    if _explained(found.records.get(consumer), self.host):
                        continue
                    if not self.release_leaked:
                        report.leaked.append(consumer)
                    elif self.stores.ledger.release_unexplained(consumer, self.host, provider.uuid):
                        report.leaked.append(consumer)
                        report.released.append(consumer)

    def _release_held(self, uuid: str, report: ReconcileReport) -> None:
        """The claim held for this host of ``uuid`` goes: its VM is not here (once,
        though the claim shows on each provider it holds)."""
        if uuid not in report.unheld and self.stores.ledger.release_held(self.host, uuid):
            report.unheld.append(uuid)

    def _check_running(self, found: _Slice, report: ReconcileReport) -> None:
        """What the driver runs against what the ledger places here. The driver was
        listed before the records were read, so an instance seen at odds with its record
        is looked at again (the driver listed anew, a record read anew): a delete that
        destroyed it in between, or a spawn that ended, is no finding."""
        for name, running in found.running.items():
            astray = []
            for uuid in running:
                inst = found.records.get(uuid)
                if self.busy(uuid) or _runs_here(inst, self.host, name):
                    continue
                if _built_here(inst, self.host, name):  # a spawn that finished, unrecorded
                    self._activate(uuid, name)
                    report.activated.append(uuid)
                    continue
                astray.append(uuid)
            holders = found.consumers.get(found.views[name].root.uuid, set())
            gone = [uuid for uuid in sorted(holders - set(running))
                    if _runs_here(found.records.get(uuid), self.host, name)]  # fmt: skip
            if astray or gone:
                self._check_again(name, found, astray, gone, report)

    def _check_again(
        self, name: str, found: _Slice, astray: list[str], gone: list[str], report: ReconcileReport
    ) -> None:
        """``astray``: listed while the ledger does not place them here; ``gone``: ACTIVE
        here and not listed. Each is a finding only if it still is after a new listing
        and, for ``gone``, a new read of its record once no delete of it is in flight
        (the driver destroys before the ledger ends the instance)."""
        now = set(_running(self.driver, name))
        held = set(found.held.values())
        for uuid in astray:
            if uuid in now and not self.busy(uuid):
                self._running_deleted(uuid, name, found.records.get(uuid), report)
                if uuid in held and uuid in report.reaped:  # its VM gone: so is its claim
                    self._release_held(uuid, report)
        gone = [uuid for uuid in gone if uuid not in now and not self.busy(uuid)]
        if gone:
            again = self.stores.instances.placements(gone)
            for uuid in gone:
                if _runs_here(again.get(uuid), self.host, name):
                    self._lost(uuid, name, report)

    def _running_deleted(
        self, uuid: str, name: str, inst: Placement | None, report: ReconcileReport
    ) -> None:
        """An instance the driver runs on ``name`` that the ledger has deleted, ended,
        placed elsewhere or does not know: reaped, logged or left, as the action says."""
        report.running_deleted.append(uuid)
        if self.action == "reap":
            self.driver.destroy(uuid, name)
            report.reaped.append(uuid)
            self._republish(uuid, inst, report)
        elif self.action == "log":
            LOG.warning("agent %s: %s runs on %s but the ledger has it %s", self.host, uuid,
                        name, _where(inst))  # fmt: skip

    def _republish(self, uuid: str, inst: Placement | None, report: ReconcileReport) -> None:
        """A VM reaped whose record waits for a host: the ledger lost this host's claim of
        it (a rolled-back crash), and the request this agent acked is nowhere else."""
        if inst is None or inst.state != State.BUILD or inst.host is not None:
            return
        why = f"a VM of it ran on {self.host}, whose claim the ledger no longer holds"
        if self.stores.instances.park(uuid, self.host, why):
            report.republished.append(uuid)

    def _lost(self, uuid: str, node: str, report: ReconcileReport) -> None:
        """An ACTIVE instance of this node that the driver does not run (see the module
        docstring): ERROR with a fault, or only reported."""
        report.missing.append(uuid)
        if self.lost_action != "error":
            return
        details = {"host": self.host, "node": node, "reason": "lost",
                   "found_by": "the agent's reconcile"}  # fmt: skip
        if self.stores.instances.set_lost(uuid, self.host, node, LOST_MESSAGE, details):
            report.lost.append(uuid)
            LOG.warning("agent %s: %s is ACTIVE on %s but its VM is gone: set ERROR, what it "
                        "held freed", self.host, uuid, node)  # fmt: skip

    def _apply(
        self, views: dict[str, NodeView], tokens: dict[str, int | None], roots_only: bool = False
    ) -> list[str]:
        """Refresh the index where the ledger differs; ``roots_only``: read the root
        providers and keep the children's views (a provider read and gone is dropped)."""
        if roots_only:
            uuids = [v.root.uuid for v in views.values()]
        else:
            uuids = [p.uuid for v in views.values() for p in v.providers]
        fresh = self.stores.ledger.get_providers(uuids)
        read = set(uuids)
        fixed = []
        for name, view in views.items():
            providers = [
                ProviderView.from_provider(fresh[p.uuid]) if p.uuid in read else p
                for p in view.providers
                if p.uuid in fresh or p.uuid not in read
            ]
            current = {p.uuid: p for p in view.providers}
            if all(_same(current[p.uuid], p) for p in providers):
                continue
            if self.index.refresh_if(name, providers, tokens.get(name)) is not None:
                fixed.append(name)
        return fixed


def _same(view: ProviderView, fresh: ProviderView) -> bool:
    """Whether the agent's view agrees with the ledger's, its generation included: a
    view at an older generation would make the node's next claim conflict."""
    return same_usage(view, fresh) and view.generation == fresh.generation


def _explained(inst: Placement | None, host: str) -> bool:
    """The instance holds a claim on this host: its own, or one end of its move."""
    return inst is not None and inst.state in (State.BUILD, State.ACTIVE) and inst.on(host)


def _runs_here(inst: Placement | None, host: str, node: str) -> bool:
    """The ledger agrees that the instance is ACTIVE on this node: its host, or one end
    of a move of it under way (docs/moves.rst: its copy there is the move's)."""
    return inst is not None and inst.state == State.ACTIVE and inst.on(host, node)


def _built_here(inst: Placement | None, host: str, node: str) -> bool:
    return inst is not None and inst.state == State.BUILD and (inst.host, inst.node) == (host, node)


def _where(inst: Placement | None) -> str:
    if inst is None:
        return "unknown (no record)"
    return f"{inst.state.value} on {inst.host or 'no host'}"


def _log(host: str, report: ReconcileReport) -> None:
    LOG.warning(
        "agent %s reconciled %d nodes: %d builds made ACTIVE, %d requeued; %d leaked "
        "allocations (%d released); %d instances running while deleted (%d reaped, %d of "
        "them waiting again: republished); %d ACTIVE instances the driver does not run "
        "(%d set ERROR); %d claims taken while it was silent released; %d node views "
        "refreshed",
        host, report.nodes, len(report.activated), len(report.requeued), len(report.leaked),
        len(report.released), len(report.running_deleted), len(report.reaped),
        len(report.republished), len(report.missing), len(report.lost), len(report.unheld),
        len(report.refreshed),
    )  # fmt: skip


def _running(driver: VirtDriver, node: str) -> list[str]:
    try:
        return driver.list_instances(node)
    except exception.NotFound:
        return []
