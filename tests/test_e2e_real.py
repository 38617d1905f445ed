"""End to end on real servers, as separate processes.

The API runs under gunicorn, two ``qsched-agent`` processes drive two fake nodes
each, the ledger is a real Redis and the bus RabbitMQ (quorum queues) or kombu's
Redis transport. Requests go through HTTP like any client's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http import client
from pathlib import Path
from typing import Any

import pytest
import redis

from agents.service import wait_until
from qsched import conf as qconf
from qsched.bus.kombu import KombuBus
from qsched.ledger import Stores, open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State, Usage
from qsched.reaper import NO_VALID_HOST
from tests.conftest import REDIS_URL, real_redis, require_server

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(180)]

AMQP_URL = os.environ.get("QSCHED_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
BUS_REDIS_URL = os.environ.get("QSCHED_TEST_BUS_REDIS_URL", "redis://127.0.0.1:6379/6")
IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"
BUILD_TIMEOUT_S = 4
CAPACITY = 8  # 2 agents x 2 nodes x 2 VCPUs, allocation ratio 1.0, flavor "small" = 1 VCPU


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_rabbitmq() -> None:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError as exc:
        require_server("RabbitMQ", AMQP_URL, exc, "start it with: rabbitmq-server -detached")


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
heartbeat_interval_s = 0.5
heartbeat_ttl_s = 3
class_poll_interval_s = 0.2
reap_interval_s = 0.5
"""


class Cloud:
    """The processes of one stack, and a client for its API."""

    def __init__(self, tmp: Path, transport_url: str) -> None:
        self.prefix = f"e2e{uuid.uuid4().hex[:8]}"
        self.transport_url = transport_url
        self.port = free_port()
        self.config = tmp / "qsched.conf"
        self.config.write_text(CONFIG.format(
            transport_url=transport_url, prefix=self.prefix, ledger_url=REDIS_URL,
            timeout=BUILD_TIMEOUT_S,
        ))  # fmt: skip
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = tmp
        self.conf = qconf.load([], [str(self.config)])
        self.stores: Stores = open_stores(self.conf)

    def start(self) -> None:
        bindir = Path(sys.executable).parent
        env = dict(os.environ, QSCHED_CONFIG=str(self.config))
        gunicorn = [str(bindir / "gunicorn"), "-b", f"127.0.0.1:{self.port}", "-w", "2",
                    "--threads", "8", "qsched.api.app:wsgi_app"]  # fmt: skip
        self._spawn("api", gunicorn, env)
        for i in range(2):
            host_conf = self.logs / f"agent{i}.conf"
            host_conf.write_text(f"[agent]\nhost = {self.prefix}-cn{i}\n")
            cmd = [str(bindir / "qsched-agent"), "--config-file", str(self.config),
                   "--config-file", str(host_conf)]  # fmt: skip
            self._spawn(f"agent{i}", cmd, env)
        ready = lambda: self.healthy() and len(self.alive_agents()) == 2  # noqa: E731
        assert wait_until(ready, timeout_s=30, interval_s=0.2), self.tail_logs()

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))

    def alive_agents(self) -> list[str]:
        return [a.host for a in self.stores.agents.list() if a.alive]

    def healthy(self) -> bool:
        try:
            return self.request("GET", "/healthcheck", token=None)[0] == 200
        except OSError:
            return False

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = "u1:p1"
    ) -> tuple[int, dict[str, Any]]:
        conn = client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["X-Auth-Token"] = token
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None, headers)
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw.strip().startswith(b"{") else {}
        finally:
            conn.close()

    def boot(self, flavor: str = "small", token: str = "u1:p1") -> tuple[int, dict[str, Any]]:
        server = {"name": "vm", "flavorRef": flavor, "imageRef": IMAGE}
        return self.request("POST", "/v2.1/servers", {"server": server}, token)

    def state(self, uuid_: str) -> State:
        return self.stores.instances.get(uuid_).state

    def settle(self, uuids: list[str], timeout_s: float = 30) -> None:
        done = lambda: all(self.state(u) != State.BUILD for u in uuids)  # noqa: E731
        assert wait_until(done, timeout_s, interval_s=0.1), self.tail_logs()

    def tail_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.logs.glob("*.log"))

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._forget_queues()

    def _forget_queues(self) -> None:
        bus = KombuBus(self.transport_url, prefix=self.prefix)
        names = [bus.names.dead_queue, *(bus.names.boot_queue(c) for c in ("small", "huge")),
                 *(bus.names.host_queue(f"{self.prefix}-cn{i}") for i in range(2))]  # fmt: skip
        connection = bus.connect()
        try:
            channel = connection.channel()
            for name in names:
                if bus.amqp:
                    channel.queue_delete(name)
                else:
                    channel.queue_purge(name)
            if bus.amqp:
                channel.exchange_delete(bus.names.exchange)
                channel.exchange_delete(bus.names.dead_exchange)
        finally:
            connection.release()
            bus.close()
        if not bus.amqp:
            client_ = redis.Redis.from_url(BUS_REDIS_URL)
            for key in client_.scan_iter(match=f"*{self.prefix}*"):
                client_.delete(key)


