"""os-services over HTTP (falcon's TestClient), on fakeredis and a real Redis: Nova's
shapes at 2.1, 2.11 and 2.53, its errors, its policy."""

from __future__ import annotations

import datetime
import uuid

import pytest

from qsched.ledger import Stores
from tests.api.test_api import ADMIN, USER, app, at, bus, client, fault

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api


@pytest.fixture
def cell(stores: Stores) -> Stores:
    """cn0 (zone az1) heartbeating, cn1 registered and never heard of since."""
    stores.agents.register_service("cn0", "az1")
    stores.agents.register_service("cn1")
    stores.agents.heartbeat("cn0", ttl_s=60)
    return stores


def listed(client, version: str = "2.1", **query: str) -> list[dict]:
    result = client.simulate_get("/v2.1/os-services", params=query, headers=at(version, ADMIN))
    assert result.status_code == 200, result.text
    assert result.headers["OpenStack-API-Version"] == f"compute {version}"
    assert result.headers["X-OpenStack-Nova-API-Version"] == version
    return list(result.json["services"])


def test_list_at_2_1(client, cell) -> None:
    cn0, cn1 = listed(client)
    updated = cn0.pop("updated_at")
    assert cn0 == {"id": 1, "binary": "nova-compute", "host": "cn0", "zone": "az1",
                   "status": "enabled", "state": "up", "disabled_reason": None}  # fmt: skip
    assert datetime.datetime.strptime(updated, "%Y-%m-%dT%H:%M:%S.%f")
    assert (cn1["id"], cn1["state"], cn1["zone"], cn1["updated_at"]) == (2, "down", None, None)


def test_list_filters(client, cell) -> None:
    assert [s["host"] for s in listed(client, host="cn1")] == ["cn1"]
    assert len(listed(client, binary="nova-compute")) == 2
    assert listed(client, binary="nova-scheduler") == []
    result = client.simulate_get("/v2.1/os-services", params={"zone": "az1"}, headers=ADMIN)
    assert "('zone' was unexpected)" in fault(result, 400, "badRequest")


def test_list_at_2_11_and_2_53(client, cell) -> None:
    assert [s["forced_down"] for s in listed(client, "2.11")] == [False, False]
    ids = [s["id"] for s in listed(client, "2.53")]
    assert ids == [cell.agents.service("cn0").id, cell.agents.service("cn1").id]
    latest = client.simulate_get("/v2.1/os-services", headers=at("latest", ADMIN))
    assert latest.headers["OpenStack-API-Version"] == "compute 2.79"


def test_microversions_it_does_not_speak(client, cell) -> None:
    message = fault(client.simulate_get("/v2.1/os-services", headers=at("2.80", ADMIN)), 406,
                    "notAcceptable")  # fmt: skip
    assert (
        message == "Version 2.80 is not supported by the API. Minimum is 2.1 and maximum is 2.79."
    )
    bad = client.simulate_get("/v2.1/os-services", headers=at("2.x", ADMIN))
    assert "is of invalid format" in fault(bad, 400, "badRequest")
    legacy = {**ADMIN, "X-OpenStack-Nova-API-Version": "2.11"}
    assert "forced_down" in client.simulate_get("/v2.1/os-services", headers=legacy).json[
        "services"][0]  # fmt: skip


def test_only_admins(client, cell) -> None:
    message = fault(client.simulate_get("/v2.1/os-services", headers=USER), 403, "forbidden")
    assert message == "Policy doesn't allow os_compute_api:os-services:list to be performed."
    for path, body in (
        ("/v2.1/os-services/disable", {"host": "cn0", "binary": "nova-compute"}),
        ("/v2.1/os-services/no-such-action", {"host": "cn0", "binary": "x"}),
    ):
        result = client.simulate_put(path, json=body, headers=USER)
        assert "os_compute_api:os-services:update" in fault(result, 403, "forbidden")
    assert cell.agents.service("cn0").schedulable


def put(client, action: str, version: str = "2.1", **body):
    return client.simulate_put(f"/v2.1/os-services/{action}", json=body, headers=at(version, ADMIN))


