"""The whole of qsched in one process: the embedded default (memory bus, fakeredis).

The API serves on a local port with a threaded WSGI server, agents drive fake
nodes in threads, and the API service's housekeeping (the deadline reaper, the
janitor, the outbox pass) runs in the same process, as it does in
``qsched-api``. Used by ``qsched-demo`` and the end-to-end tests.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from typing import Any

from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched import conf as qconf
from qsched import exception
from qsched.api import app as api_app
from qsched.api.wsgi import ThreadingWSGIServer, make_server
from qsched.bus.kombu import KombuBus
from qsched.cells.housekeeping import start_periodic_tasks
from qsched.compute.api import ComputeAPI
from qsched.conf import Options
from qsched.conf.bus import KOMBU
from qsched.ledger import Stores, embedded, open_stores
from qsched.notifications import NULL, Notifier
from qsched.periodic import Periodic
from qsched.urls import masked

LOG = logging.getLogger(__name__)

DEMO_FLAVORS = (
    "m1.tiny:1:512:1",
    "m1.small:1:2048:20",
    "m1.medium:2:4096:40",
    "m1.large:4:8192:80",
)

# The reaper's period on an embedded stack: tests and the demo shorten deadlines.
EMBEDDED_REAP_INTERVAL_S = 1.0
#: The embedded stack's [ledger] durability: its ledger lives and dies with the process.
EMBEDDED_DURABILITY = "async"


def embedded_options(**overrides: tuple[str | None, Any]) -> Options:
    """Options for an in-process stack with its own fakeredis server and bus prefix.

    ``overrides``: option name -> (section, value), as the stack's entry point reads them.
    """
    conf = qconf.load()
    run = uuid.uuid4().hex[:8]
    conf.set_override("transport_url", "memory://")
    conf.set_override("url", f"fakeredis://embedded-{run}", group="ledger")  # may be overridden
    # The embedded ledger keeps nothing past this process: async is what it is, said
    # here rather than assumed ([ledger] durability's default, disk, refuses it).
    conf.set_override("durability", EMBEDDED_DURABILITY, group="ledger")
    conf.set_override("prefix", f"qsched-{run}", group="bus")
    conf.set_override("flavor", list(DEMO_FLAVORS), group="api")
    for name, (group, value) in overrides.items():
        conf.set_override(name, value, group=group)
    return Options.from_conf(conf)


@dataclasses.dataclass
class Stack:
    options: Options
    stores: Stores
    bus: KombuBus
    server: ThreadingWSGIServer
    agents: list[ComputeAgent]
    housekeeping: list[Periodic]
    thread: threading.Thread
    notifier: Notifier = NULL

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    @property
    def providers(self) -> int:
        return sum(len(agent.index) for agent in self.agents)

    def compute_api(self) -> ComputeAPI:
        """Another front door on this stack's ledger and bus."""
        return ComputeAPI(
            self.stores, self.bus, self.options.scheduler, self.options.api,
            notifier=self.notifier,
        )  # fmt: skip

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for task in self.housekeeping:
            task.stop()
        for agent in self.agents:
            agent.stop(timeout_s=10)
        self.bus.close()


def start_stack(
    options: Options,
    hosts: int,
    agents: int,
    node_spec: FakeNodeSpec,
    port: int = 0,
    spawn_delay_s: float = 0.0,
    failure_rate: float = 0.0,
    notifier: Notifier = NULL,
) -> Stack:
    """Start the API on 127.0.0.1:``port`` and ``agents`` agents sharing ``hosts`` nodes,
    their notifications (and the reaper's) sent to ``notifier``, and the API service's
    housekeeping (the reaper every second, the janitor and the outbox pass as
    ``options.scheduler`` sets them: a request parked in the outbox is published again,
    a dead agent's work requeued)."""
    if options.bus.driver != KOMBU:  # its callers reach into the memory bus's wire
        raise exception.Invalid(reason="the embedded stack runs on [bus] driver kombu only")
    stores = open_stores(options.ledger, options.quota)
    LOG.info("embedded stack: ledger %s, [ledger] durability = %s", masked(options.ledger.url),
             options.ledger.durability)  # fmt: skip
    bus = KombuBus.from_options(options.bus)
    app = api_app.create_app(stores, bus, options.api, options.scheduler, notifier=notifier)
    server = make_server(app, "127.0.0.1", port)
    thread = threading.Thread(target=server.serve_forever, name="qsched-api", daemon=True)
    thread.start()
    agent_options = options.agent.replace(reap_interval_s=0)  # one reaper, the API's
    running = []
    for i, count in enumerate(_split(hosts, agents)):
        driver = FakeDriver(
            count, node_spec, host=f"cn{i}", spawn_delay_s=spawn_delay_s,
            failure_rate=failure_rate, seed=i,
        )  # fmt: skip
        agent = ComputeAgent(
            agent_options.replace(host=f"cn{i}"), stores, bus, driver,
            options.ledger.max_conflict_retries, notifier,
        )  # fmt: skip
        agent.start()
        running.append(agent)
    housekeeping = start_periodic_tasks(
        options.scheduler.replace(reap_interval_s=EMBEDDED_REAP_INTERVAL_S),
        stores, bus, notifier=notifier,
    )  # fmt: skip
    return Stack(options, stores, bus, server, running, housekeeping, thread, notifier)


class SharedState:
    """The embedded ledger and bus served over TCP (fakeredis speaks the Redis protocol),
    so that ``qsched-admin`` in another terminal sees what this process holds."""

    def __init__(self, port: int) -> None:
        self.server = embedded.tcp_server("127.0.0.1", port)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.ledger_url = f"redis://127.0.0.1:{port}/0"
        self.transport_url = f"redis://127.0.0.1:{port}/1"

    def write_config(self, options: Options, path: str) -> None:
        """A config file for qsched-admin pointing at this state."""
        with open(path, "w") as out:
            out.write(
                f"[DEFAULT]\ntransport_url = {self.transport_url}\n\n"
                f"[bus]\nprefix = {options.bus.prefix}\n\n"
                f"[ledger]\nurl = {self.ledger_url}\n"
                "# the demo's ledger, in its process: nothing survives it\n"
                f"durability = {options.ledger.durability}\n"
            )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _split(total: int, parts: int) -> list[int]:
    """``total`` nodes over ``parts`` agents, as even as can be, none empty."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
