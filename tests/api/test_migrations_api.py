"""os-migrations and a server's migrations over HTTP (qsched.api.migrations): Nova's
shapes by microversion (its api_samples, as the installed nova package ships them), its
filters, paging and errors, its policies; and the front door's part over two cells.

The moves are made in the ledger straight (start, claim, finish), as the API and the
agents would make them; fakeredis and a real Redis, as ``stores`` gives them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from qsched import exception
from qsched.api import migrations as views
from qsched.compute.cell import Cell
from qsched.compute.migrations import MigrationFilter, MigrationsAPI, order
from qsched.compute.parts import Migrations
from qsched.conf import LedgerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import Inventory, Migration, MoveRequest
from qsched.ledger.base.migrations import LIVE_MIGRATION, MIGRATION
from qsched.policy import Policy
from qsched.scheduling.request import flavor_demand
from tests.api.test_api import ADMIN, OTHER, USER, app, at, bus, client, fault, post_server
from tests.compute.test_compute import RecordingBus, place
from tests.ledger.test_moves_ledger import Cloud
from tests.samples import SAMPLES, mismatches, needs_samples, samples_dir, shape

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

ADMIN_CONTEXT = RequestContext.for_project("admin", "admin", ("admin", "member", "reader"))
#: what qsched shows null where Nova's samples show a value (its schemas allow null)
NULLS = (
    "dest_host", "old_instance_type_id", "new_instance_type_id",
    *(f"{part}_{amount}_bytes" for part in ("memory", "disk")
      for amount in ("total", "processed", "remaining")),
)  # fmt: skip


# -- a small cloud: servers of alice (project pa) on cn1, destinations on cn2 --


def server(client, stores: Stores, host: str = "cn1") -> str:
    made = post_server(client)
    assert made.status_code == 202, made.text
    found: str = made.json["server"]["id"]
    place(stores, found, host)
    stores.agents.heartbeat(host, 3600)
    return found


def start(stores: Stores, instance: str, kind: str = MIGRATION, user: str = "admin") -> str:
    mig = str(uuid.uuid4())
    request = MoveRequest(instance, mig, kind, f"req-{mig}", user, "admin", time.time() + 600)
    stores.migrations.start(request)
    return mig


def claim(stores: Stores, mig: str, host: str = "cn2") -> str:
    """The destination ``host`` claims the move, on a provider of its own."""
    rp = str(uuid.uuid4())
    stores.ledger.create_provider(rp, f"{host}-{rp[:8]}")
    stores.ledger.set_inventory(rp, 0, {"VCPU": Inventory(64), "MEMORY_MB": Inventory(65536),
                                        "DISK_GB": Inventory(10_000)})  # fmt: skip
    stores.agents.heartbeat(host, 3600)
    instance = stores.instances.get(stores.migrations.get(mig).instance_uuid)
    demand = flavor_demand(Flavor.from_dict(instance.flavor))
    return stores.migrations.claim(mig, {rp: demand}, host, f"{host}-n1").status


def moves(client, stores: Stores) -> dict[str, Any]:
    """A cold migration claimed on cn2 (``migrating``), then a live migration of another
    server whose destination is ready (``running``): the oldest first."""
    cold_vm, live_vm = server(client, stores), server(client, stores)
    cold = start(stores, cold_vm)
    assert claim(stores, cold) == "migrating"
    live = start(stores, live_vm, LIVE_MIGRATION, user="admin-2")
    assert claim(stores, live) == "preparing"
    assert stores.migrations.finish(live, "cn2") == "running"
    return {"cold": cold, "live": live, "cold_vm": cold_vm, "live_vm": live_vm,
            "ids": {m: stores.migrations.get(m).id for m in (cold, live)}}  # fmt: skip


def listed(client, version: str = "2.1", query: str | None = None, headers=ADMIN) -> Any:
    result = client.simulate_get("/v2.1/os-migrations", headers=at(version, headers),
                                 query_string=query)  # fmt: skip
    assert result.status_code == 200, result.text
    return result.json


def uuids(body: Any) -> list[str]:
    return [m["uuid"] for m in body["migrations"]]


# -- os-migrations --


def test_os_migrations_lists_every_move_newest_first_in_novas_fields(client, stores) -> None:
    made = moves(client, stores)
    plain = listed(client)["migrations"]
    assert [m["id"] for m in plain] == [made["ids"][made["live"]], made["ids"][made["cold"]]]
    live, cold = plain
    assert set(cold) == {
        "created_at", "dest_compute", "dest_host", "dest_node", "id", "instance_uuid",
        "new_instance_type_id", "old_instance_type_id", "source_compute", "source_node",
        "status", "updated_at",
    }  # fmt: skip
    hosts = ("source_compute", "source_node", "dest_compute", "dest_node", "dest_host")
    assert [cold[key] for key in hosts] == ["cn1", "cn1-n1", "cn2", "cn2-n1", None]
    assert cold["status"] == "migrating"
    assert cold["instance_uuid"] == made["cold_vm"] and live["status"] == "running"
    # the test flavors' ids are names, not Nova's integers
    assert cold["old_instance_type_id"] is None and cold["new_instance_type_id"] is None
    assert len(cold["created_at"]) == len("2016-01-29T13:42:02.000000")
    live, cold = listed(client, "2.23")["migrations"]
    assert (live["migration_type"], cold["migration_type"]) == ("live-migration", "migration")
    assert "links" not in cold  # only a live migration in progress links to itself
    path = f"/servers/{made['live_vm']}/migrations/{live['id']}"
    assert live["links"] == [
        {"rel": "self", "href": f"http://falconframework.org/v2.1{path}"},
        {"rel": "bookmark", "href": f"http://falconframework.org{path}"},
    ]
    assert "uuid" not in live
    assert uuids(listed(client, "2.59")) == [made["live"], made["cold"]]


def test_os_migrations_filters_as_novas_query(client, stores) -> None:
    made = moves(client, stores)
    live, cold = made["live"], made["cold"]

    def found(query: str, version: str = "2.59") -> list[str]:
        return uuids(listed(client, version, query))

    assert found("host=cn2") == [live, cold]  # the destination
    assert found("host=cn1") == [live, cold]  # the source
    assert found("host=cn3") == []
    assert found("host=cn3&source_compute=cn1") == []  # host wins, as in Nova
    assert found("source_compute=cn1") == [live, cold]
    assert found("source_compute=cn2") == []
    assert found("status=running") == [live]
    assert found("status=error&status=migrating") == [cold]  # given twice: the last one
    assert found(f"instance_uuid={made['cold_vm']}") == [cold]
    assert found(f"instance_uuid={made['cold_vm']}&status=running") == []
    assert found("migration_type=live-migration") == [live]
    assert found("migration_type=resize") == []
    assert found("hidden=0") == [live, cold]
    assert found("hidden=1") == []  # qsched hides none
    maybe = client.simulate_get("/v2.1/os-migrations", headers=ADMIN, query_string="hidden=maybe")
    message = fault(maybe, 400, "badRequest")
    assert message.startswith("Invalid input for query parameters hidden")
    assert found("changes-since=2100-01-01T00:00:00Z") == []
    assert found("changes-since=2000-01-01T00:00:00") == [live, cold]
    assert found("changes-before=2000-01-01T00:00:00Z", "2.66") == []
    assert found("changes-before=2100-01-01T00:00:00%2B02:00", "2.66") == [live, cold]


def test_os_migrations_pages_by_uuid_from_2_59(client, stores) -> None:
    made = moves(client, stores)
    page = listed(client, "2.59", "limit=1")
    assert uuids(page) == [made["live"]]
    (link,) = page["migrations_links"]
    assert link["rel"] == "next"
    assert link["href"] == (
        f"http://falconframework.org/v2.1/os-migrations?limit=1&marker={made['live']}"
    )
    second = listed(client, "2.59", link["href"].split("?", 1)[1])
    assert uuids(second) == [made["cold"]] and "migrations_links" in second  # a full page
    third = listed(client, "2.59", f"limit=1&marker={made['cold']}")
    assert third == {"migrations": []}
    assert "migrations_links" not in listed(client, "2.59")  # less than a page
    assert listed(client, "2.59", "limit=0") == {"migrations": []}  # Nova's: none
    assert uuids(listed(client, "2.59", f"marker={made['live']}")) == [made["cold"]]


def test_os_migrations_refuses_what_its_version_does_not_take(client, stores) -> None:
    def refused(query: str, version: str = "2.59") -> str:
        result = client.simulate_get("/v2.1/os-migrations", headers=at(version, ADMIN),
                                     query_string=query)  # fmt: skip
        return fault(result, 400, "badRequest")

    unknown = "Additional properties are not allowed ('limit' was unexpected)"
    assert refused("limit=1", "2.58") == unknown
    assert "'changes-before' was unexpected" in refused("changes-before=2000-01-01T00:00:00Z")
    assert "'user_id' was unexpected" in refused("user_id=u", "2.79")
    assert "'sort_key' was unexpected" in refused("sort_key=id", "2.1")
    assert "It must be given once" in refused("limit=1&limit=2")
    assert "limit" in refused("limit=-1")
    assert "'yesterday' is not a 'date-time'" in refused("changes-since=yesterday")
    window = "changes-since=2020-01-02T00:00:00Z&changes-before=2020-01-01T00:00:00Z"
    assert refused(window, "2.66") == (
        "The value of changes-since must be less than or equal to changes-before."
    )
    assert refused(f"marker={uuid.uuid4()}").endswith("could not be found.")
    assert refused("marker=nope") == "Marker nope could not be found."


def test_only_an_admin_lists_migrations(client, stores) -> None:
    made = moves(client, stores)
    assert fault(client.simulate_get("/v2.1/os-migrations", headers=USER), 403, "forbidden")
    vm = made["live_vm"]
    for path in (f"/v2.1/servers/{vm}/migrations", f"/v2.1/servers/{vm}/migrations/2"):
        fault(client.simulate_get(path, headers=at("2.23", USER)), 403, "forbidden")  # its own
        fault(client.simulate_get(path, headers=at("2.23", OTHER)), 404, "itemNotFound")


@pytest.mark.parametrize(
    "path", ["/os-migrations", "/servers/x/migrations", "/servers/x/migrations/x"]
)
def test_the_routes_answer_the_same_after_a_project_id(client, path) -> None:
    """As tests/api/test_microversions.py asks of every route: not the router's 404."""
    plain = client.simulate_get(f"/v2.1{path}", headers=USER)
    scoped = client.simulate_get(f"/v2.1/pa{path}", headers=USER)
    assert (scoped.status_code, scoped.json) == (plain.status_code, plain.json)
    assert plain.json["itemNotFound" if plain.status_code == 404 else "forbidden"]["message"] != (
        "The resource could not be found."
    )


