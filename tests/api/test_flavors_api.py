"""Flavors as Nova serves them: os-flavor-access, PUT, one extra spec, listings, views."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from qsched.bus.base import Names
from qsched.flavors import Flavor, request_groups
from tests.api.test_api import ADMIN, IMAGE, OTHER, USER, app, at, bus, client, fault
from tests.samples import SAMPLES, mismatches

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api


def create(client, headers=ADMIN, **fields: Any):
    body = {"flavor": {"name": "p1", "id": "p1", "vcpus": 1, "ram": 512, "disk": 1, **fields}}
    return client.simulate_post("/v2.1/flavors", json=body, headers=headers)


def boot(client, flavor: str, headers=USER):
    body = {"server": {"name": "vm", "flavorRef": flavor, "imageRef": IMAGE}}
    return client.simulate_post("/v2.1/servers", json=body, headers=headers)


def action(client, flavor: str, name: str, tenant: str, headers=ADMIN):
    body = {name: {"tenant": tenant}}
    return client.simulate_post(f"/v2.1/flavors/{flavor}/action", json=body, headers=headers)


def ids(result) -> list[str]:
    assert result.status_code == 200, result.text
    return [f["id"] for f in result.json["flavors"]]


@pytest.fixture
def private(client) -> str:
    created = create(client, **{"os-flavor-access:is_public": False})
    assert created.status_code == 200, created.text
    assert created.json["flavor"]["os-flavor-access:is_public"] is False
    return "p1"


class TestFlavorAccess:
    def test_private_flavor_only_for_granted_projects(self, client, private) -> None:
        assert private not in ids(client.simulate_get("/v2.1/flavors", headers=USER))
        assert private not in ids(client.simulate_get("/v2.1/flavors/detail", headers=USER))
        shown = client.simulate_get(f"/v2.1/flavors/{private}", headers=USER)
        assert "Flavor p1 could not be found." in fault(shown, 404, "itemNotFound")
        specs = client.simulate_get(f"/v2.1/flavors/{private}/os-extra_specs", headers=USER)
        fault(specs, 404, "itemNotFound")
        assert fault(boot(client, private), 400, "badRequest") == "Flavor p1 could not be found."

        granted = action(client, private, "addTenantAccess", "pa")
        assert granted.status_code == 200, granted.text
        assert granted.json == {"flavor_access": [{"flavor_id": "p1", "tenant_id": "pa"}]}
        assert private in ids(client.simulate_get("/v2.1/flavors", headers=USER))
        assert client.simulate_get(f"/v2.1/flavors/{private}", headers=USER).status_code == 200
        assert boot(client, private).status_code == 202
        # another project still neither sees nor boots it
        assert private not in ids(client.simulate_get("/v2.1/flavors", headers=OTHER))
        fault(boot(client, private, OTHER), 400, "badRequest")

        listed = client.simulate_get(f"/v2.1/flavors/{private}/os-flavor-access", headers=ADMIN)
        assert listed.json == {"flavor_access": [{"flavor_id": "p1", "tenant_id": "pa"}]}
        removed = action(client, private, "removeTenantAccess", "pa")
        assert removed.status_code == 200 and removed.json == {"flavor_access": []}
        # the front door kept the flavor in memory from the boot above: it must not
        # keep the grant with it
        assert fault(boot(client, private), 400, "badRequest") == "Flavor p1 could not be found."
        assert private not in ids(client.simulate_get("/v2.1/flavors", headers=USER))

    def test_admin_sees_and_boots_private_flavors(self, client, private) -> None:
        shown = client.simulate_get(f"/v2.1/flavors/{private}", headers=ADMIN)
        assert shown.status_code == 200
        assert boot(client, private, ADMIN).status_code == 202

    def test_grant_errors_in_novas_words(self, client, private) -> None:
        assert action(client, private, "addTenantAccess", "pa").status_code == 200
        again = action(client, private, "addTenantAccess", "pa")
        assert fault(again, 409, "conflictingRequest") == (
            "Flavor access already exists for flavor p1 and project pa combination."
        )
        absent = action(client, private, "removeTenantAccess", "pz")
        assert fault(absent, 404, "itemNotFound") == (
            "Flavor access not found for p1 / pz combination."
        )
        unknown = action(client, "nope", "addTenantAccess", "pa")
        assert fault(unknown, 404, "itemNotFound") == "Flavor nope could not be found."
        public = client.simulate_get("/v2.1/flavors/m1.small/os-flavor-access", headers=ADMIN)
        assert fault(public, 404, "itemNotFound") == (
            "Access list not available for public flavors."
        )

    def test_public_flavor_refused_from_2_7(self, client) -> None:
        body = {"addTenantAccess": {"tenant": "pa"}}
        path = "/v2.1/flavors/m1.small/action"
        late = client.simulate_post(path, json=body, headers=at("2.7", ADMIN))
        assert fault(late, 409, "conflictingRequest") == "Can not add access to a public flavor."
        early = client.simulate_post(path, json=body, headers=at("2.6", ADMIN))
        assert early.status_code == 200, early.text
        assert early.json["flavor_access"] == [{"flavor_id": "m1.small", "tenant_id": "pa"}]

    @pytest.mark.parametrize(
        "body",
        [
            {},
            {"addTenantAccess": {}},
            {"addTenantAccess": {"tenant": ""}},
            {"addTenantAccess": {"tenant": "pa", "x": 1}},
            {"removeTenantAccess": {"tenant": 5}},
            {"addTenantAccess": {"tenant": "pa"}, "removeTenantAccess": {"tenant": "pa"}},
            {"grantEverything": {}},
            [],
        ],
    )
    def test_bad_actions(self, client, private, body) -> None:
        result = client.simulate_post(f"/v2.1/flavors/{private}/action", json=body, headers=ADMIN)
        fault(result, 400, "badRequest")
        listed = client.simulate_get(f"/v2.1/flavors/{private}/os-flavor-access", headers=ADMIN)
        assert listed.json == {"flavor_access": []}

    def test_only_admins_manage_access(self, client, private) -> None:
        for call in (
            action(client, private, "addTenantAccess", "pa", USER),
            action(client, private, "removeTenantAccess", "pa", USER),
            client.simulate_get(f"/v2.1/flavors/{private}/os-flavor-access", headers=USER),
        ):
            fault(call, 403, "forbidden")

    def test_admin_is_public_filter(self, client, private) -> None:
        everything = ids(client.simulate_get("/v2.1/flavors?is_public=none", headers=ADMIN))
        assert private in everything and "m1.small" in everything
        default = ids(client.simulate_get("/v2.1/flavors", headers=ADMIN))
        assert private not in default and "m1.small" in default
        only = ids(client.simulate_get("/v2.1/flavors?is_public=false", headers=ADMIN))
        assert only == [private]
        assert ids(client.simulate_get("/v2.1/flavors?is_public=No", headers=ADMIN)) == only
        assert private in ids(client.simulate_get("/v2.1/flavors?is_public=NONE", headers=ADMIN))
        bad = client.simulate_get("/v2.1/flavors?is_public=maybe", headers=ADMIN)
        assert fault(bad, 400, "badRequest") == "Invalid is_public filter [maybe]"
        # a member lists public flavors whatever it asks, as in Nova
        member = ids(client.simulate_get("/v2.1/flavors?is_public=none", headers=USER))
        assert private not in member and "m1.small" in member


class TestUpdateAndViews:
    def test_put_description_from_2_55(self, client) -> None:
        body = {"flavor": {"description": "small and cheap"}}
        early = client.simulate_put("/v2.1/flavors/m1.small", json=body, headers=ADMIN)
        fault(early, 404, "itemNotFound")
        path, headers = "/v2.1/flavors/m1.small", at("2.55", ADMIN)
        done = client.simulate_put(path, json=body, headers=headers)
        assert done.status_code == 200, done.text
        assert done.json["flavor"]["description"] == "small and cheap"
        listed = client.simulate_get("/v2.1/flavors", headers=at("2.55", USER))
        brief = next(f for f in listed.json["flavors"] if f["id"] == "m1.small")
        assert set(brief) == {"id", "name", "links", "description"}
        assert brief["description"] == "small and cheap"
        old = client.simulate_get(path, headers=USER).json["flavor"]
        assert "description" not in old
        cleared = client.simulate_put(path, json={"flavor": {"description": None}}, headers=headers)
        assert cleared.json["flavor"]["description"] is None
        for bad in ({"flavor": {}}, {"flavor": {"description": "x", "name": "y"}}, {"x": 1},
                    {"flavor": {"description": "bell\x07"}}):  # fmt: skip
            fault(client.simulate_put(path, json=bad, headers=headers), 400, "badRequest")
        member = client.simulate_put(path, json=body, headers=at("2.55", USER))
        fault(member, 403, "forbidden")
        missing = client.simulate_put("/v2.1/flavors/nope", json=body, headers=headers)
        fault(missing, 404, "itemNotFound")

    def test_create_with_novas_fields(self, client) -> None:
        fields = {"swap": 1024, "OS-FLV-EXT-DATA:ephemeral": 5, "rxtx_factor": 2.5,
                  "description": "with disks"}  # fmt: skip
        created = create(client, headers=at("2.55", ADMIN), **fields)
        assert created.status_code == 200, created.text
        flavor = created.json["flavor"]
        assert flavor["swap"] == 1024 and flavor["OS-FLV-EXT-DATA:ephemeral"] == 5
        assert flavor["rxtx_factor"] == 2.5 and flavor["description"] == "with disks"
        shown = client.simulate_get("/v2.1/flavors/p1", headers=USER).json["flavor"]
        assert shown["swap"] == 1024 and "description" not in shown
        before = create(client, headers=at("2.54", ADMIN), description="x", id="p2")
        fault(before, 400, "badRequest")

    def test_swap_is_0_from_2_75(self, client) -> None:
        path = "/v2.1/flavors/m1.small"
        assert client.simulate_get(path, headers=at("2.74", USER)).json["flavor"][
            "swap"
        ] == ""  # fmt: skip
        assert client.simulate_get(path, headers=at("2.75", USER)).json["flavor"][
            "swap"
        ] == 0  # fmt: skip

    def test_extra_specs_in_views_from_2_61(self, client) -> None:
        path = "/v2.1/flavors/g1.gpu"
        late = client.simulate_get(path, headers=at("2.61", USER)).json["flavor"]
        assert late["extra_specs"] == {
            "resources:CUSTOM_GPU": "1", "trait:CUSTOM_FAST": "required"
        }  # fmt: skip
        early = client.simulate_get(path, headers=at("2.60", USER)).json["flavor"]
        assert "extra_specs" not in early
        detail = client.simulate_get("/v2.1/flavors/detail", headers=at("2.61", USER))
        assert all("extra_specs" in f for f in detail.json["flavors"])
        brief = client.simulate_get("/v2.1/flavors", headers=at("2.61", USER))
        assert all("extra_specs" not in f for f in brief.json["flavors"])

    def test_nova_names_boot(self, client, bus) -> None:
        fields = {"name": "Größe M+flavor", "id": "grosse m", "swap": 1536,
                  "OS-FLV-EXT-DATA:ephemeral": 2}  # fmt: skip
        created = create(client, **fields)
        assert created.status_code == 200, created.text
        assert created.json["flavor"]["name"] == "Größe M+flavor"
        assert boot(client, "grosse m").status_code == 202
        (request,) = bus.boots
        Names().boot_queue(request.scheduling_class)  # a queue can carry the class
        (group,) = request_groups(request.to_flavor())
        assert group.resources["DISK_GB"] == 1 + 2 + 2  # root, ephemeral, swap rounded up
        for bad in (" lead", "trail ", "tab\there", ""):
            fault(create(client, name=bad, id="p9"), 400, "badRequest")


class TestExtraSpecPut:
    PATH = "/v2.1/flavors/m1.small/os-extra_specs/hw:cpu_policy"

    def test_set_one(self, client) -> None:
        done = client.simulate_put(self.PATH, json={"hw:cpu_policy": "dedicated"}, headers=ADMIN)
        assert done.status_code == 200 and done.json == {"hw:cpu_policy": "dedicated"}
        shown = client.simulate_get(self.PATH, headers=USER)
        assert shown.json == {"hw:cpu_policy": "dedicated"}
        number = client.simulate_put(
            "/v2.1/flavors/m1.small/os-extra_specs/resources:VCPU",
            json={"resources:VCPU": 2}, headers=ADMIN,
        )  # fmt: skip
        assert number.json == {"resources:VCPU": "2"}

    @pytest.mark.parametrize(
        "body, words",
        [
            ({"hw:mem_page_size": "large"}, "Request body and URI mismatch"),
            ({}, ""),
            ({"hw:cpu_policy": "a", "hw:mem_page_size": "b"}, ""),
            ({"hw:cpu_policy": {"nested": 1}}, ""),
        ],
    )
    def test_refused(self, client, body, words) -> None:
        message = fault(client.simulate_put(self.PATH, json=body, headers=ADMIN), 400, "badRequest")
        assert words in message
        assert client.simulate_get(self.PATH, headers=USER).status_code == 404

    def test_checked_with_the_others(self, client) -> None:
        path = "/v2.1/flavors/m1.small/os-extra_specs/trait:CUSTOM_X"
        bad = client.simulate_put(path, json={"trait:CUSTOM_X": "maybe"}, headers=ADMIN)
        assert "required or forbidden" in fault(bad, 400, "badRequest")

    def test_only_admins(self, client) -> None:
        result = client.simulate_put(self.PATH, json={"hw:cpu_policy": "x"}, headers=USER)
        assert "os-flavor-extra-specs:update" in fault(result, 403, "forbidden")


class TestListings:
    @pytest.fixture
    def many(self, client) -> list[str]:
        made = []
        for n, (ram, disk) in enumerate([(512, 1), (1024, 10), (4096, 80)]):
            result = create(client, name=f"t{n}", id=f"t{n}", ram=ram, disk=disk)
            assert result.status_code == 200, result.text
            made.append(f"t{n}")
        return made

    def test_limit_marker_and_links(self, client, many) -> None:
        everything = ids(client.simulate_get("/v2.1/flavors", headers=USER))
        first = client.simulate_get("/v2.1/flavors?limit=2", headers=USER)
        assert ids(first) == everything[:2]
        (link,) = first.json["flavors_links"]
        assert link["rel"] == "next" and f"marker={everything[1]}" in link["href"]
        assert "/v2.1/flavors?" in link["href"] and "limit=2" in link["href"]
        query = link["href"].split("?", 1)[1]
        second = client.simulate_get("/v2.1/flavors", query_string=query, headers=USER)
        assert ids(second) == everything[2:4]
        detail = client.simulate_get("/v2.1/flavors/detail?limit=1", headers=USER)
        assert "/v2.1/flavors/detail?" in detail.json["flavors_links"][0]["href"]
        last = client.simulate_get(f"/v2.1/flavors?marker={everything[-1]}", headers=USER)
        assert ids(last) == [] and "flavors_links" not in last.json
        bad = client.simulate_get("/v2.1/flavors?marker=nope", headers=USER)
        assert fault(bad, 400, "badRequest") == "marker [nope] not found"

    def test_min_ram_and_disk(self, client, many) -> None:
        found = ids(client.simulate_get("/v2.1/flavors?minRam=1024&minDisk=10", headers=USER))
        assert "t0" not in found and {"t1", "t2"} <= set(found)
        found = ids(client.simulate_get("/v2.1/flavors/detail?minRam=4096", headers=USER))
        assert "t2" in found and "t1" not in found
        bad = client.simulate_get("/v2.1/flavors?minRam=lots", headers=USER)
        assert fault(bad, 400, "badRequest") == "Invalid minRam filter [lots]"

    def test_sort(self, client, many) -> None:
        by_ram = client.simulate_get("/v2.1/flavors/detail?sort_key=memory_mb&sort_dir=desc",
                                     headers=USER).json["flavors"]  # fmt: skip
        rams = [f["ram"] for f in by_ram]
        assert rams == sorted(rams, reverse=True)
        page = client.simulate_get(
            "/v2.1/flavors/detail?sort_key=memory_mb&sort_dir=desc&limit=2", headers=USER
        )
        marker = page.json["flavors"][-1]["id"]
        rest = client.simulate_get(
            f"/v2.1/flavors/detail?sort_key=memory_mb&sort_dir=desc&marker={marker}",
            headers=USER,
        ).json["flavors"]  # fmt: skip
        assert [f["ram"] for f in page.json["flavors"] + rest] == rams
        for query in ("sort_key=bogus", "sort_dir=sideways", "sort_key=created_at"):
            fault(client.simulate_get(f"/v2.1/flavors?{query}", headers=USER), 400, "badRequest")

    def test_unknown_parameters_from_2_75(self, client) -> None:
        path = "/v2.1/flavors?color=red"
        assert client.simulate_get(path, headers=at("2.74", USER)).status_code == 200
        late = client.simulate_get(path, headers=at("2.75", USER))
        assert "'color' was unexpected" in fault(late, 400, "badRequest")


# -- Nova's api_samples (the nova package ships them; nova itself is never imported) --

PLACEHOLDERS = {"flavor_id": "10", "flavorid": "10", "flavor_name": "test_flavor",
                "tenant_id": "6f70656e737461636b20342065766572", "value1": "shared",
                "value2": "1", "compute_endpoint": "http://x", "versioned_compute_endpoint":
                "http://x/v2.1"}  # fmt: skip


def sample(name: str) -> Any:
    """One of Nova's sample templates, its placeholders filled."""
    if SAMPLES is None or not (SAMPLES / name).exists():
        pytest.skip("Nova's api_samples are not installed (make install)")
    text = (SAMPLES / name).read_text()
    return json.loads(re.sub(r"%\((\w+)\)s", lambda m: PLACEHOLDERS[m.group(1)], text))


