"""The plumbing scenario of qsched-bench: notifications and metrics switched in turns.

The switch (qsched.bench.switch) must really turn the features off and on in running
agents, or the scenario compares a cloud with itself; the summary must compare each
block's "on" slices with its own "off" ones. The end-to-end run counts the
notifications that reached RabbitMQ against the placements of the "on" slices.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from agents.main import catch_stop_signals
from qsched.bench import cli, report
from qsched.bench.plumbing import summary
from qsched.bench.switch import SIGNAL, NotifierSwitch, SwitchTimeout, flip, obey
from qsched.notifications.base import NULL, RecordingNotifier
from tests.cloud import AMQP_URL, require_rabbitmq
from tests.conftest import real_redis


def test_a_switched_off_notifier_is_disabled_and_sends_nothing() -> None:
    inner = RecordingNotifier()
    switch = NotifierSwitch(inner)
    switch.notify("instance.create.start", {"a": 1})
    switch.turn(False)
    assert switch.enabled is False  # callers build no payload
    switch.notify("instance.create.end", {"a": 2})
    switch.turn(True)
    switch.notify("instance.delete.start", {"a": 3})
    assert [e[1] for e in inner.sent] == ["instance.create.start", "instance.delete.start"]
    off = NotifierSwitch(NULL)
    off.turn(True)  # notifications never configured stay off
    assert off.enabled is False


@pytest.fixture
def own_signal() -> Iterator[None]:
    """This process's handler of the switch's signal, as it was, afterwards."""
    before = signal.getsignal(SIGNAL)
    yield
    signal.signal(SIGNAL, before)


def _agent(metrics: bool) -> Any:
    return SimpleNamespace(notifier=NotifierSwitch(RecordingNotifier()),
                           metrics=SimpleNamespace(enabled=metrics))  # fmt: skip


def test_a_switch_reaches_every_agent_of_the_process(tmp_path: Path, own_signal: None) -> None:
    """The process applies the state to every agent and acknowledges it with its CPU
    time; an agent that serves no metrics keeps them off when they are turned on."""
    agents = [_agent(True), _agent(False)]
    request, ack = tmp_path / "switch.json", tmp_path / "agent0.switched"
    signal.signal(SIGNAL, obey(agents, request, ack))
    acks = flip(request, {os.getpid(): ack}, 1, notifications=False, metrics=False)
    assert [(a.notifier.enabled, a.metrics.enabled) for a in agents] == [(False, False)] * 2
    assert acks[os.getpid()]["seq"] == 1 and acks[os.getpid()]["notifications"] is False
    first_cpu = acks[os.getpid()]["cpu_s"]
    sum(range(200_000))  # some CPU between the two readings
    acks = flip(request, {os.getpid(): ack}, 2, notifications=True, metrics=True)
    assert [(a.notifier.enabled, a.metrics.enabled) for a in agents] == [(True, True),
                                                                         (True, False)]  # fmt: skip
    assert acks[os.getpid()]["cpu_s"] > first_cpu
    assert json.loads(ack.read_text())["seq"] == 2


def test_a_switch_not_acknowledged_fails_with_the_process(tmp_path: Path, own_signal: None) -> None:
    signal.signal(SIGNAL, lambda _signum, _frame: None)  # a process that ignores it
    with pytest.raises(SwitchTimeout, match=f"{os.getpid()}.*did not apply switch 3"):
        flip(tmp_path / "s.json", {os.getpid(): tmp_path / "a.switched"}, 3, timeout_s=0.2,
             notifications=True, metrics=True)  # fmt: skip
    with pytest.raises(ValueError, match="notifications, metrics"):
        flip(tmp_path / "s.json", {}, 4, notifications=True)


def _slice(on: bool, agents: float | None) -> dict[str, Any]:
    return {"on": on, "agents": agents, "rabbitmq": 1.0}


def test_each_block_compares_its_own_slices_off_and_on() -> None:
    """A drift between blocks does not count: block 1 at 1.0 ms, block 2 at 2.0 ms, each
    10% dearer on; the change is 10% in both, where medians across blocks would not
    tell it."""
    blocks = [
        [_slice(False, 1.0), _slice(True, 1.1), _slice(True, 1.1), _slice(False, 1.0)],
        [_slice(False, 2.0), _slice(True, 2.2), _slice(True, 2.2), _slice(False, 2.0)],
        [_slice(False, 1.0), _slice(True, None), _slice(True, 1.5), _slice(False, 1.0)],
    ]
    found = summary(blocks)["agents"]
    assert found["change_pct"] == 10.0 and found["min_pct"] == found["max_pct"] == 10.0
    assert found["blocks"] == 2  # the third had a slice with no figure
    assert summary(blocks)["rabbitmq"]["change_pct"] == 0.0


def test_the_target_is_judged_on_both_features_together() -> None:
    both = {"agents": {"off_ms": 1.4, "on_ms": 1.5, "change_pct": 7.1, "min_pct": 3.0,
                       "max_pct": 12.0, "blocks": 3}}  # fmt: skip
    row = report.targets({"plumbing": {"limit_pct": 10.0, "comparisons": {"both": both}}})[0]
    assert row["met"] is True and "+7.1%" in row["measured"]
    both["agents"]["change_pct"] = 10.5
    assert report.targets({"plumbing": {"comparisons": {"both": both}}})[0]["met"] is False
    skipped = report.targets({"plumbing": {"skipped": "needs RabbitMQ: embedded"}})[0]
    assert skipped["met"] is None and "embedded" in skipped["measured"]


def test_the_embedded_default_skips_it_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli.main, ["--embedded", "--scenario", "plumbing", "-o", str(out)])
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())
    assert "embedded" in found["plumbing"]["skipped"]
    assert found["targets"][0]["met"] is None


@pytest.mark.real
@pytest.mark.slow
def test_plumbing_run_on_real_servers(tmp_path: Path) -> None:
    """Every slice placed its boots; the cloud's notification queue holds three for each
    placement of the slices with them on and none of the others (the scenario checks it
    and fails otherwise); each comparison has its figures."""
    real_redis()
    require_rabbitmq()
    out = tmp_path / "bench.json"
    args = ["--scenario", "plumbing", "--bus", "rabbitmq", "--amqp-url", AMQP_URL,
            "--plumbing-hosts", "8", "--agents", "2", "--plumbing-blocks", "1",
            "--plumbing-slice-s", "0.5", "--rate", "40", "--settle-timeout-s", "60",
            "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())["plumbing"]
    assert set(found["comparisons"]) == {"nothing", "notifications", "metrics", "both"}
    slices = [s for c in found["comparisons"].values() for b in c["blocks"] for s in b]
    assert len(slices) == 16 and all(s["placed"] == 20 and s["agents"] > 0 for s in slices)
    told = found["notifications"]
    assert told == {"placements": 4 * 20, "sent": 3 * 4 * 20}
    assert "Cost of notifications and metrics, switched in turns" in result.output


def test_a_signal_another_thread_received_is_handled(tmp_path: Path, own_signal: None) -> None:
    """The kernel may hand a process's signal to any thread (another one while a
    profiler stops the main thread); CPython then only marks it for the main thread.
    An agent process's main thread, waiting for its stop, still runs the handlers: the
    switch is applied, and the stop returns."""
    agents = [_agent(True)]
    request, ack = tmp_path / "switch.json", tmp_path / "agent0.switched"
    signal.signal(SIGNAL, obey(agents, request, ack))
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    wait = catch_stop_signals()
    try:
        request.write_text(json.dumps({"seq": 1, "notifications": False, "metrics": True}))

        def elsewhere() -> None:  # signals sent to this thread, not to the main one
            signal.pthread_kill(threading.get_ident(), SIGNAL)
            time.sleep(0.1)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        other = threading.Thread(target=elsewhere)
        other.start()
        began = time.monotonic()
        assert wait() == signal.SIGTERM
        other.join()
        assert time.monotonic() - began < 5
        assert json.loads(ack.read_text())["seq"] == 1 and not agents[0].notifier.enabled
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
