"""The faults of a run: a seeded plan, and a thread that injects them one at a time.

Kinds:

``agent_kill``
    SIGKILL a random running agent; start it again (same host) after a random
    delay, sometimes shorter and sometimes longer than its heartbeat TTL, so
    both the agent's own reconciliation and the janitor get their turn.
``agent_term``
    SIGTERM a random running agent (graceful: it must finish or give back what
    it holds), wait for it to exit, start it again.
``broker_restart``
    RabbitMQ ``stop_app`` / ``start_app``, or for the Redis transport a restart
    of the bus's own ``redis-server``.
``ledger_restart``
    A restart of the ledger's ``redis-server`` (SIGTERM makes it fsync before
    exiting).
``agent_freeze``
    SIGSTOP a random running agent for longer than its heartbeat TTL (the API
    then deletes its instances locally and a janitor takes back its claims, as
    for a network cut), then SIGCONT: it must find out and converge by itself.
``api_worker_kill``
    A burst of boots, and a gunicorn worker SIGKILLed while they are in flight
    (gunicorn starts another): records made and never published are the
    outbox's to publish.
``machine_crash``
    A crash of the ledger's machine: SIGKILL its ``redis-server``, cut its AOF
    back by what the disk would not have had (``--crash-loss-s`` under
    ``appendfsync everysec``, nothing under ``always``), start it again.
``ledger_stall``
    SIGSTOP the ledger's ``redis-server`` for longer than the services'
    ledger timeout, then SIGCONT: the commands that waited run late.
``master_kill``
    With the ledger on a Sentinel set (``--ledger sentinel``): SIGKILL its
    master under load, wait until the sentinels promote a replica, then start
    the killed server again ``--outage-s`` later as a replica of the new master (an
    operator bringing the machine back). ``restored`` is the promotion.
``poison``
    Malformed messages published straight to a boot queue and a host queue
    (an empty body, a text body, garbage, a wrong shape, an unknown class, an
    oversized one), each marked so the checks can find its dead letter.
``rabbit_node_loss`` (runs on a RabbitMQ cluster of their own only)
    One node of the cluster stopped (SIGKILL of its Erlang VM, a crash, or
    ``rabbitmqctl stop``) for the outage, then started again; the fault ends once
    the cluster is whole again. Each loss takes the next node in the order the bus
    URL lists them, starting with the first, which every client prefers: the
    clients on it must fail over while the other nodes keep its quorum queues.

For agent faults the injector records which instances the agent left claimed
and not ACTIVE (read from the ledger after the process is gone), and
:meth:`FaultInjector.poll_held` notes when none of them is still waiting on it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time
from typing import Any, Protocol

from qsched.chaos.checks import claimed_by
from qsched.chaos.poison import inject_poison
from qsched.chaos.stack import Stack
from qsched.ledger.server import AofSampler, RedisServer
from qsched.stack.rabbitmq import KILL, RabbitCluster
from qsched.stack.sentinel import SentinelSet

KINDS = (
    "agent_kill",
    "agent_term",
    "broker_restart",
    "ledger_restart",
    "agent_freeze",
    "api_worker_kill",
    "machine_crash",
    "ledger_stall",
    "poison",
)
#: the faults of a ledger on a Sentinel set (``--ledger sentinel``), which the one-server
#: ledger faults above do not apply to
SENTINEL_KINDS = ("master_kill",)
#: the faults that hit the one ledger server, refused on a Sentinel set
SERVER_KINDS = ("ledger_restart", "machine_crash", "ledger_stall")
#: The faults of a run given a RabbitMQ cluster (:class:`~qsched.stack.rabbitmq.RabbitCluster`).
CLUSTER_KINDS = ("rabbit_node_loss",)
WINDOW = (0.1, 0.75)  # faults start within this share of the run, to leave time to settle
GAP_S = 4.0  # between one fault's end and the next one's start, while there is time
GAP_SHARE = 0.025  # and at most this share of the run (short runs have no time to spare)
LAST_START = 0.85  # share of the run after which faults no longer wait for the gap


class Restartable(Protocol):
    def restart(self, outage_s: float, abort: threading.Event) -> float:
        """Take the server down for ``outage_s``, bring it back; return when it is up."""


@dataclasses.dataclass
class Fault:
    """One fault: planned, then what happened (epoch seconds)."""

    kind: str
    at_s: float  # planned, from the start of the load
    target: str = ""
    started: float | None = None
    restored: float | None = None  # the part is back: agent beating again, server answering
    held: list[str] = dataclasses.field(default_factory=list)
    held_resolved: float | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str = ""


def make_plan(duration_s: float, counts: dict[str, int], rng: random.Random) -> list[Fault]:
    """Spread the faults over the run, one per slot, kinds in a seeded random order."""
    kinds = [kind for kind in KINDS + SENTINEL_KINDS + CLUSTER_KINDS
             for _ in range(counts.get(kind, 0))]  # fmt: skip
    rng.shuffle(kinds)
    if not kinds:
        return []
    low, high = WINDOW[0] * duration_s, WINDOW[1] * duration_s
    slot = (high - low) / len(kinds)
    return [
        Fault(kind, round(low + (i + rng.uniform(0.0, 0.5)) * slot, 2))
        for i, kind in enumerate(kinds)
    ]


def default_counts(
    duration_s: float, ledger: str = "redis", cluster: bool = False
) -> dict[str, int]:
    """Agent kills and freezes, worker kills, poison, one of each server fault; on a
    Sentinel set (``ledger`` ``sentinel``) one master kill instead of the ledger
    server's faults; on a RabbitMQ ``cluster``, two node losses (one node, then
    another) instead of a broker restart."""
    if ledger == "sentinel":
        kinds = {kind: 0 for kind in SERVER_KINDS} | {"master_kill": 1}
        return default_counts(duration_s, cluster=cluster) | kinds
    return {
        "agent_kill": max(1, int(duration_s // 45)),
        "agent_term": max(1, int(duration_s // 120)),
        "broker_restart": 0 if cluster else 1,
        "rabbit_node_loss": 2 if cluster else 0,
        "ledger_restart": 1,
        "agent_freeze": max(1, int(duration_s // 120)),
        "api_worker_kill": max(1, int(duration_s // 120)),
        "machine_crash": 1,
        "ledger_stall": 1,
        "poison": max(1, int(duration_s // 120)),
    }


@dataclasses.dataclass(frozen=True)
class FaultSettings:
    """How long and how hard the faults hit."""

    outage_s: float = 5.0  # broker and ledger restarts, machine crashes
    freeze_s: float = 0.0  # 0: twice the heartbeat TTL plus a second
    stall_s: float = 8.0  # above the services' [ledger] timeout_s
    crash_loss_s: float = 1.0  # what a crash loses under appendfsync everysec
    burst: int = 8  # boots in flight when an API worker is killed
    node_loss: str = KILL  # how a RabbitMQ node is stopped: KILL or STOP


class FaultInjector(threading.Thread):
    """Injects ``faults`` at their times (from ``t0``), one after the other."""

    def __init__(
        self,
        stack: Stack,
        faults: list[Fault],
        broker: Restartable | None,
        ledger: RedisServer,
        settings: FaultSettings,
        rng: random.Random,
        t0: float,
        duration_s: float,
        load: Any = None,
        sentinels: SentinelSet | None = None,
        cluster: RabbitCluster | None = None,
    ) -> None:
        super().__init__(name="chaos-faults")  # not a daemon: a restart must finish
        self.stack = stack
        self.faults = faults
        self.broker = broker
        self.ledger = ledger  # on a Sentinel set, its first master
        self.sentinels = sentinels
        self.cluster = cluster
        self.node_losses = 0  # so far: the next loss takes the next node
        self.settings = settings
        self.outage_s = settings.outage_s
        self.load = load  # the LoadGenerator, for the bursts of api_worker_kill
        self.sampler = AofSampler(ledger)  # what a machine crash cuts back to
        self.poison: list[dict[str, Any]] = []  # every poison message sent, for the checks
        self.rng = rng
        self.t0 = t0
        self.duration_s = duration_s
        self.closing = threading.Event()  # inject nothing more
        self.abort = threading.Event()  # and cut an outage in progress short
        self.current: Fault | None = None

    def finish(self, abort: bool = False) -> None:
        """Inject no further fault (``abort``: end the one in progress early); wait."""
        self.closing.set()
        if abort:
            self.abort.set()
        if self.is_alive():
            self.join()
        self.sampler.stop()

    def run(self) -> None:
        if any(f.kind == "machine_crash" for f in self.faults):
            self.sampler.start()
        ready_at = self.t0
        latest = self.t0 + LAST_START * self.duration_s
        for fault in self.faults:
            # The gap after the previous fault, but never so late that the load has ended.
            start_at = max(self.t0 + fault.at_s, min(ready_at, latest))
            if self.closing.wait(max(0.0, start_at - time.time())):
                fault.error = "not injected: the load had ended"
                continue
            self.current = fault
            try:
                self.inject(fault)
            except Exception as exc:
                fault.error = f"{type(exc).__name__}: {exc}"
            self.current = None
            # Let the system recover before the next fault, so each recovery is its own.
            ready_at = time.time() + min(GAP_S, GAP_SHARE * self.duration_s)

    def inject(self, fault: Fault) -> None:
        if fault.kind == "agent_kill":
            self._agent(fault, signal.SIGKILL, self.rng.uniform(0.5, 2 * self._ttl() + 2))
        elif fault.kind == "agent_term":
            self._agent(fault, signal.SIGTERM, 1.0)
        elif fault.kind == "broker_restart":
            self._restart(fault, self.broker, "broker")
        elif fault.kind == "ledger_restart":
            self._restart(fault, self.ledger, "ledger redis-server")
        elif fault.kind == "agent_freeze":
            self._freeze(fault)
        elif fault.kind == "api_worker_kill":
            self._kill_worker(fault)
        elif fault.kind == "machine_crash":
            self._crash(fault)
        elif fault.kind == "ledger_stall":
            self._stall(fault)
        elif fault.kind == "poison":
            self._poison(fault)
        elif fault.kind == "master_kill":
            self._kill_master(fault)
        elif fault.kind == "rabbit_node_loss":
            self._node_loss(fault)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    def _ttl(self) -> float:
        return self.stack.spec.heartbeat_ttl_s

    def _pick_agent(self, fault: Fault) -> int | None:
        """A random running agent, made the fault's target; None (and an error) if none."""
        running = [i for i in self.stack.agents if self.stack.agent_running(i)]
        if not running:
            fault.error = "no agent running"
            return None
        index = self.rng.choice(running)
        fault.target = self.stack.hosts[index]
        return index

    def _agent(self, fault: Fault, sig: int, down_s: float) -> None:
        index = self._pick_agent(fault)
        if index is None:
            return
        fault.started = time.time()
        self.stack.signal_agent(index, sig)
        timeout_s = 10.0 if sig == signal.SIGKILL else self.stack.spec.shutdown_timeout_s + 15
        code = self.stack.wait_agent_exit(index, timeout_s)
        fault.detail["exit_s"] = round(time.time() - fault.started, 2)
        fault.detail["exit_code"] = code
        if code is None:
            fault.error = f"still running {timeout_s:.0f}s after signal {sig}; killed"
            self.stack.signal_agent(index, signal.SIGKILL)
            self.stack.wait_agent_exit(index, 10)
        fault.held = sorted(claimed_by(self.stack.stores, fault.target))
        self.abort.wait(down_s)
        fault.detail["down_s"] = round(down_s, 2)
        restarted = time.time()
        self.stack.start_agent(index)
        if _wait(lambda: self._beat_since(fault.target, restarted), 60, self.abort):
            fault.restored = time.time()
        else:
            fault.error = "restarted agent sent no heartbeat within 60s"

    def _freeze(self, fault: Fault) -> None:
        index = self._pick_agent(fault)
        if index is None:
            return
        frozen_s = self.settings.freeze_s or 2 * self._ttl() + 1
        fault.started = time.time()
        self.stack.signal_agent(index, signal.SIGSTOP)
        try:
            self.abort.wait(frozen_s)
            fault.held = sorted(claimed_by(self.stack.stores, fault.target))
        finally:
            self.stack.signal_agent(index, signal.SIGCONT)
        thawed = time.time()
        fault.detail["frozen_s"] = round(thawed - fault.started, 2)
        if _wait(lambda: self._beat_since(fault.target, thawed), 60, self.abort):
            fault.restored = time.time()
        else:
            fault.error = "the thawed agent sent no heartbeat within 60s"

    def _kill_worker(self, fault: Fault) -> None:
        workers = self.stack.api_workers()
        if not workers or self.load is None:
            fault.error = "no API worker to kill" if not workers else "no load to burst"
            return
        pid = self.rng.choice(workers)
        fault.target = f"gunicorn worker {pid}"
        fault.detail["in_flight"] = self.load.burst(self.settings.burst)
        time.sleep(0.005)  # the burst is in the workers now
        fault.started = time.time()
        os.kill(pid, signal.SIGKILL)

        def replaced() -> bool:
            # the kill lands asynchronously: the worker is listed until it is a zombie
            now = self.stack.api_workers()
            return pid not in now and len(now) >= len(workers)

        if _wait(replaced, 60, self.abort):
            fault.restored = time.time()
        else:
            fault.error = "gunicorn did not start another worker within 60s"

    def _crash(self, fault: Fault) -> None:
        fault.target = "ledger machine"
        lose_s = self.settings.crash_loss_s if self.ledger.fsync == "everysec" else 0.0
        fault.started = time.time()
        fault.detail.update(
            self.ledger.crash(self.sampler, lose_s, self.outage_s, self.abort), lose_s=lose_s
        )
        fault.restored = time.time()

    def _stall(self, fault: Fault) -> None:
        proc = self.ledger.proc
        if proc is None:
            fault.error = "the ledger is not running"
            return
        fault.target = "ledger redis-server"
        fault.started = time.time()
        proc.send_signal(signal.SIGSTOP)
        try:
            self.abort.wait(self.settings.stall_s)
        finally:
            proc.send_signal(signal.SIGCONT)
        fault.detail["stalled_s"] = round(time.time() - fault.started, 2)
        fault.restored = time.time()

    def _kill_master(self, fault: Fault) -> None:
        if self.sentinels is None:
            fault.error = "no Sentinel set: run with --ledger sentinel"
            return
        fault.target = f"ledger master {self.sentinels.master().name}"
        fault.started = time.time()
        killed, promoted = self.sentinels.kill_master()
        fault.restored = time.time()  # the ledger has a master again
        fault.detail["promoted"] = promoted.name
        self.abort.wait(self.outage_s)
        self.sentinels.rejoin(killed)
        fault.detail["rejoined_after_s"] = round(time.time() - fault.started, 2)

    def _poison(self, fault: Fault) -> None:
        fault.target = "boot and host queues"
        fault.started = time.time()
        sent = inject_poison(self.stack, self.rng)
        self.poison += sent
        fault.detail["messages"] = len(sent)
        fault.restored = time.time()

    def _node_loss(self, fault: Fault) -> None:
        cluster = self.cluster
        if cluster is None:
            fault.error = "no RabbitMQ cluster (run with --rabbit-cluster 3)"
            return
        index = self.node_losses % len(cluster.nodes)
        self.node_losses += 1
        fault.target = cluster.nodes[index].node.partition("@")[0]
        fault.detail.update(outage_s=self.outage_s, how=self.settings.node_loss)
        fault.started = time.time()
        try:
            cluster.stop_node(index, self.settings.node_loss)
            self.abort.wait(self.outage_s)
        finally:  # the node always comes back, whatever happens meanwhile
            fault.detail["node_start_s"] = cluster.start_node(index)
        fault.detail["whole_after_s"] = cluster.wait_whole()
        fault.restored = time.time()

    def _beat_since(self, host: str, since: float) -> bool:
        seen = self.stack.stores.agents.last_seen(host)
        return seen is not None and seen > since

    def _restart(self, fault: Fault, server: Restartable | None, what: str) -> None:
        if server is None:
            fault.error = f"no {what} to restart"
            return
        fault.target = what
        fault.started = time.time()
        fault.detail["outage_s"] = self.outage_s
        fault.restored = server.restart(self.outage_s, self.abort)

    def poll_held(self) -> None:
        """Note when every instance an agent fault left claimed stopped waiting on that host."""
        for fault in self.faults:
            if not fault.held or fault.held_resolved is not None or fault.started is None:
                continue
            if not claimed_by(self.stack.stores, fault.target, fault.held):
                fault.held_resolved = time.time()


def _wait(predicate: Any, timeout_s: float, abort: threading.Event) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not abort.is_set():
        try:
            if predicate():
                return True
        except Exception:
            pass
        time.sleep(0.1)
    return False
