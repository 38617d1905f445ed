"""Periodic tasks on one timer thread (qsched.periodic)."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from qsched import exception
from qsched.periodic import Periodic, Timer
from tests.helpers import wait_until


def counting(calls: list[float], sleep_s: float = 0.0):
    def fn() -> None:
        calls.append(time.monotonic())
        time.sleep(sleep_s)

    return fn


def test_a_task_runs_every_interval_after_its_first_delay() -> None:
    calls: list[float] = []
    began = time.monotonic()
    task = Periodic("t", 0.05, counting(calls), first_after_s=0.2, timer=Timer())
    task.start()
    assert wait_until(lambda: len(calls) >= 4, 5)
    task.stop()
    assert calls[0] - began >= 0.2
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(gap >= 0.05 for gap in gaps), gaps


def test_a_stop_may_wait_for_the_run_under_way() -> None:
    """An agent's goodbye must land after its last heartbeat, not before it."""
    running, release, finished = threading.Event(), threading.Event(), threading.Event()

    def fn() -> None:
        running.set()
        release.wait(10)
        finished.set()

    task = Periodic("t", 0.01, fn, first_after_s=0.0, timer=Timer())
    task.start()
    assert running.wait(5)
    assert task.stop(wait_s=0.05) is False and not finished.is_set()  # it still runs
    threading.Timer(0.1, release.set).start()
    assert task.stop(wait_s=10) is True and finished.is_set()
    assert Periodic("idle", 1, fn, timer=Timer()).stop() is True  # nothing under way


def test_a_stopped_task_runs_no_more() -> None:
    calls: list[float] = []
    task = Periodic("t", 0.02, counting(calls), timer=Timer())
    task.start()
    assert wait_until(lambda: len(calls) >= 2, 5)
    task.stop()
    time.sleep(0.05)  # a run under way may still end
    seen = len(calls)
    time.sleep(0.2)
    assert len(calls) == seen


def test_wake_runs_it_now_and_a_wake_during_a_run_runs_it_again_after() -> None:
    calls: list[float] = []
    task = Periodic("t", 60.0, counting(calls, sleep_s=0.2), timer=Timer())
    task.start()
    task.wake()
    assert wait_until(lambda: len(calls) == 1, 5)
    task.wake()  # while the first run sleeps: one more run right after it, not two at once
    task.wake()
    assert wait_until(lambda: len(calls) == 2, 5)
    assert calls[1] - calls[0] >= 0.2
    time.sleep(0.3)
    assert len(calls) == 2  # then the interval again
    task.stop()


def test_a_wake_before_the_start_makes_the_first_run_immediate() -> None:
    calls: list[float] = []
    task = Periodic("t", 60.0, counting(calls), timer=Timer())
    task.wake()
    task.start()
    assert wait_until(lambda: len(calls) == 1, 5)
    task.stop()


def test_a_task_never_runs_twice_at_once() -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def fn() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1

    task = Periodic("t", 0.0, fn, timer=Timer())
    task.start()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        task.wake()
    task.stop()
    assert most[0] == 1


def test_errors_are_logged_and_the_task_goes_on(caplog) -> None:
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise exception.BackendUnavailable("ledger down")
        if len(calls) == 2:
            raise RuntimeError("bug")

    task = Periodic("flaky", 0.01, fn, timer=Timer())
    task.start()
    assert wait_until(lambda: len(calls) >= 3, 5)
    task.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert any("flaky: ledger down" in m for m in messages), messages
    assert any("periodic task flaky failed" in m for m in messages), messages


def test_a_thousand_tasks_share_a_few_threads() -> None:
    """What the timer is for: a process of many hosts holds a few threads, not a
    thread per task, and every task still gets its turns."""
    timer = Timer(workers=8)
    counts = [0] * 1000
    tasks = []
    before = threading.active_count()
    for i in range(1000):

        def fn(i: int = i) -> None:
            counts[i] += 1

        tasks.append(Periodic(f"t{i}", 0.05, fn, first_after_s=0.0, timer=timer))
    for task in tasks:
        task.start()
    try:
        assert wait_until(lambda: min(counts) >= 3, 10)
        assert threading.active_count() - before <= 1 + 8  # the timer and its workers
    finally:
        for task in tasks:
            task.stop()


def test_a_slow_task_does_not_hold_back_the_others() -> None:
    timer = Timer(workers=4)
    fast: list[float] = []
    slow = Periodic("slow", 0.0, lambda: time.sleep(0.5), first_after_s=0.0, timer=timer)
    quick = Periodic("quick", 0.02, counting(fast), first_after_s=0.0, timer=timer)
    slow.start()
    quick.start()
    try:
        assert wait_until(lambda: len(fast) >= 5, 0.45)
    finally:
        slow.stop()
        quick.stop()


def test_a_lane_of_its_own_is_not_held_back_by_busy_workers() -> None:
    """Every worker of the default lane busy: a task of another lane still runs."""
    timer = Timer(workers=2)
    slow = [Periodic(f"slow{i}", 0.0, lambda: time.sleep(0.5), first_after_s=0.0, timer=timer)
            for i in range(4)]  # fmt: skip
    beats: list[float] = []
    beat = Periodic("beat", 0.02, counting(beats), first_after_s=0.05, timer=timer, lane="hb")
    for task in [*slow, beat]:
        task.start()
    try:
        assert wait_until(lambda: len(beats) >= 5, 0.45)
    finally:
        for task in [*slow, beat]:
            task.stop()


def test_jitter_spreads_runs_bunched_together_around_the_interval() -> None:
    """Tasks run together (woken by one event) are due apart afterwards, each within
    ``interval * (1 ± jitter)``, one interval on average; no jitter: the interval."""
    tasks = [Periodic(f"t{i}", 10.0, lambda: None, timer=Timer(), jitter=0.5) for i in range(400)]
    nexts = [t.next_interval_s() for t in tasks]
    assert all(5.0 <= n <= 15.0 for n in nexts)
    assert max(nexts) - min(nexts) > 8.0  # spread over most of the window
    assert 9.0 < sum(nexts) / len(nexts) < 11.0
    assert Periodic("plain", 10.0, lambda: None, timer=Timer()).next_interval_s() == 10.0
    for bad in (-0.1, 1.0):
        with pytest.raises(exception.Invalid, match="jitter"):
            Periodic("bad", 10.0, lambda: None, jitter=bad)


def test_a_jittered_task_runs_again_within_its_window() -> None:
    calls: list[float] = []
    task = Periodic("t", 0.1, counting(calls), first_after_s=0.0, timer=Timer(), jitter=0.5)
    task.start()
    assert wait_until(lambda: len(calls) >= 6, 5)
    task.stop()
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(g >= 0.045 for g in gaps), gaps  # never sooner than half the interval
