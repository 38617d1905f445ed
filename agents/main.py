"""``qsched-agent``: run one compute agent until SIGTERM or SIGINT."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

# An agent serves its own registry from its own process: gunicorn's multiprocess mode
# for the API's workers (PROMETHEUS_MULTIPROC_DIR, read when prometheus_client is first
# imported) must not reach it through an inherited environment.
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)

import click

from agents.service import ComputeAgent
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec, check_children
from qsched import conf as qconf
from qsched import exception
from qsched.bus import open_bus
from qsched.bus.base import Bus
from qsched.ledger import Stores, open_stores
from qsched.ledger.durability import DurabilityRefused
from qsched.notifications import Notifier, open_notifier

#: Who sends an agent's notifications, as ``nova-compute`` names Nova's compute service.
PUBLISHER = "qsched-agent"

LOG = logging.getLogger("qsched.agent")
#: How often the main thread of an agent process looks for a signal that came to
#: another of its threads (:func:`catch_stop_signals`).
SIGNAL_CHECK_S = 0.5


def build_agent(
    options: qconf.Options,
    stores: Stores | None = None,
    bus: Bus | None = None,
    notifier: Notifier | None = None,
) -> ComputeAgent:
    """An agent with the fake driver as the [agent] section describes it.

    ``stores`` and ``bus``: the ledger and bus clients to use (several agents of one
    benchmark process share theirs); by default it opens its own. ``notifier``: where
    its notifications go; by default the one ``[oslo_messaging_notifications]`` names
    (:func:`open_notifier`).

    :raises Invalid: a malformed ``[agent] node_provider`` line.
    """
    opts = options.agent
    spec = FakeNodeSpec(
        vcpus=opts.node_vcpus,
        ram_mb=opts.node_ram_mb,
        disk_gb=opts.node_disk_gb,
        cpu_allocation_ratio=options.ledger.cpu_allocation_ratio,
        ram_allocation_ratio=options.ledger.ram_allocation_ratio,
        traits=frozenset(opts.node_traits),
        children=check_children([FakeChild.parse(line) for line in opts.node_provider]),
    )
    driver = FakeDriver(
        opts.node_count,
        spec,
        host=opts.host,
        spawn_delay_s=opts.spawn_delay_s,
        failure_rate=opts.spawn_failure_rate,
        seed=opts.seed,
        state_path=opts.fake_state_path or None,
    )
    stores = stores or open_stores(options.ledger, options.quota)
    if notifier is None:
        notifier = open_notifier(options.notifications, f"{PUBLISHER}:{opts.host}")
    return ComputeAgent(
        opts, stores, bus or open_bus(options.bus), driver, options.ledger.max_conflict_retries,
        notifier,
    )  # fmt: skip


#: ``--config-file``, repeatable: the INI files of an agent process
config_file_option = click.option(
    "--config-file",
    "config_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="INI file(s) read with oslo.config; later files override earlier ones.",
)


def settle_heap() -> None:
    """Put what the start built out of the cyclic garbage collector's reach.

    The node index, the classes and the clients live as long as the process. Left to
    the collector, each full collection walks all of them while every thread of the
    agent waits: hundreds of milliseconds for an agent of many nodes, a stalled claim
    each time. After one collection of the start's garbage, ``gc.freeze`` moves what
    is left to the permanent generation; objects made later are collected as usual,
    and frozen ones are still freed when no reference is left.
    """
    gc.collect()
    gc.freeze()


def catch_stop_signals() -> Callable[[], int]:
    """Catch SIGTERM and SIGINT, the ways an agent process is told to stop, from now on;
    return what blocks until one came, and returns it. Call it before the agent starts:
    a signal that came while it started is then kept, not the end of the process."""
    received: list[int] = []
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def wait() -> int:
        # In turns, not for good: the kernel may hand a process's signal to any of its
        # threads (another one when the main thread is stopped by a debugger or a
        # profiler), and then CPython only marks it, for the main thread to handle when
        # it next runs Python code; blocked without end, it never would.
        while not stop.wait(SIGNAL_CHECK_S):
            pass
        return received[0]

    return wait


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@config_file_option
@click.option("--debug", is_flag=True, help="Log at DEBUG level ([DEFAULT] debug = true).")
def main(config_files: tuple[str, ...], debug: bool) -> None:
    """Run a qsched compute agent.

    The agent registers its nodes in the ledger ([ledger] url), consumes the boot
    queues of the scheduling classes its nodes can fit now and its own host
    queue on the bus (transport_url), claims, spawns through the virt driver,
    and heartbeats. Its nodes come from the [agent] section (node_count and the
    node_* sizes of the fake driver).

    SIGTERM or SIGINT stops it cleanly: it takes no new request, lets spawns in
    flight finish (up to [agent] shutdown_timeout_s) and gives every request it
    has not finished back to the broker unacked.

    It logs through oslo.log, as its [DEFAULT] options say (log_file,
    use_journal, use_json, default_log_levels...); stdout without log_file.
    """
    conf = qconf.load(config_files=config_files, service=True)
    if debug:
        conf.set_override("debug", True)
    try:
        options = qconf.read_options(conf)
    except exception.Invalid as exc:  # refused before logging is set up: said on stderr
        raise click.ClickException(str(exc)) from None
    qconf.setup_logging(conf)
    wait_for_stop_signal = catch_stop_signals()
    try:
        agent = build_agent(options)
        agent.start()
        settle_heap()
    except DurabilityRefused as exc:  # its message says what to set
        raise click.ClickException(str(exc)) from exc
    except exception.QschedError as exc:
        raise click.ClickException(f"{exc} (check transport_url and [ledger] url)") from exc
    signum = wait_for_stop_signal()
    LOG.info("agent %s: signal %d, stopping", agent.host, signum)
    agent.stop()
    agent.notifier.close()  # sends what is still queued
    LOG.info("agent %s: stopped (%s)", agent.host, dict(agent.counters))
    sys.exit(0)
