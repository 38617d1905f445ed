"""qsched-api over two cells (:func:`qsched.api.app.create_cells_app`,
:func:`qsched.cells.opening.front_door`): every route answers across the cells as one cell would,
on fakeredis, a real Redis and a real three-master Redis Cluster.

The deployment is the one of tests/cells/test_cells_api.py (built by ``open_cells`` from
``[cells]`` options; zone ``az1`` is ``cell1``'s, ``az2`` is ``cell2``'s, one agent
of 8 VCPU in each); here a falcon test client calls the application built over it.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import falcon.testing
import pytest

from qsched import conf as qconf
from qsched import exception
from qsched.api import app as api_app
from qsched.cells import housekeeping, router
from qsched.cells.audit import audit_cells
from qsched.compute.parts import ID_BITS
from qsched.conf import APIOptions
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from tests.agents.test_agent import USER
from tests.cells.test_cells_api import (
    API_USER,
    Buses,
    Deployment,
    cells_options,
    deployment,
    ledger_url,
)
from tests.cells.test_cells_outage import down
from tests.helpers import wait_until
from tests.raw import DeadClient, redis_store

__all__ = ["deployment", "ledger_url"]  # fixtures, see tests.cells.test_cells_api

ADMIN = {"X-Auth-Token": "admin"}


@pytest.fixture
def client(conf, deployment: Deployment) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(
        api_app.create_cells_app(deployment.front, APIOptions.from_conf(conf))
    )


def boot(
    client: falcon.testing.TestClient,
    zone: str | None = None,
    name: str = "vm",
    headers: dict[str, str] | None = None,
    **server: Any,
) -> falcon.testing.Result:
    body = {"name": name, "flavorRef": "small", "imageRef": str(uuid.uuid4()), **server}
    if zone is not None:
        body["availability_zone"] = zone
    return client.simulate_post("/v2.1/servers", json={"server": body},
                                headers=headers or API_USER)  # fmt: skip


def booted(
    client: falcon.testing.TestClient, zone: str | None = None, name: str = "vm", **server: Any
) -> str:
    made = boot(client, zone, name, **server)
    assert made.status_code == 202, made.text
    return str(made.json["server"]["id"])


def clean(deployment: Deployment) -> None:
    """Every cell's ledger audit and the deployment's quota audit are clean."""
    deployment.mover.run_once()
    for cell in deployment.cells:
        report = audit(deployment.stores(cell))
        assert report.ok, report.to_dict()
    found = audit_cells(deployment.front)
    assert found["ok"], found


def pages(client: falcon.testing.TestClient, path: str, size: int, **query: str) -> list[str]:
    """Every server of a list, a page of ``size`` at a time from the last one's marker."""
    found: list[str] = []
    marker = None
    while True:
        params = {**query, "limit": str(size), **({"marker": marker} if marker else {})}
        page = client.simulate_get(path, params=params, headers=API_USER)
        assert page.status_code == 200, page.text
        servers = page.json["servers"]
        assert len(servers) <= size
        if not servers:
            return found
        found += [s["id"] for s in servers]
        marker = servers[-1]["id"]


# -- servers --


