"""One benchmark agent process: ``qsched-agent`` with its start timed.

``python -m qsched.bench.agent --config-file A --config-file B --report PATH``
builds the agent exactly as ``qsched-agent`` does (:func:`agents.main.build_agent`,
the fake driver from ``[agent]``), times :meth:`ComputeAgent.start` and its
registration and reconcile phases (:class:`~qsched.bench.timing.PhaseTimer`),
writes them as JSON to PATH once the agent consumes, and then runs until
SIGTERM like ``qsched-agent``; at exit it writes the report again with the
agent's counters.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import click

from agents.main import build_agent, config_file_option, wait_for_stop_signal
from qsched import conf as qconf
from qsched.bench.timing import RECONCILE, REGISTRATION, PhaseTimer, peak_rss_kb

LOG = logging.getLogger("qsched.bench.agent")


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` so that a reader never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, sort_keys=True))
    os.replace(tmp, path)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@config_file_option
@click.option(
    "--go",
    "go_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Start only once this file exists (all agents of a cloud start together); "
    "REPORT.loaded says that this one waits.",
)
@click.option(
    "--report",
    "report_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the start timings (JSON).",
)
def main(config_files: tuple[str, ...], go_path: Path | None, report_path: Path) -> None:
    """Run a qsched compute agent and report how long its start took."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    timer = PhaseTimer()
    wrapped = timer.wrap("registration", REGISTRATION) + timer.wrap("reconcile", RECONCILE)
    agent = build_agent(qconf.load_options(config_files=config_files))
    if go_path is not None:
        report_path.with_suffix(".loaded").touch()
        while not go_path.exists():
            time.sleep(0.01)
    began_at, began = time.time(), time.perf_counter()
    agent.start()
    report: dict[str, Any] = {
        "host": agent.host,
        "pid": os.getpid(),
        "nodes": len(agent.index),
        "began_at": began_at,
        "ready_at": time.time(),
        "start_s": time.perf_counter() - began,
        "phases": timer.to_dict(),
        "timed": wrapped,
    }
    write_report(report_path, report)
    LOG.info("bench agent %s: started in %.2fs", agent.host, report["start_s"])
    wait_for_stop_signal()
    report["peak_rss_kb"] = peak_rss_kb()
    agent.stop()
    report["counters"] = dict(agent.counters)
    write_report(report_path, report)


if __name__ == "__main__":
    main()
