"""deploy/qsched.conf.sample lists every option as the code defines it."""

from __future__ import annotations

from pathlib import Path

from oslo_config import generator

ROOT = Path(__file__).resolve().parent.parent


def test_sample_config_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "qsched.conf.sample"
    generator.main(
        ["--config-file", str(ROOT / "deploy/qsched-config-generator.conf"),
         "--output-file", str(fresh)]
    )  # fmt: skip
    committed = (ROOT / "deploy/qsched.conf.sample").read_text()
    assert fresh.read_text() == committed, "run `make sample-config` and commit the result"