def test_boots_land_in_both_cells_and_every_read_answers_as_one_cell(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    names = ["e", "a", "d", "b", "c"]
    zones = ["az1", "az2", "az1", "az2", "az1"]
    uuids = [booted(client, zone, name) for zone, name in zip(zones, names, strict=True)]
    deployment.placed(uuids)
    assert [deployment.front.cell_of(u) for u in uuids] == [f"cell{z[-1]}" for z in zones]
    admin_view = {"OpenStack-API-Version": "compute 2.16", **ADMIN}
    for server, zone in zip(uuids, zones, strict=True):
        shown = client.simulate_get(f"/v2.1/servers/{server}", headers=admin_view)
        assert shown.status_code == 200, shown.text
        assert shown.json["server"]["status"] == "ACTIVE"
        assert shown.json["server"]["OS-EXT-AZ:availability_zone"] == zone
        assert shown.json["server"]["OS-EXT-SRV-ATTR:host"] == f"cell{zone[-1]}-cn0"
        assert shown.json["server"]["host_status"] == "UP"  # its cell's service
    records = [deployment.door.get(USER, u) for u in uuids]
    newest = [r.uuid for r in sorted(records, key=lambda r: (r.created_at, r.uuid), reverse=True)]
    assert pages(client, "/v2.1/servers", 2) == newest
    assert pages(client, "/v2.1/servers/detail", 2) == newest
    by_name = pages(client, "/v2.1/servers/detail", 2, sort_key="display_name", sort_dir="asc")
    assert by_name == [uuids[names.index(n)] for n in sorted(names)]
    every = client.simulate_get("/v2.1/servers", params={"all_tenants": "1"}, headers=ADMIN)
    assert [s["id"] for s in every.json["servers"]] == newest
    full = client.simulate_get("/v2.1/servers/detail", params={"limit": "2"}, headers=API_USER)
    assert "marker=" in full.json["servers_links"][0]["href"]
    bad = client.simulate_get("/v2.1/servers", params={"marker": str(uuid.uuid4())},
                              headers=API_USER)  # fmt: skip
    assert bad.status_code == 400, bad.text
    for missing in (str(uuid.uuid4()), "not-a-uuid"):
        gone = client.simulate_get(f"/v2.1/servers/{missing}", headers=API_USER)
        assert gone.status_code == 404 and "itemNotFound" in gone.json, gone.text
    theirs = client.simulate_get(f"/v2.1/servers/{uuids[1]}", headers={"X-Auth-Token": "bob:p9"})
    assert theirs.status_code == 404


def test_updates_metadata_actions_and_deletes_go_to_the_servers_cell(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    first, second = booted(client, "az1"), booted(client, "az2")
    deployment.placed([first, second])
    renamed = client.simulate_put(f"/v2.1/servers/{second}", json={"server": {"name": "new"}},
                                  headers=API_USER)  # fmt: skip
    assert renamed.status_code == 200 and renamed.json["server"]["name"] == "new"
    assert deployment.stores("cell2").instances.get(second).name == "new"
    meta = client.simulate_post(f"/v2.1/servers/{second}/metadata",
                                json={"metadata": {"k": "v"}}, headers=API_USER)  # fmt: skip
    assert meta.status_code == 200 and meta.json["metadata"] == {"k": "v"}
    item = client.simulate_get(f"/v2.1/servers/{second}/metadata/k", headers=API_USER)
    assert item.json == {"meta": {"k": "v"}}
    stop = client.simulate_post(f"/v2.1/servers/{first}/action", json={"os-stop": None},
                                headers=API_USER)  # fmt: skip
    assert stop.status_code == 202, stop.text
    stores = deployment.stores("cell1")
    assert wait_until(lambda: stores.instances.get(first).stopped, 10)
    actions = client.simulate_get(f"/v2.1/servers/{first}/os-instance-actions", headers=API_USER)
    assert [a["action"] for a in actions.json["instanceActions"]] == ["stop", "create"]
    request_id = actions.json["instanceActions"][0]["request_id"]
    one = client.simulate_get(f"/v2.1/servers/{first}/os-instance-actions/{request_id}",
                              headers=API_USER)  # fmt: skip
    assert one.status_code == 200 and one.json["instanceAction"]["action"] == "stop"
    for server in (first, second):
        assert (
            client.simulate_delete(f"/v2.1/servers/{server}", headers=API_USER).status_code == 204
        )
    for server, cell in ((first, "cell1"), (second, "cell2")):
        ended = deployment.stores(cell)
        assert wait_until(lambda s=server, e=ended: e.instances.get(s).state == State.DELETED, 10)
        assert client.simulate_get(f"/v2.1/servers/{server}", headers=API_USER).status_code == 404
    nowhere = str(uuid.uuid4())
    for method, path in (("DELETE", ""), ("PUT", ""), ("GET", "/metadata"), ("POST", "/action"),
                         ("GET", "/os-instance-actions")):  # fmt: skip
        body = {"PUT": {"server": {"name": "x"}}, "POST": {"os-start": None}}.get(method)
        found = client.simulate_request(method, f"/v2.1/servers/{nowhere}{path}", json=body,
                                        headers=API_USER)  # fmt: skip
        assert found.status_code == 404, (method, path, found.text)
    clean(deployment)


def test_a_multi_create_and_a_boot_without_a_zone(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    made = boot(client, "az2", min_count=2, max_count=3, return_reservation_id=True)
    assert made.status_code == 202, made.text
    reservation = made.json["reservation_id"]
    listed = client.simulate_get("/v2.1/servers", params={"reservation_id": reservation},
                                 headers=API_USER)  # fmt: skip
    members = [s["id"] for s in listed.json["servers"]]
    assert len(members) == 3
    assert {deployment.front.cell_of(m) for m in members} == {"cell2"}
    drawn = booted(client)  # a cell drawn by the room it has
    deployment.placed([*members, drawn])
    assert deployment.api.quota.get_usage("p1").instances == 4
    too_many = boot(client, "az1", min_count=2, max_count=3)  # one left of five
    assert too_many.status_code == 403, too_many.text
    unknown = client.simulate_post("/v2.1/servers", headers=API_USER, json={"server": {
        "name": "vm", "flavorRef": "no-such", "imageRef": str(uuid.uuid4())}})  # fmt: skip
    assert unknown.status_code == 400 and "no-such" in unknown.text, unknown.text
    assert boot(client, "az1", min_count=1001, max_count=1001).status_code == 400
    assert deployment.front.map.pending_count() == 0
    clean(deployment)


def test_a_project_at_its_limit_cannot_pass_it_by_booting_into_both_cells(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    """Twelve boots over HTTP at once, half into each cell, for a limit of five."""
    answers: list[falcon.testing.Result] = []
    lock = threading.Lock()

    def one(zone: str) -> None:
        found = boot(client, zone)
        with lock:
            answers.append(found)

    threads = [threading.Thread(target=one, args=(f"az{1 + n % 2}",)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [202] * 5 + [403] * 7, [a.text for a in answers if a.status_code != 202]
    accepted = [a.json["server"]["id"] for a in answers if a.status_code == 202]
    deployment.placed(accepted)
    assert deployment.live("cell1") + deployment.live("cell2") == 5
    limits = client.simulate_get("/v2.1/limits", headers=API_USER).json["limits"]["absolute"]
    assert (limits["maxTotalInstances"], limits["totalInstancesUsed"]) == (5, 5)
    clean(deployment)


# -- flavors, keypairs, quotas: the deployment's --


def test_a_flavor_created_over_http_is_bootable_in_both_cells(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    body = {"flavor": {"name": "made", "vcpus": 2, "ram": 1024, "disk": 0}}
    made = client.simulate_post("/v2.1/flavors", json=body, headers=ADMIN)
    assert made.status_code == 200, made.text
    flavor_id = made.json["flavor"]["id"]
    spec = client.simulate_post(f"/v2.1/flavors/{flavor_id}/os-extra_specs",
                                json={"extra_specs": {"hw:cpu_policy": "shared"}},
                                headers=ADMIN)  # fmt: skip
    assert spec.status_code == 200, spec.text
    for cell in deployment.cells.values():
        stored = cell.flavors.get(flavor_id)
        assert (stored.name, stored.vcpus, stored.extra_specs) == (
            "made",
            2,
            {"hw:cpu_policy": "shared"},
        )
    servers = [booted(client, zone, flavorRef=flavor_id) for zone in ("az1", "az2")]
    deployment.placed(servers)
    assert [deployment.door.get(USER, s).state for s in servers] == [State.ACTIVE] * 2
    assert client.simulate_delete(f"/v2.1/flavors/{flavor_id}", headers=ADMIN).status_code == 202
    for cell in deployment.cells.values():
        with pytest.raises(exception.FlavorNotFound):
            cell.flavors.get(flavor_id)
    again = client.simulate_delete(f"/v2.1/flavors/{flavor_id}", headers=ADMIN)
    assert again.status_code == 404  # as one cell answers a second delete
    clean(deployment)


def test_a_flavor_write_a_cell_misses_is_503_and_its_retry_completes_it(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    store = redis_store(deployment.stores("cell2"))
    live = store.client
    body = {"flavor": {"name": "late", "vcpus": 1, "ram": 512, "disk": 0, "id": "late"}}
    nameless = {"flavor": {"name": "nameless", "vcpus": 1, "ram": 512, "disk": 0}}
    store.client = DeadClient()  # type: ignore[assignment]
    try:
        down = client.simulate_post("/v2.1/flavors", json=body, headers=ADMIN)
        assert down.status_code == 503 and down.headers.get("Retry-After"), down.text
        made_here = client.simulate_post("/v2.1/flavors", json=nameless, headers=ADMIN)
        assert made_here.status_code == 503
    finally:
        store.client = live
    assert deployment.cells["cell1"].flavors.get("late").name == "late"  # its id was given
    assert "nameless" not in {f.name for f in deployment.cells["cell1"].flavors.list()}
    retried = client.simulate_post("/v2.1/flavors", json=body, headers=ADMIN)
    assert retried.status_code == 200, retried.text
    assert deployment.cells["cell2"].flavors.get("late").name == "late"
    assert client.simulate_post("/v2.1/flavors", json=nameless, headers=ADMIN).status_code == 200
    taken = {**body["flavor"], "vcpus": 4}  # the same id, another flavor: a conflict
    clash = client.simulate_post("/v2.1/flavors", json={"flavor": taken}, headers=ADMIN)
    assert clash.status_code == 409, clash.text


def test_a_keypair_created_over_http_boots_in_both_cells(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    made = client.simulate_post("/v2.1/os-keypairs", json={"keypair": {"name": "k1"}},
                                headers=API_USER)  # fmt: skip
    assert made.status_code == 200, made.text
    public_key = made.json["keypair"]["public_key"]
    assert "PRIVATE KEY" in made.json["keypair"]["private_key"]
    for cell in deployment.cells.values():
        assert cell.stores.keypairs.get("alice", "k1").public_key == public_key
    servers = [booted(client, zone, key_name="k1") for zone in ("az1", "az2")]
    deployment.placed(servers)
    for server in servers:
        shown = client.simulate_get(f"/v2.1/servers/{server}", headers=API_USER)
        assert shown.json["server"]["key_name"] == "k1"
        assert shown.json["server"]["status"] == "ACTIVE"
    listed = client.simulate_get("/v2.1/os-keypairs", headers=API_USER).json["keypairs"]
    assert [k["keypair"]["name"] for k in listed] == ["k1"]
    assert client.simulate_delete("/v2.1/os-keypairs/k1", headers=API_USER).status_code == 202
    for cell in deployment.cells.values():
        with pytest.raises(exception.KeypairNotFound):
            cell.stores.keypairs.get("alice", "k1")
    assert client.simulate_delete("/v2.1/os-keypairs/k1", headers=API_USER).status_code == 404
    assert boot(client, "az2", key_name="k1").status_code == 400
    clean(deployment)


def test_a_keypair_a_cell_misses_is_503_and_taken_back_or_completed(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    """A generated keypair is taken back from the cells that kept it (a retry makes a
    new key); an imported one is completed by its retry."""
    made = client.simulate_post("/v2.1/os-keypairs", json={"keypair": {"name": "ssh"}},
                                headers=API_USER)  # fmt: skip
    imported = {"keypair": {"name": "mine", "public_key": made.json["keypair"]["public_key"]}}
    client.simulate_delete("/v2.1/os-keypairs/ssh", headers=API_USER)
    store = redis_store(deployment.stores("cell2"))
    live = store.client
    store.client = DeadClient()  # type: ignore[assignment]
    try:
        down = client.simulate_post("/v2.1/os-keypairs", json={"keypair": {"name": "gen"}},
                                    headers=API_USER)  # fmt: skip
        assert down.status_code == 503
        half = client.simulate_post("/v2.1/os-keypairs", json=imported, headers=API_USER)
        assert half.status_code == 503
    finally:
        store.client = live
    cell1 = deployment.stores("cell1").keypairs
    assert [k.name for k in cell1.list_user("alice")] == ["mine"]
    assert client.simulate_post("/v2.1/os-keypairs", json=imported,
                                headers=API_USER).status_code == 200  # fmt: skip
    assert deployment.stores("cell2").keypairs.get("alice", "mine").public_key == (
        imported["keypair"]["public_key"])  # fmt: skip


def test_flavor_and_keypair_reads_answer_from_the_next_cell_when_the_first_does_not(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    """Every cell holds the same flavors and keypairs: with cell1's ledger down, a
    flavor's show, list, extra specs and access, and a keypair's show and list, are
    read from cell2 (200, not 503); with both down they are 503."""
    made = client.simulate_post("/v2.1/os-keypairs", json={"keypair": {"name": "k1"}},
                                headers=API_USER)  # fmt: skip
    assert made.status_code == 200, made.text
    private = {"name": "private", "vcpus": 1, "ram": 512, "disk": 0, "id": "private",
               "os-flavor-access:is_public": False}  # fmt: skip
    assert client.simulate_post("/v2.1/flavors", json={"flavor": private},
                                headers=ADMIN).status_code == 200  # fmt: skip
    shared = client.simulate_post("/v2.1/flavors/private/action", headers=ADMIN,
                                  json={"addTenantAccess": {"tenant": "p1"}})  # fmt: skip
    assert shared.status_code == 200, shared.text
    reads = {
        "/v2.1/flavors/small": lambda j: j["flavor"]["name"] == "small",
        "/v2.1/flavors?is_public=None": lambda j: {f["name"] for f in j["flavors"]} >= {
            "small", "private"},
        "/v2.1/flavors/private/os-extra_specs": lambda j: j["extra_specs"] == {},
        "/v2.1/flavors/private/os-flavor-access": lambda j: [
            a["tenant_id"] for a in j["flavor_access"]] == ["p1"],
        "/v2.1/os-keypairs/k1": lambda j: j["keypair"]["public_key"] == (
            made.json["keypair"]["public_key"]),
        "/v2.1/os-keypairs": lambda j: [k["keypair"]["name"] for k in j["keypairs"]] == ["k1"],
    }  # fmt: skip
    with down("cell1", deployment):
        for path, right in reads.items():
            answer = client.simulate_get(path, headers=ADMIN if "flavor" in path else API_USER)
            assert answer.status_code == 200 and right(answer.json), (path, answer.text)
        with down("cell2", deployment):
            for path in reads:
                answer = client.simulate_get(path, headers=ADMIN if "flavor" in path else API_USER)
                assert answer.status_code == 503, (path, answer.text)
    client.simulate_delete("/v2.1/os-keypairs/k1", headers=API_USER)
    client.simulate_delete("/v2.1/flavors/private", headers=ADMIN)
    clean(deployment)


def test_quotas_are_the_deployments_and_every_cell_checks_them(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    body = {"quota_set": {"key_pairs": 1, "metadata_items": 1, "instances": 3}}
    changed = client.simulate_put("/v2.1/os-quota-sets/p1", json=body, headers=ADMIN)
    assert changed.status_code == 200, changed.text
    shown = client.simulate_get("/v2.1/os-quota-sets/p1", headers=ADMIN).json["quota_set"]
    assert (shown["key_pairs"], shown["metadata_items"], shown["instances"]) == (1, 1, 3)
    for cell in deployment.cells.values():
        assert cell.stores.quota.limits("p1")["instances"] == -1  # the cell's own: unlimited
    first = client.simulate_post("/v2.1/os-keypairs", json={"keypair": {"name": "a"}},
                                 headers=API_USER)  # fmt: skip
    assert first.status_code == 200
    second = client.simulate_post("/v2.1/os-keypairs", json={"keypair": {"name": "b"}},
                                  headers=API_USER)  # fmt: skip
    assert second.status_code == 403, second.text
    server = booted(client, "az2", metadata={"a": "1"})
    deployment.placed([server])
    more = client.simulate_post(f"/v2.1/servers/{server}/metadata",
                                json={"metadata": {"b": "2"}}, headers=API_USER)  # fmt: skip
    assert more.status_code == 403, more.text
    assert [boot(client, "az1").status_code for _ in range(3)] == [202, 202, 403]
    defaults = {"quota_class_set": {"instances": 7}}
    assert client.simulate_put("/v2.1/os-quota-class-sets/default", json=defaults,
                               headers=ADMIN).status_code == 200  # fmt: skip
    assert deployment.api.quota.default_limits()["instances"] == 7
    for cell in deployment.cells.values():
        assert cell.stores.quota.default_limits()["instances"] == -1


# -- the operators' views --


def test_hypervisors_services_and_zones_are_every_cells_with_ids_of_their_own(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    listed = client.simulate_get("/v2.1/os-hypervisors", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    found = {h["hypervisor_hostname"]: h["id"] for h in listed.json["hypervisors"]}
    assert len(found) == 2, found
    ids = [h["id"] for h in listed.json["hypervisors"]]
    assert len(set(ids)) == 2 and ids == sorted(ids)
    assert ids[0] >> ID_BITS == 0 and ids[1] >> ID_BITS == 1
    for name, hypervisor_id in found.items():
        one = client.simulate_get(f"/v2.1/os-hypervisors/{hypervisor_id}", headers=ADMIN)
        assert one.json["hypervisor"]["hypervisor_hostname"] == name
    paged = {"OpenStack-API-Version": "compute 2.33", **ADMIN}
    page = client.simulate_get("/v2.1/os-hypervisors", params={"limit": "1"}, headers=paged)
    assert [h["id"] for h in page.json["hypervisors"]] == ids[:1]
    rest = client.simulate_get("/v2.1/os-hypervisors", headers=paged,
                               params={"limit": "1", "marker": str(ids[0])})  # fmt: skip
    assert [h["id"] for h in rest.json["hypervisors"]] == ids[1:]
    by_uuid = {"OpenStack-API-Version": "compute 2.53", **ADMIN}
    uuids = [h["id"] for h in client.simulate_get("/v2.1/os-hypervisors",
                                                  headers=by_uuid).json["hypervisors"]]  # fmt: skip
    after = client.simulate_get("/v2.1/os-hypervisors", headers=by_uuid,
                                params={"marker": uuids[0]})  # fmt: skip
    assert [h["id"] for h in after.json["hypervisors"]] == uuids[1:]
    assert client.simulate_get(f"/v2.1/os-hypervisors/{uuids[1]}",
                               headers=by_uuid).status_code == 200  # fmt: skip
    stats = client.simulate_get("/v2.1/os-hypervisors/statistics", headers=ADMIN)
    assert stats.json["hypervisor_statistics"]["count"] == 2
    assert stats.json["hypervisor_statistics"]["vcpus"] == 16
    services = client.simulate_get("/v2.1/os-services", headers=ADMIN).json["services"]
    assert sorted(s["host"] for s in services) == ["cell1-cn0", "cell2-cn0"]
    assert len({s["id"] for s in services}) == 2
    zones = client.simulate_get("/v2.1/os-availability-zone", headers=API_USER)
    shown = {z["zoneName"]: z["zoneState"]["available"] for z in zones.json["availabilityZoneInfo"]}
    assert shown == {"az1": True, "az2": True}
    detail = client.simulate_get("/v2.1/os-availability-zone/detail", headers=ADMIN)
    hosts = {z["zoneName"]: sorted(z["hosts"] or {}) for z in detail.json["availabilityZoneInfo"]}
    assert hosts == {"az1": ["cell1-cn0"], "az2": ["cell2-cn0"]}
    disable = {"host": "cell2-cn0", "binary": "nova-compute"}
    assert client.simulate_put("/v2.1/os-services/disable", json=disable,
                               headers=ADMIN).status_code == 200  # fmt: skip
    assert deployment.stores("cell2").agents.service("cell2-cn0").disabled
    nowhere = {"host": "no-such", "binary": "nova-compute"}
    assert client.simulate_put("/v2.1/os-services/enable", json=nowhere,
                               headers=ADMIN).status_code == 404  # fmt: skip
    zones = client.simulate_get("/v2.1/os-availability-zone", headers=API_USER)
    shown = {z["zoneName"]: z["zoneState"]["available"] for z in zones.json["availabilityZoneInfo"]}
    assert shown == {"az1": True, "az2": False}  # its one service is disabled, as Nova


def test_a_same_host_hint_goes_to_its_servers_cell(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    first = booted(client, "az2")
    deployment.placed([first])
    hinted = client.simulate_post("/v2.1/servers", headers=API_USER, json={
        "server": {"name": "vm", "flavorRef": "small", "imageRef": str(uuid.uuid4())},
        "os:scheduler_hints": {"same_host": first}})  # fmt: skip
    assert hinted.status_code == 202, hinted.text
    second = hinted.json["server"]["id"]
    deployment.placed([second])
    assert deployment.front.cell_of(second) == "cell2"
    assert deployment.door.get(USER, second).host == "cell2-cn0"
    other_zone = client.simulate_post("/v2.1/servers", headers=API_USER, json={
        "server": {"name": "vm", "flavorRef": "small", "imageRef": str(uuid.uuid4()),
                   "availability_zone": "az1"},
        "os:scheduler_hints": {"same_host": first}})  # fmt: skip
    assert other_zone.status_code == 400 and "cell2" in other_zone.text, other_zone.text
    clean(deployment)


def test_a_requested_host_goes_to_its_cell_found_by_its_host_mapping(
    deployment: Deployment, client: falcon.testing.TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Microversion 2.74's ``host``: the first boot asks the cells which has the host and
    maps it (host-map); the next reads the mapping alone."""
    asked: list[str] = []
    has_host = router.has_host
    monkeypatch.setattr(router, "has_host", lambda compute, host: asked.append(host)
                        or has_host(compute, host))  # fmt: skip
    headers = {"OpenStack-API-Version": "compute 2.74", **ADMIN}
    body = {"server": {"name": "vm", "flavorRef": "small", "imageRef": str(uuid.uuid4()),
                       "host": "cell2-cn0", "networks": "none"}}  # fmt: skip
    servers = []
    for _ in range(2):
        made = client.simulate_post("/v2.1/servers", headers=headers, json=body)
        assert made.status_code == 202, made.text
        servers.append(made.json["server"]["id"])
    assert 1 <= len(asked) <= 2  # the first boot only: cell1 (no), cell2 (yes)
    assert deployment.front.map.host_cell("cell2-cn0") == "cell2"
    deployment.placed(servers)
    assert {deployment.front.cell_of(s) for s in servers} == {"cell2"}
    clean(deployment)


def test_a_requested_host_whose_mapping_is_stale_is_looked_up_again_once(
    deployment: Deployment, client: falcon.testing.TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cell2-cn0's host mapping names cell1, as after a move: a 2.74 boot naming it,
    which cell1 refuses (and, with zone az2, the hints' check), asks every cell again,
    maps it to cell2 and is placed there; the refused attempt holds nothing. The next
    boot reads the mapping alone; a host no cell has is 400 as before."""
    headers = {"OpenStack-API-Version": "compute 2.74", **ADMIN}

    def boot_on(host: str, **more: str) -> falcon.testing.Result:
        body = {"name": "vm", "flavorRef": "small", "imageRef": str(uuid.uuid4()),
                "host": host, "networks": "none", **more}  # fmt: skip
        return client.simulate_post("/v2.1/servers", headers=headers, json={"server": body})

    asked: list[str] = []
    has_host = router.has_host
    monkeypatch.setattr(router, "has_host", lambda compute, host: asked.append(host)
                        or has_host(compute, host))  # fmt: skip
    servers = []
    for more in ({}, {"availability_zone": "az2"}):
        deployment.front.map.map_host("cell2-cn0", "cell1")  # stale
        made = boot_on("cell2-cn0", **more)
        assert made.status_code == 202, made.text
        servers.append(made.json["server"]["id"])
        assert deployment.front.map.host_cell("cell2-cn0") == "cell2"
    asked.clear()
    made = boot_on("cell2-cn0")
    assert made.status_code == 202 and asked == [], made.text
    servers.append(made.json["server"]["id"])
    deployment.placed(servers)
    assert {deployment.front.cell_of(s) for s in servers} == {"cell2"}
    cell2 = deployment.stores("cell2").instances
    assert {cell2.get(s).host for s in servers} == {"cell2-cn0"}
    assert deployment.api.quota.get_usage("admin").instances == 3  # the refused held nothing
    nowhere = boot_on("no-such-host")
    assert nowhere.status_code == 400 and "no-such-host" in nowhere.text, nowhere.text
    for server in servers:
        assert client.simulate_delete(f"/v2.1/servers/{server}", headers=ADMIN).status_code == 204
    assert wait_until(lambda: {cell2.get(s).state for s in servers} == {State.DELETED}, 10)
    clean(deployment)


def test_a_requested_node_goes_to_its_cell_found_by_its_node_mapping(
    deployment: Deployment, client: falcon.testing.TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Microversion 2.74's ``hypervisor_hostname``: the first boot asks the cells which
    has the node and maps it (node-map, apart from the host mappings); the next reads
    the mapping alone; a stale mapping is looked up again once. With cell1's ledger down,
    a boot naming cell2's node (mapped or not) is placed."""
    (node,) = [p.name for p in deployment.stores("cell2").ledger.list_providers()
               if p.parent_uuid is None]  # fmt: skip
    headers = {"OpenStack-API-Version": "compute 2.74", **ADMIN}
    body = {"server": {"name": "vm", "flavorRef": "small", "imageRef": str(uuid.uuid4()),
                       "hypervisor_hostname": node, "networks": "none"}}  # fmt: skip
    asked: list[str] = []
    has_node = router.has_node
    monkeypatch.setattr(router, "has_node", lambda compute, node: asked.append(node)
                        or has_node(compute, node))  # fmt: skip
    servers = []

    def boot_on_node(expected: int) -> None:
        asked.clear()
        made = client.simulate_post("/v2.1/servers", headers=headers, json=body)
        assert made.status_code == 202, made.text
        servers.append(made.json["server"]["id"])
        assert len(asked) == expected, asked
        assert deployment.front.map.node_cell(node) == "cell2"

    boot_on_node(2)  # cell1 (no), cell2 (yes)
    boot_on_node(0)  # the mapping alone
    assert deployment.front.map.host_cell(node) is None  # a node's mapping is not a host's
    deployment.front.map.map_node(node, "cell1")  # stale, as after a move
    boot_on_node(2)  # refused by cell1, looked up again
    with down("cell1", deployment):
        boot_on_node(0)
        deployment.front.map.map_node(node, "gone")  # a cell no line names: asked again
        boot_on_node(2)  # cell1 passed over
    deployment.placed(servers)
    cell2 = deployment.stores("cell2").instances
    assert {deployment.front.cell_of(s) for s in servers} == {"cell2"}
    assert {cell2.get(s).node for s in servers} == {node}
    assert deployment.api.quota.get_usage("admin").instances == len(servers)
    for server in servers:
        assert client.simulate_delete(f"/v2.1/servers/{server}", headers=ADMIN).status_code == 204
    assert wait_until(lambda: {cell2.get(s).state for s in servers} == {State.DELETED}, 10)
    clean(deployment)


# -- the entry point --


def test_the_api_service_serves_the_cells_when_cells_are_named(
    conf, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qsched-api's entry point with [cells], its [ledger] cell one of them: boots over
    HTTP reserve the deployment's quota and are mapped (before, this API served its
    [ledger] cell alone and refused boots, 409); a boot straight into a cell, which
    would not reserve it, is still refused (BootsNotServedHere)."""
    url = f"fakeredis://test-{uuid.uuid4().hex}"
    options = cells_options(url, f"t{uuid.uuid4().hex[:8]}", mover_interval_s=0)
    conf.set_override("cell", list(options.cell), group="cells")
    conf.set_override("zone", list(options.zone), group="cells")
    conf.set_override("api_url", url, group="cells")
    conf.set_override("mover_interval_s", 0, group="cells")
    conf.set_override("url", url, group="ledger")
    conf.set_override("cell", "cell1", group="ledger")
    conf.set_override("flavor", ["m1.tiny:1:512:0:1"], group="api")
    started: list[tuple] = []
    monkeypatch.setattr(qconf, "setup_logging", lambda conf: None)
    monkeypatch.setattr(
        housekeeping, "start_periodic_tasks", lambda *args: started.append(args) or []
    )
    app, bus = api_app.serve(conf, Buses(), ["127.0.0.1"])
    ((*_single_cell, front, _cells),) = started
    try:
        client = falcon.testing.TestClient(app)
        for name in ("cell1", "cell2"):  # [api] flavor in every cell
            assert front.cells[name].flavors.get("1").name == "m1.tiny"
        body = {"server": {"name": "vm", "flavorRef": "1", "imageRef": str(uuid.uuid4())}}
        made = client.simulate_post("/v2.1/servers", json=body, headers=API_USER)
        assert made.status_code == 202, made.text
        server = made.json["server"]["id"]
        cell, project = front.mapping(server)
        assert project == "p1" and front.cells[cell].stores.instances.get(server).name == "vm"
        assert front.api.quota.get_usage("p1").instances == 1
        assert client.simulate_get(f"/v2.1/servers/{server}", headers=API_USER).status_code == 200
        held = front.cells["cell1"].stores.quota.get_usage("p1")  # 1 if the boot went there
        with pytest.raises(exception.BootsNotServedHere):
            front.cells["cell1"].accept(USER, "vm", "1")
        assert front.cells["cell1"].stores.quota.get_usage("p1") == held  # nothing held
    finally:
        front.close()
        bus.close()


def test_one_cell_serves_as_before(conf) -> None:
    """No [cells]: the application is one cell's ComputeAPI, and aggregates and groups
    are served (the single-cell path is unchanged)."""
    from qsched.bus.kombu import KombuBus
    from qsched.ledger import open_stores

    stores = open_stores(qconf.Options.from_conf(conf).ledger,
                         url=f"fakeredis://test-{uuid.uuid4().hex}")  # fmt: skip
    bus = KombuBus("memory://", prefix=f"t{uuid.uuid4().hex[:8]}")
    try:
        client = falcon.testing.TestClient(api_app.create_app(stores, bus))
        assert client.simulate_get("/v2.1/os-aggregates", headers=ADMIN).status_code == 200
        assert client.simulate_get("/v2.1/os-server-groups", headers=ADMIN).status_code == 200
    finally:
        bus.close()
