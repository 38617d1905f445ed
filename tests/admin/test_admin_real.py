"""qsched-admin on real servers: RabbitMQ, Redis, and two live ``qsched-agent`` processes.

The test process boots through :class:`~qsched.compute.api.ComputeAPI` (what the API
service does on POST) and runs qsched-admin with the same config file the
agents read. Database 9 of Redis is flushed before and after; the bus uses a
prefix of its own, and its queues and exchanges are deleted at the end.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from qsched.admin import schemas
from qsched.admin.cli import cli
from qsched.bus.kombu import KombuBus
from qsched.compute.api import ComputeAPI
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.recovery.reaper import reap_expired
from tests.cloud import Cloud, transport_url
from tests.conftest import real_redis
from tests.helpers import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(90)]

USER = RequestContext.for_project("u1", "p1")
BUILD_TIMEOUT_S = 60

# No periodic reconcile within a test: the allocations a test takes behind the agents'
# backs (_fill_behind_the_agents_backs) are leaks to it, which a pass would release (on a
# loaded machine a test outlasted the default 5 to 15 s between passes).
FAST_AGENTS = {
    "agent": {"heartbeat_interval_s": 0.3, "class_poll_interval_s": 0.1, "reap_interval_s": 0.3,
              "reconcile_interval_s": 3600}
}  # fmt: skip


class Cell:
    """Two agent processes on RabbitMQ and Redis, and qsched-admin pointed at them."""

    def __init__(self, tmp: Path, transport_url: str) -> None:
        self.cloud = Cloud(tmp, transport_url, options=FAST_AGENTS, timeout_s=BUILD_TIMEOUT_S)
        self.config = self.cloud.config
        self.prefix = self.cloud.prefix
        self.hosts = [self.cloud.host(i) for i in range(self.cloud.agent_count)]
        self.stores: Stores = self.cloud.stores
        options = self.cloud.options
        self.bus = KombuBus.from_options(options.bus)
        self.api = ComputeAPI(self.stores, self.bus, options.scheduler, options.api)
        self.runner = CliRunner()

    def start(self) -> None:
        self.api.seed_flavors()
        self.stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        self.cloud.start(api=False)

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
        return self.cloud.tail_logs()

    def stop(self) -> None:
        self.cloud.shutdown()
        self.bus.close()


@pytest.fixture(scope="module", params=["rabbitmq", "redis"])
def cell(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cell]:
    ledger = real_redis()
    transport = transport_url(request.param)
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
    consumers = 2 if cell.bus.wire.amqp else None  # kombu's Redis transport does not count them
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
    cell.bus.wire.publish(cell.bus.wire.boot_entity("small"), b"\x93garbage")
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
    if cell.bus.wire.amqp:  # a passive declare tells a missing queue; elsewhere it is just empty
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