# -- a server's migrations --


def test_a_server_lists_its_live_migrations_in_progress_from_2_23(client, stores) -> None:
    made = moves(client, stores)
    vm, live_id = made["live_vm"], made["ids"][made["live"]]
    path = f"/v2.1/servers/{vm}/migrations"
    message = fault(client.simulate_get(path, headers=at("2.22", ADMIN)), 404, "itemNotFound")
    assert "2.23" in message
    found = client.simulate_get(path, headers=at("2.23", ADMIN)).json["migrations"]
    assert [m["id"] for m in found] == [live_id]
    (shown,) = found
    assert shown["server_uuid"] == vm and shown["status"] == "running"
    assert shown["memory_total_bytes"] is None and "uuid" not in shown
    one = client.simulate_get(f"{path}/{live_id}", headers=at("2.59", ADMIN))
    assert one.status_code == 200, one.text
    assert one.json["migration"]["uuid"] == made["live"]
    assert one.json["migration"] == {**shown, "uuid": made["live"]}
    # the cold migration's server lists none: Nova's are live migrations only
    cold_path = f"/v2.1/servers/{made['cold_vm']}/migrations"
    assert client.simulate_get(cold_path, headers=at("2.23", ADMIN)).json == {"migrations": []}
    query = client.simulate_get(path, headers=at("2.23", ADMIN), query_string="status=running")
    assert fault(query, 400, "badRequest").startswith("Additional properties")


