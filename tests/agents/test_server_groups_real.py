"""Server groups and multi-create end to end: gunicorn, two ``qsched-agent`` processes
(two hosts of two fake nodes each), a real Redis, RabbitMQ or kombu's Redis transport;
every call through HTTP as a client makes it."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.recovery.reaper import NO_VALID_HOST
from tests.cloud import BUILD_TIMEOUT_S, IMAGE, Cloud, running_cloud
from tests.helpers import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", params=["rabbitmq", "redis"])
def cloud(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Cloud]:
    with running_cloud(
        tmp_path_factory.mktemp(f"groups-{request.param}"), request.param
    ) as started:
        yield started


def token(cloud: Cloud) -> str:
    project = f"p{uuid.uuid4().hex[:8]}"
    cloud.stores.quota.set_limits(project, instances=-1, cores=-1, ram_mb=-1)
    return f"u1:{project}"


def group(cloud: Cloud, who: str, policy: str) -> str:
    status, body = cloud.request(
        "POST", "/v2.1/os-server-groups", {"server_group": {"name": "g", "policies": [policy]}},
        who,
    )  # fmt: skip
    assert status == 200, body
    return str(body["server_group"]["id"])


def boot(cloud: Cloud, who: str, group_id: str | None = None, **server: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"server": {"name": "vm", "flavorRef": "small", "imageRef": IMAGE,
                                       **server}}  # fmt: skip
    if group_id:
        body["os:scheduler_hints"] = {"group": group_id}
    status, answer = cloud.request("POST", "/v2.1/servers", body, who)
    assert status == 202, answer
    return answer


def servers(cloud: Cloud, who: str, reservation_id: str) -> list[str]:
    status, body = cloud.request("GET", f"/v2.1/servers?reservation_id={reservation_id}",
                                 token=who)  # fmt: skip
    assert status == 200, body
    return [s["id"] for s in body["servers"]]


def hosts(cloud: Cloud, uuids: list[str]) -> Counter[str | None]:
    return Counter(cloud.stores.instances.get(u).host for u in uuids)


def delete(cloud: Cloud, who: str, uuids: list[str]) -> None:
    for u in uuids:
        cloud.request("DELETE", f"/v2.1/servers/{u}", token=who)
    gone = lambda: all(cloud.state(u) == State.DELETED for u in uuids)  # noqa: E731
    assert wait_until(gone, 20), cloud.tail_logs()


def test_anti_affinity_over_two_hosts(cloud: Cloud) -> None:
    who = token(cloud)
    gid = group(cloud, who, "anti-affinity")
    rid = boot(cloud, who, gid, min_count=3, max_count=3, return_reservation_id=True)
    uuids = servers(cloud, who, rid["reservation_id"])
    assert len(uuids) == 3
    cloud.settle(uuids, timeout_s=BUILD_TIMEOUT_S + 20)
    # two hosts for three members: the batch cannot be whole, so none is placed
    assert {cloud.state(u) for u in uuids} == {State.ERROR}
    two = servers(cloud, who, boot(cloud, who, gid, max_count=2,
                                   return_reservation_id=True)["reservation_id"])  # fmt: skip
    cloud.settle(two, timeout_s=BUILD_TIMEOUT_S + 20)
    assert {cloud.state(u) for u in two} == {State.ACTIVE}
    assert len(hosts(cloud, two)) == 2
    third = boot(cloud, who, gid)["server"]["id"]
    cloud.settle([third], timeout_s=BUILD_TIMEOUT_S + 20)
    _status, shown = cloud.request("GET", f"/v2.1/servers/{third}", token=who)
    assert shown["server"]["status"] == "ERROR"
    assert shown["server"]["fault"]["message"] == NO_VALID_HOST
    _status, listed = cloud.request("GET", f"/v2.1/os-server-groups/{gid}", token=who)
    assert sorted(listed["server_group"]["members"]) == sorted([*uuids, *two, third])
    assert audit(cloud.stores).ok
    delete(cloud, who, [*uuids, *two, third])
    _status, listed = cloud.request("GET", f"/v2.1/os-server-groups/{gid}", token=who)
    assert listed["server_group"]["members"] == []
    assert cloud.request("DELETE", f"/v2.1/os-server-groups/{gid}", token=who)[0] == 204


def test_affinity_keeps_a_group_on_one_host(cloud: Cloud) -> None:
    who = token(cloud)
    gid = group(cloud, who, "affinity")
    uuids = [boot(cloud, who, gid)["server"]["id"] for _ in range(4)]  # 2 nodes x 2 VCPUs
    cloud.settle(uuids, timeout_s=BUILD_TIMEOUT_S + 20)
    assert {cloud.state(u) for u in uuids} == {State.ACTIVE}
    assert len(hosts(cloud, uuids)) == 1
    fifth = boot(cloud, who, gid)["server"]["id"]  # its host is full: at once, no wait
    assert wait_until(lambda: cloud.state(fifth) == State.ERROR, BUILD_TIMEOUT_S - 1)
    delete(cloud, who, [*uuids, fifth])