def carries(expected: Any, found: Any) -> None:
    """``found`` has every key of the sample ``expected``, each of the sample's type."""
    assert mismatches(found, expected) == []


def headers_at(dirname: str) -> dict[str, str]:
    """The admin at the sample directory's microversion (``v2.55`` or none: 2.1)."""
    return at(dirname[1:] if dirname else "2.1", ADMIN)


@pytest.mark.parametrize("folder", ["", "v2.55", "v2.61", "v2.75"])
def test_flavor_manage_samples(client, folder) -> None:
    where = f"flavor-manage/{folder}/" if folder else "flavor-manage/"
    headers = headers_at(folder)
    made = client.simulate_post(
        "/v2.1/flavors", json=sample(where + "flavor-create-post-req.json.tpl"), headers=headers
    )
    assert made.status_code == 200, made.text
    carries(sample(where + "flavor-create-post-resp.json.tpl"), made.json)
    if folder:
        path, body = "/v2.1/flavors/10", sample(where + "flavor-update-req.json.tpl")
        updated = client.simulate_put(path, json=body, headers=headers)
        assert updated.status_code == 200, updated.text
        carries(sample(where + "flavor-update-resp.json.tpl"), updated.json)


@pytest.mark.parametrize("folder", ["", "v2.55", "v2.61", "v2.75"])
def test_flavors_samples(client, folder) -> None:
    where, headers = (f"flavors/{folder}/" if folder else "flavors/"), headers_at(folder)
    body = {"flavor": {"name": "m1.small.description", "id": "10", "ram": 2048, "vcpus": 1,
                       "disk": 20, "extra_specs": {"hw:cpu_policy": "shared"}}}  # fmt: skip
    assert client.simulate_post("/v2.1/flavors", json=body, headers=ADMIN).status_code == 200
    shown = client.simulate_get("/v2.1/flavors/10", headers=headers)
    carries(sample(where + "flavor-get-resp.json.tpl"), shown.json)
    listed = client.simulate_get("/v2.1/flavors", headers=headers)
    carries(sample(where + "flavors-list-resp.json.tpl"), listed.json)
    if (SAMPLES is not None) and (SAMPLES / where / "flavors-detail-resp.json.tpl").exists():
        detail = client.simulate_get("/v2.1/flavors/detail", headers=headers)
        carries(sample(where + "flavors-detail-resp.json.tpl"), detail.json)


