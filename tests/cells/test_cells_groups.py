"""Server groups over two cells (:mod:`qsched.cells.groups`), over HTTP, on fakeredis, a
real Redis and a real three-master Redis Cluster: a group lives in the cell drawn at its
creation, found by its mapping in the API keyspace; its members boot there under its
policy; a project's ``server_groups`` limit holds across the cells and its
``server_group_members`` is the deployment's.

The deployment is the one of tests/cells/test_cells_api.py (zone ``az1`` is ``cell1``'s,
``az2`` is ``cell2``'s); the tests that need it add a second host to each cell.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import falcon.testing
import pytest

from qsched import exception
from qsched.cells.audit import audit_cells
from qsched.ledger.base import ServerGroup, State
from tests.agents.test_agent import USER, make_agent
from tests.cells.test_cells_api import API_USER, ZONES, Deployment, deployment, ledger_url
from tests.cells.test_cells_http import ADMIN, booted, clean, client
from tests.helpers import wait_until
from tests.raw import DeadClient, redis_store

__all__ = ["client", "deployment", "ledger_url"]  # fixtures

V264 = {"OpenStack-API-Version": "compute 2.64"}
OTHER = {"X-Auth-Token": "bob:p9", **V264}


@pytest.fixture
def two_hosts(conf, deployment: Deployment) -> Deployment:
    """The deployment with a second host in each cell (``cellN-cn1``, in its zone)."""
    for zone, name in ZONES.items():
        conf.set_override("availability_zone", zone, group="agent")
        agent = make_agent(conf, deployment.stores(name), deployment.bus(name), f"{name}-cn1",
                           nodes=1, vcpus=8, ram_mb=8192)  # fmt: skip
        deployment.agents.append(agent)
    return deployment


@pytest.fixture
def drawn(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Groups go to ``cell1``, ``cell2``, ``cell1``...: the draw made certain, so that a
    test's groups are in both cells. Yields nothing of use; the order is the contract."""
    order = itertools.cycle(ZONES.values())
    monkeypatch.setattr(deployment.front, "draw", lambda demand: next(order))
    yield "cell1"


def made(client: falcon.testing.TestClient, policy: str = "anti-affinity",
         headers: Mapping[str, str] = API_USER, **rules: Any) -> falcon.testing.Result:  # fmt: skip
    body: dict[str, Any] = {"name": f"g-{policy}", "policy": policy}
    if rules:
        body["rules"] = rules
    return client.simulate_post("/v2.1/os-server-groups", json={"server_group": body},
                                headers={**headers, **V264})  # fmt: skip


def group_of(client: falcon.testing.TestClient, **rules: Any) -> str:
    answer = made(client, **rules)
    assert answer.status_code == 200, answer.text
    return str(answer.json["server_group"]["id"])


def member(client: falcon.testing.TestClient, group: str, **server: Any) -> falcon.testing.Result:
    body = {"name": "m", "flavorRef": "small", "imageRef": str(uuid.uuid4()), **server}
    return client.simulate_post("/v2.1/servers", headers=API_USER, json={
        "server": body, "os:scheduler_hints": {"group": group}})  # fmt: skip


def cell_groups(deployment: Deployment, cell: str) -> dict[str, ServerGroup]:
    return {g.uuid: g for g in deployment.stores(cell).groups.list_all()}


def test_a_groups_members_boot_in_its_cell_under_its_policy(
    two_hosts: Deployment, client: falcon.testing.TestClient
) -> None:
    deployment = two_hosts
    groups = [group_of(client) for _ in range(4)]  # drawn by free VCPU
    for group in groups:
        found = deployment.front.map.group_mapping(group)
        assert found is not None and found[1] == "p1", found
        for cell in deployment.cells:  # in its cell, and only there
            assert (group in cell_groups(deployment, cell)) == (cell == found[0])
    group = groups[0]
    home = deployment.front.map.group_mapping(group)[0]  # type: ignore[index]
    pair = member(client, group, min_count=2, max_count=2, return_reservation_id=True)
    assert pair.status_code == 202, pair.text
    members = [s.uuid for s in deployment.stores(home).instances.list_project("p1")]
    assert len(members) == 2
    deployment.placed(members)
    hosts = sorted(deployment.door.get(USER, m).host or "" for m in members)
    assert hosts == [f"{home}-cn0", f"{home}-cn1"]  # anti-affinity: one a host
    alone = member(client, group)
    assert alone.status_code == 202, alone.text
    third = alone.json["server"]["id"]
    assert deployment.front.cell_of(third) == home
    wait_until(lambda: deployment.door.get(USER, third).state != State.BUILD, 3)
    assert deployment.door.get(USER, third).host is None  # no third host in its cell
    shown = client.simulate_get(f"/v2.1/os-server-groups/{group}", headers={**API_USER, **V264})
    assert shown.status_code == 200, shown.text
    assert sorted(shown.json["server_group"]["members"]) == sorted([*members, third])
    assert shown.json["server_group"]["policy"] == "anti-affinity"
    for server in [*members, third]:
        deployment.deleted(server)
    clean(deployment)


