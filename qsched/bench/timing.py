"""Time the phases of an agent's start without touching the agent's code.

:class:`PhaseTimer` wraps module-level functions (``agents.service.register_node``,
``register_nodes`` once it exists, ``reconcile``) with a timer for the life of a
benchmark process. Nested wrapped calls (a bulk registration that calls the
per-node one) count once, in the outermost call.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import threading
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

#: (module name, function names) whose calls are the registration phase of a start.
REGISTRATION = (
    ("agents.service", ("register_nodes", "register_node")),
    ("agents.registration", ("register_nodes", "register_node")),
)
RECONCILE = (("agents.service", ("reconcile",)),)


@dataclasses.dataclass
class Phase:
    """Wall time spent in one phase: summed, and first start to last end (epoch s)."""

    seconds: float = 0.0
    calls: int = 0
    began_at: float | None = None
    ended_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PhaseTimer:
    """Named phases, each fed by the functions wrapped for it."""

    def __init__(self) -> None:
        self.phases: dict[str, Phase] = {}
        self._local = threading.local()
        self._lock = threading.Lock()  # agents of one process start in several threads
        self._undo: list[tuple[ModuleType, str, Any]] = []

    def wrap(self, phase: str, targets: Iterable[tuple[str, Iterable[str]]]) -> list[str]:
        """Wrap every function of ``targets`` that exists; return what was wrapped."""
        import importlib

        wrapped = []
        self.phases.setdefault(phase, Phase())
        for module_name, names in targets:
            module = importlib.import_module(module_name)
            for name in names:
                original = getattr(module, name, None)
                if callable(original):
                    setattr(module, name, self._timed(phase, original))
                    self._undo.append((module, name, original))
                    wrapped.append(f"{module_name}.{name}")
        return wrapped

    def restore(self) -> None:
        """Put the original functions back."""
        for module, name, original in reversed(self._undo):
            setattr(module, name, original)
        self._undo.clear()

    def _timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            if depth:
                return fn(*args, **kwargs)
            self._local.depth = 1
            began, began_at = time.perf_counter(), time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._local.depth = 0
                self._record(phase, time.perf_counter() - began, began_at)

        return timed

    def _record(self, phase: str, seconds: float, began_at: float) -> None:
        with self._lock:
            entry = self.phases[phase]
            entry.seconds += seconds
            entry.calls += 1
            entry.began_at = began_at if entry.began_at is None else min(entry.began_at, began_at)
            entry.ended_at = time.time()

    def to_dict(self) -> dict[str, Any]:
        return {name: phase.to_dict() for name, phase in self.phases.items()}


def peak_rss_kb(pid: int | str = "self") -> int | None:
    """Peak resident set size of a process (VmHWM in /proc), in KiB; None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class FullCollections:
    """The full (generation 2) garbage collections of this process while installed:
    how many, their summed and their longest pause. A process of many simulated hosts
    holds every node's views, so one full collection walks all of them while every
    thread of the process waits."""

    def __init__(self) -> None:
        self.count = 0
        self.total_ms = 0.0
        self.longest_ms = 0.0
        self._began: float | None = None

    def install(self) -> FullCollections:
        gc.callbacks.append(self._seen)
        return self

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            took = (time.perf_counter() - self._began) * 1000
            self._began = None
            self.count += 1
            self.total_ms += took
            self.longest_ms = max(self.longest_ms, took)

    def to_counters(self) -> dict[str, int]:
        return {"gc_full_collections": self.count, "gc_full_ms": round(self.total_ms),
                "gc_full_max_ms": round(self.longest_ms)}  # fmt: skip
