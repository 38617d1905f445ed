"""/v2.1/os-aggregates as Nova serves it: shapes, status codes, words, policy."""

from __future__ import annotations

import json
import uuid

import pytest

from qsched.ledger import Stores
from tests.api.test_api import app, at, bus, client

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

ADMIN = {"X-Auth-Token": "admin"}
MEMBER = {"X-Auth-Token": "alice:pa"}


def call(client, method: str, path: str, body=None, headers=ADMIN):
    return client.simulate_request(method, f"/v2.1/os-aggregates{path}", json=body,
                                   headers=headers)  # fmt: skip


def create(client, name: str = "rack1", zone: str | None = "london") -> dict:
    answer = call(client, "POST", "", {"aggregate": {"name": name, "availability_zone": zone}})
    assert answer.status_code == 200, answer.text
    return answer.json["aggregate"]


def test_create_answers_as_novas_sample(client) -> None:
    made = create(client)
    # nova/doc/api_samples/os-aggregates/aggregate-post-resp.json (2.1)
    assert set(made) == {"availability_zone", "created_at", "deleted", "deleted_at", "id",
                         "name", "updated_at"}  # fmt: skip
    assert (made["name"], made["availability_zone"], made["deleted"]) == ("rack1", "london", False)
    assert made["updated_at"] is None and made["deleted_at"] is None
    assert isinstance(made["id"], int) and "T" in made["created_at"]


def test_the_uuid_comes_with_2_41(client) -> None:
    made = create(client)
    assert "uuid" not in call(client, "GET", f"/{made['id']}").json["aggregate"]
    shown = call(client, "GET", f"/{made['id']}", headers=at("2.41", ADMIN)).json["aggregate"]
    listed = call(client, "GET", "", headers=at("2.41", ADMIN)).json["aggregates"]
    assert uuid.UUID(shown["uuid"]) and listed[0]["uuid"] == shown["uuid"]


def test_show_list_update_and_delete(client, stores: Stores) -> None:
    made = create(client)
    shown = call(client, "GET", f"/{made['id']}").json["aggregate"]
    # aggregates-get-resp.json
    assert shown["hosts"] == [] and shown["metadata"] == {"availability_zone": "london"}
    listed = call(client, "GET", "").json["aggregates"]
    assert [a["id"] for a in listed] == [made["id"]] and listed[0]["metadata"] == shown["metadata"]
    body = {"aggregate": {"name": "newname", "availability_zone": "nova2"}}
    updated = call(client, "PUT", f"/{made['id']}", body).json["aggregate"]
    assert (updated["name"], updated["availability_zone"]) == ("newname", "nova2")
    assert updated["updated_at"] is not None
    assert call(client, "DELETE", f"/{made['id']}").status_code == 200
    gone = call(client, "GET", f"/{made['id']}")
    assert gone.status_code == 404
    assert gone.json["itemNotFound"]["message"] == f"Aggregate {made['id']} could not be found."


def test_hosts_and_metadata_through_the_actions(client, stores: Stores) -> None:
    stores.agents.heartbeat("cn1", 30)
    made = create(client)
    action = f"/{made['id']}/action"
    added = call(client, "POST", action, {"add_host": {"host": "cn1"}}).json["aggregate"]
    assert added["hosts"] == ["cn1"]
    again = call(client, "POST", action, {"add_host": {"host": "cn1"}})
    assert again.status_code == 409
    assert again.json["conflictingRequest"]["message"] == (
        f"Aggregate {made['id']} already has host cn1."
    )
    unknown = call(client, "POST", action, {"add_host": {"host": "cn9"}})
    assert unknown.status_code == 404 and "Compute host cn9 could not be found." in unknown.text
    body = {"set_metadata": {"metadata": {"key": "value", "availability_zone": "london"}}}
    meta = call(client, "POST", action, body).json["aggregate"]["metadata"]
    assert meta == {"availability_zone": "london", "key": "value"}  # metadata-post-resp.json
    removed = call(client, "POST", action, {"set_metadata": {"metadata": {"key": None}}})
    assert removed.json["aggregate"]["metadata"] == {"availability_zone": "london"}
    busy = call(client, "DELETE", f"/{made['id']}")
    assert busy.status_code == 400
    assert busy.json["badRequest"]["message"] == (
        f"Cannot remove host from aggregate {made['id']}. Reason: Host aggregate is not empty."
    )
    left = call(client, "POST", action, {"remove_host": {"host": "cn1"}}).json["aggregate"]
    assert left["hosts"] == []
    missing = call(client, "POST", action, {"remove_host": {"host": "cn1"}})
    assert missing.status_code == 404
    assert missing.json["itemNotFound"]["message"] == (
        f"Cannot remove host cn1 in aggregate {made['id']}"
    )