def test_a_group_hint_naming_another_cell_is_400_and_holds_nothing(
    deployment: Deployment, client: falcon.testing.TestClient, drawn: str
) -> None:
    group = group_of(client)  # in cell1
    away = booted(client, "az2")  # in cell2
    deployment.placed([away])
    zoned = member(client, group, availability_zone="az2")
    assert zoned.status_code == 400, zoned.text
    assert "cell1" in zoned.text and "cell2" in zoned.text and "az2" in zoned.text
    hinted = client.simulate_post("/v2.1/servers", headers=API_USER, json={
        "server": {"name": "m", "flavorRef": "small", "imageRef": str(uuid.uuid4())},
        "os:scheduler_hints": {"group": group, "same_host": away}})  # fmt: skip
    assert hinted.status_code == 400 and "several cells" in hinted.text, hinted.text
    unknown = member(client, str(uuid.uuid4()))
    assert unknown.status_code == 400 and "could not be found" in unknown.text, unknown.text
    theirs = made(client, headers=OTHER)
    assert theirs.status_code == 200
    foreign = member(client, theirs.json["server_group"]["id"])
    assert foreign.status_code == 400, foreign.text  # another project's group, as one cell
    assert deployment.api.quota.get_usage("p1").instances == 1
    assert deployment.front.map.pending_count() == 0
    clean(deployment)


def test_a_projects_group_quotas_hold_across_the_cells(
    deployment: Deployment, client: falcon.testing.TestClient, drawn: str
) -> None:
    body = {"quota_set": {"server_groups": 3, "server_group_members": 2}}
    assert client.simulate_put("/v2.1/os-quota-sets/p1", json=body,
                               headers=ADMIN).status_code == 200  # fmt: skip
    answers: list[falcon.testing.Result] = []
    lock = threading.Lock()

    def one() -> None:
        found = made(client)
        with lock:
            answers.append(found)

    group = group_of(client)  # cell1
    assert made(client).status_code == 200  # cell2: one place left
    threads = [threading.Thread(target=one) for _ in range(6)]  # drawn into both cells
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200] + [403] * 5, [a.text for a in answers]
    refused = next(a for a in answers if a.status_code == 403)
    assert "too many server groups" in refused.json["forbidden"]["message"]
    assert sum(len(cell_groups(deployment, cell)) for cell in deployment.cells) == 3
    usage = client.simulate_get("/v2.1/os-quota-sets/p1/detail", headers=ADMIN)
    assert usage.json["quota_set"]["server_groups"] == {"in_use": 3, "limit": 3, "reserved": 0}
    pair = member(client, group, min_count=2, max_count=2, return_reservation_id=True)
    assert pair.status_code == 202, pair.text  # the cell's own default would allow 10
    over = member(client, group)
    assert over.status_code == 403 and "too many servers in group" in over.text, over.text
    for server in deployment.stores("cell1").instances.list_project("p1"):
        deployment.deleted(server.uuid)
    gone = client.simulate_delete(f"/v2.1/os-server-groups/{group}", headers=API_USER)
    assert gone.status_code == 204, gone.text
    again = made(client)
    assert again.status_code == 200, again.text  # the deleted group's place came back
    assert made(client).status_code == 403
    clean(deployment)