def test_a_server_migration_that_is_no_live_one_in_progress_is_not_found(client, stores):
    made = moves(client, stores)
    cold_vm, cold_id = made["cold_vm"], made["ids"][made["cold"]]

    def missing(server_id: str, migration_id: Any) -> str:
        path = f"/v2.1/servers/{server_id}/migrations/{migration_id}"
        return fault(client.simulate_get(path, headers=at("2.23", ADMIN)), 404, "itemNotFound")

    assert missing(cold_vm, cold_id) == (
        f"Migration {cold_id} for server {cold_vm} is not live-migration."
    )
    assert missing(cold_vm, 999) == (
        f"In-progress live migration 999 is not found for server {cold_vm}."
    )
    live_id = made["ids"][made["live"]]
    assert missing(cold_vm, live_id).startswith("In-progress live migration")  # another's
    assert missing(cold_vm, "x").startswith("In-progress live migration x")
    assert stores.migrations.finish(made["live"], "cn1") == "completed"
    assert missing(made["live_vm"], live_id) == (
        f"Live migration {live_id} for server {made['live_vm']} is not in progress."
    )
    assert missing(str(uuid.uuid4()), 1).startswith("Instance ")


# -- the views at 2.80 (above the served microversions yet) --


def record(**fields: Any) -> Migration:
    base: dict[str, Any] = dict(
        id=7, uuid=str(uuid.uuid4()), instance_uuid=str(uuid.uuid4()), kind=LIVE_MIGRATION,
        status="queued", source_compute="cn1", source_node="cn1-n1", dest_compute="cn2",
        dest_node=None, project_id="pa", user_id="admin-2", old_flavor={"id": "1"},
        new_flavor={"id": "2"}, created_at=0.0, updated_at=1.5, caller_project_id="admin",
    )  # fmt: skip
    return Migration(**{**base, **fields})


