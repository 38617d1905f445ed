"""/v2.1/os-server-groups and the ``group`` hint, in Nova's shapes (falcon's TestClient).

The placement of members (the claim's check, routing, the race) is in
tests/agents/test_server_groups.py; this module is the API: shapes by microversion,
errors, rules of who may do what, and what a boot into a group records.
"""

from __future__ import annotations

import uuid
from typing import Any

import falcon.testing
import pytest

from qsched.ledger import Stores
from tests.api.test_api import ADMIN, OTHER, USER, at, bus, fault, post_server
from tests.compute.test_compute import RecordingBus, make_app

__all__ = ["bus"]  # a fixture, see tests.api.test_api

V264 = at("2.64")
V213 = at("2.13")
READER = {"X-Auth-Token": "carol:pa", "X-Roles": "reader"}


@pytest.fixture
def client(conf, stores: Stores, bus: RecordingBus) -> falcon.testing.TestClient:
    """Not tests.api.test_api's: project pa has no limits, so no boot into a group is refused
    for its quota."""
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    return falcon.testing.TestClient(make_app(conf, stores, bus))


def create(client, body: dict[str, Any], headers=None) -> Any:
    return client.simulate_post(
        "/v2.1/os-server-groups", json={"server_group": body}, headers={**USER, **(headers or {})}
    )


def a_group(client, policy: str = "anti-affinity", **rules: int) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "g", "policy": policy}
    if rules:
        body["rules"] = rules
    result = create(client, body, V264)
    assert result.status_code == 200, result.text
    group: dict[str, Any] = result.json["server_group"]
    return group


# -- shapes, as Nova's api samples --


def test_create_at_2_1_has_nova_2_1_shape(client) -> None:
    result = create(client, {"name": "test", "policies": ["anti-affinity"]})
    assert result.status_code == 200, result.text
    group = result.json["server_group"]
    assert set(group) == {"id", "name", "policies", "members", "metadata"}
    assert (group["name"], group["policies"], group["members"], group["metadata"]) == (
        "test", ["anti-affinity"], [], {},
    )  # fmt: skip
    assert result.headers["OpenStack-API-Version"] == "compute 2.1"


def test_2_13_adds_the_owner(client) -> None:
    group = create(client, {"name": "t", "policies": ["affinity"]}, V213).json["server_group"]
    assert (group["project_id"], group["user_id"]) == ("pa", "alice")


def test_create_show_list_at_2_64(client) -> None:
    result = create(client, {"name": "test", "policy": "anti-affinity",
                             "rules": {"max_server_per_host": 3}}, V264)  # fmt: skip
    assert result.headers["OpenStack-API-Version"] == "compute 2.64"
    group = result.json["server_group"]
    assert set(group) == {"id", "name", "policy", "rules", "members", "project_id", "user_id"}
    assert (group["policy"], group["rules"]) == ("anti-affinity", {"max_server_per_host": 3})
    shown = client.simulate_get(f"/v2.1/os-server-groups/{group['id']}", headers=V264)
    assert shown.json == {"server_group": group}
    listed = client.simulate_get("/v2.1/os-server-groups", headers=V264)
    assert listed.json == {"server_groups": [group]}
    old = client.simulate_get(f"/v2.1/os-server-groups/{group['id']}", headers=USER)
    assert old.json["server_group"]["policies"] == ["anti-affinity"]  # 2.1 hides the rules


def test_rules_are_anti_affinitys_alone(client) -> None:
    result = create(client, {"name": "t", "policy": "affinity",
                             "rules": {"max_server_per_host": 2}}, V264)  # fmt: skip
    assert fault(result, 400, "badRequest") == "Only anti-affinity policy supports rules."
    group = a_group(client, "anti-affinity")
    assert group["rules"] == {}
    assert a_group(client, "anti-affinity", max_server_per_host="2")["rules"] == {  # type: ignore[arg-type]
        "max_server_per_host": 2
    }