def test_groups_list_show_and_delete_across_the_cells(
    deployment: Deployment, client: falcon.testing.TestClient, drawn: str
) -> None:
    groups = [group_of(client) for _ in range(4)]
    assert [deployment.front.map.group_mapping(g)[0] for g in groups] == [  # type: ignore[index]
        "cell1", "cell2", "cell1", "cell2"]  # fmt: skip
    theirs = made(client, headers=OTHER).json["server_group"]["id"]

    def listed(headers: Mapping[str, str] = API_USER, **query: str) -> list[str]:
        found = client.simulate_get("/v2.1/os-server-groups", params=query,
                                    headers={**headers, **V264})  # fmt: skip
        assert found.status_code == 200, found.text
        return [g["id"] for g in found.json["server_groups"]]

    assert listed() == groups  # oldest first, as one cell
    assert listed(limit="2") == groups[:2]
    assert listed(limit="2", offset="1") == groups[1:3]
    assert listed(offset="3") == groups[3:]
    assert listed(ADMIN, all_projects="1") == [*groups, theirs]
    assert listed(ADMIN) == []  # the admin's own project has none
    for group in groups:
        shown = client.simulate_get(f"/v2.1/os-server-groups/{group}", headers=API_USER)
        assert shown.status_code == 200 and shown.json["server_group"]["id"] == group
        assert shown.json["server_group"]["policies"] == ["anti-affinity"]
    hidden = client.simulate_get(f"/v2.1/os-server-groups/{theirs}", headers=API_USER)
    assert hidden.status_code == 404, hidden.text
    for missing in (str(uuid.uuid4()), "not-a-uuid"):
        gone = client.simulate_get(f"/v2.1/os-server-groups/{missing}", headers=API_USER)
        assert gone.status_code == 404 and "itemNotFound" in gone.json, gone.text
    assert client.simulate_delete(f"/v2.1/os-server-groups/{theirs}",
                                  headers=API_USER).status_code == 404  # fmt: skip
    for group in groups[:3]:
        deleted = client.simulate_delete(f"/v2.1/os-server-groups/{group}", headers=API_USER)
        assert deleted.status_code == 204, deleted.text
        assert deployment.front.map.group_mapping(group) is None
        again = client.simulate_delete(f"/v2.1/os-server-groups/{group}", headers=API_USER)
        assert again.status_code == 404
    assert listed() == groups[3:]
    assert deployment.front.map.counted_groups("p1") == {groups[3]}
    clean(deployment)


def test_a_group_create_its_cell_misses_is_settled_by_the_mover(
    deployment: Deployment, client: falcon.testing.TestClient, drawn: str
) -> None:
    """The cell does not answer the create: 503, the group stays mapped and counted,
    pending, until the mover keeps it (its cell has it) or gives it up (it has not)."""
    kept = group_of(client)  # cell1, confirmed
    store = redis_store(deployment.stores("cell2"))
    live = store.client
    store.client = DeadClient()  # type: ignore[assignment]
    try:
        down = made(client)  # drawn into cell2
        assert down.status_code == 503, down.text
    finally:
        store.client = live
    (lost,) = deployment.front.map.groups_pending_before(float("inf"))
    assert deployment.front.map.group_mapping(lost) == ("cell2", "p1")
    assert lost in deployment.front.map.counted_groups("p1")
    assert deployment.mover.run_once()["groups_settled"] == 0  # within its grace
    deployment.mover.pending_grace_s = 0
    assert deployment.mover.run_once()["groups_settled"] == 1
    assert deployment.front.map.group_mapping(lost) is None
    assert deployment.front.map.counted_groups("p1") == {kept}
    late = ServerGroup(lost, "late", "p1", "alice", "anti-affinity")
    with pytest.raises(exception.Conflict, match="abandoned"):
        deployment.stores("cell2").groups.create(late)
    # a group whose create reached its cell although its API was told otherwise is kept
    reached = ServerGroup(str(uuid.uuid4()), "reached", "p1", "alice", "affinity")
    deployment.front.map.map_group(reached.uuid, "cell1", "p1")
    deployment.stores("cell1").groups.create(reached)
    assert deployment.mover.run_once()["groups_settled"] == 1
    assert deployment.front.map.group_mapping(reached.uuid) == ("cell1", "p1")
    clean(deployment)


def test_the_audit_finds_a_group_without_its_mapping_and_a_mapping_without_its_group(
    deployment: Deployment, client: falcon.testing.TestClient, drawn: str
) -> None:
    group = group_of(client)
    assert audit_cells(deployment.front)["ok"]
    deployment.front.map.unmap_group(group, "p1")
    found = audit_cells(deployment.front)
    assert not found["ok"] and f"group {group} (p1): in cell1, mapped to None" in found["problems"]
    deployment.front.map.map_group(group, "cell1", "p1")
    deployment.front.map.confirm_groups([group])
    assert audit_cells(deployment.front)["ok"]
    deployment.stores("cell1").groups.delete(group)
    found = audit_cells(deployment.front)
    assert f"group {group} (p1): mapped to cell1, in no cell" in found["problems"]
    gone = client.simulate_delete(f"/v2.1/os-server-groups/{group}", headers=API_USER)
    assert gone.status_code == 404  # a delete cut short after its cell's step: completed
    assert audit_cells(deployment.front)["ok"]
