"""The compute agent: pull boot requests for classes its nodes fit, claim, spawn.

One agent drives one node or many. It consumes only the scheduling classes that
at least one of its nodes can fit right now (its :class:`~agents.nodes.NodeIndex`
says which, and which node to pick, without scanning nodes), plus its own host
queue for deletes. Per boot request it:

1. decodes it (undecodable: dead letter with the reason, go on);
2. drops it if the instance was deleted or placed meanwhile, and ends it in
   NoValidHost if its deadline has passed;
3. picks a node and claims in the ledger (client-driven retries on conflicts);
   when no node has room it records why in the instance history, stops
   consuming the class, and republishes the request at the tail of the queue;
4. acks, and hands the spawn to a worker: ACTIVE on success; on failure the claim
   is released and the request rescheduled until ``max_attempts``.

A request is acked only once its claim is in the ledger, so a crash before that
gives it back to the broker; the claim is idempotent per instance, so the
redelivery cannot place twice.

Its index and its driver are kept in line with the ledger by
:mod:`agents.reconcile`: at start, every ``[agent] reconcile_interval_s`` on a
slice of its nodes, at once when its heartbeat finds it was silent past the TTL,
and for a node whose claim the ledger took back under a spawn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agents.nodes import NodeIndex, Pick
from agents.reconcile import Reconciler, ReconcileReport, reconcile
from agents.registration import register_nodes
from agents.virt.base import SpawnFailed, VirtDriver
from qsched import exception, message
from qsched.bus.base import Bus, Consumer, Delivery
from qsched.conf import AgentOptions
from qsched.ledger import Stores, retry
from qsched.ledger.base import State
from qsched.reaper import Periodic, fail_no_valid_host, reap_expired
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.fit import Refusal, fit_request

LOG = logging.getLogger(__name__)
T = TypeVar("T")

#: How many nodes one request may try after the ledger refused the first pick.
MAX_PICKS = 3
#: A delete marked longer ago than this without its request arriving is done anyway.
STUCK_DELETE_S = 10.0


@dataclasses.dataclass
class _Build:
    """A claimed instance whose spawn is in flight."""

    request: message.BootRequest
    pick: Pick


class UnknownClass(exception.Invalid):
    msg_fmt = (
        "scheduling class {name} is not published in the ledger: no front door made it, so "
        "no agent consumes it"
    )


class ComputeAgent:
    """One compute service: its ``[agent]`` options, the ledger, the bus and a virt driver.

    ``claim_retries``: re-reads after generation conflicts before a claim gives up
    (``[ledger] max_conflict_retries``).
    """

    def __init__(
        self,
        options: AgentOptions,
        stores: Stores,
        bus: Bus,
        driver: VirtDriver,
        claim_retries: int = retry.DEFAULT_RETRIES,
    ) -> None:
        self.opts = options
        self.host: str = options.host
        self.claim_retries = claim_retries
        self.stores = stores
        self.bus = bus
        self.driver = driver
        self.index = NodeIndex(policy=options.placement_policy, on_change=self._on_change)
        self.consumer: Consumer | None = None
        self._builds: dict[str, _Build] = {}
        self._lock = threading.Lock()
        self._spawner = ThreadPoolExecutor(options.spawn_workers, f"spawn-{self.host}")
        self._periodic: list[Periodic] = []
        self._reconcile_task: Periodic | None = None
        self._stopped = threading.Event()
        self.counters: Counter[str] = Counter()
        self._sample_node: str | None = None  # where refusals are explained
        self._backoff = Backoff(options.ledger_retry_max_s)
        self.reconciler = Reconciler(
            stores, bus, driver, self.host, self.index, self._building,
            batch=options.reconcile_batch,
            release_leaked=options.release_leaked_allocations,
            action=options.running_deleted_instance_action,
        )  # fmt: skip
        self.reconciled = ReconcileReport()  # what the start found
        self._last_beat: float | None = None  # monotonic time of the last heartbeat written
        self._came_back = threading.Event()  # silent past the TTL: reconcile everything
        # A test hook: called with each request the agent is about to claim.
        self.before_claim: Callable[[message.BootRequest], None] | None = None

    # -- life cycle ---------------------------------------------------------------------

    def start(self, ready_timeout_s: float = 30.0) -> None:
        """Register the nodes and their zone, learn the classes, consume and heartbeat."""
        views = register_nodes(
            self.stores.ledger, self.driver.nodes(), self.opts.availability_zone,
            self.opts.aggregates,
        )  # fmt: skip
        if self.opts.availability_zone:  # the API accepts boots only in registered zones
            self.stores.agents.add_zone(self.opts.availability_zone)
        for view in views:
            self.index.add_node(view)
            self._sample_node = self._sample_node or view.name
        self.reconciled = reconcile(self.reconciler)
        self.sync_classes()
        self.heartbeat()
        self.finish_deletes()  # whatever a previous run of this agent left undone
        self.consumer = self.bus.consumer(self.host, self.on_message, self.index.fittable())
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
            ("deletes", STUCK_DELETE_S / 2,
             lambda: self.finish_deletes(time.time() - STUCK_DELETE_S)),
        ]  # fmt: skip
        if self.opts.reap_interval_s:
            tasks.append(("reaper", self.opts.reap_interval_s, lambda: reap_expired(self.stores)))
        for name, interval_s, fn in tasks:
            self._start_task(Periodic(f"{name}-{self.host}", interval_s, fn))
        # Agents started together must not all reconcile at once: the first pass falls
        # somewhere in the second half of the interval.
        interval_s = self.opts.reconcile_interval_s
        self._reconcile_task = self._start_task(Periodic(
            f"reconcile-{self.host}", interval_s, self.reconcile_pass,
            first_after_s=random.uniform(0.5, 1.0) * interval_s,
        ))  # fmt: skip

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
        if self.consumer is not None:
            self.consumer.stop(timeout_s)
        self._spawner.shutdown(wait=False, cancel_futures=False)
        # Keep heartbeating while spawns finish: a silent agent's builds are the
        # janitor's to requeue, and it would take them from under a live spawn.
        deadline = time.monotonic() + timeout_s
        while self._builds and time.monotonic() < deadline:
            time.sleep(0.05)
        for task in self._periodic:
            task.stop()
        if self._builds:
            LOG.warning("agent %s: %d builds unfinished at exit; the janitor requeues them",
                        self.host, len(self._builds))  # fmt: skip
        try:
            self.stores.agents.forget(self.host)
        except exception.QschedError:
            LOG.warning("agent %s: could not clear its heartbeat", self.host)

    def heartbeat(self) -> None:
        """Say this agent lives; notice when it was silent past its TTL (frozen, cut off).

        While it was silent the API may have deleted its instances locally and a
        janitor taken back its claims: the next reconcile then covers every node.
        """
        consumer = self.consumer
        classes = sorted(consumer.classes) if consumer is not None else []
        started = time.monotonic()
        self.stores.agents.heartbeat(
            self.host,
            self.opts.heartbeat_ttl_s,
            nodes=len(self.index),
            availability_zone=self.opts.availability_zone,
            classes=classes,
            building=len(self._builds),
            counters=dict(self.counters),
            resources={rc: {"used": used, "capacity": cap}
                       for rc, (used, cap) in self.index.totals().items()},
            index_digest=self.index.digest(),
        )  # fmt: skip
        last, self._last_beat = self._last_beat, started
        if last is not None and started - last > self.opts.heartbeat_ttl_s:
            LOG.warning("agent %s: silent for %.1fs, past its heartbeat TTL of %.1fs; "
                        "reconciling every node", self.host, started - last,
                        self.opts.heartbeat_ttl_s)  # fmt: skip
            self.counters["came_back"] += 1
            self._came_back.set()
            if self._reconcile_task is not None:
                self._reconcile_task.wake()

    def reconcile_pass(self) -> ReconcileReport:
        """One periodic reconcile: the next slice, or every node after a silence.

        The counters keep how many passes ran and their summed wall time (ms).
        """
        began = time.perf_counter()
        if self._came_back.is_set():
            self._came_back.clear()
            report = self.reconciler.run_all()
        else:
            report = self.reconciler.run_pass()
        self.counters["reconcile_passes"] += 1
        self.counters["reconcile_ms"] += round((time.perf_counter() - began) * 1000)
        for name in ("released", "reaped", "running_deleted", "missing", "refreshed",
                     "requeued", "activated"):  # fmt: skip
            self.counters[f"reconcile_{name}"] += len(getattr(report, name))
        return report

    def _building(self, uuid: str) -> bool:
        with self._lock:
            return uuid in self._builds

    def sync_classes(self) -> None:
        """Learn the live classes from the ledger: O(number of classes)."""
        known = self.index.classes()
        for name, definition in self.stores.agents.classes().items():
            if name not in known:
                self._learn_class(name, definition)

    def _learn_class(self, name: str, definition: dict[str, Any]) -> None:
        try:
            request = SchedulingClass.from_definition(definition).request()
        except exception.Invalid as exc:
            LOG.error("agent %s: ignoring class %s with a bad definition: %s", self.host, name,
                      exc)  # fmt: skip
            return
        self.index.add_request(name, request)

    def _on_change(self, name: str, fittable: bool) -> None:
        consumer = self.consumer
        if consumer is None:
            return  # before start: the consumer is built with index.fittable()
        if fittable:
            consumer.add_class(name)
        else:
            consumer.remove_class(name)

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
        else:
            self.boot(msg, delivery)

    def boot(self, msg: message.BootRequest, delivery: Delivery) -> None:
        """Claim a node for a boot request and spawn; requeue it if nothing here fits.

        The claim script is the check that the instance still waits (a deleted,
        placed or ended one fails it), so the usual path reads no record first.
        """
        uuid = msg.instance_uuid
        with self._lock:
            in_flight = uuid in self._builds
        if in_flight:
            # A redelivery while our spawn runs: drop it. But if the ledger took our
            # claim back (the janitor thought us dead), the request is due again: once
            # that spawn has given up, we or another agent must take it.
            if self._still_waiting(msg):
                self._stopped.wait(0.1)
                delivery.requeue(msg.encode())
            else:
                self.counters["dropped"] += 1
                delivery.ack()
            return
        if msg.expired():
            with contextlib.suppress(exception.InstanceNotFound):
                fail_no_valid_host(self.stores, uuid, "deadline")
            delivery.ack()
            return
        try:
            self._ensure_class(msg)
        except UnknownClass as exc:
            self.counters["unknown_class"] += 1
            LOG.warning("agent %s: dead-lettering a boot request from %s: %s", self.host,
                        delivery.queue, exc)  # fmt: skip
            delivery.reject(str(exc))
            return
        if self.before_claim is not None:
            self.before_claim(msg)
        placed = self._place(msg)
        if isinstance(placed, Refusal):
            if self._still_waiting(msg):
                self._refuse(msg, delivery, placed)
            else:
                self.counters["dropped"] += 1
                delivery.ack()
            return
        if placed is not None:
            # The claim is in the ledger: spawn even if the ack fails (a redelivery
            # then finds the build in flight or done, and is dropped).
            self._spawner.submit(self._spawn, uuid)
            delivery.ack()
            return
        self.counters["dropped"] += 1  # nothing to place any more (deleted, placed elsewhere)
        delivery.ack()

    def _still_waiting(self, msg: message.BootRequest) -> bool:
        """Whether the instance still waits for a host: worth requeueing its request."""
        try:
            inst = self.stores.instances.get(msg.instance_uuid)
        except exception.InstanceNotFound:
            return False
        return inst.state == State.BUILD and inst.host is None

    def _ensure_class(self, msg: message.BootRequest) -> None:
        """Know the request's class, from the ledger only: agents consume what it lists.

        :raises UnknownClass: the ledger does not list it (a forged or stray message).
        """
        if msg.scheduling_class in self.index.classes():
            return
        self.sync_classes()
        if msg.scheduling_class not in self.index.classes():
            raise UnknownClass(name=msg.scheduling_class)

    def _place(self, msg: message.BootRequest) -> Pick | Refusal | None:
        """Claim a node; the pick, why nothing fits, or None if it needs no placing."""
        for _ in range(MAX_PICKS):
            pick = self.index.pick(msg.scheduling_class)
            if pick is None:
                return self._why_not(msg)
            try:
                with self.index.writing(pick.node):
                    result = retry.claim(
                        self.stores.ledger, msg.instance_uuid, pick.allocations, self.host,
                        pick.node, max_retries=self.claim_retries,
                        on_conflict=functools.partial(self._note_conflict, msg, pick),
                    )  # fmt: skip
                    # ``already``: a redelivery after a restart; the index read it from the ledger
                    self._hold(msg, pick, account=not result.already)
            except exception.CapacityExceeded as exc:
                self._note_conflict(msg, pick, exc)
                self.reconciler.refresh_nodes([pick.node])
                continue
            except (exception.InstanceNotWaiting, exception.InstanceNotFound):
                return None
            return pick
        return self._why_not(msg)

    def _hold(self, msg: message.BootRequest, pick: Pick, account: bool) -> None:
        with self._lock:
            self._builds[msg.instance_uuid] = _Build(msg, pick)
        if account:
            self.index.claim(pick.node, pick.allocations)
        self.counters["claimed"] += 1

    def _note_conflict(self, msg: message.BootRequest, pick: Pick, exc: Exception) -> None:
        self.counters["conflicts"] += 1
        self.stores.instances.add_event(
            msg.instance_uuid, "conflict", host=self.host, node=pick.node,
            reason=str(exc), retried=True,
        )  # fmt: skip

    def _why_not(self, msg: message.BootRequest) -> Refusal | None:
        """Why no node fits, told on one node: exact for one node, a sample for many."""
        if self._sample_node is None:
            return None
        node = self.index.node(self._sample_node)
        result = fit_request(node, self.index.request(msg.scheduling_class))
        return result if isinstance(result, Refusal) else None

    def _refuse(self, msg: message.BootRequest, delivery: Delivery, why: Refusal | None) -> None:
        reason = str(why) if why is not None else "no node of this agent fits the request"
        self.counters["refused"] += 1
        self.stores.instances.add_event(
            msg.instance_uuid, "refused", host=self.host, node=why.node if why else None,
            reason=reason, kind=why.kind.value if why else "none", nodes=len(self.index),
        )  # fmt: skip
        delivery.requeue(msg.refused_by(self.host).encode())

    # -- spawning -----------------------------------------------------------------------

    def _spawn(self, uuid: str) -> None:
        build = self._builds[uuid]
        msg, pick = build.request, build.pick
        try:
            self.driver.spawn(uuid, pick.node, msg.to_flavor())
        except SpawnFailed as exc:
            self._reschedule(build, str(exc))
            return
        except Exception as exc:  # a driver bug must not leak the claim
            LOG.exception("agent %s: spawn of %s crashed", self.host, uuid)
            self._reschedule(build, f"spawn crashed: {exc}")
            return
        try:
            self._persist(msg, lambda: self.stores.instances.set_active(uuid, self.host, pick.node))
            self.counters["active"] += 1
        except (exception.InstanceNotWaiting, exception.InstanceNotFound):
            # Deleted, ended by its deadline or taken back by a janitor while it
            # spawned: the ledger released its claim; the index reads the node again.
            self.driver.destroy(uuid, pick.node)
            self._forget(uuid)
            self.reconciler.refresh_nodes([pick.node])
            return
        self._forget(uuid)

    def _reschedule(self, build: _Build, reason: str) -> None:
        msg, node = build.request, build.pick.node
        uuid = msg.instance_uuid
        self.counters["spawn_failed"] += 1
        try:
            with self.index.writing(node):
                inst = self._persist(
                    msg, lambda: self.stores.instances.requeue(uuid, self.host, reason)
                )
                self._forget(uuid, release=True)
        except (exception.InstanceNotWaiting, exception.InstanceNotFound):
            self._forget(uuid)  # its claim was released under it: read the node again
            self.reconciler.refresh_nodes([node])
            return
        if inst.state != State.BUILD:
            return  # it was being deleted: the ledger ended it
        if inst.attempts >= msg.max_attempts:
            fail_no_valid_host(self.stores, uuid, "max_attempts")
            return
        try:
            self._persist(msg, lambda: self.bus.publish_boot(msg.next_attempt(self.host)))
            self.stores.instances.outbox_done([(uuid, inst.outbox)])
        except exception.BackendUnavailable:
            LOG.error("agent %s: could not reschedule %s; the janitor publishes it from the "
                      "outbox", self.host, uuid)  # fmt: skip

    def _persist(self, msg: message.BootRequest, write: Callable[[], T]) -> T:
        """Run ``write``, retrying while the ledger or bus is down, up to the deadline.

        A spawn worker holds a claim nobody else will finish, so it keeps trying
        instead of giving up at the first outage.
        """
        backoff = Backoff(self.opts.ledger_retry_max_s)
        while True:
            try:
                return write()
            except exception.BackendUnavailable:
                if msg.expired() or self._stopped.is_set():
                    raise
                self._stopped.wait(backoff.next())

    def _forget(self, uuid: str, release: bool = False) -> None:
        """End a build; ``release``: the agent released its claim, free it here too."""
        with self._lock:
            build = self._builds.pop(uuid, None)
        if build is not None and release:
            self.index.release(build.pick.node, build.pick.allocations)

    # -- deletes ------------------------------------------------------------------------

    def delete(self, msg: message.DeleteRequest, delivery: Delivery) -> None:
        self._destroy(msg.instance_uuid, msg.node)
        delivery.ack()

    def _destroy(self, uuid: str, node: str) -> None:
        """Destroy an instance of this host, then release its claim and quota."""
        if node in self.index:
            self.driver.destroy(uuid, node)
            with self.index.writing(node):
                allocations = self.stores.ledger.get_allocations(uuid).allocations
                with contextlib.suppress(exception.InstanceNotFound):
                    self.stores.instances.delete(uuid)
                if allocations:
                    self.index.release(node, allocations)
        else:
            with contextlib.suppress(exception.InstanceNotFound):
                self.stores.instances.delete(uuid)
        self.counters["deleted"] += 1

    def finish_deletes(self, marked_before: float | None = None) -> int:
        """Finish deletes of this host's instances marked before ``marked_before``.

        Catches a delete request lost on the bus (or with a previous run of this
        agent): reads only this host's deleting set.
        """
        done = 0
        for uuid in self.stores.instances.deleting(self.host, marked_before):
            with self._lock:
                if uuid in self._builds:
                    continue  # its spawn ends first; its delete request is still due
            try:
                node = self.stores.instances.get(uuid).node or ""
            except exception.InstanceNotFound:
                continue
            self._destroy(uuid, node)
            done += 1
        return done


class Backoff:
    """Exponential delays from 0.1 s, doubling up to ``max_s``."""

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self._delay_s = 0.05

    def next(self) -> float:
        self._delay_s = min(self.max_s, self._delay_s * 2)
        return self._delay_s

    def reset(self) -> None:
        self._delay_s = 0.05


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.01) -> bool:
    """Poll ``predicate`` until true or timed out (for tests and the demo)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True