@pytest.mark.parametrize(
    ("body", "headers", "where"),
    [
        ({"name": "t", "policies": ["soft-affinity"]}, None, "policies"),  # 2.15 and later
        ({"name": "t", "policies": ["affinity", "anti-affinity"]}, None, "policies"),
        ({"name": "t", "policies": []}, None, "policies"),
        ({"name": "t", "policy": "affinity"}, None, "server_group"),  # 2.64's word at 2.1
        ({"name": "t", "policies": ["affinity"]}, V264, "server_group"),
        ({"name": "t", "policy": "legacy"}, V264, "policy"),
        ({"name": "t", "policy": "anti-affinity", "rules": {"max_server_per_host": 0}}, V264,
         "max_server_per_host"),
        ({"name": "t", "policy": "anti-affinity", "rules": {"other": 1}}, V264, "rules"),
        ({"name": " t", "policy": "affinity"}, V264, "name"),
    ],
)  # fmt: skip
def test_bad_bodies_are_nova_400s(client, body, headers, where) -> None:
    assert where in fault(create(client, body, headers), 400, "badRequest")


def test_soft_policies_from_2_15(client) -> None:
    result = create(client, {"name": "t", "policies": ["soft-affinity"]}, at("2.15"))
    assert result.json["server_group"]["policies"] == ["soft-affinity"]


# -- who may do what, and what is not found --


def test_another_projects_group_is_not_found(client) -> None:
    group = a_group(client)
    path = f"/v2.1/os-server-groups/{group['id']}"
    message = fault(client.simulate_get(path, headers=OTHER), 404, "itemNotFound")
    assert message == f"Instance group {group['id']} could not be found."
    fault(client.simulate_delete(path, headers=OTHER), 404, "itemNotFound")
    assert client.simulate_get(path, headers=ADMIN).status_code == 200
    fault(client.simulate_get("/v2.1/os-server-groups/nope", headers=USER), 404, "itemNotFound")


def test_readers_read_members_create_and_delete(client) -> None:
    message = fault(create(client, {"name": "t", "policies": ["affinity"]}, READER), 403,
                    "forbidden")  # fmt: skip
    assert message == (
        "Policy doesn't allow os_compute_api:os-server-groups:create to be performed."
    )
    group = a_group(client)
    path = f"/v2.1/os-server-groups/{group['id']}"
    assert client.simulate_get(path, headers=READER).status_code == 200
    fault(client.simulate_delete(path, headers=READER), 403, "forbidden")
    assert client.simulate_delete(path, headers=USER).status_code == 204
    fault(client.simulate_get(path, headers=USER), 404, "itemNotFound")


def test_all_projects_is_for_admins(client) -> None:
    mine = a_group(client)
    theirs = create(client, {"name": "t", "policies": ["affinity"]}, OTHER).json["server_group"]
    every = client.simulate_get("/v2.1/os-server-groups?all_projects=True", headers=ADMIN)
    assert {g["id"] for g in every.json["server_groups"]} >= {mine["id"], theirs["id"]}
    own = client.simulate_get("/v2.1/os-server-groups?all_projects=True", headers=USER)
    assert [g["id"] for g in own.json["server_groups"]] == [mine["id"]]  # as Nova: ignored


def test_limit_and_offset(client) -> None:
    made = [a_group(client)["id"] for _ in range(3)]
    page = client.simulate_get("/v2.1/os-server-groups?limit=1&offset=1", headers=USER)
    assert [g["id"] for g in page.json["server_groups"]] == made[1:2]
    bad = client.simulate_get("/v2.1/os-server-groups?limit=-1", headers=USER)
    assert "limit" in fault(bad, 400, "badRequest")


def test_the_group_quota_is_novas_403(client, stores) -> None:
    stores.groups.limits = type(stores.groups.limits)(server_groups=1, server_group_members=10)
    a_group(client)
    message = fault(create(client, {"name": "t", "policies": ["affinity"]}), 403, "forbidden")
    assert message == "Quota exceeded, too many server groups."


# -- the group hint --


def boot(client, hints: Any, key: str = "os:scheduler_hints", headers=USER) -> Any:
    body = {"server": {"name": "vm", "flavorRef": "m1.small",
                       "imageRef": "c9a4b3f2-3f4e-4bb5-9a55-0c1e62c1c0de"}, key: hints}  # fmt: skip
    return client.simulate_post("/v2.1/servers", json=body, headers=headers)


