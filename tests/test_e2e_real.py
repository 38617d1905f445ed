"""End to end on real servers, as separate processes.

The API runs under gunicorn, two ``qsched-agent`` processes drive two fake nodes
each, the ledger is a real Redis and the bus RabbitMQ (quorum queues), kombu's
Redis transport, or RabbitMQ through the oslo.messaging bus (``[bus] driver``).
Requests go through HTTP like any client's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from qsched.bus.kombu import KombuBus
from qsched.ledger.audit import audit
from qsched.ledger.base import State, Usage
from qsched.recovery.reaper import NO_VALID_HOST
from tests.cloud import BUILD_TIMEOUT_S, Cloud, running_cloud
from tests.helpers import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(180)]

CAPACITY = 8  # 2 agents x 2 nodes x 2 VCPUs, allocation ratio 1.0, flavor "small" = 1 VCPU


@pytest.fixture(scope="module", params=["rabbitmq", "redis", "oslo"])
def cloud(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Cloud]:
    with running_cloud(tmp_path_factory.mktemp(request.param), request.param) as started:
        yield started


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


def test_boots_through_a_rabbit_transport_url_whose_first_host_is_down(tmp_path) -> None:
    """oslo.messaging's ``rabbit://``, two hosts listed, the first one down: the API's
    workers and both agents fail over to the second, and every boot goes ACTIVE."""
    with running_cloud(tmp_path, "rabbit-failover") as failover:
        assert failover.transport_url.startswith("rabbit://") and "," in failover.transport_url
        token = project(failover)
        uuids = []
        for _ in range(CAPACITY):
            status, body = failover.boot(token=token)
            assert status == 202, body
            uuids.append(body["server"]["id"])
        failover.settle(uuids)
        assert {failover.state(u) for u in uuids} == {State.ACTIVE}, failover.tail_logs()
        logs = {path.stem: path.read_text() for path in failover.logs.glob("*.log")}
        assert sorted(logs) == ["agent0", "agent1", "api"]
        down = failover.transport_url.split(",")[0].rsplit(":", 1)[1]
        for name, text in logs.items():
            assert f":{down}// is unreachable" in text, f"{name} did not fail over"


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
    if cloud.options.bus.driver != "kombu":
        pytest.skip("garbage is published with kombu's names; the oslo.messaging bus's is "
                    "the chaos run's poison fault (tests/chaos/test_chaos.py)")  # fmt: skip
    token = project(cloud)
    bus = KombuBus(cloud.transport_url, prefix=cloud.prefix)
    try:
        bus.wire.publish(bus.wire.boot_entity("small"), b"\x93garbage")
        uuid_ = cloud.boot(token=token)[1]["server"]["id"]
        cloud.settle([uuid_])
        assert cloud.state(uuid_) == State.ACTIVE
        dead: list[Any] = []
        assert wait_until(lambda: dead.extend(bus.take_dead_letters()) or dead, 10)
        assert [d.body for d in dead] == [b"\x93garbage"] and dead[0].reason
    finally:
        bus.close()
    cloud.request("DELETE", f"/v2.1/servers/{uuid_}", token=token)
