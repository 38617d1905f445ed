"""qsched-ledger-bench through click's CliRunner, on tiny sizes: fakeredis, and the
durability backend on redis-servers of its own."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from qsched.cmd import ledger_bench
from qsched.cmd.ledger_bench import main
from tests.conftest import require_server

RESULT_KEYS = {"backend", "threads", "claims", "refused", "conflicts", "seconds",
               "claims_per_s", "p50_ms", "p99_ms"}  # fmt: skip
pytestmark = pytest.mark.timeout(30)

TINY = ["--backend", "fakeredis", "--providers", "3", "--claims", "12", "--threads", "3"]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.output


def test_json_shape() -> None:
    code, stdout, _ = run(*TINY, "--format", "json")
    assert code == 0, stdout
    report = json.loads(stdout)  # progress goes to stderr: stdout is pure JSON
    assert (report["providers"], report["claims"], report["threads"]) == (3, 12, 3)
    assert [(r["backend"], r["threads"]) for r in report["results"]] == [
        ("fakeredis", 1),
        ("fakeredis", 3),
    ]
    for r in report["results"]:
        assert set(r) == RESULT_KEYS
        assert (r["claims"], r["refused"]) == (12, 0)
        assert r["claims_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    assert report["skipped"] == []
    assert report["reference"]["claims_per_s"] == [45, 80]
    assert "not measured" in report["reference"]["note"]


def test_a_full_provider_refuses_claims() -> None:
    args = ["--backend", "fakeredis", "--providers", "1", "--claims", "1030", "--threads", "1"]
    code, stdout, _ = run(*args, "--format", "json")
    assert code == 0, stdout
    (result,) = json.loads(stdout)["results"]
    assert (result["claims"], result["refused"]) == (1030, 6)  # room for 1024


def test_table_names_the_reference_as_not_measured() -> None:
    code, stdout, _ = run(*TINY)
    assert code == 0, stdout
    assert "fakeredis" in stdout and "claims/s" in stdout
    assert "NOT measured by this run" in stdout and "45-80" in stdout


def test_unreachable_redis_is_reported_and_skipped() -> None:
    args = ["--redis-url", "redis://127.0.0.1:1/9", "--providers", "2", "--claims", "4"]
    code, stdout, _ = run(*args, "--threads", "1", "--format", "json")
    assert code == 0, stdout
    report = json.loads(stdout)
    assert [r["backend"] for r in report["results"]] == ["fakeredis"]
    (skipped,) = report["skipped"]
    assert skipped["backend"] == "redis" and "not reachable" in skipped["reason"]


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379", "unix:///tmp/redis.sock"]
)
def test_db_0_is_refused_without_force(url: str) -> None:
    code, _, output = run("--redis-url", url, "--backend", "redis")
    assert code == 2
    assert "FLUSH db 0" in output and "--force" in output


def test_force_allows_db_0(monkeypatch: pytest.MonkeyPatch) -> None:
    reached = []
    down = lambda url: reached.append(url) or "down"  # noqa: E731
    monkeypatch.setattr(ledger_bench.server, "unreachable", down)
    code, stdout, _ = run("--redis-url", "redis://h:1/0", "--backend", "redis", "--force")
    assert code == 0 and reached == ["redis://h:1/0"]
    assert "not reachable (down): skipped" in stdout


def test_password_is_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_bench.server, "unreachable", lambda url: "down")
    code, stdout, output = run("--redis-url", "redis://u:s3cret@h:6379/9", "--backend", "redis")
    assert code == 0 and "real Redis at redis://u:***@h:6379/9 not reachable" in stdout
    assert "s3cret" not in output


def test_help_warns_about_the_flush() -> None:
    code, stdout, _ = run("--help")
    assert code == 0
    assert "FLUSHED" in stdout and "--demo" in stdout and "p99" in stdout


def test_demo() -> None:
    code, stdout, _ = run("--demo")
    assert code == 0, stdout
    assert "Quota exceeded for cores" in stdout
    assert "Not enough MEMORY_MB" in stdout
    assert "No valid host was found." in stdout
    assert "Audit of the ledger's own records: ok" in stdout


def test_percentile() -> None:
    values = [float(n) for n in range(1, 101)]
    assert ledger_bench.percentile(values, 0.50) == 50.0
    assert ledger_bench.percentile(values, 0.99) == 99.0
    assert ledger_bench.percentile([7.0], 0.99) == 7.0
    assert ledger_bench.percentile([], 0.5) == 0.0


@pytest.mark.real
@pytest.mark.timeout(90)
def test_each_durability_claims_on_servers_of_its_own() -> None:
    """--backend durability: async, replica (a master and one replica) and disk, each on
    redis-servers it starts (qsched.ledger.server.start_for) and stops."""
    if shutil.which("redis-server") is None:
        require_server("redis-server", "PATH", FileNotFoundError("redis-server"),
                       "apt-get install redis-server")  # fmt: skip
    args = ["--backend", "durability", "--providers", "3", "--claims", "12", "--threads", "2"]
    code, stdout, output = run(*args, "--format", "json")
    assert code == 0, output
    results = json.loads(stdout)["results"]
    assert [(r["backend"], r["threads"]) for r in results] == [
        (f"redis {mode}", threads) for mode in ("async", "replica", "disk") for threads in (1, 2)
    ]
    assert all((r["claims"], r["refused"]) == (12, 0) for r in results)
