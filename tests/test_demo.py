"""qsched-demo: the embedded default end to end, and a summary that says what it measured."""

from __future__ import annotations

import json

from click.testing import CliRunner

from qsched.cmd import demo


def test_a_small_demo_places_everything_and_splits_its_latencies() -> None:
    result = CliRunner().invoke(
        demo.main, ["--boots", "60", "--hosts", "5", "--agents", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["accepted"], summary["active"], summary["lost"]) == (60, 60, 0)
    assert summary["overcommitted_providers"] == 0 and summary["audit_ok"]
    phases = summary["phases"]
    assert list(phases) == ["first", "paced", "burst"]
    assert [phases[p]["boots"] for p in phases] == [5, 13, 42]
    assert phases["paced"]["rate_per_s"] == demo.PACED_RATE_PER_S
    for phase in phases.values():
        assert phase["submit_to_claimed_ms"]["p50"] is not None
        assert phase["claimed_to_active_ms"]["p50"] is not None
    assert summary["placements_per_s"] > 0
    nested = summary["nested"]  # the nested flavor, checked on the ledger's allocations
    assert nested["active"] >= 1 and nested["on_gpu_child"] == nested["active"]
    assert "VGPU" in summary["fill"]


def test_the_table_says_which_latency_is_which() -> None:
    result = CliRunner().invoke(demo.main, ["--boots", "24", "--hosts", "3", "--agents", "1"])
    assert result.exit_code == 0, result.output
    assert "(scheduling)" in result.stdout
    assert "(queueing behind the burst)" in result.stdout
    assert "(agents learn the new class)" in result.stdout
    assert "nested (g1.vgpu) on a GPU child" in result.stdout
    # its ledger keeps nothing past the process, and it says so rather than assume it
    assert "[ledger] durability = async" in result.stderr
