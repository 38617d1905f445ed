"""Host aggregates over two cells (:mod:`qsched.cells.aggregates`), over HTTP, on
fakeredis, a real Redis and a real three-master Redis Cluster: every aggregate is in
every cell with one id and uuid, each cell's copy with that cell's hosts; a host's
changes go to its cell by its host mapping; a boot into an aggregate's zone goes to a
cell with hosts in it.

The deployment is the one of tests/cells/test_cells_api.py (one host in each cell,
``cell1-cn0`` and ``cell2-cn0``, whose agents registered zones ``az1`` and ``az2``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import falcon.testing

from qsched.cells.audit import audit_cells
from qsched.ledger.base import State
from tests.agents.test_agent import USER
from tests.cells.test_cells_api import Deployment, deployment, ledger_url
from tests.cells.test_cells_http import ADMIN, booted, clean, client
from tests.cells.test_cells_outage import down
from tests.helpers import wait_until
from tests.raw import DeadClient, redis_store

__all__ = ["client", "deployment", "ledger_url"]  # fixtures

V241 = {"OpenStack-API-Version": "compute 2.41", **ADMIN}
AGGREGATES = "/v2.1/os-aggregates"


def made(client: falcon.testing.TestClient, name: str, zone: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, **({"availability_zone": zone} if zone else {})}
    answer = client.simulate_post(AGGREGATES, json={"aggregate": body}, headers=V241)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json["aggregate"]
    return found


def act(client: falcon.testing.TestClient, aggregate: int, action: str,
        body: Mapping[str, Any]) -> falcon.testing.Result:  # fmt: skip
    return client.simulate_post(f"{AGGREGATES}/{aggregate}/action", json={action: body},
                                headers=V241)  # fmt: skip


def copies(deployment: Deployment, aggregate: int) -> dict[str, Any]:
    """Each cell's copy: cell -> (uuid, name, metadata, hosts)."""
    found = {}
    for name, compute in deployment.cells.items():
        copy = compute.aggregates.store.get(aggregate)
        found[name] = (copy.uuid, copy.name, dict(copy.metadata), sorted(copy.hosts))
    return found


def audited(deployment: Deployment) -> None:
    clean(deployment)
    assert audit_cells(deployment.front)["problems"] == []