def test_2_80_adds_who_asked_to_the_views_and_filters() -> None:
    shown = views.migration_view(record(), (2, 80), "http://h")
    assert (shown["user_id"], shown["project_id"]) == ("admin-2", "admin")
    assert (shown["old_instance_type_id"], shown["new_instance_type_id"]) == (1, 2)
    assert shown["updated_at"] == "1970-01-01T00:00:01.500000" and "links" in shown
    assert shown["dest_node"] is None
    one = views.server_migration_view(record(caller_project_id=""), (2, 80))
    assert (one["user_id"], one["project_id"]) == ("admin-2", None)  # an older record's
    assert "user_id" not in views.migration_view(record(), (2, 79), "http://h")
    query = views.list_query({"user_id": "admin-2", "project_id": "admin"}, (2, 80))
    assert query.wanted.finds(record())
    assert not query.wanted.finds(record(caller_project_id="pa"))  # the asker's, as Nova's
    assert not query.wanted.finds(record(user_id="u1"))
    with pytest.raises(exception.Invalid, match="It must be given once"):
        views.list_query({"user_id": ["a", "b"]}, (2, 80))
    with pytest.raises(exception.Invalid, match="'project_id' was unexpected"):
        views.list_query({"project_id": "admin"}, (2, 79))


def test_a_flavor_id_that_is_no_integer_is_null() -> None:
    shown = views.migration_view(record(old_flavor={"id": "m1.small"}, new_flavor={}), (2, 1), "")
    assert (shown["old_instance_type_id"], shown["new_instance_type_id"]) == (None, None)


# -- one cell's scan and the front door's part over two cells --


@pytest.fixture
def clouds(conf) -> list[Cloud]:
    """Two cells, each its own ledger with hosts h0..h2."""
    found = []
    for _ in range(2):
        stores = open_stores(LedgerOptions.from_conf(conf), url=f"fakeredis://{uuid.uuid4().hex}")
        stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        found.append(Cloud(stores))
    return found


class TwoCells:
    """The front door's cells (:class:`~qsched.compute.target.Cells`), what the part reads
    of them: each, the reader, the cell of a server."""

    def __init__(self, cells: list[Cell]) -> None:
        self.cells = cells

    def each(self) -> list[Cell]:
        return self.cells

    @property
    def reader(self) -> Cell:
        return self.cells[0]

    def of_instance(self, uuid_: str) -> Cell:
        return next(c for c in self.cells if c.stores.instances.get_many([uuid_]))


def test_a_cell_scans_its_moves_a_chunk_at_a_time(clouds: list[Cloud]) -> None:
    cloud = clouds[0]
    made = [cloud.start(cloud.server(f"h{n % 2}")) for n in range(7)]  # h0, h1, h0...
    part = MigrationsAPI(cloud.stores, Policy(), chunk=2)
    newest = list(reversed(made))
    assert [m.uuid for m in part.page(MigrationFilter(), 100)] == newest
    from_h1 = part.page(MigrationFilter(host="h1"), 2)
    assert [m.uuid for m in from_h1] == [made[5], made[3]]
    below = cloud.stores.migrations.get(made[3]).id
    assert [m.uuid for m in part.page(MigrationFilter(host="h1"), 5, below=below)] == [made[1]]
    assert part.page(MigrationFilter(), 0) == []
    vm = cloud.stores.migrations.get(made[2]).instance_uuid
    assert [m.uuid for m in part.page(MigrationFilter(instance_uuid=vm), 5)] == [made[2]]


