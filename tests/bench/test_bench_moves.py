"""The moves scenario: its report, how it reads a move from a server's history, and a tiny
run on the embedded default (a host drained, a host evacuated, resizes and live
migrations timed), every figure checked against the others of the same run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from qsched.bench import cli
from qsched.bench.measure import MoveTimes, _last_move
from qsched.bench.moves_report import emptied_table, moves_table, moves_targets
from tests.cloud import AMQP_URL, require_rabbitmq
from tests.conftest import REDIS_URL, real_redis


def _event(t: float, event: str, migration: str) -> dict[str, Any]:
    return {"t": str(t), "event": event, "detail": {"migration": migration}}


def test_a_servers_last_move_is_read_from_its_history() -> None:
    """The last move counts; its first claim (a destination that failed gave it back for
    another), and its finish."""
    history = [
        {"t": "1.0", "event": "claimed", "detail": {}},
        _event(2.0, "move_requested", "m1"),
        _event(2.5, "move_claimed", "m1"),
        _event(2.6, "move_finished", "m1"),
        _event(3.0, "move_requested", "m2"),
        _event(3.1, "move_claimed", "m2"),
        _event(3.2, "move_retried", "m2"),
        _event(3.4, "move_claimed", "m2"),
        _event(3.9, "move_finished", "m2"),
    ]
    assert _last_move(history) == MoveTimes("m2", 3.0, 3.1, 3.9, False)
    failed = [_event(5.0, "move_requested", "m3"), _event(5.5, "move_failed", "m3")]
    assert _last_move(failed) == MoveTimes("m3", 5.0, None, None, True)
    assert _last_move([{"t": "1.0", "event": "claimed"}]) == MoveTimes(None)


def _moves(hosts: int, resize_p50: float, live_p50: float, left: int = 0) -> dict[str, Any]:
    emptied = {"servers": 100, "moved": 100 - left, "could_not_move": left, "seconds": 9.0}
    return {"hosts": hosts, "drain": emptied, "evacuation": emptied,
            "resize": {"submit_to_claimed_ms": {"p50": resize_p50}},
            "live_migration": {"submit_to_claimed_ms": {"p50": live_p50}}}  # fmt: skip


def test_moves_are_judged_flat_only_from_100_to_100000_hosts() -> None:
    full = moves_targets([_moves(100, 4.0, 5.0), _moves(100_000, 5.0, 7.0)], 1.3, 100_000)
    resize, live, emptied = full
    assert "resize" in resize["target"] and resize["met"] is True  # 1.25x
    assert "live migration" in live["target"] and live["met"] is False  # 1.4x
    assert emptied["met"] is True and "100 of 100" in emptied["measured"]
    quick = moves_targets([_moves(100, 4.0, 5.0), _moves(10_000, 4.0, 5.0, left=1)], 1.3,
                          100_000)  # fmt: skip
    assert [r["met"] for r in quick] == [None, None, False]


def test_every_run_measures_moves_and_the_full_one_at_100000_hosts() -> None:
    assert cli.PRESETS["moves_sizes"] == ([100, 100_000], [100, 10_000])
    assert cli.PRESETS["host_servers"][0] == 100
    for quick, embedded in ((False, False), (True, False), (True, True)):
        assert "moves" in cli.default_scenarios(quick=quick, embedded=embedded)[0]


#: 8 nodes on 2 agent processes of 4 compute hosts each; 6 servers on the host drained
#: and on the host evacuated; 10 timed moves of each kind at 40/s.
ARGS = ["--embedded", "--scenario", "moves", "--moves-sizes", "8", "--agents", "2",
        "--rate", "40", "--duration-s", "0.25", "--host-servers", "6",
        "--settle-timeout-s", "30"]  # fmt: skip


def test_the_scenario_on_the_embedded_default(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli.main, [*ARGS, "-o", str(out)])
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())
    assert found["failures"] == [] and found["backends"]["embedded"] is True
    (entry,) = found["moves"]
    assert (entry["hosts"], entry["compute_hosts"]) == (8, 8) and entry["audit"]["ok"]
    for kind in ("resize", "live_migration"):
        _check_timed(entry[kind])
    assert entry["confirm"]["confirmed"] == 10 + 20  # the timed resizes and the warm-up's
    drained, evacuated = entry["drain"], entry["evacuation"]
    for emptied in (drained, evacuated):
        _check_emptied(emptied, {drained["host"], evacuated["host"]})
    assert drained["host"] != evacuated["host"]
    assert drained["concurrency"] == 4 and drained["listing_s"] > 0
    assert drained["engine_s"] >= drained["seconds"]  # the engine polls each move
    assert evacuated["calls_s"] <= evacuated["seconds"]
    rows = {r["target"]: r["met"] for r in found["targets"]}
    assert rows["every server of a drained host and of an evacuated host moves"] is True
    assert [met for target, met in rows.items() if "flat" in target] == [None, None]  # N=8
    assert "Moves (library path" in result.output and "Hosts emptied" in result.output
    for table in (moves_table, emptied_table):  # the tables printed are the JSON's
        assert "\n".join(table(found["moves"])) in result.output


def _check_timed(stats: dict[str, Any]) -> None:
    """Every one of the 10 moves asked for was claimed and ended, and the figures are of
    those 10: each ends after its claim, and the percentiles are in order."""
    assert stats["moves"] == stats["accepted"] == stats["moved"] == 10
    assert stats["failed"] == stats["refused"] == 0
    claimed, done = stats["submit_to_claimed_ms"], stats["submit_to_done_ms"]
    for figures in (claimed, done, stats["api_call_ms"]):
        assert figures["count"] == 10
        assert 0 < figures["p50"] <= figures["p95"] <= figures["p99"] <= figures["max"]
    for q in ("p50", "p99", "max"):
        assert done[q] >= claimed[q]


def _check_emptied(emptied: dict[str, Any], emptied_hosts: set[str]) -> None:
    """Every server moved, each to a host that was neither emptied, and no move took
    longer than the whole."""
    assert emptied["servers"] == emptied["moved"] == 6 and emptied["could_not_move"] == 0
    assert sum(emptied["destinations"].values()) == 6
    assert not set(emptied["destinations"]) & emptied_hosts
    claimed, done = emptied["to_claimed_ms"], emptied["to_done_ms"]
    assert claimed["count"] == done["count"] == 6
    assert 0 < claimed["p50"] <= done["p50"]
    assert 0 < done["max"] <= emptied["seconds"] * 1000 + 1


@pytest.mark.real
@pytest.mark.slow
def test_the_scenario_on_real_servers(tmp_path: Path) -> None:
    """Agent processes of 4 compute hosts each on RabbitMQ and Redis: the same figures."""
    real_redis()
    require_rabbitmq()
    out = tmp_path / "bench.json"
    args = [*ARGS[1:], "--bus", "rabbitmq", "--amqp-url", AMQP_URL, "--ledger-url", REDIS_URL,
            "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())
    assert found["failures"] == [] and found["backends"]["embedded"] is False
    (entry,) = found["moves"]
    assert entry["compute_hosts"] == 8 and entry["mode"] == "processes" and entry["audit"]["ok"]
    for kind in ("resize", "live_migration"):
        _check_timed(entry[kind])
    for emptied in (entry["drain"], entry["evacuation"]):
        _check_emptied(emptied, {entry["drain"]["host"], entry["evacuation"]["host"]})
