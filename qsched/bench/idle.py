"""What one idle agent process of many hosts costs: CPU, threads, broker connections.

``python -m qsched.bench.idle --nodes 25000 --hosts 250`` starts the rules
scenario's cloud with one agent process (:mod:`qsched.bench.agent` ``--hosts``,
the rules cloud's nodes, child providers and spread-out periodic work), no API,
and no load; once it has consumed for ``--settle-s`` it reads the process's CPU
time over ``--seconds`` from ``/proc``, its threads by name (py-spy's dump, when
py-spy is installed), and its TCP connections to RabbitMQ and Redis (``ss``).
``--profile FILE`` samples it with ``py-spy record`` meanwhile (collapsed stacks;
py-spy's own cost then shows in the CPU figure). Linux only.

It runs on the real servers the bench uses and removes its cell's keys and
queues when done; it is a heavy run: take the machine's lock first.
"""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from qsched.bench.rules import GPU_FLAVOR, QUIET, RULES_NODE_PROVIDERS, SHARED_FLAVOR
from qsched.bench.runner import SCALE_FLAVOR
from qsched.bench.stack import CloudSpec, ProcessCloud

CLOCK_TICKS = 100  # USER_HZ on Linux


def py_spy() -> str | None:
    """py-spy on the PATH, or beside this Python (a virtualenv's bin)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def connections(pid: int) -> dict[str, int]:
    """The process's TCP connections to port 5672 (AMQP) and 6379 (Redis)."""
    listing = subprocess.run(["ss", "-tnp"], capture_output=True, text=True).stdout
    mine = [line for line in listing.splitlines() if f"pid={pid}," in line]
    return {name: sum(f":{port} " in line for line in mine)
            for name, port in (("amqp", 5672), ("redis", 6379))}  # fmt: skip


def threads_by_name(pid: int) -> dict[str, int]:
    """Python threads by name, less the host part (``heartbeat-<host>`` -> ``heartbeat``)."""
    spy = py_spy()
    if spy is None:
        return {}
    dump = subprocess.run([spy, "dump", "--nonblocking", "-p", str(pid)],
                          capture_output=True, text=True).stdout  # fmt: skip
    names = [line.split('"')[1] for line in dump.splitlines()
             if line.startswith("Thread ") and '"' in line]  # fmt: skip
    return dict(collections.Counter(name.split("-bench")[0] for name in names).most_common())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--nodes", type=click.IntRange(1), default=25000, show_default=True,
              help="Simulated nodes of the process.")  # fmt: skip
@click.option("--hosts", type=click.IntRange(1), default=250, show_default=True,
              help="Compute hosts (agents) the process runs, splitting the nodes.")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(1), default=30.0, show_default=True,
              help="How long the idle CPU is measured.")  # fmt: skip
@click.option("--settle-s", type=click.FloatRange(0), default=15.0, show_default=True,
              help="Wait this long after the agents consume before measuring.")  # fmt: skip
@click.option("--transport-url", default="amqp://guest:guest@127.0.0.1:5672//",
              show_default=True, help="The bus.")  # fmt: skip
@click.option("--ledger-url", default="redis://127.0.0.1:6379/10", show_default=True,
              help="The ledger (a cell of its own in it, removed at the end).")  # fmt: skip
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also sample the process with py-spy record into this file.")  # fmt: skip
def main(nodes: int, hosts: int, seconds: float, settle_s: float, transport_url: str,
         ledger_url: str, profile_path: Path | None) -> None:  # fmt: skip
    """Measure an idle agent process of many hosts; print one JSON line."""
    spec = CloudSpec(nodes, 1, (SCALE_FLAVOR, GPU_FLAVOR, SHARED_FLAVOR),
                     transport_url=transport_url, ledger_url=ledger_url, http=False,
                     metrics=False, node_providers=RULES_NODE_PROVIDERS,
                     hosts_per_agent=hosts, **QUIET)  # type: ignore[arg-type]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="qsched-idle-") as workdir:
        cloud = ProcessCloud(spec, Path(workdir), lambda line: None)
        try:
            cloud.start()
            pid = next(iter(cloud.profile_targets().values()))
            time.sleep(settle_s)
            click.echo(json.dumps(_measure(pid, seconds, profile_path), sort_keys=True))
        finally:
            cloud.stop()


def _measure(pid: int, seconds: float, profile_path: Path | None) -> dict[str, Any]:
    began_cpu, began = cpu_s(pid), time.monotonic()
    spy = py_spy()
    if profile_path is not None and spy is not None:
        subprocess.run([spy, "record", "--nonblocking", "-r", "4", "-f", "raw", "-p", str(pid),
                        "-d", str(round(seconds)), "-o", str(profile_path)],
                       capture_output=True, check=False)  # fmt: skip
    else:
        time.sleep(seconds)
    wall_s = time.monotonic() - began
    return {
        "idle_cores": round((cpu_s(pid) - began_cpu) / wall_s, 3),
        "seconds": round(wall_s, 1),
        "threads": len(list(Path(f"/proc/{pid}/task").iterdir())),
        "threads_by_name": threads_by_name(pid),
        "connections": connections(pid),
    }


if __name__ == "__main__":
    main()