def test_a_host_in_another_zone_is_a_conflict(client, stores: Stores) -> None:
    stores.agents.heartbeat("cn1", 30)
    east, west = create(client, "east", "az-east"), create(client, "west", "az-west")
    call(client, "POST", f"/{east['id']}/action", {"add_host": {"host": "cn1"}})
    answer = call(client, "POST", f"/{west['id']}/action", {"add_host": {"host": "cn1"}})
    assert answer.status_code == 409
    assert answer.json["conflictingRequest"]["message"] == (
        f"Cannot add host to aggregate {west['id']}. Reason: One or more hosts already in "
        "availability zone(s) ['az-east']."
    )


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("POST", "", {"aggregate": {}}, 400, "'name' is a required property"),
        ("POST", "", {"aggregate": {"name": " x"}}, 400, "printable characters"),
        ("POST", "", {"aggregate": {"name": "x", "zone": "y"}}, 400, "'zone' was unexpected"),
        ("PUT", "/1", {"aggregate": {}}, 400, "a name, an availability_zone or both"),
        ("GET", "/abc", None, 400, "id must be an integer"),
        ("GET", "/-1", None, 400, "id must be an integer"),
        ("POST", "/1/action", {"reboot": {}}, 400, "send one of add_host"),
        ("POST", "/1/action", {"add_host": {"host": "a b"}}, 400, "must be a host name"),
        ("POST", "/1/action", {"set_metadata": {"metadata": {"k": 1}}}, 400, "or null"),
        ("GET", "/99", None, 404, "Aggregate 99 could not be found."),
    ],
)
def test_bad_input_gets_a_clear_error(client, method, path, body, status, words) -> None:
    create(client)
    answer = call(client, method, path, body)
    assert answer.status_code == status, answer.text
    assert words in answer.text


def test_duplicate_names_conflict(client) -> None:
    create(client)
    answer = call(client, "POST", "", {"aggregate": {"name": "rack1"}})
    assert answer.status_code == 409
    assert answer.json["conflictingRequest"]["message"] == "Aggregate rack1 already exists."


@pytest.mark.parametrize(
    ("method", "path", "body", "rule"),
    [
        ("GET", "", None, "index"),
        ("POST", "", {"aggregate": {"name": "x"}}, "create"),
        ("GET", "/1", None, "show"),
        ("PUT", "/1", {"aggregate": {"name": "y"}}, "update"),
        ("DELETE", "/1", None, "delete"),
        ("POST", "/1/action", {"add_host": {"host": "cn1"}}, "add_host"),
        ("POST", "/1/action", {"remove_host": {"host": "cn1"}}, "remove_host"),
        ("POST", "/1/action", {"set_metadata": {"metadata": {}}}, "set_metadata"),
    ],
)
def test_only_admins_manage_aggregates(client, method, path, body, rule) -> None:
    create(client)
    answer = call(client, method, path, body, headers=MEMBER)
    assert answer.status_code == 403, answer.text
    assert answer.json["forbidden"]["message"] == (
        f"Policy doesn't allow os_compute_api:os-aggregates:{rule} to be performed."
    )


def test_every_response_is_json(client) -> None:
    made = create(client)
    for path in ("", f"/{made['id']}"):
        json.loads(call(client, "GET", path).text)
