"""qsched-admin on real servers: RabbitMQ, Redis, and two live ``qsched-agent`` processes.

The test process boots through :class:`~qsched.compute.ComputeAPI` (what the API
service does on POST) and runs qsched-admin with the same config file the
agents read. Database 9 of Redis is flushed before and after; the bus uses a
prefix of its own, and its queues and exchanges are deleted at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from click.testing import CliRunner, Result

from agents.service import wait_until
from qsched import conf as qconf
from qsched.admin import schemas
from qsched.admin.cli import cli
from qsched.bus.kombu import KombuBus
from qsched.compute import ComputeAPI, RequestContext
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import State
from qsched.reaper import reap_expired
from tests.cloud import AMQP_URL, BUS_REDIS_URL, require_rabbitmq
from tests.conftest import REDIS_URL, real_redis

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(90)]

USER = RequestContext("u1", "p1")
BUILD_TIMEOUT_S = 60

CONFIG = """
[DEFAULT]
transport_url = {transport_url}
[bus]
prefix = {prefix}
[ledger]
url = {ledger_url}
cpu_allocation_ratio = 1.0
[scheduler]
build_timeout_s = {timeout}
[api]
flavor = small:1:1024:0
flavor = huge:64:1024:0
[agent]
node_count = 2
node_vcpus = 2
node_ram_mb = 8192
node_disk_gb = 0
heartbeat_interval_s = 0.3
heartbeat_ttl_s = 3
class_poll_interval_s = 0.1
reap_interval_s = 0.3
"""


class Cell:
    """Two agent processes on RabbitMQ and Redis, and qsched-admin pointed at them."""

    def __init__(self, tmp: Path, transport_url: str) -> None:
        self.tmp = tmp
        self.prefix = f"adm{uuid.uuid4().hex[:8]}"
        self.hosts = [f"{self.prefix}-cn{i}" for i in range(2)]
        self.config = tmp / "qsched.conf"
        self.config.write_text(
            CONFIG.format(
                transport_url=transport_url, prefix=self.prefix, ledger_url=REDIS_URL,
                timeout=BUILD_TIMEOUT_S,
            )
        )  # fmt: skip
        self.conf = qconf.load([], [str(self.config)])
        self.stores: Stores = open_stores(self.conf)
        self.bus = KombuBus.from_conf(self.conf)
        self.api = ComputeAPI(self.conf, self.stores, self.bus)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.runner = CliRunner()

    def start(self) -> None:
        self.api.seed_flavors()
        self.stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        agent = str(Path(sys.executable).parent / "qsched-agent")
        for host in self.hosts:
            host_conf = self.tmp / f"{host}.conf"
            host_conf.write_text(f"[agent]\nhost = {host}\n")
            log = open(self.tmp / f"{host}.log", "wb")  # noqa: SIM115 (closed with the process)
            cmd = [agent, "--config-file", str(self.config), "--config-file", str(host_conf)]
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        alive = lambda: sum(a.alive for a in self.stores.agents.list()) == 2  # noqa: E731
        assert wait_until(alive, timeout_s=30, interval_s=0.1), self.logs()

    def admin(self, *args: str, code: int = 0) -> Result:
        result = self.runner.invoke(cli, ["--config-file", str(self.config), *args])
        assert result.exit_code == code, (result.output, result.exception)
        return result

    def json(self, schema: dict[str, Any], *args: str) -> Any:
        document = json.loads(self.admin(*args, "--format", "json").stdout)
        jsonschema.validate(document, schema)
        return document

    def boot(self, flavor: str) -> str:
        return self.api.boot(USER, "vm", flavor).uuid

    def state(self, uuid_: str) -> State:
        return self.stores.instances.get(uuid_).state

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.tmp.glob("*.log"))

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._delete_queues()
        self.bus.close()

    def _delete_queues(self) -> None:
        names = self.bus.names
        queues = [names.dead_queue, *(names.boot_queue(c) for c in ("small", "huge")),
                  *(names.host_queue(h) for h in self.hosts)]  # fmt: skip
        if not self.bus.amqp:  # kombu's Redis transport: keys named after the prefix
            client = redis.Redis.from_url(BUS_REDIS_URL)
            for key in client.scan_iter(match=f"*{self.prefix}*"):
                client.delete(key)
            return
        connection = self.bus.connect()
        try:
            channel = connection.channel()
            for name in queues:
                channel.queue_delete(name)
            channel.exchange_delete(names.exchange)
            channel.exchange_delete(names.dead_exchange)
        finally:
            connection.release()


@pytest.fixture(scope="module", params=["rabbitmq", "redis"])
def cell(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cell]:
    ledger = real_redis()
    if request.param == "rabbitmq":
        require_rabbitmq()
        transport = AMQP_URL
    else:
        real_redis(BUS_REDIS_URL)
        transport = BUS_REDIS_URL
    ledger.flushdb()
    cell = Cell(tmp_path_factory.mktemp(request.param), transport)
    try:
        cell.start()
        yield cell
    finally:
        cell.stop()
        ledger.flushdb()


def test_listings_on_rabbitmq_and_redis(cell: Cell) -> None:
    placed = cell.boot("small")
    assert wait_until(lambda: cell.state(placed) == State.ACTIVE, 15), cell.logs()
    queues = lambda: {q["class"]: q for q in cell.json(schemas.QUEUES, "queues")}  # noqa: E731
    consumers = 2 if cell.bus.amqp else None  # kombu's Redis transport does not count them
    both = lambda: (queues()["small"]["consumers"], queues()["small"]["agents"]) == (consumers, 2)  # noqa: E731
    assert wait_until(both, 5, interval_s=0.1), queues()
    assert queues()[None]["queue"] == f"{cell.prefix}.dead"
    agents = cell.json(schemas.AGENTS, "agents")
    assert {a["host"] for a in agents if a["alive"]} == set(cell.hosts)
    assert sum(a["free"]["VCPU"] for a in agents) == 7  # 2 agents x 2 nodes x 2, one used
    providers = cell.json(schemas.PROVIDERS, "providers", "--host", cell.hosts[0])
    assert [p["name"] for p in providers] == [f"{cell.hosts[0]}-0", f"{cell.hosts[0]}-1"]
    why = cell.json(schemas.WHY, "server", "why", placed)
    assert why["outcome"] == "placed" and why["host"] in cell.hosts
    held = cell.json(schemas.ALLOCATIONS, "allocations", placed)
    assert {a["resource_class"] for a in held["allocations"]} == {"VCPU", "MEMORY_MB"}
    frames = cell.admin("top", "--iterations", "2", "--interval", "0.1", "-f", "json").stdout
    for frame in map(json.loads, frames.splitlines()):
        jsonschema.validate(frame, schemas.TOP_FRAME)
        assert frame["agents_alive"] == 2


def test_dead_letters_and_queue_purge(cell: Cell) -> None:
    cell.bus.publish(cell.bus.boot_entity("small"), b"\x93garbage")
    listed = lambda: cell.json(schemas.DEAD_LETTERS, "dead-letters", "list")  # noqa: E731
    assert wait_until(lambda: len(listed()) == 1, 10), cell.logs()
    letter = listed()[0]  # reading twice kept it: a copy went back before the ack
    assert "not msgpack" in letter["reason"] and letter["class"] == "small"
    shown = cell.json(schemas.DEAD_LETTER, "dead-letters", "show", letter["id"])
    assert shown["body_hex"] == b"\x93garbage".hex()
    purged = cell.json(schemas.OUTCOMES, "dead-letters", "purge", letter["id"], "--yes")
    assert purged == [{"id": letter["id"], "instance": None, "result": "purged"}]
    assert listed() == []

    waiting = cell.boot("huge")  # 64 VCPU: nobody consumes it
    assert wait_until(lambda: cell.bus.queue_stats("huge").ready == 1, 5)
    assert "dropped 1 message(s)" in cell.admin("queue", "purge", "huge", "--yes").stdout
    assert cell.state(waiting) == State.BUILD  # the deadline ends it
    if cell.bus.amqp:  # a passive declare tells a missing queue; elsewhere it is just empty
        cell.admin("queue", "purge", "no-such-class", "--yes", code=1)


def test_why_refused_by_both_hosts_then_timed_out(cell: Cell) -> None:
    fillers = _fill_behind_the_agents_backs(cell.stores, cell.hosts)
    try:
        uuid_ = cell.boot("small")
        refused = lambda: {e.host for e in cell.stores.instances.events(uuid_)  # noqa: E731
                           if e.event == "refused"}  # fmt: skip
        assert wait_until(lambda: refused() == set(cell.hosts), 15), cell.logs()
        why = lambda: cell.json(schemas.WHY, "server", "why", uuid_)  # noqa: E731
        assert wait_until(lambda: why()["now"]["consumers"] == [], 5)  # the next heartbeats
        assert why()["outcome"] == "waiting"
        assert {r["host"] for r in why()["refusals"]} == set(cell.hosts)
        assert "not enough VCPU" in why()["refusals"][0]["reason"]

        # Its deadline passes: what the reaper does then, without waiting for it.
        assert reap_expired(cell.stores, now=time.time() + BUILD_TIMEOUT_S + 1) >= 1
        assert cell.state(uuid_) == State.ERROR
        ended = why()
        assert ended["outcome"] == "error" and "before its deadline" in ended["verdict"]
        assert all(f"{host} (not enough VCPU" in ended["verdict"] for host in cell.hosts)
        assert "no node has 1 VCPU free" in ended["now"]["explanation"]
    finally:
        for filler in fillers:
            cell.stores.ledger.put_allocations(filler, {}, 1, "other", "other")


def _fill_behind_the_agents_backs(stores: Stores, hosts: list[str]) -> list[str]:
    """Take every free VCPU of the agents' nodes in the ledger; their indexes still see room."""
    fillers = []
    for provider in stores.ledger.list_providers():
        free = provider.free("VCPU")
        if free > 0 and provider.name.rsplit("-", 1)[0] in hosts:
            filler = str(uuid.uuid4())
            stores.ledger.put_allocations(filler, {provider.uuid: {"VCPU": free}}, None, "o", "o")
            fillers.append(filler)
    return fillers