def test_flavor_access_samples(client) -> None:
    made = client.simulate_post(
        "/v2.1/flavors", json=sample("flavor-access/flavor-create-req.json.tpl"), headers=ADMIN
    )
    assert made.status_code == 200, made.text
    add = sample("flavor-access/flavor-access-add-tenant-req.json.tpl")
    added = client.simulate_post("/v2.1/flavors/10/action", json=add, headers=ADMIN)
    carries(sample("flavor-access/flavor-access-add-tenant-resp.json.tpl"), added.json)
    assert added.json["flavor_access"] == [
        {"flavor_id": "10", "tenant_id": PLACEHOLDERS["tenant_id"]}
    ]
    listed = client.simulate_get("/v2.1/flavors/10/os-flavor-access", headers=ADMIN)
    carries(sample("flavor-access/flavor-access-list-resp.json.tpl"), listed.json)
    remove = sample("flavor-access/flavor-access-remove-tenant-req.json.tpl")
    removed = client.simulate_post("/v2.1/flavors/10/action", json=remove, headers=ADMIN)
    carries(sample("flavor-access/flavor-access-remove-tenant-resp.json.tpl"), removed.json)
    # 2.7: the sample makes a public flavor, which may then not be granted
    public = sample("flavor-access/v2.7/flavor-create-req.json.tpl")
    public["flavor"].update(id="11", name="public_flavor")
    assert client.simulate_post("/v2.1/flavors", json=public, headers=ADMIN).status_code == 200
    late = client.simulate_post(
        "/v2.1/flavors/11/action",
        json=sample("flavor-access/v2.7/flavor-access-add-tenant-req.json.tpl"),
        headers=at("2.7", ADMIN),
    )
    fault(late, 409, "conflictingRequest")


