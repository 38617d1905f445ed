"""The boot bus on a three-node RabbitMQ cluster of this module's own, losing nodes.

The cluster (:class:`~qsched.stack.rabbitmq.RabbitCluster`: its own node names,
ports, cookie and data in a temporary directory; the machine's RabbitMQ is never
touched) starts once for the module. On it, a short chaos run per bus driver:
the API under gunicorn and three agents, every process given every node (kombu's
``;`` failover list for the kombu bus, oslo.messaging's multi-host ``rabbit://`` URL
for the oslo.messaging bus), boots and deletes as a steady load, while one node is
killed and started again, then (kombu) another once the cluster is whole. Afterwards the
run's checks (:mod:`qsched.chaos.checks`, the ledger audit among them) must all
hold: no accepted request lost or placed twice, no over-commit, no leak, quota
never exceeded, every quorum queue still replicated on the three nodes; and boots
sent after each stop must have been placed while the node was down, the time that
took being printed. Last, the first node hangs (SIGSTOP) under a kombu publish,
which must end within its timeouts.

Needs ``rabbitmq-server`` and ``redis-server`` installed: skipped without them,
a failure under CI=true. About 20 s to start the cluster on two quiet cores
(40 s on a busy machine), then about 65 s for kombu (two node losses), 60 s for
oslo.messaging (one: its failover is the same broker's) and 20 s for the hang.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qsched.bus.base import BusUnavailable
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.chaos.report import table
from qsched.chaos.runner import ChaosRun, RunSettings
from qsched.chaos.stack import StackSpec
from qsched.stack.rabbitmq import RabbitCluster, RabbitFailed, RabbitNode
from tests.bus.test_bus import request
from tests.conftest import require_server
from tests.helpers import failed_invariants

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.chaos]

NODES = 3
OUTAGE_S = 6.0
HANG_S = 15.0  # how long the hung node stays stopped at most


def beam_pid(node: RabbitNode) -> int:
    """The process of a node's Erlang VM (its pid file)."""
    return int((node.dir / "rabbit.pid").read_text().strip())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    for command in ("rabbitmq-server", "redis-server"):
        if shutil.which(command) is None:
            require_server(command, "PATH", FileNotFoundError(command),
                           f"install it with: apt-get install {command}")  # fmt: skip
    if shutil.which("gunicorn", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("gunicorn is missing from the virtual environment: run make install")
    started = RabbitCluster(tmp_path_factory.mktemp("rabbit"), NODES)
    try:
        started.start()
    except RabbitFailed as exc:
        require_server("a RabbitMQ cluster", str(started.dir), exc, "see its nodes' logs")
    print(f"\n3-node RabbitMQ cluster started in {started.started_s} s, "
          f"RSS per node (MB): {started.rss_mb()}")  # fmt: skip
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.timeout(200)  # the first test of the module waits for the cluster to start
def test_a_quorum_queue_has_a_replica_on_every_node(cluster: RabbitCluster) -> None:
    assert cluster.whole()
    bus = KombuBus(cluster.kombu_url, prefix=f"qc{id(cluster):x}")
    try:
        bus.wire.note_class("m1.small")
        with bus.wire.channel() as channel:
            bus.wire.declare(channel, bus.wire.boot_entity("m1.small"))
        queue = bus.names.boot_queue("m1.small")
        assert cluster.queues()[queue] == "quorum"
        assert cluster.members(queue) == sorted(node.node for node in cluster.nodes)
    finally:
        with bus.wire.channel() as channel:
            channel.queue_delete(bus.names.boot_queue("m1.small"))
            channel.queue_delete(bus.names.dead_queue)
        bus.close()


def node_loss_run(
    cluster: RabbitCluster, transport: str, directory: Path, losses: int, duration_s: float
) -> dict[str, Any]:
    """A chaos run on ``cluster`` whose only faults are ``losses`` node losses."""
    spec = StackSpec(agents=3, nodes_per_agent=2, node_vcpus=4, node_ram_mb=8192,
                     spawn_delay_s=0.3, build_timeout_s=30, shutdown_timeout_s=5,
                     heartbeat_ttl_s=3, reconcile_interval_s=1)  # fmt: skip
    settings = RunSettings(transport, duration_s=duration_s, rate=4, lifetime_s=3,
                           outage_s=OUTAGE_S, fault_counts={"rabbit_node_loss": losses}, spec=spec,
                           progress_every_s=600, rabbit_cluster=NODES)  # fmt: skip
    return ChaosRun(settings, directory, lambda line: None, cluster=cluster).execute()


@pytest.mark.timeout(240)
# kombu's failover list loses the first node, then the second once the first is back;
# oslo.messaging's multi-host URL loses one (a second loss adds 20 s to make test)
@pytest.mark.parametrize(
    ("transport", "count", "duration_s"), [("amqp", 2, 50), ("oslo", 1, 30)],
    ids=["kombu", "oslo.messaging"],
)  # fmt: skip
def test_boots_are_placed_while_a_node_is_down_and_nothing_is_lost(
    cluster: RabbitCluster, transport: str, count: int, duration_s: float, tmp_path: Path
) -> None:
    report = node_loss_run(cluster, transport, tmp_path, count, duration_s)
    print(f"\n{table(report)}")
    losses = report["faults"]["events"]
    assert [e["kind"] for e in losses] == ["rabbit_node_loss"] * count, losses
    assert [e.get("error") for e in losses] == [None] * count, losses
    names = [node.node.partition("@")[0] for node in cluster.nodes]
    assert [e["target"] for e in losses] == names[:count], "the first node, then the second"
    for loss in losses:  # the others served while it was down, not once it was back
        assert loss["placed_while_down"] > 0, loss
        assert loss["failover_s"] < OUTAGE_S, loss
    queues = report["cluster"]["queues"]  # boot and host queues: replicated on every node
    boot, host = [[q for q in queues if f".{kind}." in q] for kind in ("boot", "host")]
    assert boot and len(host) == 3, queues
    assert all(queues[q] == {"type": "quorum", "replicas": NODES} for q in boot + host), queues
    assert report["requests"]["accepted"] > 50
    assert report["quiescence"]["reached"]
    assert report["ok"], failed_invariants(report)
    assert cluster.whole()


@pytest.mark.timeout(200)  # run alone (-k), it waits for the cluster to start too
def test_a_publish_on_a_node_that_hangs_fails_in_bounded_time(cluster: RabbitCluster) -> None:
    """The first node's Erlang VM stopped (SIGSTOP): its sockets stay open, nothing
    answers. A publish whose confirm times out drops its connection without AMQP's
    close handshake, which would wait for the hung node (it did, for the whole hang),
    and tries the next node; the boot queue's leader is on the hung node, so it may
    still fail, but within its timeouts, not when the node wakes."""
    options = KombuOptions(connect_timeout_s=1.0, confirm_timeout_s=2.0)
    bus = KombuBus(cluster.kombu_url, prefix=f"qh{id(cluster):x}", options=options)
    outcome: list[str] = []

    def publish() -> None:
        try:
            bus.publish_boot(request())
            outcome.append("confirmed")
        except BusUnavailable as exc:
            outcome.append(f"refused: {exc}")

    node = cluster.nodes[0]  # every connection starts there
    pid = beam_pid(node)
    try:
        publish()  # the pooled connection and the queue, on the first node
        assert outcome == ["confirmed"]
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            worker = threading.Thread(target=publish, daemon=True)
            worker.start()
            worker.join(HANG_S)
            took_s = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        worker.join(30)
        print(f"\na publish with the first node hung: {outcome[1:]} after {took_s:.1f} s")
        assert len(outcome) == 2 and took_s < 2 * 2.0 + 1.0 + 3.0, (outcome, took_s)
    finally:
        os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(BusUnavailable), bus.wire.channel() as channel:
            channel.queue_delete(bus.names.boot_queue("m1.small"))
            channel.queue_delete(bus.names.dead_queue)
        bus.close()
    assert cluster.wait_whole(60) >= 0
