"""Listing, showing and updating servers as Nova does: filters, microversions, metadata."""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

import pytest

from qsched.ledger import Stores
from qsched.ledger.audit import audit
from tests.api.test_api import ADMIN, OTHER, USER, app, at, bus, client, fault, post_server
from tests.compute.test_compute import place
from tests.samples import SAMPLES

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

#: Nova's api_samples, as the nova package ships them (templates whose placeholders are
#: all quoted, so each is JSON); ``make install`` installs it without its dependencies


def boot(client, name: str = "vm1", headers: dict[str, str] = USER, **fields: Any) -> str:
    result = post_server(client, headers, name=name, **fields)
    assert result.status_code == 202, result.text
    server: str = result.json["server"]["id"]
    return server


def names(result) -> list[str]:
    assert result.status_code == 200, result.text
    return [s["name"] for s in result.json["servers"]]


def listed(client, query: str, headers: dict[str, str] = USER, path: str = "/v2.1/servers"):
    return client.simulate_get(path, headers=headers, query_string=query)


class TestFilters:
    def test_name_is_a_regex_and_the_order_newest_first(self, client) -> None:
        for name in ("web-1", "web-2", "db-1"):
            boot(client, name)
        assert names(listed(client, "")) == ["db-1", "web-2", "web-1"]
        assert names(listed(client, "name=^web")) == ["web-2", "web-1"]
        assert names(listed(client, "name=nomatch")) == []
        fault(listed(client, "name=("), 400, "badRequest")

    def test_status_by_version(self, client, stores) -> None:
        server = boot(client, "a")
        boot(client, "b")
        place(stores, server)
        assert names(listed(client, "status=active")) == ["a"]
        assert names(listed(client, "status=BUILD&status=ACTIVE")) == ["b", "a"]
        assert names(listed(client, "status=nonsense")) == []
        refused = listed(client, "status=nonsense", at("2.38"))
        assert "Invalid status value" in fault(refused, 400, "badRequest")
        fault(listed(client, "status=DELETED"), 403, "forbidden")

    def test_flavor_and_image(self, client) -> None:
        boot(client, "small")
        boot(client, "other", imageRef="70a599e0-31e7-49b7-b260-868f441e862b")
        assert names(listed(client, "flavor=m1.small")) == ["other", "small"]
        assert names(listed(client, "flavor=nope")) == []
        image = "70a599e0-31e7-49b7-b260-868f441e862b"
        assert names(listed(client, f"image={image}")) == ["other"]

    def test_all_tenants_is_for_admins_and_pages(self, client) -> None:
        for n in range(3):
            boot(client, f"a{n}")
        boot(client, "b0", OTHER)
        fault(listed(client, "all_tenants=1"), 403, "forbidden")
        assert names(listed(client, "", ADMIN)) == []
        assert names(listed(client, "all_tenants", ADMIN)) == ["b0", "a2", "a1", "a0"]
        first = listed(client, "all_tenants=1&limit=2", ADMIN)
        assert names(first) == ["b0", "a2"]
        href = first.json["servers_links"][0]["href"]
        marker = href.split("marker=")[1].split("&")[0]
        rest = listed(client, f"all_tenants=1&limit=2&marker={marker}", ADMIN)
        assert names(rest) == ["a1", "a0"]
        assert names(listed(client, "all_tenants=1&project_id=pb", ADMIN)) == ["b0"]
        assert names(listed(client, "all_tenants=1&name=^a&limit=2", ADMIN)) == ["a2", "a1"]
        fault(listed(client, "all_tenants=maybe", ADMIN), 400, "badRequest")
        fault(listed(client, "all_tenants=1&marker=nope", ADMIN), 400, "badRequest")

    def test_host_is_for_admins_and_dropped_for_members(self, client, stores) -> None:
        server = boot(client, "placed")
        boot(client, "waiting")
        place(stores, server, "cn7")
        assert names(listed(client, "host=cn7")) == ["waiting", "placed"]  # dropped, as Nova
        assert names(listed(client, "all_tenants=1&host=cn7", ADMIN)) == ["placed"]
        fault(listed(client, "sort_key=host"), 403, "forbidden")

    def test_changes_since_lists_deleted_servers(self, client) -> None:
        start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5)
        gone = boot(client, "gone")
        boot(client, "kept")
        assert client.simulate_delete(f"/v2.1/servers/{gone}", headers=USER).status_code == 204
        assert names(listed(client, "")) == ["kept"]
        since = start.strftime("%Y-%m-%dT%H:%M:%SZ")
        found = listed(client, f"changes-since={since}", path="/v2.1/servers/detail")
        assert {s["name"]: s["status"] for s in found.json["servers"]} == {
            "kept": "BUILD",
            "gone": "DELETED",
        }
        later = (start + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
        assert names(listed(client, f"changes-since={later}")) == []
        fault(listed(client, "changes-since=yesterday"), 400, "badRequest")
        before = listed(client, f"changes-since={later}&changes-before={since}", at("2.66"))
        assert "changes-since must be less" in fault(before, 400, "badRequest")
        everywhere = listed(client, f"all_tenants=1&changes-since={since}", ADMIN)
        assert sorted(names(everywhere)) == ["gone", "kept"]

    def test_ip_and_locked_match_nothing(self, client) -> None:
        boot(client)
        assert names(listed(client, "ip=10.0.0.1")) == []
        assert names(listed(client, "locked=true", at("2.73"))) == []
        assert names(listed(client, "locked=false", at("2.73"))) == ["vm1"]
        fault(listed(client, "locked=perhaps", at("2.73")), 400, "badRequest")

    def test_sort_keys(self, client) -> None:
        for name in ("b", "c", "a"):
            boot(client, name)
        assert names(listed(client, "sort_key=display_name&sort_dir=asc")) == ["a", "b", "c"]
        assert names(listed(client, "sort_key=display_name")) == ["c", "b", "a"]
        assert names(listed(client, "sort_key=vcpus")) == ["a", "c", "b"]  # ignored, as Nova
        fault(listed(client, "sort_key=vcpus", at("2.75")), 400, "badRequest")
        fault(listed(client, "sort_key=nope"), 400, "badRequest")
        fault(listed(client, "sort_key=uuid&sort_dir=up"), 400, "badRequest")

    def test_unknown_parameters_until_2_75(self, client) -> None:
        boot(client)
        assert names(listed(client, "whatever=1")) == ["vm1"]
        refused = fault(listed(client, "whatever=1", at("2.75")), 400, "badRequest")
        assert "'whatever' was unexpected" in refused
        fault(listed(client, "all_tenants=1&metadata=x", ADMIN), 400, "badRequest")


class TestShow:
    def test_fields_by_version(self, client, stores) -> None:
        server = boot(client)
        place(stores, server, "cn7")
        stores.agents.register_service("cn7")
        old = client.simulate_get(f"/v2.1/servers/{server}", headers=USER).json["server"]
        assert "locked" not in old and set(old["flavor"]) == {"id", "links"}
        new = client.simulate_get(f"/v2.1/servers/{server}", headers=at("2.79")).json["server"]
        assert new["locked"] is False and new["locked_reason"] is None
        assert new["server_groups"] == [] and "host_status" not in new
        assert new["flavor"] == {
            "original_name": "m1.small",
            "vcpus": 1,
            "ram": 2048,
            "disk": 20,
            "ephemeral": 0,
            "swap": 0,
            "extra_specs": {},
        }
        admin = client.simulate_get(f"/v2.1/servers/{server}", headers=at("2.79", ADMIN))
        shown = admin.json["server"]
        assert shown["host_status"] == "UNKNOWN"  # a service with no heartbeat
        assert shown["OS-EXT-SRV-ATTR:hostname"] == "vm1"
        assert shown["OS-EXT-SRV-ATTR:reservation_id"].startswith("r-")
        stores.agents.update_service("cn7", disabled=True)
        again = client.simulate_get(f"/v2.1/servers/{server}", headers=at("2.16", ADMIN))
        assert again.json["server"]["host_status"] == "MAINTENANCE"
        detail = listed(client, "all_tenants=1", at("2.79", ADMIN), "/v2.1/servers/detail")
        assert "server_groups" not in detail.json["servers"][0]

    @pytest.mark.skipif(SAMPLES is None, reason="the nova package is not installed")
    @pytest.mark.parametrize("version", ["2.3", "2.9", "2.16", "2.47", "2.71", "2.73"])
    def test_every_key_of_novas_sample(self, client, stores, version) -> None:
        sample = nova_sample(f"servers/v{version}/server-get-resp.json.tpl")
        server = boot(client)
        place(stores, server, "cn1")
        stores.agents.register_service("cn1")
        shown = client.simulate_get(f"/v2.1/servers/{server}", headers=at(version, ADMIN))
        assert_shaped(shown.json["server"], sample["server"], skip={"description", "tags"})


def nova_sample(path: str) -> Any:
    assert SAMPLES is not None
    return json.loads((SAMPLES / path).read_text())


def assert_shaped(ours: dict[str, Any], theirs: dict[str, Any], skip: set[str]) -> None:
    """Every key of Nova's sample, with a value of the same JSON type (null matching any)."""
    missing = sorted(set(theirs) - set(ours) - skip)
    assert missing == []
    for key, value in theirs.items():
        if key in skip or value is None or ours[key] is None:
            continue
        assert isinstance(ours[key], type(value)), (key, ours[key], value)


class TestUpdate:
    def test_name_and_fields(self, client) -> None:
        server = boot(client)
        body = {"server": {"name": "renamed", "accessIPv4": "10.0.0.5"}}
        done = client.simulate_put(f"/v2.1/servers/{server}", json=body, headers=USER)
        assert done.status_code == 200, done.text
        assert done.json["server"]["name"] == "renamed"
        assert done.json["server"]["accessIPv4"] == "10.0.0.5"
        assert "OS-EXT-STS:vm_state" not in done.json["server"]  # Nova's fewer keys
        shown = client.simulate_get(f"/v2.1/servers/{server}", headers=USER).json["server"]
        assert shown["name"] == "renamed"

    def test_description_from_2_19_and_full_view_from_2_75(self, client) -> None:
        server = boot(client)
        body = {"server": {"description": "mine"}}
        old = client.simulate_put(f"/v2.1/servers/{server}", json=body, headers=USER)
        fault(old, 400, "badRequest")
        new = client.simulate_put(f"/v2.1/servers/{server}", json=body, headers=at("2.19"))
        assert new.json["server"]["description"] == "mine"
        full = client.simulate_put(f"/v2.1/servers/{server}", json=body, headers=at("2.75"))
        shown = client.simulate_get(f"/v2.1/servers/{server}", headers=at("2.75")).json
        assert set(full.json["server"]) == set(shown["server"])

    @pytest.mark.parametrize(
        "body",
        [{}, {"server": {"name": ""}}, {"server": {"accessIPv4": "nope"}},
         {"server": {"accessIPv6": "10.0.0.1"}}, {"server": {"OS-DCF:diskConfig": "x"}},
         {"server": {"flavorRef": "m1.small"}}],
    )  # fmt: skip
    def test_bad_bodies(self, client, stores, body) -> None:
        server = boot(client)
        before = stores.instances.get(server)
        fault(client.simulate_put(f"/v2.1/servers/{server}", json=body, headers=USER), 400,
              "badRequest")  # fmt: skip
        assert stores.instances.get(server) == before

    def test_others_and_deleted(self, client) -> None:
        server = boot(client)
        body = {"server": {"name": "x"}}
        fault(client.simulate_put(f"/v2.1/servers/{server}", json=body, headers=OTHER), 404,
              "itemNotFound")  # fmt: skip
        client.simulate_delete(f"/v2.1/servers/{server}", headers=USER)
        fault(client.simulate_put(f"/v2.1/servers/{server}", json=body, headers=USER), 404,
              "itemNotFound")  # fmt: skip


class TestMetadata:
    def test_the_whole_cycle(self, client, stores: Stores) -> None:
        server = boot(client, metadata={"a": "1"})
        place(stores, server)
        path = f"/v2.1/servers/{server}/metadata"
        assert client.simulate_get(path, headers=USER).json == {"metadata": {"a": "1"}}
        added = client.simulate_post(path, json={"metadata": {"b": "2"}}, headers=USER)
        assert added.json == {"metadata": {"a": "1", "b": "2"}}
        replaced = client.simulate_put(path, json={"metadata": {"c": "3"}}, headers=USER)
        assert replaced.json == {"metadata": {"c": "3"}}
        item = client.simulate_put(f"{path}/d", json={"meta": {"d": "4"}}, headers=USER)
        assert item.json == {"meta": {"d": "4"}}
        assert client.simulate_get(f"{path}/d", headers=USER).json == {"meta": {"d": "4"}}
        assert client.simulate_delete(f"{path}/c", headers=USER).status_code == 204
        assert client.simulate_get(path, headers=USER).json == {"metadata": {"d": "4"}}
        missing = fault(client.simulate_get(f"{path}/c", headers=USER), 404, "itemNotFound")
        assert missing == "Metadata item was not found"
        fault(client.simulate_delete(f"{path}/c", headers=USER), 404, "itemNotFound")
        shown = client.simulate_get(f"/v2.1/servers/{server}", headers=USER).json["server"]
        assert shown["metadata"] == {"d": "4"}
        assert audit(stores).ok

    def test_nova_errors(self, client, stores) -> None:
        server = boot(client)
        path = f"/v2.1/servers/{server}/metadata"
        building = client.simulate_post(path, json={"metadata": {"a": "1"}}, headers=USER)
        assert "while it is in vm_state building" in fault(building, 409, "conflictingRequest")
        place(stores, server)
        mismatch = client.simulate_put(f"{path}/a", json={"meta": {"b": "1"}}, headers=USER)
        assert fault(mismatch, 400, "badRequest") == "Request body and URI mismatch"
        two = {"meta": {"a": "1", "b": "2"}}
        fault(client.simulate_put(f"{path}/a", json=two, headers=USER), 400, "badRequest")
        fault(client.simulate_post(path, json={"metadata": {"": "1"}}, headers=USER), 400,
              "badRequest")  # fmt: skip
        fault(client.simulate_post(path, json={"metadata": {"a": "x" * 256}}, headers=USER),
              400, "badRequest")  # fmt: skip
        fault(client.simulate_get(path, headers=OTHER), 404, "itemNotFound")
        reader = {"X-Auth-Token": "alice:pa", "X-Roles": "reader"}
        assert client.simulate_get(path, headers=reader).status_code == 200

    def test_quota(self, client, stores) -> None:
        server = boot(client, metadata={f"k{n}": "v" for n in range(100)})
        place(stores, server)
        path = f"/v2.1/servers/{server}/metadata"
        more = {"metadata": {f"m{n}": "v" for n in range(29)}}
        refused = fault(client.simulate_post(path, json=more, headers=USER), 403, "forbidden")
        assert refused == "Maximum number of metadata items exceeds 128"
        assert len(client.simulate_get(path, headers=USER).json["metadata"]) == 100
        fewer = {"metadata": {f"m{n}": "v" for n in range(28)}}
        assert client.simulate_post(path, json=fewer, headers=USER).status_code == 200


@pytest.mark.skipif(SAMPLES is None, reason="the nova package is not installed")
class TestNovaSamples:
    def test_detail_and_update_at_their_latest(self, client, stores) -> None:
        server = boot(client)
        place(stores, server, "cn1")
        stores.agents.register_service("cn1")
        detail = listed(client, "all_tenants=1", at("2.73", ADMIN), "/v2.1/servers/detail")
        sample = nova_sample("servers/v2.73/servers-details-resp.json.tpl")
        assert_shaped(detail.json["servers"][0], sample["servers"][0], skip={"description", "tags"})
        request = nova_sample("servers/v2.75/server-update-req.json.tpl")
        request["server"].pop("hostname", None)  # 2.90
        fill = {"%(access_ip_v4)s": "4.3.2.1", "%(access_ip_v6)s": "80fe::"}  # Nova's values
        request["server"] = {k: fill.get(v, v) for k, v in request["server"].items()}
        done = client.simulate_put(
            f"/v2.1/servers/{server}", json=request, headers=at("2.75", ADMIN)
        )
        assert done.status_code == 200, done.text
        sample = nova_sample("servers/v2.75/server-update-resp.json.tpl")
        assert_shaped(done.json["server"], sample["server"], skip={"tags"})


class TestIndexes:
    def test_live_and_deleted_indexes_follow_the_records(self, client, stores) -> None:
        first, second = boot(client, "a"), boot(client, "b", OTHER)
        assert stores.instances.newest(10) == [second, first]
        assert stores.instances.newest(10, second) == [first]
        assert stores.instances.newest(10, "nope") is None
        client.simulate_delete(f"/v2.1/servers/{first}", headers=USER)
        assert stores.instances.newest(10) == [second]
        assert stores.instances.deleted_since(0, "pa") == [first]
        assert stores.instances.deleted_since(0, "pb") == []
        assert stores.instances.deleted_since(0) == [first]

    def test_a_members_list_never_reads_the_cells_index(self, client, stores, monkeypatch):
        boot(client, "mine")
        boot(client, "theirs", OTHER)

        def scan(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("a member's list read the index of every project")

        monkeypatch.setattr(stores.instances, "newest", scan)
        monkeypatch.setattr(stores.instances, "deleted_since", scan)
        assert names(listed(client, "name=e&sort_key=display_name")) == ["mine"]
        assert names(listed(client, "all_tenants=1&project_id=pb", ADMIN)) == ["theirs"]

    def test_an_admins_sorted_list_of_every_project(self, client) -> None:
        for name, headers in (("b", USER), ("c", OTHER), ("a", USER)):
            boot(client, name, headers)
        query = "all_tenants=1&sort_key=display_name&sort_dir=asc&limit=2"
        first = listed(client, query, ADMIN)
        assert names(first) == ["a", "b"]
        marker = first.json["servers"][-1]["id"]
        assert names(listed(client, f"{query}&marker={marker}", ADMIN)) == ["c"]


class TestConcurrentWrites:
    def test_metadata_writes_in_parallel_keep_every_item(self, client, stores) -> None:
        server = boot(client)
        place(stores, server)
        path = f"/v2.1/servers/{server}/metadata"

        def write(prefix: str) -> None:
            for n in range(10):
                item = {"meta": {f"{prefix}{n}": "v"}}
                result = client.simulate_put(f"{path}/{prefix}{n}", json=item, headers=USER)
                assert result.status_code == 200, result.text

        threads = [threading.Thread(target=write, args=(p,)) for p in "abc"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        found = client.simulate_get(path, headers=USER).json["metadata"]
        assert sorted(found) == sorted(f"{p}{n}" for p in "abc" for n in range(10))


def test_the_metadata_limit_is_the_projects_quota(client, stores) -> None:
    server = boot(client)
    place(stores, server)
    quota = {"quota_set": {"metadata_items": 2}}
    done = client.simulate_put("/v2.1/os-quota-sets/pa", json=quota, headers=ADMIN)
    assert done.status_code == 200, done.text
    path = f"/v2.1/servers/{server}/metadata"
    three = {"metadata": {"a": "1", "b": "2", "c": "3"}}
    refused = fault(client.simulate_put(path, json=three, headers=USER), 403, "forbidden")
    assert refused == "Maximum number of metadata items exceeds 2"
    two = {"metadata": {"a": "1", "b": "2"}}
    assert client.simulate_put(path, json=two, headers=USER).status_code == 200
