"""Periodic tasks: every task of a process on one timer thread and a few workers.

An agent has eight periodic tasks (heartbeat, class poll, reconcile, reaper...).
A thread each is nothing for one host, but a benchmark process that plays a
thousand hosts would hold eight thousand threads that mostly sleep, and the
interpreter's switching between them is what the benchmark then measures. Here
one timer thread per process keeps the next due time of every task in a heap and
hands a due task to a small pool of daemon workers, started only as they are
needed: a process of one agent never runs more tasks at once than it has, so it
behaves as with a thread per task.

A task never runs twice at once: its next run is due ``interval_s`` after the end
of the last one (or at once when :meth:`Periodic.wake` was called meanwhile).
Tasks of another ``lane`` have workers of their own: hundreds of hosts reading
every node at once must not hold back the heartbeats that say they are alive.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable

from qsched import exception

LOG = logging.getLogger(__name__)

#: Tasks of one process that may run at the same moment, at most. More than an
#: agent has, so one agent's slow reconcile never holds back its own heartbeat.
WORKERS = 32


class _Workers:
    """Daemon threads that run what they are given, up to ``most``, started as needed."""

    def __init__(self, most: int, lane: str = "") -> None:
        self._most = most
        self._name = f"-{lane}" if lane else ""
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle == 0 and self._started < self._most:
                self._started += 1
                name = f"qsched-periodic{self._name}-{self._started}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        self._queue.put(job)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            job = self._queue.get()
            with self._lock:
                self._idle -= 1
            job()


class Timer:
    """One thread that hands every task its turn when it is due (module docstring)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._due: list[tuple[float, int, Periodic, int]] = []  # (when, order, task, turn)
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._workers_per_lane = workers
        self._lanes: dict[str, _Workers] = {}  # only the timer thread touches it
        self._thread: threading.Thread | None = None

    def at(self, when: float, task: Periodic, turn: int) -> None:
        """Give ``task`` its ``turn`` at monotonic time ``when``."""
        with self._changed:
            heapq.heappush(self._due, (when, next(self._order), task, turn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="qsched-timer", daemon=True)
                self._thread.start()
            elif self._due[0][2] is task:  # sooner than the timer sleeps for
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._changed.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _when, _order, task, turn = heapq.heappop(self._due)
            if task._take(turn):
                workers = self._lanes.get(task.lane)
                if workers is None:
                    workers = self._lanes[task.lane] = _Workers(self._workers_per_lane, task.lane)
                workers.submit(task._run_once)


_TIMER = Timer()


class Periodic:
    """Call ``fn`` every ``interval_s`` seconds until stopped; log and go on on errors.

    ``first_after_s`` delays the first call differently: processes started together
    then spread a heavy task over the interval instead of all running it at once.
    ``jitter``: each next call is due ``interval_s`` times a random factor within
    ``1 ± jitter`` after the last (the mean stays ``interval_s``), so that runs
    bunched by one event (hundreds of hosts woken by one aggregate change) spread
    out again instead of coming back together every interval.
    ``lane``: tasks of one lane share workers (module docstring).
    """

    def __init__(
        self,
        name: str,
        interval_s: float,
        fn: Callable[[], object],
        first_after_s: float | None = None,
        timer: Timer | None = None,
        lane: str = "",
        jitter: float = 0.0,
    ) -> None:
        if not 0.0 <= jitter < 1.0:
            raise exception.Invalid(reason=f"periodic task {name}: jitter {jitter} not in [0, 1)")
        self.name = name
        self.jitter = jitter
        self.lane = lane
        self.interval_s = interval_s
        self.fn = fn
        self.first_after_s = interval_s if first_after_s is None else first_after_s
        self._timer = timer or _TIMER
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # a run under way ended
        self._turn = 0  # the one turn in the timer's heap that counts; older ones are dropped
        self._due_at = 0.0  # when that turn is due (monotonic)
        self._started = self._running = self._woken = self._stopped = False

    def start(self) -> None:
        with self._lock:
            if self._started or self._stopped:
                return
            self._started = True
            self._due_in(0.0 if self._woken else self.first_after_s)

    def wake(self) -> None:
        """Run ``fn`` now rather than at the end of the interval."""
        with self._lock:
            if self._stopped:
                return
            if self._running or not self._started:
                self._woken = True  # at once after this run, or at the start
            elif self._due_at > time.monotonic():  # else its turn is due already
                self._due_in(0.0)

    def stop(self, wait_s: float = 0.0) -> bool:
        """Run no more; a run under way finishes, waited for up to ``wait_s`` (what it
        writes then lands before what the caller writes next). False if it still runs."""
        with self._lock:
            self._stopped = True
            self._turn += 1
            return self._idle.wait_for(lambda: not self._running, timeout=wait_s)

    def _due_in(self, delay_s: float) -> None:
        """With the lock held: the next turn, ``delay_s`` from now."""
        self._turn += 1
        self._due_at = time.monotonic() + delay_s
        self._timer.at(self._due_at, self, self._turn)

    def _take(self, turn: int) -> bool:
        """The timer offers ``turn``: True if it is the current one (the task runs)."""
        with self._lock:
            if turn != self._turn or self._stopped or self._running:
                return False
            self._running, self._woken = True, False
            return True

    def _run_once(self) -> None:
        try:
            self.fn()
        except exception.BackendUnavailable as exc:  # an outage: no traceback to read
            LOG.warning("periodic task %s: %s; next try in %.1fs", self.name, exc, self.interval_s)
        except Exception:
            LOG.exception("periodic task %s failed; next try in %.1fs", self.name, self.interval_s)
        finally:
            with self._lock:
                self._running = False
                self._idle.notify_all()
                if not self._stopped:
                    self._due_in(0.0 if self._woken else self.next_interval_s())

    def next_interval_s(self) -> float:
        """How long after a run the next is due (``interval_s``, jittered)."""
        if not self.jitter:
            return self.interval_s
        return self.interval_s * random.uniform(1.0 - self.jitter, 1.0 + self.jitter)
