"""A real qsched cloud as separate processes, for end-to-end and fault tests.

The API runs under gunicorn, ``qsched-agent`` processes drive fake nodes, the
ledger is a real Redis and the bus RabbitMQ or kombu's Redis transport.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from http import client
from pathlib import Path
from typing import Any

import redis

from agents.service import wait_until
from qsched import conf as qconf
from qsched.bus.kombu import KombuBus
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import State
from tests.conftest import REDIS_URL, require_server

AMQP_URL = os.environ.get("QSCHED_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
BUS_REDIS_URL = os.environ.get("QSCHED_TEST_BUS_REDIS_URL", "redis://127.0.0.1:6379/6")
IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"
BUILD_TIMEOUT_S = 4


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

    def __init__(
        self, tmp: Path, transport_url: str, ledger_url: str = REDIS_URL, extra: str = "",
        agents: int = 2, timeout_s: float = BUILD_TIMEOUT_S,
    ) -> None:  # fmt: skip
        self.prefix = f"e2e{uuid.uuid4().hex[:8]}"
        self.transport_url = transport_url
        self.port = free_port()
        self.config = tmp / "qsched.conf"
        self.config.write_text(CONFIG.format(
            transport_url=transport_url, prefix=self.prefix, ledger_url=ledger_url,
            timeout=timeout_s,
        ) + extra)  # fmt: skip
        self.agent_count = agents
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agents: dict[int, subprocess.Popen[bytes]] = {}
        self.logs = tmp
        self.conf = qconf.load([], [str(self.config)])
        self.stores: Stores = open_stores(self.conf)

    def start(self, agent_extra: dict[int, str] | None = None) -> None:
        bindir = Path(sys.executable).parent
        gunicorn = [str(bindir / "gunicorn"), "-b", f"127.0.0.1:{self.port}", "-w", "2",
                    "--threads", "8", "-c", "deploy/gunicorn.conf.py",
                    "qsched.api.app:wsgi_app"]  # fmt: skip
        self._spawn("api", gunicorn)
        for i in range(self.agent_count):
            self.start_agent(i, (agent_extra or {}).get(i, ""), wait=False)
        ready = lambda: self.healthy() and len(self.alive_agents()) == self.agent_count  # noqa: E731
        assert wait_until(ready, timeout_s=30, interval_s=0.2), self.tail_logs()

    def host(self, i: int) -> str:
        return f"{self.prefix}-cn{i}"

    def start_agent(self, i: int, extra: str = "", wait: bool = True) -> None:
        bindir = Path(sys.executable).parent
        host_conf = self.logs / f"agent{i}.conf"
        host_conf.write_text(f"[agent]\nhost = {self.host(i)}\n{extra}")
        cmd = [str(bindir / "qsched-agent"), "--config-file", str(self.config),
               "--config-file", str(host_conf)]  # fmt: skip
        self.agents[i] = self._spawn(f"agent{i}", cmd)
        if wait:
            alive = lambda: self.host(i) in self.alive_agents()  # noqa: E731
            assert wait_until(alive, timeout_s=30, interval_s=0.2), self.tail_logs()

    def kill_agent(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.agents.pop(i)
        proc.send_signal(sig)
        proc.wait(timeout=30)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        env = dict(os.environ, QSCHED_CONFIG=str(self.config))
        root = Path(__file__).resolve().parent.parent
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
        self.procs.append(proc)
        return proc

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
        live = [proc for proc in self.procs if proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        for proc in live:
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
