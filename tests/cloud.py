"""A real qsched cloud as separate processes, for end-to-end and fault tests.

A :class:`~qsched.stack.ProcessStack`: the API under gunicorn with the
deployment's settings file, ``qsched-agent`` processes driving two fake nodes
each, the ledger a real Redis (its database is the fixtures' to flush) and the
bus RabbitMQ or kombu's Redis transport.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest

from qsched.ledger.base import State
from qsched.net import free_port
from qsched.stack import CellConfig, GunicornConfig, Options, ProcessStack, merged, new_prefix
from tests.conftest import (
    BUS_REDIS_URL,
    REDIS_URL,
    TEST_DURABILITY,
    real_redis,
    require_server,
)
from tests.helpers import ROOT, wait_until

AMQP_URL = os.environ.get("QSCHED_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"
BUILD_TIMEOUT_S = 4
DEPLOY_GUNICORN = ROOT / "deploy" / "gunicorn.conf.py"

OPTIONS: Options = {
    "ledger": {"cpu_allocation_ratio": 1.0, "durability": TEST_DURABILITY},
    "api": {"flavor": ["small:1:1024:0", "huge:64:1024:0"]},
    "agent": {"node_count": 2, "node_vcpus": 2, "node_ram_mb": 8192, "node_disk_gb": 0,
              "heartbeat_interval_s": 0.5, "heartbeat_ttl_s": 3, "class_poll_interval_s": 0.2,
              "reap_interval_s": 0.5},
}  # fmt: skip


def require_rabbitmq() -> None:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError as exc:
        require_server("RabbitMQ", AMQP_URL, exc, "start it with: rabbitmq-server -detached")


def rabbit_failover_url(amqp_url: str = AMQP_URL) -> str:
    """oslo.messaging's ``rabbit://`` listing two hosts: a closed port first, then ``amqp_url``."""
    parts = urlsplit(amqp_url)
    user = f"{parts.username}:{parts.password}@"
    vhost = quote(unquote(parts.path[1:]) or "/", safe="")
    down, up = f"{parts.hostname}:{free_port()}", f"{parts.hostname}:{parts.port or 5672}"
    return f"rabbit://{user}{down},{user}{up}/{vhost}"


#: The ``[bus]`` options of a fixture param other than the kombu bus's defaults.
BUS_OPTIONS: dict[str, Options] = {"oslo": {"bus": {"driver": "oslo.messaging"}}}


def transport_url(server: str) -> str:
    """The bus URL for a fixture's ``rabbitmq``, ``rabbit-failover`` (:func:`rabbit_failover_url`),
    ``oslo`` (RabbitMQ, through the oslo.messaging bus: :data:`BUS_OPTIONS`) or ``redis``
    param, once the server answers."""
    if server in ("rabbitmq", "rabbit-failover", "oslo"):
        require_rabbitmq()
        return rabbit_failover_url() if server == "rabbit-failover" else AMQP_URL
    real_redis(BUS_REDIS_URL)
    return BUS_REDIS_URL


class Cloud(ProcessStack):
    """The processes of one stack, and a client for its API."""

    def __init__(
        self, tmp: Path, transport_url: str, ledger_url: str = REDIS_URL,
        options: Options | None = None, agents: int = 2, timeout_s: float = BUILD_TIMEOUT_S,
    ) -> None:  # fmt: skip
        timeout = {"scheduler": {"build_timeout_s": timeout_s}}
        config = CellConfig(transport_url, ledger_url, new_prefix("e2e"),
                            options=merged(OPTIONS, timeout, options))  # fmt: skip
        super().__init__(tmp, config, GunicornConfig(workers=2, threads=8, base=DEPLOY_GUNICORN))
        self.agent_count = agents

    def start(
        self, agent_options: dict[int, dict[str, Any]] | None = None, api: bool = True
    ) -> None:
        if api:
            self.start_api()
        for i in range(self.agent_count):
            self.start_agent(i, (agent_options or {}).get(i))
        self.wait_ready(timeout_s=30)

    def boot(self, flavor: str = "small", token: str = "u1:p1") -> tuple[int, dict[str, Any]]:
        server = {"name": "vm", "flavorRef": flavor, "imageRef": IMAGE}
        return self.request("POST", "/v2.1/servers", {"server": server}, token)

    def state(self, uuid_: str) -> State:
        return self.stores.instances.get(uuid_).state

    def settle(self, uuids: list[str], timeout_s: float = 30) -> None:
        done = lambda: all(self.state(u) != State.BUILD for u in uuids)  # noqa: E731
        assert wait_until(done, timeout_s, interval_s=0.1), self.tail_logs()

    def shutdown(self) -> None:
        """Stop the processes and delete the stack's queues (the fixtures flush the ledger)."""
        self.stop()
        failed = self.forget()
        self.close()
        assert not failed, failed


@contextlib.contextmanager
def running_cloud(directory: Path, server: str) -> Iterator[Cloud]:
    """A started :class:`Cloud` on the bus a param of :func:`transport_url` names, its ledger's
    database flushed before and after."""
    if shutil.which("gunicorn", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("gunicorn is missing from the virtual environment: run make install")
    ledger = real_redis()
    transport = transport_url(server)
    ledger.flushdb()
    cloud = Cloud(directory, transport, options=BUS_OPTIONS.get(server))
    cloud.start()
    try:
        yield cloud
    finally:
        cloud.shutdown()
        ledger.flushdb()