@pytest.fixture(scope="module", params=["rabbitmq", "redis"])
def cloud(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Cloud]:
    if shutil.which("gunicorn", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("gunicorn is missing from the virtual environment: run make install")
    ledger = real_redis()
    if request.param == "rabbitmq":
        require_rabbitmq()
        transport = AMQP_URL
    else:
        real_redis(BUS_REDIS_URL)
        transport = BUS_REDIS_URL
    ledger.flushdb()
    cloud = Cloud(tmp_path_factory.mktemp(request.param), transport)
    cloud.start()
    yield cloud
    cloud.stop()
    ledger.flushdb()


def project(cloud: Cloud, **limits: int) -> str:
    name = f"p{uuid.uuid4().hex[:8]}"
    cloud.stores.quota.set_limits(name, **limits)
    return f"u1:{name}"


def test_boots_reach_active(cloud: Cloud) -> None:
    token = project(cloud)
    uuids = []
    for _ in range(4):
        status, body = cloud.boot(token=token)
        assert status == 202, body
        uuids.append(body["server"]["id"])
    cloud.settle(uuids)
    assert {cloud.state(u) for u in uuids} == {State.ACTIVE}
    for u in uuids:
        assert cloud.request("DELETE", f"/v2.1/servers/{u}", token=token)[0] == 204
    assert wait_until(lambda: cloud.stores.quota.get_usage(token[3:]) == Usage(0, 0, 0), 15)
    assert audit(cloud.stores).ok


def test_a_flavor_no_host_fits_ends_in_no_valid_host(cloud: Cloud) -> None:
    token = project(cloud, cores=-1)
    status, body = cloud.boot("huge", token=token)
    assert status == 202
    uuid_ = body["server"]["id"]
    cloud.settle([uuid_], timeout_s=BUILD_TIMEOUT_S + 15)
    status, shown = cloud.request("GET", f"/v2.1/servers/{uuid_}", token=token)
    assert shown["server"]["status"] == "ERROR"
    assert shown["server"]["fault"]["message"] == NO_VALID_HOST
    assert "details" not in shown["server"]["fault"]  # topology stays with the admins
    assert cloud.stores.quota.get_usage(token[3:]) == Usage(0, 0, 0)


def test_quota_exhaustion_is_403_and_creates_nothing(cloud: Cloud) -> None:
    token = project(cloud, instances=2)
    for _ in range(2):
        assert cloud.boot(token=token)[0] == 202
    status, body = cloud.boot(token=token)
    assert status == 403
    assert body["forbidden"]["message"].startswith("Quota exceeded for instances: Requested 1")
    assert len(cloud.stores.instances.list_project(token[3:])) == 2


def test_delete_before_and_after_placement(cloud: Cloud) -> None:
    token = project(cloud, cores=-1)
    waiting = cloud.boot("huge", token=token)[1]["server"]["id"]
    placed = cloud.boot("small", token=token)[1]["server"]["id"]
    cloud.settle([placed])
    assert cloud.request("DELETE", f"/v2.1/servers/{waiting}", token=token)[0] == 204
    assert cloud.state(waiting) == State.DELETED
    assert cloud.request("DELETE", f"/v2.1/servers/{placed}", token=token)[0] == 204
    assert wait_until(lambda: cloud.state(placed) == State.DELETED, 15), cloud.tail_logs()
    assert cloud.stores.ledger.get_allocations(placed).generation is None
    assert cloud.stores.quota.get_usage(token[3:]) == Usage(0, 0, 0)
    assert cloud.request("GET", f"/v2.1/servers/{placed}", token=token)[0] == 404


def test_a_burst_never_exceeds_quota_or_capacity(cloud: Cloud) -> None:
    token = project(cloud, instances=12, cores=-1, ram_mb=-1)
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: cloud.boot(token=token), range(30)))
    accepted = [body["server"]["id"] for status, body in results if status == 202]
    assert len(accepted) == 12
    assert sorted({status for status, _ in results}) == [202, 403]
    cloud.settle(accepted, timeout_s=BUILD_TIMEOUT_S + 20)
    active = [u for u in accepted if cloud.state(u) == State.ACTIVE]
    assert 0 < len(active) <= CAPACITY
    report = audit(cloud.stores)
    assert report.ok and not report.overcommitted, report.to_dict()
    for u in accepted:
        cloud.request("DELETE", f"/v2.1/servers/{u}", token=token)


def test_garbage_is_dead_lettered_and_placing_goes_on(cloud: Cloud) -> None:
    token = project(cloud)
    bus = KombuBus(cloud.transport_url, prefix=cloud.prefix)
    try:
        bus.publish(bus.boot_entity("small"), b"\x93garbage")
        uuid_ = cloud.boot(token=token)[1]["server"]["id"]
        cloud.settle([uuid_])
        assert cloud.state(uuid_) == State.ACTIVE
        dead: list[Any] = []
        assert wait_until(lambda: dead.extend(bus.take_dead_letters()) or dead, 10)
        assert [d.body for d in dead] == [b"\x93garbage"] and dead[0].reason
    finally:
        bus.close()
    cloud.request("DELETE", f"/v2.1/servers/{uuid_}", token=token)
