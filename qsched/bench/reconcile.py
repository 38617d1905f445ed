"""What one periodic reconcile pass of an agent costs: CPU and wall time per pass.

``python -m qsched.bench.reconcile --nodes 100 --passes 50`` registers one agent
host of ``--nodes`` nodes shaped as the rules scenario's (a GPU child provider
under each root: two providers a node), in a cell of its own on ``--ledger-url``,
and times ``--passes`` passes of its reconcile over every node (the agent's
consumer and periodic tasks stopped, the pause between chunks skipped), after a
few untimed ones. It prints one JSON line: CPU and wall milliseconds per pass, what
the last pass looked at and whether it found anything to fix (nothing, on a quiet
host), and the CPU the Redis server used meanwhile, from ``INFO cpu`` (server-wide:
another client's commands in the same seconds count too). The cell's
keys are removed at the end.

The figure it isolates is the one a bench process of many simulated hosts pays
for every host (docs/benchmarks.rst, "What a reconcile pass costs").
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import click

from agents.service import ComputeAgent
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec
from qsched import conf as qconf
from qsched.bench.rules import RULES_NODE_PROVIDERS
from qsched.bus.kombu import KombuBus
from qsched.conf import AgentOptions, LedgerOptions
from qsched.ledger import open_stores

WARM_PASSES = 3


def measure(ledger_url: str, nodes: int, passes: int) -> dict[str, Any]:
    """Time ``passes`` reconcile passes of one host of ``nodes`` nodes (module doc)."""
    conf = qconf.load()
    conf.set_override("cell", f"reconcile-{uuid.uuid4().hex[:8]}", group="ledger")
    # a pass reads: what the ledger's writes would cost on disk is not this figure, and
    # the shared Redis it runs on by default keeps no AOF (disk, the default, refuses it)
    conf.set_override("durability", "async", group="ledger")
    stores = open_stores(LedgerOptions.from_conf(conf), url=ledger_url)
    bus = KombuBus("memory://", prefix=f"rb{uuid.uuid4().hex[:8]}")
    children = tuple(FakeChild.parse(line) for line in RULES_NODE_PROVIDERS)
    for name, value in (("host", "reconcile-bench"), ("reconcile_interval_s", 3600.0),
                        ("reconcile_batch", nodes), ("heartbeat_interval_s", 3600.0),
                        ("heartbeat_ttl_s", 7200.0)):  # fmt: skip
        conf.set_override(name, value, group="agent")
    driver = FakeDriver(nodes, FakeNodeSpec(children=children), host="reconcile-bench")
    agent = ComputeAgent(AgentOptions.from_conf(conf), stores, bus, driver)
    try:
        agent.start(ready_timeout_s=60)
        agent.stop()  # its own tasks stay out of the figures
        reconciler = agent.reconciler
        reconciler.pause = lambda _s: None
        for _ in range(WARM_PASSES):
            reconciler.run_pass()
        began_redis, began_cpu, began = (
            stores.backend.server_cpu_ms(),
            time.process_time(),
            time.monotonic(),
        )
        for _ in range(passes):
            last = reconciler.run_pass()
        wall_s, cpu_s = time.monotonic() - began, time.process_time() - began_cpu
        redis_ms = stores.backend.server_cpu_ms() - began_redis
        return {
            "nodes": nodes,
            "providers": 2 * nodes,
            "passes": passes,
            "cpu_ms_per_pass": round(1000 * cpu_s / passes, 2),
            "wall_ms_per_pass": round(1000 * wall_s / passes, 2),
            "redis_cpu_ms_per_pass": round(redis_ms / passes, 2),
            "last_pass": {"nodes": last.nodes, "found_anything": last.found_anything()},
        }
    finally:
        stores.backend.forget_cell()
        bus.close()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--nodes", type=click.IntRange(1), default=100, show_default=True,
              help="Nodes of the one host; a pass reads them all.")  # fmt: skip
@click.option("--passes", type=click.IntRange(1), default=50, show_default=True,
              help="Timed passes (after a few untimed ones).")  # fmt: skip
@click.option("--ledger-url", default="redis://127.0.0.1:6379/10", show_default=True,
              help="The ledger (a cell of its own in it, removed at the end).")  # fmt: skip
def main(nodes: int, passes: int, ledger_url: str) -> None:
    """Time an agent's reconcile pass over every node of one host; print one JSON line."""
    click.echo(json.dumps(measure(ledger_url, nodes, passes), sort_keys=True))


if __name__ == "__main__":
    main()
