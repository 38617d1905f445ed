"""The compute agent: pull boot requests for classes its nodes fit, claim, spawn.

One agent drives one node or many. It consumes only the scheduling classes that
at least one of its nodes can fit right now (its :class:`~agents.nodes.NodeIndex`
says which, and which node to pick, without scanning nodes), plus its own host
queue for deletes (:mod:`agents.deletes`) and server actions (:mod:`agents.actions`).
This module is the service around the steps: its life cycle, periodic tasks and
heartbeat, the consumer callback, and the one dispatch that settles a delivery by
the code of its step's :class:`~agents.outcome.Outcome`. A boot request goes through
named steps, each a method of a small class:

1. decode (undecodable: dead letter with the reason, go on);
2. :mod:`agents.placing`: *admit* (drop a redelivery of a build in flight, end
   a request past its deadline in NoValidHost, dead-letter an unknown class),
   *pick* a node, *claim* it in the ledger (client-driven retries on conflicts),
   or *refuse*: record why in the instance history and republish the request at
   the tail of the queue, or *hand back* a request this host already tried while
   another can take it (alternates), pausing its class here; what a placement
   rule refused goes on to :mod:`agents.groups`;
3. ack, and hand the spawn to a worker, :mod:`agents.spawning`: *spawn*, then
   *settle* ACTIVE, or *give back* the claim and reschedule until ``max_attempts``.

A request is acked only once its claim is in the ledger, so a crash before that
gives it back to the broker; the claim is idempotent per instance, so the
redelivery cannot place twice.

Its index and its driver are kept in line with the ledger by
:mod:`agents.reconcile`: at start, every ``[agent] reconcile_interval_s`` on a
slice of its nodes, at once when its heartbeat finds it was silent past the TTL,
and for a node whose claim the ledger took back under a spawn.

Maintenance: the agent registers its host's compute service at start, and every
heartbeat answers with what operators set there (``os-services``). While the
service is disabled or forced down the agent consumes no boot request and tells
the ledger it has room for nothing (so it is nobody's alternate); the claim refuses
it anyway, so a request it took just before it learned is requeued. It keeps its
host queue, finishes its spawns, reconciles and deletes: a maintenance drain, as
``openstack compute service set --disable`` does to nova-compute.
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from agents.actions import STUCK_ACTION_S, ActionStep
from agents.consuming import ClassGate
from agents.deletes import STUCK_DELETE_S, DeleteStep
from agents.groups import GroupStep
from agents.lease import Lease
from agents.metrics import AgentMetrics
from agents.moves import STUCK_MOVE_S, MoveSteps
from agents.nodes import NodeIndex
from agents.outcome import Code, Outcome, Settle, SettleAny
from agents.permit import POLL_S, Permit
from agents.placing import Alternates, Placer
from agents.reconcile import Reconciler, ReconcileReport, reconcile
from agents.registration import register_nodes
from agents.spawning import Spawner
from agents.steps import AgentParts, Backoff, Builds
from agents.virt.base import VirtDriver
from qsched import exception
from qsched.bus.base import Bus, Consumer, Delivery
from qsched.conf import AgentOptions
from qsched.ledger import Stores, retry
from qsched.ledger.base import Service
from qsched.notifications import NULL, Notifier
from qsched.periodic import Periodic
from qsched.recovery.reaper import reap_expired
from qsched.scheduling import message

LOG = logging.getLogger(__name__)

#: A reconcile pass is due within this fraction of ``reconcile_interval_s`` either way
#: of one interval after the last (qsched.periodic, ``jitter``).
RECONCILE_JITTER = 0.5
#: How long a stop waits, in all, for the periodic tasks under way (a heartbeat that
#: lands after the goodbye would show the host's room for another TTL)
PERIODIC_STOP_S = 10.0


class ComputeAgent:
    """One compute service: its ``[agent]`` options, the ledger, the bus and a virt driver.

    ``claim_retries``: re-reads after generation conflicts before a claim gives up
    (``[ledger] max_conflict_retries``); ``notifier``: where its versioned notifications
    go (docs/notifications.rst; by default nowhere).
    """

    def __init__(
        self,
        options: AgentOptions,
        stores: Stores,
        bus: Bus,
        driver: VirtDriver,
        claim_retries: int = retry.DEFAULT_RETRIES,
        notifier: Notifier = NULL,
    ) -> None:
        self.opts = options
        self.host: str = options.host
        self.stores = stores
        self.bus = bus
        self.driver = driver
        self.notifier = notifier
        self.gate = ClassGate()  # the classes to consume: fittable, not paused
        self.index = NodeIndex(policy=options.placement_policy, on_change=self._on_change)
        self.consumer: Consumer | None = None
        self.builds = Builds()
        self._spawner = ThreadPoolExecutor(options.spawn_workers, f"spawn-{self.host}")
        self._periodic: list[Periodic] = []
        self._reconcile_task: Periodic | None = None
        self._register_task: Periodic | None = None
        self._stopped = threading.Event()
        self.counters: Counter[str] = Counter()
        self.metrics = AgentMetrics(
            self.counters, self.index.totals, self._consumed, self.builds.__len__,
            enabled=bool(options.metrics_port),
        )  # fmt: skip
        self._backoff = Backoff(options.ledger_retry_max_s)
        self.reconciler = Reconciler(
            stores, bus, driver, self.host, self.index, self._busy,
            batch=options.reconcile_batch,
            release_leaked=options.release_leaked_allocations,
            action=options.running_deleted_instance_action, notifier=notifier,
            lost_action=options.lost_instance_action,
        )  # fmt: skip
        self.lease = Lease(options.heartbeat_ttl_s)
        parts = AgentParts(
            self.host, stores, bus, driver, self.index, self.builds, self.reconciler,
            self.counters, self._stopped, options.ledger_retry_max_s, self.gate, self.metrics,
            self.lease, notifier,
        )  # fmt: skip
        alternates = Alternates(
            options.max_handbacks, options.handback_pause_s,
            # a class new to them is learnt and registered within these two intervals
            move_grace_s=max(2.0, 5 * (options.heartbeat_interval_s
                                       + options.class_poll_interval_s)),
        )  # fmt: skip
        self.placer = Placer(parts, claim_retries, alternates)
        self.spawner = Spawner(parts)
        self.groups = GroupStep(parts)
        self.actions = ActionStep(stores, driver, self.host, self.counters, notifier,
                                  options.shelved_offload_time, self.index)  # fmt: skip
        self.permit = Permit(parts, lambda uuid: self._spawner.submit(self.spawner.spawn, uuid))
        self.deletes = DeleteStep(parts)
        self.moves = MoveSteps(parts)
        self.settle_any, self.settle = self._settlers()
        self.reconciled = ReconcileReport()  # what the start found
        self._last_beat: float | None = None  # monotonic time of the last heartbeat written
        self._registered: frozenset[str] | None = None  # the classes the ledger has from us
        self._registered_at: float | None = None  # monotonic time they were written
        self._came_back = threading.Event()  # silent past the TTL: reconcile everything
        self._reread_all = threading.Event()  # the host's aggregates moved: read every node
        self._host_aggregates: frozenset[str] | None = None

    # -- life cycle ---------------------------------------------------------------------

    def start(self, ready_timeout_s: float = 30.0) -> None:
        """Register the nodes and their zone, learn the classes, consume and heartbeat.

        :raises MetricsUnavailable: ``[agent] metrics_port`` is taken; nothing is done.
        """
        if self.opts.metrics_port:  # first: a port taken stops the agent before it holds work
            self.metrics.serve(self.opts.metrics_host, self.opts.metrics_port)
        views = register_nodes(
            self.stores.ledger, self.driver.nodes(), self.opts.availability_zone,
            self.opts.aggregates, host=self.opts.host,
        )  # fmt: skip
        if self.opts.availability_zone:  # the API accepts boots only in registered zones
            self.stores.agents.add_zone(self.opts.availability_zone)
        for view in views:
            self.index.add_node(view)
            self.placer.sample_node = self.placer.sample_node or view.name
        self.reconciler.refresh_sharing()
        zone = self.opts.availability_zone or None
        self.apply_service(self.stores.agents.register_service(self.host, zone))
        self.reconciled = reconcile(self.reconciler)
        self.sync_classes()
        self.heartbeat()
        self.register_classes()
        self.deletes.finish()  # whatever a previous run of this agent left undone
        self.actions.finish_stuck()  # and its server actions
        self.moves.finish_stuck()  # and its steps of moves
        self.consumer = self.gate.open(
            lambda classes: self.bus.consumer(self.host, self.on_message, classes)
        )
        self.consumer.start()
        if not self.consumer.wait_ready(ready_timeout_s):
            LOG.warning("agent %s: bus not ready after %.0fs; it keeps trying", self.host,
                        ready_timeout_s)  # fmt: skip
        self._start_periodic()
        LOG.info("agent %s: %d nodes, consuming %s", self.host, len(self.index),
                 sorted(self.index.fittable()) or "nothing yet")  # fmt: skip

    def _start_periodic(self) -> None:
        tasks: list[tuple[str, float, Callable[[], object]]] = [
            ("heartbeat", self.opts.heartbeat_interval_s, self.heartbeat),
            ("classes", self.opts.class_poll_interval_s, self.sync_classes),
            # no more often than it heartbeats: a host told to be quiet (hundreds in one
            # process) sweeps its deletes as rarely, a lost one done within two intervals
            ("deletes", max(STUCK_DELETE_S / 2, self.opts.heartbeat_interval_s),
             lambda: self.deletes.finish(time.time() - STUCK_DELETE_S)),
            ("actions", STUCK_ACTION_S / 2,
             lambda: self.actions.finish_stuck(time.time() - STUCK_ACTION_S)),
            # as rarely as it heartbeats, for the same reason as its deletes
            ("moves", max(STUCK_MOVE_S / 2, self.opts.heartbeat_interval_s),
             lambda: self.moves.finish_stuck(time.time() - STUCK_MOVE_S)),
            ("permit", POLL_S, self.permit.check),  # multi-creates waiting for their claims
        ]  # fmt: skip
        if self.opts.reap_interval_s:
            tasks.append(("reaper", self.opts.reap_interval_s, self._reap))
        if self.opts.shelved_offload_time > 0 and self.opts.shelved_poll_interval > 0:
            tasks.append(("shelved", self.opts.shelved_poll_interval, self.actions.offload_due))
        for name, interval_s, fn in tasks:
            # heartbeats have workers of their own: a process of many hosts reading their
            # nodes at once must not fall silent past the TTL (qsched.periodic)
            lane = "heartbeat" if name == "heartbeat" else ""
            self._start_task(Periodic(f"{name}-{self.host}", interval_s, fn, lane=lane))
        self._register_task = self._start_task(Periodic(
            f"classes-registry-{self.host}", self.opts.heartbeat_interval_s,
            self.register_classes,
        ))  # fmt: skip
        # Agents started together must not all reconcile at once: the first pass falls
        # somewhere in the second half of the interval, and each next one within half
        # an interval either way of its due time, so that passes one event bunched (an
        # aggregate change waking every host in it) drift apart again.
        interval_s = self.opts.reconcile_interval_s
        self._reconcile_task = self._start_task(Periodic(
            f"reconcile-{self.host}", interval_s, self.reconcile_pass,
            first_after_s=random.uniform(0.5, 1.0) * interval_s, jitter=RECONCILE_JITTER,
        ))  # fmt: skip

    def _busy(self, uuid: str) -> bool:
        """Whether a spawn or a delete of the instance is in flight here."""
        return uuid in self.builds or uuid in self.deletes.in_flight

    def _reap(self) -> None:
        self.metrics.no_valid_host("deadline", reap_expired(self.stores, notifier=self.notifier))

    def _consumed(self) -> frozenset[str]:
        """The classes the consumer takes now (none before it starts)."""
        consumer = self.consumer
        return consumer.classes if consumer is not None else frozenset()

    def _start_task(self, task: Periodic) -> Periodic:
        task.start()
        self._periodic.append(task)
        return task

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop taking requests, let spawns in flight finish, say goodbye. Idempotent.

        Deliveries not yet settled go back to the broker unacked.
        """
        if self._stopped.is_set():
            return
        self._stopped.set()
        timeout_s = self.opts.shutdown_timeout_s if timeout_s is None else timeout_s
        self.gate.close()
        if self.consumer is not None:
            self.consumer.stop(timeout_s)
        self._spawner.shutdown(wait=False, cancel_futures=False)
        # Keep heartbeating while spawns finish: a silent agent's builds are the
        # janitor's to requeue, and it would take them from under a live spawn.
        deadline = time.monotonic() + timeout_s
        while self.builds and time.monotonic() < deadline:
            time.sleep(0.05)
        stop_by = time.monotonic() + PERIODIC_STOP_S
        for task in self._periodic:  # a heartbeat under way must not outlive the goodbye
            task.stop(max(0.0, stop_by - time.monotonic()))
        self.metrics.stop()
        if self.builds:
            LOG.warning("agent %s: %d builds unfinished at exit; the janitor requeues them",
                        self.host, len(self.builds))  # fmt: skip
        try:
            self.stores.agents.set_classes(self.host, ())
            self.stores.agents.forget(self.host)
        except exception.QschedError:
            LOG.warning("agent %s: could not clear its heartbeat", self.host)

    def heartbeat(self) -> None:
        """Say this agent lives, renewing its lease; notice when it was silent past its
        TTL (starved, frozen, cut off).

        While it was silent the API may have deleted its instances locally and a
        janitor taken back its claims: the next reconcile then covers every node.
        """
        consumer = self.consumer
        classes = sorted(consumer.classes) if consumer is not None else []
        started = time.monotonic()
        totals = self.index.totals()
        service = self.stores.agents.heartbeat(
            self.host,
            self.opts.heartbeat_ttl_s,
            free={rc: capacity - used for rc, (used, capacity) in totals.items()},
            nodes=len(self.index),
            availability_zone=self.opts.availability_zone,
            classes=classes,
            building=len(self.builds),
            counters=dict(self.counters),
            resources={rc: {"used": used, "capacity": cap} for rc, (used, cap) in totals.items()},
            index_digest=self.index.digest(),
        )  # fmt: skip
        if service is not None and service.forced_down:
            self.lease.end()  # forced down is down: its builds are anyone's to take
        else:
            self.lease.renew(started)
        self.apply_service(service)
        self._watch_aggregates()
        last, self._last_beat = self._last_beat, started
        if last is not None and started - last > self.opts.heartbeat_ttl_s:
            LOG.warning("agent %s: silent for %.1fs, past its heartbeat TTL of %.1fs; "
                        "reconciling every node", self.host, started - last,
                        self.opts.heartbeat_ttl_s)  # fmt: skip
            self.counters["came_back"] += 1
            self._registered_at = None  # a claim may have dropped us from the consumer sets
            self._came_back.set()
            for task in (self._reconcile_task, self._register_task):
                if task is not None:
                    task.wake()

    def _watch_aggregates(self) -> None:
        """Notice the aggregate API moving this host into or out of an aggregate (one
        SMEMBERS a heartbeat): the next reconcile reads every root provider again, so a
        class the change makes fit here is consumed within a heartbeat rather than a
        reconcile cycle. A host leaving an aggregate needs no notice: the claim checks it."""
        found = frozenset(self.stores.aggregates.host_aggregates(self.host))
        known, self._host_aggregates = self._host_aggregates, found
        if known is not None and found != known:
            self.counters["aggregates_changed"] += 1
            self._reread_all.set()
            if self._reconcile_task is not None:
                self._reconcile_task.wake()

    def apply_service(self, service: Service | None) -> None:
        """Take new boots or not, as the host's service says (None: no record, take them).

        Disabled or forced down: the consumer drops every class and the ledger hears
        that this agent has room for nothing; what runs stays, deletes go on.
        """
        schedulable = service is None or service.schedulable
        if schedulable == self.gate.enabled:
            return
        if schedulable:
            LOG.info("agent %s: service enabled, taking new boots again", self.host)
        else:
            why = "forced down" if service and service.forced_down else "disabled"
            reason = f" ({service.disabled_reason})" if service and service.disabled_reason else ""
            LOG.warning("agent %s: service %s%s: no new boots; what runs stays, deletes go "
                        "on", self.host, why, reason)  # fmt: skip
        self.gate.enable(schedulable)
        task = self._register_task
        if task is not None:
            task.wake()

    def register_classes(self) -> None:
        """Tell the ledger the classes this agent has room for, when they changed.

        A claim reads them to know whether a host that already tried a request must
        hand it back to another (alternates). A periodic task of its own, woken by
        every transition of the index: one script per burst of changes, off the
        request path. Written again once per heartbeat TTL whatever changed, since a
        claim drops a consumer whose heartbeat it found expired.
        """
        fittable = self.index.fittable() if self.gate.enabled else frozenset()
        now, last = time.monotonic(), self._registered_at
        stale = last is None or now - last >= self.opts.heartbeat_ttl_s
        if fittable != self._registered or stale:
            self.stores.agents.set_classes(self.host, fittable)
            self._registered, self._registered_at = fittable, now

    def reconcile_pass(self) -> ReconcileReport:
        """One periodic reconcile: the next slice; every node after a silence; every
        root provider after a change of the host's aggregates.

        The counters keep how many passes ran and their summed wall time (ms).
        """
        began = time.perf_counter()
        moved = self._reread_all.is_set()
        self._reread_all.clear()
        if self._came_back.is_set():
            self._came_back.clear()
            report = self.reconciler.run_all()
        elif moved:
            report = ReconcileReport(refreshed=self.reconciler.reread_roots())
            # The new root views live as long as the start's, which qsched-agent froze
            # (agents.main.settle_heap): freeze them too, or every full collection walks
            # them while the claims wait. No collection first: that would be the pause.
            if gc.get_freeze_count():
                gc.freeze()
        else:
            report = self.reconciler.run_pass()
        self.counters["aggregate_rereads"] += moved  # every root read after a move
        self.counters["reconcile_passes"] += 1
        self.counters["reconcile_ms"] += round((time.perf_counter() - began) * 1000)
        for name in ("released", "reaped", "running_deleted", "missing", "refreshed",
                     "requeued", "activated", "republished", "lost", "unheld"):  # fmt: skip
            self.counters[f"reconcile_{name}"] += len(getattr(report, name))
        return report

    def sync_classes(self) -> None:
        """Learn the live classes from the ledger: O(number of classes)."""
        self.placer.sync_classes()

    def _on_change(self, name: str, fittable: bool) -> None:
        """The index's transitions (under its lock): the consumer, then the ledger, hear."""
        self.gate.changed(name, fittable)
        task = self._register_task
        if task is not None:
            task.wake()

    # -- messages -----------------------------------------------------------------------

    def on_message(self, body: bytes, delivery: Delivery) -> None:
        """The consumer callback: settle every delivery exactly once.

        While the ledger or the broker is unreachable it waits (so the consumer
        stops taking requests), then raises: the bus gives the message back
        unacked and delivers it again once things answer.
        """
        try:
            self._handle(body, delivery)
        except exception.BackendUnavailable as exc:
            self.counters["backend_down"] += 1
            delay_s = self._backoff.next()
            LOG.warning("agent %s: %s; pausing %.1fs, the request goes back to the broker",
                        self.host, exc, delay_s)  # fmt: skip
            self._stopped.wait(delay_s)
            raise
        self._backoff.reset()

    def _handle(self, body: bytes, delivery: Delivery) -> None:
        try:
            msg = message.decode(body)
        except message.PoisonMessage as exc:
            self.counters["poison"] += 1
            LOG.warning("agent %s: dead-lettering a message from %s: %s", self.host,
                        delivery.queue, exc)  # fmt: skip
            delivery.reject(str(exc))
            return
        if isinstance(msg, message.DeleteRequest):
            self.delete(msg, delivery)
        elif isinstance(msg, message.ActionRequest):
            self.action(msg, delivery)
        elif isinstance(msg, message.MoveStep):
            self.move_step(msg, delivery)
        else:
            self.boot(msg, delivery)

    def boot(self, msg: message.BootRequest, delivery: Delivery) -> None:
        """Place a boot request through the steps (:mod:`agents.placing`, then
        :mod:`agents.groups`); settle its delivery once, by the outcome's code."""
        outcome = self.placer.admit(msg)
        if outcome.code is Code.ADMITTED:
            outcome = self.groups.decide(msg, delivery, self.placer.place(msg))
        self.settle[outcome.code](msg, delivery, outcome)

    def delete(self, msg: message.DeleteRequest, delivery: Delivery) -> None:
        """Destroy the instance a delete request names if the ledger says its delete was
        asked (:mod:`agents.deletes`), and settle its delivery once by the outcome's code."""
        outcome = self.deletes.delete(msg)
        self.settle_any[outcome.code](msg, delivery, outcome)

    def _settlers(self) -> tuple[dict[Code, SettleAny], dict[Code, Settle]]:
        """How a delivery is settled by its outcome's code: any message's, a boot's."""
        any_message: dict[Code, SettleAny] = {
            Code.ENDED: _ack, Code.DROP: self._drop, Code.DEAD_LETTER: self._reject,
        }  # fmt: skip
        boot: dict[Code, Settle] = {
            **any_message, Code.PLACED: self._placed, Code.LATER: self._later,
            Code.REFUSED: self.placer.refuse, Code.CLOSED: self.placer.refuse_closed,
            Code.HAND_BACK: self.placer.hand_back, Code.FORWARD: self.groups.forward,
            Code.PASS_ON: self.groups.pass_on, Code.PARK: self.groups.park,
        }  # fmt: skip
        return any_message, boot

    def _placed(self, msg: message.BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        # The claim is in the ledger: spawn even if the ack fails (a redelivery
        # then finds the build in flight or done, and is dropped). A member of a
        # multi-create waits until every member holds its claim.
        self.permit.spawn_or_wait(msg.instance_uuid)
        delivery.ack()

    def _later(self, msg: message.BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        self._stopped.wait(0.1)
        delivery.requeue(msg.encode())

    def _drop(self, msg: message.Message, delivery: Delivery, outcome: Outcome) -> None:
        self.counters["dropped"] += 1  # nothing to do any more (deleted, placed, archived)
        delivery.ack()

    def _reject(self, msg: message.Message, delivery: Delivery, outcome: Outcome) -> None:
        """Dead-letter a message that decodes but that this agent must not act on."""
        self.counters[outcome.counter] += 1
        LOG.warning("agent %s: dead-lettering a %s message for %s from %s: %s", self.host,
                    msg.KIND, msg.instance_uuid, delivery.queue, outcome.reason)  # fmt: skip
        delivery.reject(outcome.reason)

    # -- server actions -----------------------------------------------------------------

    def action(self, msg: message.ActionRequest, delivery: Delivery) -> None:
        """Stop, start or reboot an instance of this host (:mod:`agents.actions`); one
        for another host (published to the wrong queue) is dead-lettered."""
        if msg.host != self.host:
            self.counters["poison"] += 1
            delivery.reject(f"a server action for host {msg.host} reached {self.host}")
            return
        self.actions.run(msg)
        delivery.ack()

    def move_step(self, msg: message.MoveStep, delivery: Delivery) -> None:
        """Confirm or revert a move on this host (:mod:`agents.moves`); one for another
        host is dead-lettered."""
        if msg.host != self.host:
            self.counters["poison"] += 1
            delivery.reject(f"a move's {msg.step} for host {msg.host} reached {self.host}")
            return
        self.moves.run(msg)
        delivery.ack()


def _ack(msg: message.Message, delivery: Delivery, outcome: Outcome) -> None:
    delivery.ack()
