"""One benchmark agent process: ``qsched-agent`` with its start timed.

``python -m qsched.bench.agent --config-file A --config-file B --report PATH``
builds the agent exactly as ``qsched-agent`` does (:func:`agents.main.build_agent`,
the fake driver from ``[agent]``), times :meth:`ComputeAgent.start` and its
registration and reconcile phases (:class:`~qsched.bench.timing.PhaseTimer`),
writes them as JSON to PATH once the agent consumes, and then runs until
SIGTERM like ``qsched-agent``; at exit it writes the report again with the
agent's counters.

``--hosts K`` runs K agents in the process instead, as K ``qsched-agent``
processes would run: each its own compute host (``<[agent] host>-<j>``) with
``[agent] node_count`` split between them, its own bus consumer (its channel,
host queue, prefetch and acks), heartbeat and periodic tasks. They share the
process's ledger connection pool and publisher pool, and on the kombu bus one
consumer connection and the one thread that drains it
(:meth:`~qsched.bus.kombu.KombuBus.sharing_consumers`): a thousand hosts in four
processes hold four AMQP consumer connections, not a thousand. Their callbacks
take turns in that thread. That gives a benchmark cloud enough compute hosts for
server groups, whose policies are per host. Only the first serves metrics
(``[agent] metrics_port``); counters are summed.

``--switch FILE`` lets the bench turn the agents' notifications and metrics off and
on while they run (the plumbing scenario, :mod:`qsched.bench.switch`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click

from agents.main import (
    PUBLISHER,
    build_agent,
    catch_stop_signals,
    config_file_option,
    settle_heap,
)
from agents.service import ComputeAgent
from qsched import conf as qconf
from qsched.bench.switch import SIGNAL, NotifierSwitch, obey, write_atomically
from qsched.bench.timing import (
    RECONCILE,
    REGISTRATION,
    FullCollections,
    PhaseTimer,
    peak_rss_kb,
)
from qsched.bus import open_bus
from qsched.bus.kombu import KombuBus
from qsched.ledger import open_stores
from qsched.notifications import open_notifier

#: Agents of one process started (and stopped) at once: registration and the bus
#: connect overlap, as separate processes' would.
START_THREADS = 8

LOG = logging.getLogger("qsched.bench.agent")


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
@click.option(
    "--hosts",
    "host_count",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Compute hosts (agents) this process runs, each with its own consumer.",
)
@click.option(
    "--switch",
    "switch_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Let the bench turn notifications and metrics off and on: on SIGUSR1, apply "
    "the state in this JSON file and write it back to REPORT.switched "
    "(qsched.bench.switch).",
)
def main(
    config_files: tuple[str, ...],
    go_path: Path | None,
    report_path: Path,
    host_count: int,
    switch_path: Path | None,
) -> None:
    """Run qsched compute agents and report how long their start took."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    wait_for_stop_signal = catch_stop_signals()
    timer = PhaseTimer()
    wrapped = timer.wrap("registration", REGISTRATION) + timer.wrap("reconcile", RECONCILE)
    agents = build_agents(qconf.load_options(config_files=config_files), host_count,
                          switchable=switch_path is not None)  # fmt: skip
    if switch_path is not None:
        signal.signal(SIGNAL, obey(agents, switch_path, report_path.with_suffix(".switched")))
    if go_path is not None:
        report_path.with_suffix(".loaded").touch()
        while not go_path.exists():
            time.sleep(0.01)
    began_at, began = time.time(), time.perf_counter()
    _each(agents, ComputeAgent.start)
    settle_heap()
    collections = FullCollections().install()  # from here on: while the agents consume
    report: dict[str, Any] = {
        "host": agents[0].host,
        "hosts": [a.host for a in agents],
        "pid": os.getpid(),
        "nodes": sum(len(a.index) for a in agents),
        "began_at": began_at,
        "ready_at": time.time(),
        "start_s": time.perf_counter() - began,
        "phases": timer.to_dict(),
        "timed": wrapped,
    }
    write_atomically(report_path, report)
    LOG.info("bench agents %s: %d started in %.2fs", agents[0].host, len(agents),
             report["start_s"])  # fmt: skip
    wait_for_stop_signal()
    report["peak_rss_kb"] = peak_rss_kb()
    _each(agents, ComputeAgent.stop)
    report["counters"] = dict(sum((Counter(a.counters) for a in agents), Counter()))
    report["counters"].update(collections.to_counters())  # the process's, not summed
    write_atomically(report_path, report)


def build_agents(
    options: qconf.Options, count: int, switchable: bool = False
) -> list[ComputeAgent]:
    """``count`` agents splitting ``[agent] node_count``: the process's own host when
    there is one, else ``<host>-0`` ... ``<host>-<count - 1>``, on shared clients;
    ``switchable``: their notifiers are :class:`NotifierSwitch` es."""

    def notifier(host: str) -> NotifierSwitch | None:
        if not switchable:
            return None
        return NotifierSwitch(open_notifier(options.notifications, f"{PUBLISHER}:{host}"))

    if count == 1:
        return [build_agent(options, notifier=notifier(options.agent.host))]
    opts = options.agent
    if opts.node_count < count:
        raise click.BadParameter(f"{count} hosts for {opts.node_count} nodes", param_hint="--hosts")
    # one pool for every agent of the process: redis-py's default cap of 100 connections
    # is below what a few hundred agents' threads hold at once
    url = add_query(options.ledger.url, max_connections=100 + 4 * count)
    stores, bus = open_stores(options.ledger, options.quota, url), open_bus(options.bus)
    if isinstance(bus, KombuBus):  # the oslo.messaging bus keeps a connection per host
        bus = bus.sharing_consumers()
    total = opts.node_count
    agents = []
    for j in range(count):
        nodes = total // count + (1 if j < total % count else 0)
        own = dataclasses.replace(opts, host=f"{opts.host}-{j}", node_count=nodes,
                                  metrics_port=opts.metrics_port if j == 0 else 0)  # fmt: skip
        agents.append(build_agent(dataclasses.replace(options, agent=own), stores, bus,
                                  notifier(own.host)))  # fmt: skip
    return agents


def add_query(url: str, **params: object) -> str:
    """``url`` with more query parameters (kept when it has some)."""
    parts = urlsplit(url)
    query = "&".join([*filter(None, [parts.query]), *(f"{k}={v}" for k, v in params.items())])
    return urlunsplit(parts._replace(query=query))


def _each(agents: list[ComputeAgent], step: Any) -> None:
    """``step(agent)`` for every agent, a few at once; the first error is raised."""
    with ThreadPoolExecutor(min(START_THREADS, len(agents))) as pool:
        for done in [pool.submit(step, agent) for agent in agents]:
            done.result()


if __name__ == "__main__":
    main()