def test_disable_with_a_reason_and_enable_before_2_53(client, cell) -> None:
    compute = {"host": "cn0", "binary": "nova-compute"}
    result = put(client, "disable", **compute)
    assert result.json == {"service": {**compute, "status": "disabled"}}
    assert cell.agents.service("cn0").disabled
    result = put(client, "disable-log-reason", **compute, disabled_reason="new disks")
    assert result.json == {"service": {**compute, "status": "disabled",
                                       "disabled_reason": "new disks"}}  # fmt: skip
    assert listed(client, host="cn0")[0]["disabled_reason"] == "new disks"
    assert "Missing disabled reason field" in fault(
        put(client, "disable-log-reason", **compute), 400, "badRequest")  # fmt: skip
    result = put(client, "enable", **compute)
    assert result.json == {"service": {**compute, "status": "enabled"}}
    service = cell.agents.service("cn0")
    assert (service.disabled, service.disabled_reason) == (False, None)


def test_force_down_needs_2_11(client, cell) -> None:
    compute = {"host": "cn0", "binary": "nova-compute"}
    assert fault(put(client, "force-down", **compute), 404, "itemNotFound") == "Unknown action"
    fault(put(client, "force-down", **compute, forced_down=True), 400, "badRequest")  # 2.1 body
    result = put(client, "force-down", "2.11", **compute, forced_down="true")
    assert result.json == {"service": {**compute, "forced_down": True}}
    assert listed(client, "2.11", host="cn0")[0]["state"] == "down"
    assert "Missing forced_down field" in fault(
        put(client, "force-down", "2.11", **compute), 400, "badRequest")  # fmt: skip
    put(client, "force-down", "2.11", **compute, forced_down=False)
    assert listed(client, "2.11", host="cn0")[0]["state"] == "up"


@pytest.mark.parametrize(
    "body, code, words",
    [({"host": "cn9", "binary": "nova-compute"}, 404, "Could not find binary nova-compute on "
      "host cn9."),
     ({"host": "cn0", "binary": "nova-scheduler"}, 400, "Updating a nova-scheduler service is "
      "not supported. Only nova-compute services can be updated."),
     ({"host": "cn0", "binary": "nova-compute", "zone": "az1"}, 400, "Additional properties"),
     ({"host": "cn 0", "binary": "nova-compute"}, 400, "field/attribute host")],
)  # fmt: skip
def test_bad_updates_before_2_53(client, cell, body, code, words) -> None:
    name = {400: "badRequest", 404: "itemNotFound"}[code]
    assert words in fault(put(client, "disable", **body), code, name)
    assert cell.agents.service("cn0").schedulable


def test_update_by_id_at_2_53(client, cell) -> None:
    service_id = cell.agents.service("cn1").id
    result = put(client, service_id, "2.53", status="disabled", disabled_reason="rack move")
    assert result.headers["OpenStack-API-Version"] == "compute 2.53"
    shown = result.json["service"]
    assert (shown["id"], shown["host"], shown["status"], shown["disabled_reason"]) == (
        service_id, "cn1", "disabled", "rack move",
    )  # fmt: skip
    assert (shown["forced_down"], shown["state"]) == (False, "down")
    shown = put(client, service_id, "2.53", forced_down="yes").json["service"]
    assert (shown["status"], shown["disabled_reason"], shown["forced_down"]) == (
        "disabled", "rack move", True,
    )  # fmt: skip
    shown = put(client, service_id, "2.53", status="enabled", forced_down=False).json["service"]
    assert (shown["status"], shown["disabled_reason"], shown["forced_down"]) == (
        "enabled", None, False,
    )  # fmt: skip
    assert cell.agents.service("cn1").schedulable


@pytest.mark.parametrize(
    "target, body, code, words",
    [("cn1", {"status": "enabled", "disabled_reason": "x"}, 400,
      "Specifying 'disabled_reason' with status 'enabled' is invalid."),
     ("cn1", {}, 400, "No updates were requested."),
     ("cn1", {"disabled_reason": "x"}, 400, "with status 'enabled' is invalid"),
     ("cn1", {"status": "off"}, 400, "field/attribute status"),
     ("unknown", {"status": "disabled"}, 404, "could not be found."),
     ("disable", {"status": "disabled"}, 400, "is not a UUID")],
)  # fmt: skip
def test_bad_updates_at_2_53(client, cell, target, body, code, words) -> None:
    service_id = {"cn1": cell.agents.service("cn1").id, "unknown": str(uuid.uuid4())}.get(
        target, target
    )
    name = {400: "badRequest", 404: "itemNotFound"}[code]
    assert words in fault(put(client, service_id, "2.53", **body), code, name)
    assert cell.agents.service("cn1").schedulable
