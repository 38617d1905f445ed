"""Faults on real processes and servers: SIGKILL, broker restart, ledger restart.

Each fault happens at a known point (the agent is killed while it holds a
claim it has not spawned; the servers restart between two known requests), so
the tests are deterministic; ``make chaos`` does the same at random for minutes.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.compute.api import ComputeAPI
from qsched.conf import AgentOptions, APIOptions, LedgerOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State, Usage
from qsched.stack import free_port
from tests.cloud import AMQP_URL, BUS_REDIS_URL, Cloud, require_rabbitmq
from tests.conftest import IN_CI, real_redis
from tests.helpers import before_claim, wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(240)]

FAST_FAILOVER = {
    "scheduler": {"janitor_interval_s": 0.5, "reap_interval_s": 0.5},
    "bus": {"connect_timeout_s": 1, "confirm_timeout_s": 2},
}


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, timeout=120, capture_output=True)


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    require_rabbitmq()
    ledger = real_redis()
    ledger.flushdb()
    cloud = Cloud(tmp_path, AMQP_URL, options=FAST_FAILOVER, agents=1, timeout_s=60)
    yield cloud
    cloud.shutdown()
    ledger.flushdb()


def test_an_agent_killed_mid_build_loses_nothing(cloud: Cloud) -> None:
    cloud.start(agent_options={0: {"spawn_delay_s": 30}})
    token = "u1:p1"
    uuid_ = cloud.boot(token=token)[1]["server"]["id"]
    claimed = lambda: cloud.stores.instances.building(cloud.host(0)) == {uuid_}  # noqa: E731
    assert wait_until(claimed, 20), cloud.tail_logs()
    cloud.start_agent(1)
    cloud.wait_ready(timeout_s=30)
    cloud.kill_agent(0, signal.SIGKILL)  # claimed, acked, spawn in flight: only the ledger knows
    cloud.settle([uuid_], timeout_s=30)
    record = cloud.stores.instances.get(uuid_)
    assert (record.state, record.host) == (State.ACTIVE, cloud.host(1)), cloud.tail_logs()
    allocations = cloud.stores.ledger.get_allocations(uuid_).allocations
    assert len(allocations) == 1  # placed once
    events = [e.event for e in cloud.stores.instances.events(uuid_)]
    assert events.count("claimed") == 2 and events.count("requeued") == 1
    cloud.start_agent(0)  # back: nothing of its own left to reconcile
    cloud.wait_ready(timeout_s=30)
    report = audit(cloud.stores)
    assert report.ok, report.to_dict()
    assert cloud.stores.quota.get_usage("p1") == Usage(1, 1, 1024)


def test_a_broker_restart_fails_cleanly_and_recovers(cloud: Cloud) -> None:
    cloud.start()
    token = "u1:p2"
    before = cloud.boot(token=token)[1]["server"]["id"]
    cloud.settle([before])
    rabbitmqctl("stop_app")
    try:
        status, body = cloud.boot(token=token)
        assert status == 503, body
        assert cloud.stores.quota.get_usage("p2") == Usage(1, 1, 1024)  # nothing kept
    finally:
        rabbitmqctl("start_app")
        rabbitmqctl("await_startup")
    accepted: list[str] = []

    def boot_again() -> bool:
        status, body = cloud.boot(token=token)
        if status == 202:
            accepted.append(body["server"]["id"])
        return status == 202

    assert wait_until(boot_again, 60, interval_s=1), cloud.tail_logs()
    cloud.settle(accepted, timeout_s=60)
    assert cloud.state(accepted[0]) == State.ACTIVE, cloud.tail_logs()
    assert audit(cloud.stores).ok


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    """A private redis-server with persistence on, that a test may stop and start."""
    binary = shutil.which("redis-server")
    if binary is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    start_redis(binary, port, data)
    yield binary, data, port
    subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)


def start_redis(binary: str, port: int, data: Path) -> None:
    subprocess.run(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "yes",
         "--dir", str(data), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
         "--logfile", str(data / "redis.log")],
        check=True,
    )  # fmt: skip

    def ping() -> bool:
        pong = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True)
        return pong.stdout.strip() == b"PONG"

    assert wait_until(ping, 10, interval_s=0.1)


def test_a_ledger_restart_answers_503_then_recovers(own_redis, tmp_path: Path) -> None:
    require_rabbitmq()
    binary, data, port = own_redis
    cloud = Cloud(tmp_path, AMQP_URL, ledger_url=f"redis://127.0.0.1:{port}/0",
                  options=FAST_FAILOVER, timeout_s=60)  # fmt: skip
    try:
        cloud.start()
        before = cloud.boot()[1]["server"]["id"]
        cloud.settle([before])
        subprocess.run(["redis-cli", "-p", str(port), "shutdown"], check=True)  # AOF kept
        status, body = cloud.boot()
        assert status == 503, body
        start_redis(binary, port, data)
        assert cloud.state(before) == State.ACTIVE  # what was written survived
        accepted: list[str] = []

        def boot_again() -> bool:
            status, body = cloud.boot()
            if status == 202:
                accepted.append(body["server"]["id"])
            return status == 202

        assert wait_until(boot_again, 30, interval_s=0.5), cloud.tail_logs()
        cloud.settle(accepted, timeout_s=60)
        assert cloud.state(accepted[0]) == State.ACTIVE, cloud.tail_logs()
        report = audit(cloud.stores)
        assert report.ok, report.to_dict()
        assert cloud.stores.quota.get_usage("p1") == Usage(2, 2, 2048)
    finally:
        cloud.shutdown()


def test_a_sigterm_finishes_the_spawn_in_flight(cloud: Cloud) -> None:
    cloud.start(agent_options={0: {"spawn_delay_s": 3}})
    uuid_ = cloud.boot(token="u1:p3")[1]["server"]["id"]
    claimed = lambda: cloud.stores.instances.building(cloud.host(0)) == {uuid_}  # noqa: E731
    assert wait_until(claimed, 20), cloud.tail_logs()
    assert cloud.kill_agent(0, signal.SIGTERM) == 0
    assert cloud.state(uuid_) == State.ACTIVE  # finished before it exited
    assert not cloud.stores.agents.alive(cloud.host(0))  # said goodbye at once
    assert audit(cloud.stores).ok


def test_a_redis_transport_redelivery_places_and_spawns_once(conf, real_redis_url) -> None:
    """kombu's Redis transport hands a message held past visibility_timeout to another
    consumer while the first still holds it: the claim decides, one spawn happens."""
    real_redis(BUS_REDIS_URL)
    conf.set_override("url", real_redis_url, group="ledger")
    conf.set_override("class_poll_interval_s", 0.05, group="agent")
    stores = open_stores(LedgerOptions.from_conf(conf))
    bus = KombuBus(BUS_REDIS_URL, prefix=f"vis{uuid.uuid4().hex[:8]}",
                   options=KombuOptions(visibility_timeout_s=1.0))  # fmt: skip
    api = ComputeAPI(stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf))
    api.cell.flavors.create(Flavor("small", 1, 1024, 0))
    spawns: list[str] = []
    holding, release = threading.Event(), threading.Event()
    started: list[ComputeAgent] = []

    def agent(host: str) -> ComputeAgent:
        conf.set_override("host", host, group="agent")
        spec = FakeNodeSpec(vcpus=4, ram_mb=8192, disk_gb=0)
        driver = FakeDriver(1, spec, host=host, spawn_hook=lambda i, n: spawns.append(i))
        started.append(ComputeAgent(AgentOptions.from_conf(conf), stores, bus, driver))
        started[-1].start(ready_timeout_s=10)
        return started[-1]

    try:
        slow = agent("cn-slow")
        before_claim(slow, lambda msg: (holding.set(), release.wait(10)))
        time.sleep(0.3)  # it subscribes to the class within its poll interval
        inst = api.boot(RequestContext.for_project("u1", "p1"), "vm", "small").uuid
        assert holding.wait(10)
        agent("cn-fast")
        assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 15)
        release.set()
        assert wait_until(lambda: slow.counters["dropped"] == 1, 10)
        assert spawns == [inst] and stores.instances.get(inst).host == "cn-fast"
        assert audit(stores).ok
    finally:
        release.set()
        for running in started:
            running.stop(timeout_s=5)
        bus.close()
        client_ = redis.Redis.from_url(BUS_REDIS_URL)
        for key in client_.scan_iter(match=f"*{bus.names.prefix}*"):
            client_.delete(key)
