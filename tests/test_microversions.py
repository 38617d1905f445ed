"""Microversions as Nova reads them, the version documents, the legacy /v2 API and
URLs that carry a project id."""

from __future__ import annotations

import pytest

from qsched.api import app as api_app
from qsched.api import microversion
from tests.test_api import USER, app, bus, client, fault
from tests.test_compute import RecordingBus, make_app

__all__ = ["app", "bus", "client"]  # fixtures, see tests.test_api


def version_of(result) -> str:
    return result.headers["OpenStack-API-Version"]


@pytest.mark.parametrize(
    ("headers", "answered"),
    [
        ({}, "compute 2.1"),
        ({"OpenStack-API-Version": "compute 2.37"}, "compute 2.37"),
        ({"OpenStack-API-Version": "compute 2.37, volume 3.0"}, "compute 2.37"),
        ({"OpenStack-API-Version": "volume 3.0, compute 2.47"}, "compute 2.47"),
        ({"OpenStack-API-Version": "volume 3.0"}, "compute 2.1"),  # names no compute version
        ({"OpenStack-API-Version": "compute latest"}, "compute 2.79"),
        ({"OpenStack-API-Version": "COMPUTE LATEST"}, "compute 2.79"),
        ({"X-OpenStack-Nova-API-Version": "2.11"}, "compute 2.11"),
        ({"X-OpenStack-Nova-API-Version": "latest"}, "compute 2.79"),
        # the standard header wins over the legacy one
        ({"OpenStack-API-Version": "compute 2.3", "X-OpenStack-Nova-API-Version": "2.9"},
         "compute 2.3"),
    ],
)  # fmt: skip
def test_the_version_asked_for_is_the_version_answered(client, headers, answered) -> None:
    result = client.simulate_get("/v2.1/flavors", headers={**USER, **headers})
    assert result.status_code == 200, result.text
    assert version_of(result) == answered
    assert result.headers["X-OpenStack-Nova-API-Version"] == answered.split()[1]
    assert "OpenStack-API-Version" in result.headers["Vary"]


@pytest.mark.parametrize("asked", ["2.0", "1.1", "2.80", "3.0", "2.104"])
def test_versions_outside_the_range_are_not_acceptable(client, asked) -> None:
    result = client.simulate_get(
        "/v2.1/servers", headers={**USER, "OpenStack-API-Version": f"compute {asked}"}
    )
    message = fault(result, 406, "notAcceptable")
    assert message == (
        f"Version {asked} is not supported by the API. Minimum is 2.1 and maximum is 2.79."
    )


@pytest.mark.parametrize("asked", ["2.x", "2", "2.01", "v2.1", "2.1.1", "-2.1"])
def test_malformed_versions_are_bad_requests(client, asked) -> None:
    result = client.simulate_get(
        "/v2.1/servers", headers={**USER, "X-OpenStack-Nova-API-Version": asked}
    )
    assert "is of invalid format" in fault(result, 400, "badRequest")


def test_every_route_speaks_every_version(client) -> None:
    for path in ("/v2.1/servers", "/v2.1/flavors", "/v2.1/os-server-groups"):
        result = client.simulate_get(
            path, headers={**USER, "OpenStack-API-Version": "compute 2.79"}
        )
        assert result.status_code == 200 and version_of(result) == "compute 2.79", path


def test_version_documents_as_nova_writes_them(client) -> None:
    listed = client.simulate_get("/").json["versions"]
    assert [(v["id"], v["status"], v["version"], v["min_version"]) for v in listed] == [
        ("v2.0", "DEPRECATED", "", ""),
        ("v2.1", "CURRENT", "2.79", "2.1"),
    ]
    assert listed[1]["links"] == [{"rel": "self", "href": "http://falconframework.org/v2.1/"}]
    current = client.simulate_get("/v2.1").json["version"]
    assert current["id"] == "v2.1" and current["version"] == microversion.text(microversion.MAX)
    assert [link["rel"] for link in current["links"]] == ["self", "describedby"]
    assert current["media-types"][0]["type"] == "application/vnd.openstack.compute+json;version=2.1"
    legacy = client.simulate_get("/v2/").json["version"]
    assert (legacy["id"], legacy["status"], legacy["version"]) == ("v2.0", "DEPRECATED", "")
    assert legacy["links"][0]["href"] == "http://falconframework.org/v2/"


def test_the_legacy_v2_api_is_2_1_without_version_headers(client) -> None:
    result = client.simulate_get(
        "/v2/flavors", headers={**USER, "OpenStack-API-Version": "compute 2.79"}
    )
    assert result.status_code == 200
    assert "OpenStack-API-Version" not in result.headers
    assert result.json == client.simulate_get("/v2.1/flavors", headers=USER).json


def test_a_project_id_in_the_url_must_be_the_callers(client) -> None:
    mine = client.simulate_get("/v2.1/pa/flavors", headers=USER)
    assert mine.status_code == 200
    assert mine.json == client.simulate_get("/v2.1/flavors", headers=USER).json
    other = client.simulate_get("/v2.1/pb/servers/detail", headers=USER)
    assert fault(other, 400, "badRequest") == (
        "Malformed request URL: URL's project_id 'pb' doesn't match Context's project_id 'pa'"
    )
    assert client.simulate_get("/v2/pa/servers", headers=USER).status_code == 200


def test_every_routed_collection_may_follow_a_project_id(conf, stores) -> None:
    app = make_app(conf, stores, RecordingBus())
    firsts = set()
    for route in app._router._roots:  # falcon's compiled router: the first path segments
        if route.raw_segment == "v2.1":
            firsts.update(child.raw_segment for child in route.children)
    assert firsts and firsts <= api_app.COLLECTIONS
