"""One chaos run on one transport: servers, stack, load with faults, settle, check.

Transports: ``amqp`` (the kombu bus on the machine's RabbitMQ), ``redis`` (the
kombu bus on a ``redis-server`` of the run's own) and ``oslo`` (the oslo.messaging
bus, :mod:`qsched.bus.oslo`, on a RabbitMQ node of the run's own with the
deployment's policies applied, so its broker restart never touches a shared node).
Given ``rabbit_cluster`` nodes, ``amqp`` and ``oslo`` run on a RabbitMQ cluster of
the run's own instead (:class:`~qsched.stack.rabbitmq.RabbitCluster`), every node
named in the bus URL (kombu's ``;`` failover list for ``amqp``, oslo.messaging's
``rabbit://`` multi-host URL for ``oslo``), and its nodes are lost in turn
(``rabbit_node_loss``) instead of a broker restart.

:class:`ChaosRun` owns everything it starts and stops it in ``finally``: the
stack's processes, its own Redis servers and RabbitMQ node, the run's queues on
the shared RabbitMQ. A RabbitMQ restart in progress always ends with ``start_app``.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agents.virt.fake import read_state
from qsched.bus.base import Bus
from qsched.bus.kombu import KombuBus
from qsched.bus.oslo import OsloBus
from qsched.chaos import checks, report
from qsched.chaos.faults import Fault, FaultInjector, FaultSettings, default_counts, make_plan
from qsched.chaos.load import Call, LoadGenerator, token
from qsched.chaos.moves import Mover
from qsched.chaos.servers import RabbitCluster, RabbitMQ, RabbitNode, RedisServer, wait_for
from qsched.chaos.stack import FLAVORS, Stack, StackSpec
from qsched.ledger.server import FSYNC
from qsched.stack.sentinel import SentinelSet

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
EVIDENCE_ITEMS = 10  # findings per invariant shown with their history
HISTORY_EVENTS = 30
Echo = Callable[[str], None]


@dataclasses.dataclass
class RunSettings:
    transport: str  # "amqp", "redis" or "oslo"
    duration_s: float = 240.0
    seed: int = 1
    rate: float = 4.0
    move_rate: float = 0.5  # moves of the load's servers per second (qsched/chaos/moves.py)
    lifetime_s: float = 8.0
    clients: int = 8
    outage_s: float = 5.0
    freeze_s: float = 0.0  # 0: twice the heartbeat TTL plus a second
    stall_s: float = 8.0
    crash_loss_s: float = 1.0
    fault_counts: dict[str, int] | None = None  # None: faults.default_counts(duration_s)
    amqp_url: str = AMQP_URL
    spec: StackSpec = dataclasses.field(default_factory=StackSpec)
    projects: int = 3
    drain: bool = True
    ledger_signal: int = signal.SIGTERM  # how the ledger restart stops Redis
    progress_every_s: float = 5.0
    ledger: str = "redis"  # "redis": one server; "sentinel": a master, 2 replicas, 3 sentinels
    rabbit_cluster: int = 0  # nodes of a RabbitMQ cluster of the run's own; 0: none
    node_loss: str = "kill"  # how rabbit_node_loss stops a node: "kill" or "stop"
    host_queues: str = ""  # [bus] host_queue_type; "": quorum on a cluster, else the spec's

    def counts(self) -> dict[str, int]:
        if self.fault_counts is not None:
            return self.fault_counts
        return default_counts(self.duration_s, self.ledger, cluster=bool(self.rabbit_cluster))

    def fault_settings(self) -> FaultSettings:
        return FaultSettings(self.outage_s, self.freeze_s, self.stall_s, self.crash_loss_s,
                             node_loss=self.node_loss)  # fmt: skip

    def quota_limits(self) -> dict[str, int]:
        spec = self.spec
        return {"instances": spec.quota_instances, "cores": spec.quota_cores,
                "ram_mb": spec.quota_cores * 2048}  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["fault_counts"] = self.counts()
        out["spec"] = {k: v for k, v in out["spec"].items() if k != "extra_config"}
        out.pop("amqp_url")  # may carry a password
        out["ledger_signal"] = signal.Signals(self.ledger_signal).name
        return out


class ChaosRun:
    """One run. ``cluster``: a RabbitMQ cluster already started, of ``rabbit_cluster``
    nodes, for a caller that runs several (a test module); the run stops its nodes in
    turn and starts them again, but leaves the cluster running. Without one, a run
    given ``rabbit_cluster`` starts and stops its own.

    :raises ValueError: ``rabbit_cluster`` with the ``redis`` transport, or a cluster
        of another size than ``rabbit_cluster``.
    """

    def __init__(
        self,
        settings: RunSettings,
        directory: Path,
        echo: Echo,
        cluster: RabbitCluster | None = None,
    ) -> None:
        if settings.rabbit_cluster and settings.transport not in ("amqp", "oslo"):
            raise ValueError(f"a RabbitMQ cluster serves the amqp and oslo transports, "
                             f"not {settings.transport}")  # fmt: skip
        host_queues = settings.host_queues or ("quorum" if settings.rabbit_cluster else "")
        if host_queues:  # the spec says what the stack's processes read
            spec = dataclasses.replace(settings.spec, host_queue_type=host_queues)
            settings = dataclasses.replace(settings, host_queues=host_queues, spec=spec)
        if cluster is not None and len(cluster.nodes) != settings.rabbit_cluster:
            raise ValueError(f"the cluster given has {len(cluster.nodes)} nodes, the "
                             f"settings ask for {settings.rabbit_cluster}")  # fmt: skip
        self.settings = settings
        self.dir = directory
        self.echo = echo
        self.ledger: RedisServer | None = None  # on a Sentinel set, its first master
        self.sentinels: SentinelSet | None = None
        self.bus_server: RedisServer | None = None
        self.rabbit: RabbitMQ | None = None
        self.rabbit_node: RabbitNode | None = None
        self.cluster = cluster
        self.own_cluster = cluster is None
        self.cluster_info: dict[str, Any] = {}
        self.stack: Stack | None = None
        self.load: LoadGenerator | None = None
        self.mover: Mover | None = None
        self.injector: FaultInjector | None = None
        self.faults: list[Fault] = []
        self.crashes: list[dict[str, Any]] = []
        self.t0 = 0.0
        self.quiescence: dict[str, Any] = {}
        self.drain_info: dict[str, Any] = {}
        self.quota_samples: list[tuple[float, dict[str, dict[str, int]]]] = []
        self.outbox_max_age_s = 0.0
        self.convergence: dict[str, Any] = {}

    # -- the run -----------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        """Run everything; return the report (``ok`` False if any invariant broke)."""
        result: dict[str, Any] | None = None
        try:
            self._start()
            self._load_with_faults()
            self._settle()
            result = self._check()
        finally:
            cleanup = self._cleanup()
        result["cleanup"] = cleanup
        return result

    def _start(self) -> None:
        s = self.settings
        ledger_url = self._start_ledger()
        if s.transport == "redis":
            self.bus_server = RedisServer(self.dir, "bus-redis")
            self.bus_server.start()
            transport_url = self.bus_server.url
        elif s.rabbit_cluster:
            transport_url = self._start_cluster()
        elif s.transport == "oslo":
            self.rabbit_node = RabbitNode(self.dir)
            started_s = self.rabbit_node.start()
            self.echo(f"[oslo] RabbitMQ node {self.rabbit_node.node} up in {started_s:.1f} s")
            transport_url = self.rabbit_node.url
        else:
            self.rabbit = RabbitMQ(s.amqp_url)
            self.rabbit.check()
            if s.counts().get("broker_restart"):
                self.rabbit.check_restartable()
            transport_url = s.amqp_url
        driver = "oslo.messaging" if s.transport == "oslo" else "kombu"
        self.stack = Stack(s.spec, self.dir, transport_url, ledger_url, bus_driver=driver)
        if self.rabbit_node is not None:  # before any queue exists: its dead-letter exchange
            self.rabbit_node.apply_policies(self.stack.prefix, s.spec.delivery_limit)
        if self.cluster is not None and s.transport == "oslo":
            self.cluster.apply_policies(self.stack.prefix, s.spec.delivery_limit)
        self.echo(
            f"[{s.transport}] starting the API and {s.spec.agents} agents "
            f"(bus prefix {self.stack.prefix}, logs in {self.stack.logs})"
        )
        self.stack.start()

    def _start_ledger(self) -> str:
        """The run's ledger servers, started: one redis-server, or a Sentinel set; its URL."""
        s = self.settings
        fsync = FSYNC[s.spec.durability]
        if s.ledger == "sentinel":
            self.sentinels = SentinelSet(self.dir / "ledger", fsync=fsync)
            self.sentinels.start()
            self.ledger = self.sentinels.master()
            self.echo(f"[{s.transport}] ledger on a Sentinel set: {self.sentinels.url()}")
            return self.sentinels.url()
        self.ledger = RedisServer(self.dir, "ledger-redis", s.ledger_signal, fsync=fsync)
        self.ledger.start()
        return self.ledger.url

    def _start_cluster(self) -> str:
        """The run's RabbitMQ cluster, started unless given; the bus URL naming every node."""
        s = self.settings
        if self.cluster is None:
            self.cluster = RabbitCluster(self.dir, s.rabbit_cluster)
            self.echo(f"[{s.transport}] starting a RabbitMQ cluster of {s.rabbit_cluster} nodes")
            self.cluster.start()
        cluster = self.cluster
        self.cluster_info = {
            "nodes": [n.node for n in cluster.nodes],
            "started_s": cluster.started_s,
            "rss_mb_start": cluster.rss_mb(),
        }
        self.echo(f"[{s.transport}] RabbitMQ cluster {', '.join(cluster.hosts())} up "
                  f"(started in {cluster.started_s} s)")  # fmt: skip
        return cluster.kombu_url if s.transport == "amqp" else cluster.url

    def _load_with_faults(self) -> None:
        s, stack = self.settings, self._stack()
        projects = [f"{stack.prefix}-p{i}" for i in range(s.projects)]
        self.faults = make_plan(s.duration_s, s.counts(), random.Random(s.seed))
        self.load = LoadGenerator(
            stack.port,
            projects,
            [(n, w) for n, _, _, w in FLAVORS],
            tag=stack.prefix,
            rate=s.rate,
            lifetime_s=s.lifetime_s,
            clients=s.clients,
            seed=s.seed,
        )
        self.t0 = time.time()
        broker = {"amqp": self.rabbit, "oslo": self.rabbit_node}.get(s.transport, self.bus_server)
        self.injector = FaultInjector(
            stack,
            self.faults,
            broker,
            self._ledger(),
            s.fault_settings(),
            random.Random(s.seed + 1),
            self.t0,
            s.duration_s,
            load=self.load,
            sentinels=self.sentinels,
            cluster=self.cluster,
        )
        self.echo(
            f"[{s.transport}] load {s.rate}/s for {s.duration_s:.0f} s; faults planned: "
            + ", ".join(f"{f.kind}@{f.at_s:.0f}s" for f in self.faults)
        )
        if s.move_rate > 0:
            names = [n for n, _, _, _ in FLAVORS]
            self.mover = Mover(stack.port, self.load, names, s.move_rate, s.seed + 2)
        self.load.start()
        if self.mover is not None:
            self.mover.start()
        self.injector.start()
        aborted = True
        try:
            self._tick_until(lambda: time.time() >= self.t0 + s.duration_s, "load")
            aborted = False
        finally:
            if self.mover is not None:
                self.mover.stop()
            self.load.stop()
            self.injector.finish(abort=aborted)

    def _settle(self) -> None:
        """All agents up again, then wait until no accepted request is still waiting."""
        stack = self._stack()
        for index in stack.agents:
            if not stack.agent_running(index):
                stack.start_agent(index)
        wait_for(stack.agents_alive, 30, 0.2)
        timeout_s = self.settings.spec.build_timeout_s + 30
        started = time.time()
        # every move the mover made waits no more for a confirm (one a fault ate)
        unconfirmed = self.mover.finish(timeout_s) if self.mover is not None else []
        reached = self._tick_until(lambda: not self._pending(), "settle", timeout_s)
        self.quiescence = {
            "reached": reached,
            "waited_s": round(time.time() - started, 1),
            "timeout_s": timeout_s,
            "waiting": len(self._pending()),
            "moves_unconfirmed": len(unconfirmed),
        }

    def _pending(self) -> list[str]:
        """Instances in BUILD (answered or not), and 204-deleted ones whose delete is still
        under way (task_state deleting). A 204-deleted one neither DELETED nor deleting had
        its delete lost by a crash (``lost_deletes``): nothing will end it, so it is not
        waited for."""
        calls = self._load().snapshot()
        deleted = {c.uuid for c in calls if c.kind == "delete" and c.status == 204 and c.uuid}
        records = checks.read_records(self._stack().stores)
        return sorted(
            u
            for u, record in records.items()
            if record.get("state") == "BUILD"
            or (u in deleted and record.get("task_state") == "deleting")
            or (record.get("state") == "ACTIVE" and record.get("migration"))  # a move on its way
        )

    def _tick_until(self, done: Callable[[], bool], phase: str, timeout_s: float = 1e9) -> bool:
        """Poll once a second (held claims, crashed processes, progress) until ``done``."""
        deadline = time.time() + timeout_s
        last_progress = 0.0
        while True:
            try:
                if done():
                    return True
            except Exception:
                pass
            if time.time() > deadline:
                return False
            self._watch_processes()
            self._poll_held()
            self._sample()
            if time.time() - last_progress >= self.settings.progress_every_s:
                self.echo(self._progress(phase))
                last_progress = time.time()
            time.sleep(1.0)

    def _poll_held(self) -> None:
        try:
            if self.injector is not None:
                self.injector.poll_held()
        except Exception:
            pass

    def _sample(self) -> None:
        """Once a second: every project's quota, and how long the outbox has kept a boot."""
        stores = self._stack().stores
        try:
            self.quota_samples.append(
                (round(time.time() - self.t0, 1), checks.quota_samples(stores))
            )
            oldest = stores.instances.unpublished(limit=1)
        except Exception:  # the ledger is down: nothing to sample
            return
        if oldest:
            self.outbox_max_age_s = max(self.outbox_max_age_s, oldest[0][1])

    def _watch_processes(self) -> None:
        """A process that exits without being told to is a crash: note it, start it again."""
        stack = self._stack()
        current = self.injector.current if self.injector else None
        for index, proc in list(stack.agents.items()):
            host = stack.hosts[index]
            if proc.poll() is not None and not (current and current.target == host):
                self._note_crash(f"agent{index}", host, proc.returncode)
                stack.start_agent(index)
        if stack.api is not None and stack.api.poll() is not None:
            self._note_crash("api", "gunicorn", stack.api.returncode)
            stack.start_api()

    def _note_crash(self, name: str, target: str, code: int | None) -> None:
        log = self._stack().logs / f"{name}.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        self.crashes.append(
            {
                "process": name,
                "target": target,
                "exit_code": code,
                "at_s": round(time.time() - self.t0, 1),
                "log_tail": tail,
            }
        )
        self.echo(f"!! {name} ({target}) exited by itself with {code}; restarting it")

    def _progress(self, phase: str) -> str:
        s, calls = self.settings, self._load().snapshot()
        boots = [c for c in calls if c.kind == "boot"]
        statuses = Counter("none" if c.status is None else c.status for c in boots)
        try:
            stores = self._stack().stores
            waiting: Any = stores.inspector.waiting_count()
        except Exception:
            waiting = "? (ledger down)"
        done = sum(1 for f in self.faults if f.started is not None)
        current = self.injector.current if self.injector else None
        now = f", now {current.kind} {current.target}" if current else ""
        return (
            f"[{s.transport} {phase} {time.time() - self.t0:5.0f}s/{s.duration_s:.0f}s] "
            f"boots {len(boots)} ({', '.join(f'{k}: {v}' for k, v in sorted(statuses.items(), key=str))}) "  # noqa: E501
            f"deletes {len(calls) - len(boots)} | waiting {waiting} | faults "
            f"{done}/{len(self.faults)}{now} | crashes {len(self.crashes)}"
        )

    # -- the checks --------------------------------------------------------------------

    def _check(self) -> dict[str, Any]:
        stack, calls = self._stack(), self._load().snapshot()
        self.echo(f"[{self.settings.transport}] checking the ledger")
        snap = checks.take_snapshot(stack.stores, stack.hosts)
        history = checks.histories(stack.stores, snap.records)
        audit_report, audit_found = checks.audit_findings(stack.stores)
        accepted = {c.uuid: c for c in calls if c.kind == "boot" and c.status == 202 and c.uuid}
        refused = [c for c in calls if c.kind == "boot" and c.status not in (None, 202)]
        found = {
            "lost": checks.lost(snap, accepted),
            "stuck": checks.stuck(snap, accepted),
            "stranded": checks.stranded(snap, accepted, history, self._crashes()),
            "lost_deletes": checks.lost_deletes(snap, [c for c in calls if c.kind == "delete"]),
            "duplicates": checks.duplicates(snap, history),
            "overcommits": checks.overcommits(snap),
            "leaks": checks.leaks(snap),
            "accounting": checks.accounting(snap),
            "partial_state": checks.partial_state(snap, refused),
            "quota": checks.quota_exceeded(self.quota_samples, self.settings.quota_limits()),
            "unpublished": checks.unpublished(history),
            "moves": checks.unsettled_moves(stack.stores, snap.records),
            "audit": audit_found,
            "crashes": self.crashes,
            **self._converged("before_drain"),
        }
        if self.settings.drain:
            found["drain"] = self._drain(snap)
            found.update(self._converged("after_drain"))
        # a delete the API took (204): one answered 404 found it gone already
        asked = {c.uuid for c in calls if c.kind == "delete" and c.status == 204 and c.uuid}
        found["dead_letters"] = self._dead_letters(snap.records, history, asked)
        if self.cluster is not None:
            found["replication"] = self._replication()
        return self._report(calls, snap, history, found, audit_report, accepted)

    def _crashes(self) -> list[tuple[float, float]]:
        """When each fault that may lose the ledger's writes began, and when the ledger
        answered again (:data:`qsched.chaos.report.LOSSY`)."""
        return [(f.started, f.restored or f.started) for f in self.faults
                if f.kind in report.LOSSY and f.started]  # fmt: skip

    def _converged(self, when: str) -> dict[str, list[dict[str, Any]]]:
        """Every agent's index and driver agree with the ledger, within the reconcile's bound.

        The bound: one reconcile pass (each agent has fewer nodes than a slice), a
        heartbeat to report it, and slack for a loaded machine.
        """
        stack, spec = self._stack(), self.settings.spec
        bound_s = spec.reconcile_interval_s + 2 * 0.5 + 10
        started = time.time()

        def findings() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            snap = checks.take_snapshot(stack.stores, stack.hosts)
            details = checks.agent_details(stack.stores, stack.hosts)
            running = {stack.hosts[i]: read_state(stack.vms_file(i)) for i in stack.agents}
            return checks.index_mismatches(snap, details), checks.driver_mismatches(snap, running)

        index, driver = findings()
        while (index or driver) and time.time() - started < bound_s:
            time.sleep(0.5)
            index, driver = findings()
        self.convergence[when] = {"waited_s": round(time.time() - started, 1), "bound_s": bound_s}
        return {f"index_{when}": index, f"driver_{when}": driver}

    def _replication(self) -> list[dict[str, Any]]:
        """The run's quorum queues with a replica missing on some node of the cluster.

        Boot queues are declared while every node runs, so each has a replica on each
        node (RabbitMQ's default initial group size); a lost node that came back must
        still hold its replicas.
        """
        cluster, prefix = self._cluster(), self._stack().prefix
        nodes = sorted(node.node for node in cluster.nodes)
        queues = {name: kind for name, kind in cluster.queues().items()
                  if name.startswith(f"{prefix}.")}  # fmt: skip
        members = {name: cluster.members(name) for name, kind in queues.items() if kind == "quorum"}
        self.cluster_info.update(
            queues={name: {"type": kind, "replicas": len(members.get(name, []))}
                    for name, kind in sorted(queues.items())},
            rss_mb_end=cluster.rss_mb(),
        )  # fmt: skip
        return [{"queue": name, "problem": "a node holds no replica", "members": held}
                for name, held in sorted(members.items()) if held != nodes]  # fmt: skip

    def _dead_letters(
        self,
        records: dict[str, dict[str, str]],
        history: dict[str, list[dict[str, Any]]],
        asked_deletes: set[str],
    ) -> list[dict[str, Any]]:
        """Take the run's dead letters: each poison once, each forged message at most once
        and never obeyed (``asked_deletes``: the servers the API deleted for the load), no
        valid request among them."""
        stack = self._stack()
        bus: Bus = (
            OsloBus(stack.transport_url, prefix=stack.prefix)
            if self.settings.transport == "oslo"
            else KombuBus(stack.transport_url, prefix=stack.prefix)
        )
        try:
            letters = bus.take_dead_letters(limit=100_000)
        finally:
            bus.close()
        poison = self.injector.poison if self.injector is not None else []
        return checks.dead_letter_findings(letters, poison, records, history, asked_deletes)

    def _drain(self, snap: checks.Snapshot) -> list[dict[str, Any]]:
        """Delete every server left through the API, wait, and expect an empty ledger."""
        stack = self._stack()
        left = {u: r["project_id"] for u, r in snap.records.items() if r.get("state") != "DELETED"}
        self.echo(f"[{self.settings.transport}] draining: deleting the {len(left)} servers left")
        started = time.time()
        with ThreadPoolExecutor(8) as pool:
            answers = dict(
                zip(left, pool.map(lambda u: self._delete_hard(u, left[u]), left), strict=True)
            )

        def gone() -> bool:
            records = checks.read_records(stack.stores, left).values()
            return all(r.get("state") == "DELETED" for r in records)

        reached = wait_for(gone, 60, 0.5)
        after = checks.take_snapshot(stack.stores, stack.hosts)
        self.drain_info = {
            "deleted": len(left),
            "reached": reached,
            "waited_s": round(time.time() - started, 1),
            "refused": {u: s for u, s in answers.items() if s not in (204, 404)},
        }
        return checks.drained(after) + checks.overcommits(after) + checks.accounting(after)

    def _delete_hard(self, uuid: str, project: str) -> int | None:
        status: int | None = None
        for _ in range(5):
            try:
                status = self._stack().request(
                    "DELETE", f"/v2.1/servers/{uuid}", token=token(project)
                )[0]
            except OSError:
                status = None
            if status in (204, 404):
                return status
            time.sleep(1.0)
        return status

    def _report(
        self,
        calls: list[Call],
        snap: checks.Snapshot,
        history: dict[str, list[dict[str, Any]]],
        found: dict[str, list[dict[str, Any]]],
        audit_report: dict[str, Any],
        accepted: dict[str, Call],
    ) -> dict[str, Any]:
        launched = report.launched_times(snap)
        events = [report.fault_figures(f, calls, launched, history, self.t0) for f in self.faults]
        # A run whose faults did not happen as planned proves nothing.
        found["faults"] = [
            {"fault": e["kind"], "target": e["target"], "error": e["error"]}
            for e in events
            if e.get("error")
        ]
        # a master killed under async replication may take acknowledged writes with it
        crashed = any(f.kind in report.LOSSY and f.started for f in self.faults)
        allowed = report.MAY_LOSE[self.settings.spec.durability] if crashed else frozenset()
        failed = [name for name, items in found.items() if items and name not in allowed]
        no_answer = [c.name for c in calls if c.kind == "boot" and c.status is None]
        names = snap.by_name()
        return {
            "transport": self.settings.transport,
            "ledger": self.settings.ledger,
            "ok": not failed,
            "failed": failed,
            "settings": self.settings.to_dict(),
            "requests": report.requests_summary(calls, self._load().skipped),
            "final": {
                **report.final_states(snap, list(accepted)),
                "errors": self._evidence(report.errors(snap, list(accepted)), history),
            },
            "unanswered_boots_created": dict(
                Counter(snap.records[u].get("state") for n in no_answer for u in names.get(n, []))
            ),
            "faults": {
                "by_kind": dict(Counter(f.kind for f in self.faults if f.started)),
                "events": events,
            },
            "moves_asked": dict(self.mover.asked) if self.mover is not None else {},
            "quiescence": self.quiescence,
            "drain": self.drain_info,
            "convergence": self.convergence,
            "outbox_max_age_s": round(self.outbox_max_age_s, 1),
            "durability": self.settings.spec.durability,
            "allowed_losses": sorted(allowed),
            "invariants": {
                name: {
                    "count": len(items),
                    "ok": not items or name in allowed,
                    "items": self._evidence(items, history),
                }
                for name, items in found.items()
            },
            "audit": {
                k: v
                for k, v in audit_report.items()
                if k in ("providers", "consumers", "instances", "ok")
            },
            "logs": str(self._stack().logs),
            **({"cluster": self.cluster_info} if self.cluster_info else {}),
        }

    def _evidence(
        self, items: list[dict[str, Any]], history: dict[str, list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """The first findings, each instance with its history (times from the load's start)."""
        shown = []
        for item in items[:EVIDENCE_ITEMS]:
            uuid = item.get("instance")
            if uuid:
                events = history.get(uuid) or checks.histories(self._stack().stores, [uuid])[uuid]
                item = {**item, "history": [self._event(e) for e in events[-HISTORY_EVENTS:]]}
            shown.append(item)
        return shown

    def _event(self, event: dict[str, Any]) -> dict[str, Any]:
        return {
            "at_s": round(float(event.get("t", 0)) - self.t0, 3),
            **{k: v for k, v in event.items() if k != "t" and v},
        }

    # -- cleanup -----------------------------------------------------------------------

    def _cleanup(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self.injector is not None:
            self.injector.finish(abort=True)
        if self.load is not None:
            self.load.stop()
        if self.stack is not None:
            info["exit_codes"] = self.stack.stop()
            try:  # a broker of the run's own goes with it: nothing to remove there
                info["bus_cleanup_failed"] = self.stack.forget() if self._shared_broker() else []
            except Exception as exc:
                info["bus_cleanup_failed"] = [f"{type(exc).__name__}: {exc}"]
            self.stack.close()
        for server in (self.bus_server, self.sentinels, self.ledger, self.rabbit_node):
            if server is not None:
                server.stop()
        if self.rabbit_node is not None:
            info["broker_start_s"] = self.rabbit_node.started_s
        if self.cluster is not None and self.own_cluster:
            self.cluster.stop()
        return info

    def _shared_broker(self) -> bool:
        """The bus outlives the run: the machine's RabbitMQ, or a cluster of the caller's."""
        if self.cluster is not None:
            return not self.own_cluster
        return self.settings.transport == "amqp"

    def _cluster(self) -> RabbitCluster:
        assert self.cluster is not None
        return self.cluster

    def _stack(self) -> Stack:
        assert self.stack is not None
        return self.stack

    def _load(self) -> LoadGenerator:
        assert self.load is not None
        return self.load

    def _ledger(self) -> RedisServer:
        assert self.ledger is not None
        return self.ledger
