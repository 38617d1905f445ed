"""``qsched-admin cells adopt``: the server groups, aggregates and hosts a cell made
before it was served with others, carried over (:mod:`qsched.cells.adopt`), on
fakeredis, a real Redis and a real three-master Redis Cluster.

The deployment is the one of tests/cells/test_cells_api.py (one host in each cell,
``cell1-cn0`` and ``cell2-cn0``); what a cell "made alone" is written straight into
its keyspace, as its own API did before the front door served it.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import jsonschema
import pytest
from click.testing import CliRunner, Result

from qsched.admin import schemas
from qsched.admin.cli import cli
from qsched.cells import adopt as cells_adopt
from qsched.cells import aggregates as cells_aggregates
from qsched.cells.aggregates import aggregate_lock
from qsched.cells.audit import audit_cells
from qsched.ledger import Stores
from qsched.ledger.base import ServerGroup, State
from qsched.ledger.cellmap import RedisCellMap
from qsched.net import free_port
from tests.agents.test_agent import USER
from tests.cells.test_cells_api import API_USER, Deployment, deployment, ledger_url
from tests.cells.test_cells_http import ADMIN, clean, client
from tests.conftest import DURABILITY_LINE
from tests.helpers import wait_until

__all__ = ["client", "deployment", "ledger_url"]  # fixtures

V264 = {"OpenStack-API-Version": "compute 2.64"}
V241 = {"OpenStack-API-Version": "compute 2.41", **ADMIN}


def config(deployment: Deployment, tmp_path: Path, **urls: str) -> Path:
    """qsched-api's configuration of the deployment; ``urls``: a cell's (or ``api``'s)
    ledger URL replaced (one that does not answer)."""
    lines = []
    for line in deployment.options.cell:
        name, url, prefix = line.split()
        lines.append(f"cell = {name} {urls.get(name, url)} {prefix}\n")
    api = urls.get("api", deployment.options.api_url)
    path = tmp_path / "qsched.conf"
    path.write_text(f"[ledger]\nconnect_timeout_s = 0.2\n{DURABILITY_LINE}"
                    f"[cells]\napi_url = {api}\n" + "".join(lines))  # fmt: skip
    return path


def adopt(conf_file: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, ["--config-file", str(conf_file), "cells", "adopt", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def adopted(conf_file: Path, *args: str, code: int = 0) -> dict[str, Any]:
    """The command's JSON, held to its schema."""
    document: dict[str, Any] = json.loads(adopt(conf_file, "-f", "json", *args, code=code).stdout)
    jsonschema.validate(document, schemas.ADOPT)
    return document


def alone_group(stores: Stores, name: str = "solo") -> ServerGroup:
    """A group a cell made alone: in its keyspace, mapped nowhere."""
    return stores.groups.create(ServerGroup(str(uuid.uuid4()), name, "p1", "alice",
                                            "anti-affinity"))  # fmt: skip


def copies(deployment: Deployment, aggregate: int) -> dict[str, Any]:
    """Each cell's copy: cell -> (uuid, name, metadata, hosts), None where it has none."""
    found: dict[str, Any] = {}
    for name in deployment.cells:
        listed = {a.id: a for a in deployment.stores(name).aggregates.list()}
        copy = listed.get(aggregate)
        found[name] = copy and (copy.uuid, copy.name, dict(copy.metadata), sorted(copy.hosts))
    return found


def test_a_group_an_aggregate_and_hosts_a_cell_made_alone_are_adopted(
    deployment: Deployment, client: falcon.testing.TestClient, tmp_path: Path
) -> None:
    front = deployment.front
    quota = {"quota_set": {"server_groups": 1}}
    assert client.simulate_put("/v2.1/os-quota-sets/p1", json=quota,
                               headers=ADMIN).status_code == 200  # fmt: skip
    made = client.simulate_post(
        "/v2.1/os-server-groups",
        headers={**API_USER, **V264},
        json={"server_group": {"name": "g", "policy": "affinity"}},
    )
    assert made.status_code == 200, made.text
    cell2 = deployment.stores("cell2")
    group = alone_group(cell2)
    solo = cell2.aggregates.create("solo", "solo-az")
    cell2.aggregates.set_metadata(solo.id, {"ssd": "true"})
    cell2.aggregates.add_host(solo.id, "cell2-cn0")
    front.map.map_host("cell1-cn0", "cell2")  # a mapping the host left
    shown = client.simulate_get(f"/v2.1/os-server-groups/{group.uuid}", headers=API_USER)
    assert shown.status_code == 404  # listed, but not found
    before = audit_cells(front)["problems"]
    assert f"group {group.uuid} (p1): in cell2, mapped to None" in before
    assert f"aggregate {solo.id}: not in cell1" in before
    conf_file = config(deployment, tmp_path)

    dry = adopted(conf_file, "--dry-run")
    assert dry["dry_run"] and dry["complete"]
    assert [(g["uuid"], g["cell"]) for g in dry["groups"]] == [(group.uuid, "cell2")]
    assert dry["over_limit"] == [{"project_id": "p1", "server_groups": 2, "limit": 1}]
    (copy,) = dry["aggregates"]
    assert (copy["id"], copy["source"], copy["into"], copy["result"]) == (
        solo.id, "cell2", ["cell1"], "would copy")  # fmt: skip
    assert [(c["cell"], c["hosts_mapped"]) for c in dry["cells"]] == [("cell1", 1), ("cell2", 1)]
    assert audit_cells(front)["problems"] == before  # nothing written
    assert front.map.host_cell("cell2-cn0") is None and front.map.aggregate_seq() == 0

    done = adopted(conf_file)
    assert done["complete"] and done["over_limit"] == dry["over_limit"]
    assert done["aggregates"][0]["result"] == "copied"
    assert front.map.group_mapping(group.uuid) == ("cell2", "p1")
    assert group.uuid in front.map.counted_groups("p1")
    assert copies(deployment, solo.id) == {
        "cell1": (solo.uuid, "solo", {"availability_zone": "solo-az", "ssd": "true"}, []),
        "cell2": (solo.uuid, "solo", {"availability_zone": "solo-az", "ssd": "true"},
                  ["cell2-cn0"]),
    }  # fmt: skip
    assert front.map.aggregate_seq() >= solo.id
    assert [front.map.host_cell(f"{c}-cn0") for c in deployment.cells] == ["cell1", "cell2"]
    clean(deployment)

    shown = client.simulate_get(f"/v2.1/os-server-groups/{group.uuid}", headers=API_USER)
    assert shown.status_code == 200 and shown.json["server_group"]["name"] == "solo"
    usage = client.simulate_get("/v2.1/os-quota-sets/p1/detail", headers=ADMIN)
    assert usage.json["quota_set"]["server_groups"]["in_use"] == 2  # above its limit of 1
    over = client.simulate_post(
        "/v2.1/os-server-groups",
        headers={**API_USER, **V264},
        json={"server_group": {"name": "x", "policy": "affinity"}},
    )
    assert over.status_code == 403, over.text
    member = client.simulate_post("/v2.1/servers", headers=API_USER, json={
        "server": {"name": "m", "flavorRef": "small", "imageRef": str(uuid.uuid4())},
        "os:scheduler_hints": {"group": group.uuid}})  # fmt: skip
    assert member.status_code == 202, member.text
    server = member.json["server"]["id"]
    assert front.cell_of(server) == "cell2"
    assert wait_until(lambda: deployment.door.get(USER, server).state == State.ACTIVE, 10)
    assert deployment.door.get(USER, server).host == "cell2-cn0"
    listed = client.simulate_get(f"/v2.1/os-aggregates/{solo.id}", headers=V241)
    assert (listed.json["aggregate"]["uuid"], listed.json["aggregate"]["hosts"]) == (
        solo.uuid, ["cell2-cn0"])  # fmt: skip

    again = adopted(conf_file)  # nothing left to do: nothing written
    assert (again["groups"], again["aggregates"], again["over_limit"]) == ([], [], [])
    assert [c["hosts_mapped"] for c in again["cells"]] == [0, 0]
    assert again["aggregate_seq"]["before"] == again["aggregate_seq"]["after"]
    text = adopt(conf_file).stdout
    assert re.search(r"^cell cell2: [12] server groups, 0 adopted; 1 hosts, 0 mapped now$",
                     text, re.MULTILINE)  # fmt: skip
    assert "complete  yes" in text
    deployment.deleted(server)
    clean(deployment)


def test_a_colliding_aggregate_is_reported_with_its_fix_and_the_rest_adopted(
    deployment: Deployment, client: falcon.testing.TestClient, tmp_path: Path
) -> None:
    cell1, cell2 = deployment.stores("cell1"), deployment.stores("cell2")
    first = cell1.aggregates.create("a")  # id 1, as each cell alone numbers from 1
    other = cell2.aggregates.create("b")
    assert first.id == other.id
    dup1 = cell1.aggregates.create("dup", aggregate_id=5)
    dup2 = cell2.aggregates.create("dup", aggregate_id=7)
    fine = cell2.aggregates.create("fine", aggregate_id=8)
    conf_file = config(deployment, tmp_path)
    found = adopted(conf_file, code=1)
    assert not found["complete"]
    assert [(a["id"], a["into"], a["result"]) for a in found["aggregates"]] == [
        (fine.id, ["cell1"], "copied")]  # fmt: skip
    kinds = {c["kind"]: c for c in found["collisions"]}
    assert sorted(kinds) == ["id", "name"] and len(found["collisions"]) == 2
    assert [a["uuid"] for a in kinds["id"]["aggregates"]] == [first.uuid, other.uuid]
    assert "'b'" in kinds["id"]["fix"] and "in cell2 alone" in kinds["id"]["fix"]
    assert "openstack aggregate set --name <new name> 7" in kinds["name"]["fix"]
    assert found["aggregate_seq"]["after"] == fine.id
    assert copies(deployment, dup1.id)["cell2"] is None  # not copied while colliding
    text = adopt(conf_file, code=1)
    assert "aggregates not carried over" in text.stdout
    assert "2 aggregate collisions" in text.stderr and "cells adopt again" in text.stderr

    renamed = client.simulate_put(
        f"/v2.1/os-aggregates/{dup2.id}", headers=V241, json={"aggregate": {"name": "dup-2"}}
    )  # the fix
    assert renamed.status_code == 200, renamed.text
    fixed = adopted(conf_file, code=1)  # the id collision is left
    assert sorted(a["id"] for a in fixed["aggregates"]) == [dup1.id, dup2.id]
    assert [c["kind"] for c in fixed["collisions"]] == ["id"]
    assert copies(deployment, dup2.id)["cell1"] == (dup2.uuid, "dup-2", {}, [])
    cell2.aggregates.delete(other.id)  # the other fix: gone from its cell
    last = adopted(conf_file)
    assert last["complete"] and [a["id"] for a in last["aggregates"]] == [first.id]
    clean(deployment)


def meanwhile(monkeypatch: pytest.MonkeyPatch, write: Callable[[], object]) -> None:
    """The command's copies meet ``write`` of the front door between the command's read
    of the cells and its copy (just before it takes the aggregate's lock)."""
    taken = cells_adopt.aggregate_lock

    @contextlib.contextmanager
    def lock(*args: Any, **kwargs: Any) -> Iterator[None]:
        write()
        with taken(*args, **kwargs):
            yield

    monkeypatch.setattr(cells_adopt, "aggregate_lock", lock)


def test_an_aggregate_the_api_writes_meanwhile_is_never_undone(
    deployment: Deployment, client: falcon.testing.TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy is made under the aggregate's lock, which the front door's writes hold too:
    it waits for them, reads the cells again and never brings back what they deleted
    nor the name they changed; a create of the front door that meets a copy takes it."""
    cells = {name: deployment.stores(name) for name in deployment.cells}
    cell1, cell2 = cells["cell1"], cells["cell2"]
    kept, gone, renamed = (cell2.aggregates.create(n) for n in ("kept", "gone", "renamed"))

    def write() -> None:
        if gone.id in {a.id for a in cell2.aggregates.list()}:
            deleted = client.simulate_delete(f"/v2.1/os-aggregates/{gone.id}", headers=V241)
            assert deleted.status_code == 200, deleted.text
            changed = client.simulate_put(f"/v2.1/os-aggregates/{renamed.id}", headers=V241,
                                          json={"aggregate": {"name": "new"}})  # fmt: skip
            assert changed.status_code == 200, changed.text

    meanwhile(monkeypatch, write)
    report = cells_adopt.adopt(deployment.api, cells)
    results = {a["id"]: (a["result"], a["into"]) for a in report.aggregates}
    assert results == {kept.id: ("copied", ["cell1"]), gone.id: ("changed meanwhile", []),
                       renamed.id: ("copied", ["cell1"])}  # fmt: skip
    assert not report.complete and report.retry == [gone.id]
    assert copies(deployment, gone.id) == {"cell1": None, "cell2": None}  # not brought back
    assert copies(deployment, renamed.id)["cell1"] == (renamed.uuid, "new", {}, [])
    monkeypatch.undo()

    busy = cell2.aggregates.create("busy")
    monkeypatch.setattr(cells_aggregates, "AGGREGATE_WAIT_S", 0.05)
    with aggregate_lock(deployment.front.map, busy.id):  # a write of the front door
        taken = client.simulate_put(f"/v2.1/os-aggregates/{busy.id}", headers=V241,
                                    json={"aggregate": {"name": "x"}})  # fmt: skip
        assert taken.status_code == 409 and "another call" in taken.text, taken.text
        waited = cells_adopt.adopt(deployment.api, cells, lock_wait_s=0.05)
    assert [(a["id"], a["result"]) for a in waited.aggregates] == [(busy.id, "busy")]
    assert waited.retry == [busy.id] and copies(deployment, busy.id)["cell1"] is None
    assert cells_adopt.adopt(deployment.api, cells).complete
    again = cell1.aggregates.create("x", None, busy.id, busy.uuid)  # a create in flight
    assert (again.id, again.uuid, again.name) == (busy.id, busy.uuid, "busy")
    clean(deployment)


def test_a_group_deleted_while_it_is_adopted_keeps_no_mapping(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell2 = deployment.stores("cell2")
    gone, kept = alone_group(cell2, "gone"), alone_group(cell2, "kept")
    adopt_group = RedisCellMap.adopt_group

    def racing(self: RedisCellMap, uuid: str, *args: Any) -> Any:
        done = adopt_group(self, uuid, *args)
        if uuid == gone.uuid:
            cell2.groups.delete(uuid)  # its cell's own delete, meanwhile
        return done

    monkeypatch.setattr(RedisCellMap, "adopt_group", racing)
    cells = {name: deployment.stores(name) for name in deployment.cells}
    report = cells_adopt.adopt(deployment.api, cells)
    assert [g["uuid"] for g in report.groups] == [kept.uuid]
    assert deployment.front.map.group_mapping(gone.uuid) is None
    assert deployment.front.map.counted_groups("p1") == {kept.uuid}
    assert audit_cells(deployment.front)["ok"]


def test_a_cell_down_is_reported_and_passed_over_and_the_api_keyspace_down_stops_it(
    deployment: Deployment, tmp_path: Path
) -> None:
    group = alone_group(deployment.stores("cell1"))
    solo = deployment.stores("cell1").aggregates.create("solo")
    down = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    conf_file = config(deployment, tmp_path, cell2=down)
    found = adopted(conf_file, code=1)
    first, second = found["cells"]
    assert (first["cell"], first["error"], first["groups_adopted"]) == ("cell1", None, 1)
    assert second["cell"] == "cell2" and "Check [cells] cell cell2" in second["error"]
    assert "s3cret" not in json.dumps(found) and found["aggregates"] == []
    assert deployment.front.map.group_mapping(group.uuid) == ("cell1", "p1")
    failed = adopt(conf_file, code=1)
    assert "cell2 passed over" in failed.stderr
    assert copies(deployment, solo.id)["cell2"] is None  # waits for a run it answers
    whole = adopted(config(deployment, tmp_path))
    assert whole["complete"] and whole["aggregates"][0]["into"] == ["cell2"]
    api_down = adopt(config(deployment, tmp_path, api=down), code=1)
    assert "the API keyspace (Redis at redis://:***@" in api_down.stderr
    assert "Check [cells] api_url" in api_down.stderr and "s3cret" not in api_down.output
    clean(deployment)


def test_the_command_is_refused_without_cells(tmp_path: Path) -> None:
    single = tmp_path / "single.conf"
    single.write_text(f"[ledger]\nurl = fakeredis://alone\n{DURABILITY_LINE}")
    refused = adopt(single, "--dry-run", code=2)
    assert "cells adopt: the configuration" in refused.stderr
    assert "has no [cells] cell line" in refused.stderr