def test_the_part_merges_the_cells_newest_first_and_pages_across_them(
    clouds: list[Cloud],
) -> None:
    cells = [Cell(cloud.stores, RecordingBus()) for cloud in clouds]
    part = Migrations(TwoCells(cells))  # type: ignore[arg-type]
    made = []
    for n in (0, 1, 1, 0, 0, 1):
        cloud = clouds[n]
        made.append(cloud.start(cloud.server("h0")))
        time.sleep(0.002)
    everything = part.list(ADMIN_CONTEXT)
    assert [m.uuid for m in everything] == list(reversed(made))
    assert everything == sorted(everything, key=order)
    seen: list[str] = []
    marker = None
    while True:
        page = part.list(ADMIN_CONTEXT, limit=2, marker=marker)
        if not page:
            break
        seen += [m.uuid for m in page]
        marker = page[-1].uuid
    assert seen == list(reversed(made))
    with pytest.raises(exception.MarkerCouldNotBeFound):
        part.list(ADMIN_CONTEXT, marker=str(uuid.uuid4()))
    with pytest.raises(exception.Forbidden):
        part.list(RequestContext.for_project("u1", "p1"))
    vm = clouds[1].stores.migrations.get(made[1]).instance_uuid
    assert part.list_live(ADMIN_CONTEXT, vm) == []  # a cold migration: none in its cell


# -- Nova's api_samples --

#: the os-migrations samples up to 2.79, their microversion and the query they show
LIST_SAMPLES = [
    ("", "migrations-get", "2.1", ""),
    ("v2.23", "migrations-get", "2.23", ""),
    ("v2.59", "migrations-get", "2.59", ""),
    ("v2.59", "migrations-get-with-limit", "2.59", "limit=1"),
    ("v2.59", "migrations-get-with-marker", "2.59", "marker={live}"),
    ("v2.59", "migrations-get-with-changes-since", "2.59", "changes-since=2000-01-01T00:00:00Z"),
    ("v2.66", "migrations-get", "2.66", ""),
    ("v2.66", "migrations-get-with-limit", "2.66", "limit=1"),
    ("v2.66", "migrations-get-with-marker", "2.66", "marker={live}"),
    ("v2.66", "migrations-get-with-changes-since", "2.66", "changes-since=2000-01-01T00:00:00Z"),
    ("v2.66", "migrations-get-with-changes-before", "2.66",
     "changes-before=2100-01-01T00:00:00Z"),
]  # fmt: skip


def sample(*parts: str) -> Any:
    return shape(samples_dir().joinpath(*parts).read_text())


def same_shape(ours: Any, theirs: Any) -> None:
    """Every key of the sample and no other, of its type (null where qsched has no
    value); ``links`` only on a live migration in progress, and not compared where the
    sample's first item, which every item is compared with, is a resize without them."""
    items = ours.get("migrations")
    if items and theirs["migrations"] and "links" not in theirs["migrations"][0]:
        ours = {**ours, "migrations": [{k: v for k, v in m.items() if k != "links"}
                                       for m in items]}  # fmt: skip
    assert mismatches(ours, theirs, exact=True, optional={"links"}, nullable=NULLS) == []


@needs_samples
@pytest.mark.parametrize(("directory", "name", "version", "query"), LIST_SAMPLES)
def test_os_migrations_answer_as_novas_samples(client, stores, directory, name, version, query):
    made = moves(client, stores)
    body = listed(client, version, query.format(live=made["live"]) or None)
    assert body["migrations"]
    same_shape(body, sample("os-migrations", directory, f"{name}.json.tpl"))


@needs_samples
@pytest.mark.parametrize("directory", ["v2.23", "v2.59"])
def test_server_migrations_answer_as_novas_samples(client, stores, directory) -> None:
    made = moves(client, stores)
    version = directory.removeprefix("v")
    path = f"/v2.1/servers/{made['live_vm']}/migrations"
    index = client.simulate_get(path, headers=at(version, ADMIN)).json
    same_shape(index, sample("server-migrations", directory, "migrations-index.json.tpl"))
    live_id = made["ids"][made["live"]]
    one = client.simulate_get(f"{path}/{live_id}", headers=at(version, ADMIN)).json
    same_shape(one, sample("server-migrations", directory, "migrations-get.json.tpl"))


@needs_samples
def test_every_migrations_sample_up_to_2_79_is_checked() -> None:
    assert SAMPLES is not None
    checked = {f"os-migrations/{d}/{n}".replace("//", "/") for d, n, _v, _q in LIST_SAMPLES}
    checked |= {f"server-migrations/{d}/migrations-{n}" for d in ("v2.23", "v2.59")
                for n in ("index", "get")}  # fmt: skip
    found = {
        str(path.relative_to(SAMPLES)).removesuffix(".json.tpl")
        for resource in ("os-migrations", "server-migrations")
        for path in (SAMPLES / resource).rglob("*.json.tpl")
        if "migrations-" in path.name and _version_of(path.parent.name) <= (2, 79)
    }
    assert found == checked


def _version_of(directory: str) -> tuple[int, int]:
    if not directory.startswith("v2."):
        return (2, 1)
    return (2, int(directory.removeprefix("v2.")))