def test_an_aggregate_over_http_holds_hosts_of_both_cells_and_steers_boots(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    agg = made(client, "both", "agz")
    aggregate, uuid = agg["id"], agg["uuid"]
    assert copies(deployment, aggregate) == {
        cell: (uuid, "both", {"availability_zone": "agz"}, []) for cell in deployment.cells
    }
    first = act(client, aggregate, "add_host", {"host": "cell1-cn0"})
    assert first.status_code == 200 and first.json["aggregate"]["hosts"] == ["cell1-cn0"]
    second = act(client, aggregate, "add_host", {"host": "cell2-cn0"})
    assert second.json["aggregate"]["hosts"] == ["cell1-cn0", "cell2-cn0"], second.text
    assert {cell: copy[3] for cell, copy in copies(deployment, aggregate).items()} == {
        "cell1": ["cell1-cn0"], "cell2": ["cell2-cn0"]}  # fmt: skip
    assert [deployment.front.map.host_cell(f"{c}-cn0") for c in deployment.cells] == [
        "cell1", "cell2"]  # fmt: skip
    shown = client.simulate_get(f"{AGGREGATES}/{aggregate}", headers=V241).json["aggregate"]
    assert (shown["id"], shown["uuid"], shown["hosts"]) == (
        aggregate, uuid, ["cell1-cn0", "cell2-cn0"])  # fmt: skip
    listed = client.simulate_get(AGGREGATES, headers=V241).json["aggregates"]
    assert [(a["id"], a["hosts"]) for a in listed] == [(aggregate, ["cell1-cn0", "cell2-cn0"])]
    meta = act(client, aggregate, "set_metadata", {"metadata": {"ssd": "true"}})
    assert meta.status_code == 200 and meta.json["aggregate"]["metadata"]["ssd"] == "true"
    renamed = client.simulate_put(f"{AGGREGATES}/{aggregate}", headers=V241,
                                  json={"aggregate": {"name": "renamed"}})  # fmt: skip
    assert renamed.status_code == 200 and renamed.json["aggregate"]["name"] == "renamed"
    for copy in copies(deployment, aggregate).values():
        assert copy[:3] == (uuid, "renamed", {"availability_zone": "agz", "ssd": "true"})

    def zone_hosts() -> list[str]:
        zones = client.simulate_get("/v2.1/os-availability-zone/detail", headers=ADMIN)
        found = {z["zoneName"]: z["hosts"] or {} for z in zones.json["availabilityZoneInfo"]}
        return sorted(found.get("agz", {}))

    assert wait_until(lambda: zone_hosts() == ["cell1-cn0", "cell2-cn0"], 5), zone_hosts()
    both = [booted(client, "agz") for _ in range(4)]
    deployment.placed(both)
    assert {deployment.door.get(USER, s).state for s in both} == {State.ACTIVE}
    for server in both:
        deployment.deleted(server)
    deployment.mover.run_once()  # their quota back in the API keyspace
    out = act(client, aggregate, "remove_host", {"host": "cell2-cn0"})
    assert out.status_code == 200 and out.json["aggregate"]["hosts"] == ["cell1-cn0"]
    only = [booted(client, "agz") for _ in range(5)]  # cell2 has no host in agz now
    deployment.placed(only)
    assert {deployment.front.cell_of(s) for s in only} == {"cell1"}
    assert {deployment.door.get(USER, s).host for s in only} == {"cell1-cn0"}
    for server in only:
        deployment.deleted(server)
    assert act(client, aggregate, "remove_host", {"host": "cell1-cn0"}).status_code == 200
    gone = client.simulate_delete(f"{AGGREGATES}/{aggregate}", headers=V241)
    assert gone.status_code == 200, gone.text
    for compute in deployment.cells.values():
        assert compute.aggregates.store.list() == []
    assert client.simulate_get(f"{AGGREGATES}/{aggregate}", headers=V241).status_code == 404
    audited(deployment)


def test_aggregate_refusals_answer_as_one_cell_and_leave_every_cell_alike(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    zoned = made(client, "zoned", "zc")["id"]
    plain = made(client, "plain")["id"]
    taken = client.simulate_post(AGGREGATES, json={"aggregate": {"name": "plain"}}, headers=V241)
    assert taken.status_code == 409, taken.text
    assert act(client, zoned, "add_host", {"host": "cell2-cn0"}).status_code == 200
    for host in ("cell1-cn0", "cell2-cn0"):
        assert act(client, plain, "add_host", {"host": host}).status_code == 200
    again = act(client, plain, "add_host", {"host": "cell1-cn0"})
    assert again.status_code == 409 and "already has host cell1-cn0" in again.text
    nowhere = act(client, plain, "add_host", {"host": "no-such-host"})
    assert nowhere.status_code == 404, nowhere.text
    absent = act(client, zoned, "remove_host", {"host": "cell1-cn0"})
    assert absent.status_code == 404 and "Cannot remove host cell1-cn0" in absent.text
    # cell1 takes the zone (its host has none other), cell2 refuses it (its host is in
    # zc): 400, and cell1 is put back as it was
    rezoned = client.simulate_put(f"{AGGREGATES}/{plain}", headers=V241,
                                  json={"aggregate": {"availability_zone": "zp"}})  # fmt: skip
    assert rezoned.status_code == 400 and "zc" in rezoned.text, rezoned.text
    meta = act(client, plain, "set_metadata", {"metadata": {"availability_zone": "zp"}})
    assert meta.status_code == 400, meta.text
    assert {copy[2].get("availability_zone") for copy in copies(deployment, plain).values()} == {
        None}  # fmt: skip
    member = {"X-Auth-Token": "alice:p1"}  # no admin: refused before anything is read
    for method, path, body in (
        ("PUT", f"{AGGREGATES}/999", {"aggregate": {"name": "x"}}),
        ("POST", f"{AGGREGATES}/999/action", {"add_host": {"host": "no-such-host"}}),
        ("POST", f"{AGGREGATES}/999/action", {"remove_host": {"host": "no-such-host"}}),
        ("POST", f"{AGGREGATES}/999/action", {"set_metadata": {"metadata": {"k": "v"}}}),
    ):
        refused = client.simulate_request(method, path, json=body, headers=member)
        assert refused.status_code == 403, (method, path, refused.text)
    full = client.simulate_delete(f"{AGGREGATES}/{plain}", headers=V241)
    assert full.status_code == 400 and "not empty" in full.text, full.text
    assert len(copies(deployment, plain)) == 2
    audited(deployment)
    # an id a cell gave itself alone is never given again to every cell
    solo = deployment.stores("cell2").aggregates.create("solo")
    problems = audit_cells(deployment.front)["problems"]
    assert f"aggregate {solo.id}: not in cell1" in problems
    after = made(client, "after")["id"]
    assert after > solo.id
    deployment.stores("cell2").aggregates.delete(solo.id)
    audited(deployment)


def test_an_aggregate_write_a_cell_misses_is_503_and_taken_back_or_completed(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    aggregate = made(client, "kept")["id"]
    store = redis_store(deployment.stores("cell2"))
    live = store.client
    store.client = DeadClient()  # type: ignore[assignment]
    try:
        lost = client.simulate_post(AGGREGATES, json={"aggregate": {"name": "lost"}}, headers=V241)
        assert lost.status_code == 503, lost.text
        half = act(client, aggregate, "set_metadata", {"metadata": {"k": "v"}})
        assert half.status_code == 503, half.text
    finally:
        store.client = live
    assert [a.name for a in deployment.cells["cell1"].aggregates.store.list()] == ["kept"]
    assert copies(deployment, aggregate)["cell2"][2] == {}
    retried = act(client, aggregate, "set_metadata", {"metadata": {"k": "v"}})
    assert retried.status_code == 200, retried.text
    assert {copy[2]["k"] for copy in copies(deployment, aggregate).values()} == {"v"}
    audited(deployment)


def test_with_the_first_cells_ledger_down_boots_into_an_aggregates_zone_go_to_the_other(
    deployment: Deployment, client: falcon.testing.TestClient
) -> None:
    """The request filters run on the first joined cell that answers, and a cell whose
    aggregates do not answer is passed over by the draw: cell1 down stops none of
    cell2's boots into a zone both cells' hosts are in (before, 503)."""
    aggregate = made(client, "both", "agz")["id"]
    for host in ("cell1-cn0", "cell2-cn0"):
        assert act(client, aggregate, "add_host", {"host": host}).status_code == 200
    with down("cell1", deployment):
        servers = [booted(client, "agz") for _ in range(3)]
    deployment.placed(servers)
    assert {deployment.front.cell_of(s) for s in servers} == {"cell2"}
    for server in servers:
        deployment.deleted(server)
    for host in ("cell1-cn0", "cell2-cn0"):
        assert act(client, aggregate, "remove_host", {"host": host}).status_code == 200
    audited(deployment)
