"""Notifications and metrics switched off and on in running benchmark agents.

The plumbing scenario (:mod:`qsched.bench.plumbing`) measures what they cost an
agent in slices of one run, off and on in turn, so that whatever else the machine
does weighs on both sides alike. Agent processes started with ``--switch FILE``
(:mod:`qsched.bench.agent`) send their notifications through a
:class:`NotifierSwitch`. The bench writes the wanted state to FILE and sends each
process :data:`SIGNAL`; the process applies it to every agent it runs and writes it
back, with its sequence number and the CPU time the process has used so far
(``cpu_s``, :func:`time.process_time`: every thread, to the nanosecond, where /proc
counts in 10 ms ticks), to its acknowledgement file, which the bench waits for
before it measures.

Off, a switched agent does what an agent with the feature unconfigured does on the
placement path: ``notifier.enabled`` is false, so no payload is built and nothing is
queued; ``metrics.enabled`` is false, so no claim is timed. What stays is idle: the
notification sender's thread waiting on an empty queue, the metrics port unscraped.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from agents.service import ComputeAgent
from qsched.bench.measure import BenchFailure
from qsched.notifications.base import INFO, Notifier

#: What tells an agent process to read its switch file.
SIGNAL = signal.SIGUSR1
#: The features a switch turns: ``notifications`` and ``metrics``, each on or off.
FEATURES = ("notifications", "metrics")


class SwitchTimeout(BenchFailure):
    """An agent process did not acknowledge a switch in time: the run fails."""


class NotifierSwitch(Notifier):
    """A notifier that can be turned off and on; on, it is the one it wraps."""

    def __init__(self, inner: Notifier) -> None:
        self.inner = inner
        self.enabled = inner.enabled

    def turn(self, on: bool) -> None:
        self.enabled = on and self.inner.enabled

    def notify(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        priority: str = INFO,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        if self.enabled:
            self.inner.notify(event_type, payload, priority, context)

    def close(self) -> None:
        self.inner.close()


def obey(
    agents: Sequence[ComputeAgent], request: Path, ack: Path
) -> Callable[[int, FrameType | None], None]:
    """The signal handler of an agent process: apply the state in ``request`` to
    ``agents`` (whose notifiers are :class:`NotifierSwitch`) and write it to ``ack``.

    An agent whose metrics were never on (its process serves them from its first
    agent only) keeps them off.
    """
    serving = [a.metrics.enabled for a in agents]

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        state = json.loads(request.read_text())
        for agent, serves in zip(agents, serving, strict=True):
            if isinstance(agent.notifier, NotifierSwitch):
                agent.notifier.turn(bool(state["notifications"]))
            agent.metrics.enabled = serves and bool(state["metrics"])
        write_atomically(ack, {**state, "cpu_s": time.process_time()})

    return on_signal


def flip(
    request: Path, acks: Mapping[int, Path], seq: int, timeout_s: float = 10.0, **state: bool
) -> dict[int, dict[str, Any]]:
    """Ask the agent processes ``acks`` names (pid: its acknowledgement file) for
    ``state`` (:data:`FEATURES`, each on or off) as switch number ``seq``; once every
    one applied it, their acknowledgements by pid.

    :raises SwitchTimeout: a process did not acknowledge within ``timeout_s``.
    """
    if sorted(state) != sorted(FEATURES):
        raise ValueError(f"a switch sets {', '.join(FEATURES)}, got {sorted(state)}")
    write_atomically(request, {"seq": seq, **state})
    for pid in acks:
        os.kill(pid, SIGNAL)
    deadline = time.monotonic() + timeout_s
    waiting, done = dict(acks), {}
    while waiting:
        for pid, path in list(waiting.items()):
            ack = _read(path)
            if ack is not None and ack.get("seq") == seq:
                del waiting[pid]
                done[pid] = ack
        if waiting and time.monotonic() > deadline:
            raise SwitchTimeout(
                f"agent processes {sorted(waiting)} did not apply switch {seq} ({state}) "
                f"in {timeout_s:g}s: see their logs"
            )
        time.sleep(0.01)
    return done


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def write_atomically(path: Path, content: Mapping[str, Any]) -> None:
    """Write ``content`` as JSON so that a reader never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content, sort_keys=True))
    os.replace(tmp, path)