def test_a_boot_joins_its_group(client, stores, bus) -> None:
    group = a_group(client)
    for hint in (group["id"], [group["id"]]):
        assert boot(client, {"group": hint}).status_code == 202
    assert boot(client, {"group": group["id"]}, "OS-SCH-HNT:scheduler_hints").status_code == 202
    members = [msg.instance_uuid for msg in bus.boots]
    assert {(m.group, m.group_policy) for m in bus.boots} == {(group["id"], "anti-affinity")}
    shown = client.simulate_get(f"/v2.1/os-server-groups/{group['id']}", headers=USER).json
    assert sorted(shown["server_group"]["members"]) == sorted(members)
    assert stores.instances.get(members[0]).group == group["id"]
    client.simulate_delete(f"/v2.1/servers/{members[0]}", headers=USER)
    shown = client.simulate_get(f"/v2.1/os-server-groups/{group['id']}", headers=USER).json
    assert members[0] not in shown["server_group"]["members"]  # delete removes the member


@pytest.mark.parametrize(
    ("hints", "key", "words"),
    [
        ({"query": '[">=", "$free_ram_mb", 1024]'}, "os:scheduler_hints", "remove ['query']"),
        ({"same_host": "not-a-uuid"}, "os:scheduler_hints", "a list of server UUIDs"),
        ({"different_host": [7]}, "os:scheduler_hints", "a list of server UUIDs"),
        ({"group": "not-a-uuid"}, "os:scheduler_hints", "must be a server group UUID"),
        ({"group": [str(uuid.uuid4())] * 2}, "os:scheduler_hints", "one group per server"),
    ],
)
def test_hints_qsched_does_not_act_on_are_refused(client, bus, hints, key, words) -> None:
    assert words in fault(boot(client, hints, key), 400, "badRequest")
    assert bus.boots == []


def test_hints_given_twice_are_refused(client, bus) -> None:
    body = {"server": {"name": "vm", "flavorRef": "m1.small", "imageRef": ""},
            "os:scheduler_hints": {}, "OS-SCH-HNT:scheduler_hints": {}}  # fmt: skip
    result = client.simulate_post("/v2.1/servers", json=body, headers=USER)
    assert "Give the scheduler hints once" in fault(result, 400, "badRequest")


def test_a_group_one_may_not_see_is_novas_400_and_holds_nothing(client, stores, bus) -> None:
    group = a_group(client)
    stores.quota.set_limits("pb", instances=-1, cores=-1, ram_mb=-1)
    for hint in (group["id"], str(uuid.uuid4())):
        message = fault(boot(client, {"group": hint}, headers=OTHER), 400, "badRequest")
        assert message == f"Instance group {hint} could not be found."
    assert bus.boots == [] and stores.quota.get_usage("pb").instances == 0


def test_a_full_group_is_novas_403(client, stores, bus) -> None:
    stores.instances.group_members = 1  # [quota] server_group_members
    group = a_group(client)
    assert boot(client, {"group": group["id"]}).status_code == 202
    message = fault(boot(client, {"group": group["id"]}), 403, "forbidden")
    assert message == "Quota exceeded, too many servers in group"
    assert stores.quota.get_usage("pa").instances == 1


def test_an_affinity_member_goes_to_its_groups_host(client, stores, bus) -> None:
    group = a_group(client, "affinity")
    assert boot(client, {"group": group["id"]}).status_code == 202
    first = bus.boots[0]
    _claim(stores, first.instance_uuid, "cn7")
    assert boot(client, {"group": group["id"]}).status_code == 202
    assert [(host, m.group) for host, m in bus.host_boots] == [("cn7", group["id"])]


def _claim(stores: Stores, uuid_: str, host: str) -> None:
    from qsched.ledger.base import Inventory

    rp = str(uuid.uuid4())
    stores.ledger.create_provider(rp, f"{host}-0")
    stores.ledger.set_inventory(rp, 0, {"VCPU": Inventory(8), "MEMORY_MB": Inventory(16384),
                                        "DISK_GB": Inventory(100)})  # fmt: skip
    stores.ledger.claim(uuid_, {rp: {"VCPU": 1, "MEMORY_MB": 2048, "DISK_GB": 20}}, host,
                        f"{host}-0")  # fmt: skip


def test_post_server_still_works_without_hints(client, bus) -> None:
    assert post_server(client).status_code == 202 and bus.boots[0].group is None
