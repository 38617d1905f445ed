"""Microversions as Nova reads them, the version documents, the legacy /v2 API and
URLs that carry a project id."""

from __future__ import annotations

import re

import falcon.testing
import pytest

from qsched.api import microversion, query, routes
from tests.api.test_api import ADMIN, USER, app, bus, client, fault
from tests.compute.test_compute import RecordingBus, make_app

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api


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


def routed_templates(app) -> list[str]:
    """The URI templates falcon's compiled router answers under /v2.1 (its own tree, not
    the app's table)."""
    found, nodes = [], list(app._router._roots)
    while nodes:
        node = nodes.pop()
        if node.resource is not None and node.uri_template.startswith("/v2.1/"):
            found.append(node.uri_template)
        nodes.extend(node.children)
    return sorted(found)


def test_collections_are_the_first_segments_under_v2_1() -> None:
    templates = ["/", "/v2.1", "/healthcheck", "/v2.1/servers/{server_id}", "/v2.1/limits"]
    assert routes.collections(templates) == {"servers", "limits"}


def test_every_route_answers_the_same_after_a_project_id(conf, stores) -> None:
    client = falcon.testing.TestClient(make_app(conf, stores, RecordingBus()))
    templates = routed_templates(client.app)
    firsts = {t.split("/")[2] for t in templates}
    assert {"servers", "os-keypairs", "os-hypervisors", "os-quota-class-sets"} <= firsts
    for template in templates:
        path = re.sub(r"\{project_id\}", "pa", re.sub(r"\{(?!project_id)[^}]+\}", "x", template))
        plain = client.simulate_get(path, headers=USER)
        scoped = client.simulate_get(path.replace("/v2.1/", "/v2.1/pa/", 1), headers=USER)
        assert (scoped.status_code, scoped.json) == (plain.status_code, plain.json), template
        # a route the router did not find would be the same 404 both ways: none is
        assert plain.json != NOT_FOUND, template


NOT_FOUND = {"itemNotFound": {"code": 404, "message": "The resource could not be found."}}


# -- query parameters a route does not read (qsched.api.query) --

#: the routes that ignore unknown query parameters before 2.75 and refuse them from 2.75
STRICT_FROM_2_75 = [
    ("/v2.1/servers", USER), ("/v2.1/servers/detail", USER), ("/v2.1/flavors", USER),
    ("/v2.1/flavors/detail", USER), ("/v2.1/os-keypairs", USER), ("/v2.1/os-keypairs/k", USER),
    ("/v2.1/limits", USER), ("/v2.1/os-quota-sets/pa", USER),
    ("/v2.1/os-quota-sets/pa/detail", USER),
]  # fmt: skip
#: the operators' views, which refuse them at every microversion
STRICT_ALWAYS = [
    ("/v2.1/os-hypervisors", ADMIN), ("/v2.1/os-hypervisors/statistics", ADMIN),
    ("/v2.1/os-availability-zone", USER), ("/v2.1/os-services", ADMIN),
]  # fmt: skip


def at(version: str, who: dict[str, str]) -> dict[str, str]:
    return {**who, "OpenStack-API-Version": f"compute {version}"}


@pytest.mark.parametrize(("path", "who"), STRICT_FROM_2_75)
def test_unknown_query_parameters_are_ignored_then_refused_from_2_75(client, path, who) -> None:
    ignored = client.simulate_get(path, query_string="zz=1&aa=2", headers=at("2.74", who))
    plain = client.simulate_get(path, headers=at("2.74", who))
    assert (ignored.status_code, ignored.json) == (plain.status_code, plain.json)
    refused = client.simulate_get(path, query_string="zz=1&aa=2", headers=at("2.75", who))
    assert fault(refused, 400, "badRequest") == (
        "Additional properties are not allowed ('aa', 'zz' were unexpected)"
    )


@pytest.mark.parametrize(("path", "who"), STRICT_ALWAYS)
@pytest.mark.parametrize("version", ["2.1", "2.79"])
def test_the_operators_views_refuse_unknown_query_parameters(client, path, who, version) -> None:
    result = client.simulate_get(path, query_string="x=1", headers=at(version, who))
    assert fault(result, 400, "badRequest") == (
        "Additional properties are not allowed ('x' was unexpected)"
    )


def test_a_server_list_leaves_underscored_parameters_to_the_list(client) -> None:
    # Nova's internal filters: dropped for a member, refused to those who filter by anything
    member = client.simulate_get("/v2.1/servers", query_string="_x=1", headers=at("2.75", USER))
    assert member.status_code == 200
    admin = client.simulate_get("/v2.1/servers", query_string="_x=1", headers=at("2.75", ADMIN))
    assert fault(admin, 400, "badRequest") == "Invalid filter field: _x."


def test_an_unknown_name_with_a_surrogate_is_shown_escaped() -> None:
    assert query.unknown_message(["a\udcff"]) == (
        "Additional properties are not allowed ('a\\udcff' was unexpected)"
    )
