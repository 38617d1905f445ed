"""deploy/qsched.conf.sample and policy.yaml.sample list every option and rule as the code
defines them."""

from __future__ import annotations

from pathlib import Path

from oslo_config import generator
from oslo_policy import generator as policy_generator

ROOT = Path(__file__).resolve().parent.parent


def test_sample_config_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "qsched.conf.sample"
    generator.main(
        ["--config-file", str(ROOT / "deploy/qsched-config-generator.conf"),
         "--output-file", str(fresh)]
    )  # fmt: skip
    committed = (ROOT / "deploy/qsched.conf.sample").read_text()
    assert fresh.read_text() == committed, "run `make sample-config` and commit the result"


def test_sample_policy_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "policy.yaml.sample"
    policy_generator.generate_sample(
        args=["--config-file", str(ROOT / "deploy/qsched-policy-generator.conf"),
              "--output-file", str(fresh)]
    )  # fmt: skip
    committed = (ROOT / "deploy/policy.yaml.sample").read_text()
    assert fresh.read_text() == committed, "run `make sample-config` and commit the result"