def test_flavor_extra_specs_samples(client) -> None:
    path = "/v2.1/flavors/m1.small/os-extra_specs"
    create = sample("flavor-extra-specs/flavor-extra-specs-create-req.json.tpl")
    made = client.simulate_post(path, json=create, headers=ADMIN)
    assert made.status_code == 200, made.text
    carries(sample("flavor-extra-specs/flavor-extra-specs-create-resp.json.tpl"), made.json)
    listed = client.simulate_get(path, headers=USER)
    carries(sample("flavor-extra-specs/flavor-extra-specs-list-resp.json.tpl"), listed.json)
    one = client.simulate_get(f"{path}/hw:numa_nodes", headers=USER)
    carries(sample("flavor-extra-specs/flavor-extra-specs-get-resp.json.tpl"), one.json)
    update = sample("flavor-extra-specs/flavor-extra-specs-update-req.json.tpl")
    updated = client.simulate_put(f"{path}/hw:numa_nodes", json=update, headers=ADMIN)
    assert updated.status_code == 200, updated.text
    carries(sample("flavor-extra-specs/flavor-extra-specs-update-resp.json.tpl"), updated.json)


def test_grants_keep_classes_and_specs_drop_them(client, stores) -> None:
    """Agents decide on a class's definition: a change they never see (a grant, a
    description) keeps it; a change of what the flavor asks for drops it."""
    created = create(client, **{"os-flavor-access:is_public": False})
    assert created.status_code == 200
    assert boot(client, "p1", ADMIN).status_code == 202
    assert "p1" in stores.agents.classes()
    assert action(client, "p1", "addTenantAccess", "pa").status_code == 200
    body = {"flavor": {"description": "d"}}
    put = client.simulate_put("/v2.1/flavors/p1", json=body, headers=at("2.55", ADMIN))
    assert put.status_code == 200
    assert "p1" in stores.agents.classes()
    spec = {"hw:cpu_policy": "dedicated"}
    path = "/v2.1/flavors/p1/os-extra_specs/hw:cpu_policy"
    assert client.simulate_put(path, json=spec, headers=ADMIN).status_code == 200
    assert "p1" not in stores.agents.classes()


def test_configured_flavors_keep_the_grants_and_description(client, stores) -> None:
    body = {"addTenantAccess": {"tenant": "pa"}}
    path = "/v2.1/flavors/m1.small"
    granted = client.simulate_post(f"{path}/action", json=body, headers=at("2.6", ADMIN))
    assert granted.status_code == 200
    described = {"flavor": {"description": "d"}}
    assert client.simulate_put(path, json=described, headers=at("2.55", ADMIN)).json
    configured = Flavor("m1.small", 1, 2048, 20, "m1.small")  # as [api] flavor has it
    assert stores.flavors.put(configured) is False
    kept = stores.flavors.get("m1.small")
    assert kept.projects == {"pa"} and kept.description == "d"
    assert stores.flavors.put(dataclasses.replace(configured, ram_mb=4096)) is True
    changed = stores.flavors.get("m1.small")
    assert changed.ram_mb == 4096 and changed.projects == {"pa"} and changed.description == "d"
