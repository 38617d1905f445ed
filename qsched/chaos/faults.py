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
    A restart of the ledger's ``redis-server`` (AOF everysec; SIGTERM makes it
    fsync before exiting).

For agent faults the injector records which instances the agent left claimed
and not ACTIVE (read from the ledger after the process is gone), and
:meth:`FaultInjector.poll_held` notes when none of them is still waiting on it.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import threading
import time
from typing import Any, Protocol

from qsched.chaos.checks import claimed_by
from qsched.chaos.stack import Stack

KINDS = ("agent_kill", "agent_term", "broker_restart", "ledger_restart")
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
    kinds = [kind for kind in KINDS for _ in range(counts.get(kind, 0))]
    rng.shuffle(kinds)
    if not kinds:
        return []
    low, high = WINDOW[0] * duration_s, WINDOW[1] * duration_s
    slot = (high - low) / len(kinds)
    return [
        Fault(kind, round(low + (i + rng.uniform(0.0, 0.5)) * slot, 2))
        for i, kind in enumerate(kinds)
    ]


def default_counts(duration_s: float) -> dict[str, int]:
    """Several agent kills, a SIGTERM or two, one restart of each server."""
    return {
        "agent_kill": max(1, int(duration_s // 30)),
        "agent_term": max(1, int(duration_s // 90)),
        "broker_restart": 1,
        "ledger_restart": 1,
    }


class FaultInjector(threading.Thread):
    """Injects ``faults`` at their times (from ``t0``), one after the other."""

    def __init__(
        self,
        stack: Stack,
        faults: list[Fault],
        broker: Restartable | None,
        ledger: Restartable,
        outage_s: float,
        rng: random.Random,
        t0: float,
        duration_s: float,
    ) -> None:
        super().__init__(name="chaos-faults")  # not a daemon: a restart must finish
        self.stack = stack
        self.faults = faults
        self.broker = broker
        self.ledger = ledger
        self.outage_s = outage_s
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

    def run(self) -> None:
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
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    def _ttl(self) -> float:
        return self.stack.spec.heartbeat_ttl_s

    def _agent(self, fault: Fault, sig: int, down_s: float) -> None:
        running = [i for i in self.stack.agents if self.stack.agent_running(i)]
        if not running:
            fault.error = "no agent running"
            return
        index = self.rng.choice(running)
        fault.target = self.stack.hosts[index]
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

    def _beat_since(self, host: str, since: float) -> bool:
        score = self.stack.stores.store.client.zscore(self.stack.stores.store.keys.agents, host)
        return score is not None and float(score) > since

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
