"""Two cells behind one front door (:mod:`qsched.cells`): the API keyspace's quota
and instance mappings, on fakeredis, a real Redis and a real three-master Redis
Cluster (where the API keyspace and each cell are three slots, on masters of
their own or shared, and no script spans two).

The front door is built from ``[cells]`` options (:func:`qsched.cells.opening.open_cells`):
each cell has its own stores, in-process bus and agents; zone ``az1`` is served by
``cell1``, ``az2`` by ``cell2``. The janitor runs the quota mover when cells are named.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from agents.service import ComputeAgent
from qsched import conf as qconf
from qsched import exception
from qsched.api import app as api_app
from qsched.bus.base import BusUnavailable
from qsched.bus.kombu import KombuBus
from qsched.cells import housekeeping, router
from qsched.cells.audit import audit_cells
from qsched.cells.mover import QuotaMover
from qsched.cells.opening import front_door, open_cells
from qsched.cells.router import CellsCompute
from qsched.compute.api import ComputeAPI
from qsched.compute.cell import Cell
from qsched.conf import APIOptions, BusOptions, CellsOptions, LedgerOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.metrics import APIMetrics
from tests.agents.test_agent import USER, make_agent, settled
from tests.conftest import WITH_CLUSTER, backend_url
from tests.helpers import wait_until
from tests.raw import DeadClient, redis_store
from tests.test_metrics import parse, value

ZONES = {"az1": "cell1", "az2": "cell2"}
API_USER = {"X-Auth-Token": "alice:p1"}
#: the janitor's housekeeping of one cell off: only the cells' mover runs
NO_HOUSEKEEPING = SchedulerOptions.defaults().replace(
    reap_interval_s=0, janitor_interval_s=0, outbox_interval_s=0
)


@pytest.fixture(params=WITH_CLUSTER)
def ledger_url(request: pytest.FixtureRequest) -> str:
    return backend_url(request)


def cells_options(ledger_url: str, prefix: str, **others) -> CellsOptions:
    """Both cells and the API keyspace on one ledger, each cell on a bus prefix of its own."""
    return CellsOptions.defaults().replace(
        cell=tuple(f"{name} {ledger_url} {prefix}-{name}" for name in ZONES.values()),
        api_url=ledger_url, zone=tuple(f"{zone} {name}" for zone, name in ZONES.items()),
        **others,
    )  # fmt: skip


class Buses:
    """``open_bus`` for :func:`qsched.cells.opening.open_cells`: in-process buses, kept by prefix;
    the bus of prefix ``refused`` does not open."""

    def __init__(self, refused: str | None = None) -> None:
        self.opened: dict[str, KombuBus] = {}
        self.closed: list[str] = []
        self.refused = refused

    def __call__(self, options: BusOptions) -> KombuBus:
        if options.prefix == self.refused:
            raise BusUnavailable("memory://", "refused by the test")
        bus = self.opened[options.prefix] = KombuBus("memory://", prefix=options.prefix)
        close = bus.close

        def closed() -> None:
            self.closed.append(options.prefix)
            close()

        bus.close = closed  # type: ignore[method-assign]
        return bus


@dataclasses.dataclass
class Deployment:
    options: CellsOptions
    buses: Buses
    front: CellsCompute
    mover: QuotaMover
    agents: list[ComputeAgent]

    @functools.cached_property
    def door(self) -> ComputeAPI:
        """The front door of the cells."""
        return front_door(self.front)

    @property
    def api(self) -> Stores:
        return self.front.api

    @property
    def cells(self) -> dict[str, Cell]:
        return self.front.cells

    def stores(self, cell: str) -> Stores:
        return self.cells[cell].stores

    def bus(self, cell: str) -> KombuBus:
        (spec,) = [s for s in self.options.specs() if s.name == cell]
        return self.buses.opened[spec.bus_prefix]

    def boot(self, zone: str | None = None, name: str = "vm") -> str:
        made = self.door.boot_many(USER, name, "small", availability_zone=zone)
        return made.instances[0].uuid

    def placed(self, uuids: list[str]) -> None:
        for cell, compute in self.cells.items():
            mine = [u for u in uuids if self.front.cell_of(u) == cell]
            assert wait_until(lambda s=compute.stores, m=mine: settled(s, m), timeout_s=20)

    def live(self, cell: str) -> int:
        return len(self.stores(cell).instances.list_project("p1"))

    def deleted(self, uuid: str) -> None:
        """Delete through the front door and wait for the cell to end it."""
        self.door.delete(USER, uuid)
        ended = self.stores(self.front.cell_of(uuid))
        assert wait_until(lambda: ended.instances.get(uuid).state == State.DELETED, 10)

    def housekeeping(self, metrics: APIMetrics, interval_s: float = 0.05) -> list:
        """The janitor's periodic tasks, only the cells' mover on, every ``interval_s``."""
        cells = self.options.replace(mover_interval_s=interval_s)
        return housekeeping.start_periodic_tasks(NO_HOUSEKEEPING, self.stores("cell1"),
                                            self.bus("cell1"), metrics, front=self.front,
                                            cells=cells)  # fmt: skip


@pytest.fixture
def deployment(conf, ledger_url: str) -> Iterator[Deployment]:
    conf.set_override("build_timeout_s", 30, group="scheduler")
    options = cells_options(ledger_url, f"t{uuid.uuid4().hex[:8]}")
    buses = Buses()
    front = open_cells(
        options, LedgerOptions.from_conf(conf), BusOptions.from_conf(conf), buses,
        scheduler=SchedulerOptions.from_conf(conf), api=APIOptions.from_conf(conf),
    )  # fmt: skip
    front.api.quota.set_limits("p1", instances=5, cores=-1, ram_mb=-1)
    running = Deployment(options, buses, front, QuotaMover(front, 60.0), [])
    try:
        for zone, name in ZONES.items():
            running.cells[name].flavors.create(Flavor("small", 1, 512, 0))
            conf.set_override("availability_zone", zone, group="agent")
            agent = make_agent(conf, running.stores(name), running.bus(name), f"{name}-cn0",
                               nodes=1, vcpus=8, ram_mb=8192)  # fmt: skip
            running.agents.append(agent)
        yield running
    finally:
        for agent in running.agents:
            agent.stop(timeout_s=5)
        front.close()


def test_boots_go_to_their_zones_cell_and_are_found_there(deployment: Deployment) -> None:
    first, second = deployment.boot("az1"), deployment.boot("az2")
    deployment.placed([first, second])
    assert deployment.front.mapping(first) == ("cell1", "p1")
    assert deployment.front.cell_of(second) == "cell2"
    assert deployment.door.get(USER, first).host == "cell1-cn0"
    assert deployment.door.get(USER, second).host == "cell2-cn0"
    with pytest.raises(exception.InstanceNotFound):  # each cell holds its own only
        deployment.stores("cell1").instances.get(second)
    renamed = deployment.door.update(USER, second, {"name": "renamed"})
    assert renamed.name == "renamed"
    with pytest.raises(exception.InstanceNotFound):
        deployment.door.get(USER, str(uuid.uuid4()))


def test_the_quota_is_the_deployments_and_comes_back_through_the_mover(
    deployment: Deployment,
) -> None:
    """Five instances for p1 across both cells, whichever cell each went to; a delete
    in one cell gives its instance back in the API keyspace once the mover ran."""
    booted = [deployment.boot(zone) for zone in ("az1", "az2", "az1", "az2", "az1")]
    deployment.placed(booted)
    assert deployment.api.quota.get_usage("p1").instances == 5
    with pytest.raises(exception.QuotaExceeded):
        deployment.boot("az2")
    assert deployment.live("cell1") == 3 and deployment.live("cell2") == 2
    gone = booted[1]
    deployment.door.delete(USER, gone)
    ended = deployment.stores("cell2")
    assert wait_until(lambda: ended.instances.get(gone).state == State.DELETED, 10)
    with pytest.raises(exception.QuotaExceeded):  # the cell released it; the API not yet
        deployment.boot("az1")
    assert deployment.mover.run_once()["moved"] == 1
    assert deployment.mover.run_once()["moved"] == 0
    assert deployment.api.quota.get_usage("p1").instances == 4
    deployment.placed([deployment.boot("az1")])
    for cell in deployment.cells:
        report = audit(deployment.stores(cell))
        assert report.ok, report.to_dict()
    assert audit_cells(deployment.front)["ok"]


def test_the_audit_finds_a_release_not_moved_and_a_holder_of_one_side(
    deployment: Deployment,
) -> None:
    vm = deployment.boot("az2")
    deployment.placed([vm])
    assert audit_cells(deployment.front)["ok"]
    deployment.door.delete(USER, vm)
    ended = deployment.stores("cell2")
    assert wait_until(lambda: ended.instances.get(vm).state == State.DELETED, 10)
    waiting = audit_cells(deployment.front)
    assert not waiting["ok"] and waiting["ends_waiting"] == 1
    assert waiting["problems"] == [f"{vm} (p1): held by the API, by no cell"]
    deployment.mover.run_once()
    assert audit_cells(deployment.front)["ok"]
    deployment.api.quota.reserve("p1", "stray", 1, 512)  # a holder no cell has
    ended.quota.reserve("p1", "other", 1, 512)  # and one the API does not
    found = audit_cells(deployment.front)
    assert sorted(found["problems"]) == ["other (p1): held by cell2, not by the API",
                                         "stray (p1): held by the API, by no cell"]  # fmt: skip


def test_a_project_at_its_limit_cannot_pass_it_by_booting_into_both_cells(
    deployment: Deployment,
) -> None:
    """Twelve boots at once, half into each cell, for a limit of five: five accepted."""
    accepted: list[str] = []
    refused: list[Exception] = []

    def boot(zone: str) -> None:
        try:
            accepted.append(deployment.boot(zone))
        except exception.QuotaExceeded as exc:
            refused.append(exc)

    threads = [threading.Thread(target=boot, args=(f"az{1 + n % 2}",)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(accepted) == 5 and len(refused) == 7
    deployment.placed(accepted)
    assert deployment.live("cell1") + deployment.live("cell2") == 5
    assert deployment.api.quota.get_usage("p1").instances == 5
    assert audit_cells(deployment.front)["ok"]


def test_a_boot_whose_api_died_before_its_cell_is_settled_by_the_mover(
    deployment: Deployment,
) -> None:
    """The mapping and reservation exist, the cell never heard of the boot: past the
    grace the mover abandons it in the cell (a create still on its way refuses) and
    returns its quota."""
    lost = str(uuid.uuid4())
    deployment.front.map.map([lost], "cell1", "p1")
    deployment.api.quota.reserve("p1", lost, 1, 512)
    assert deployment.api.quota.get_usage("p1").instances == 1
    assert deployment.mover.run_once()["settled"] == 0  # within the grace: left alone
    deployment.mover.pending_grace_s = 0.0
    assert deployment.mover.run_once()["settled"] == 1
    assert deployment.api.quota.get_usage("p1").instances == 0
    with pytest.raises(exception.InstanceNotFound):
        deployment.front.cell_of(lost)
    with pytest.raises(exception.InstanceAbandoned):
        deployment.cells["cell1"].accept(USER, "late", "small", uuids=[lost])
    assert deployment.stores("cell1").quota.get_usage("p1").instances == 0


def test_a_boot_the_cell_refuses_holds_nothing(deployment: Deployment) -> None:
    with pytest.raises(exception.QschedError):
        deployment.door.boot_many(USER, "vm", "no-such-flavor", availability_zone="az1")
    with pytest.raises(exception.QschedError):  # refused after the reservation
        deployment.door.boot_many(USER, "", "small", availability_zone="az1")
    with pytest.raises(exception.Invalid):
        deployment.door.boot_many(USER, "vm", "small", min_count=3, max_count=2)
    assert deployment.api.quota.get_usage("p1").instances == 0
    assert deployment.front.map.pending_count() == 0
    assert audit_cells(deployment.front)["ok"]


def test_without_a_zone_a_cell_is_drawn_by_the_room_it_has(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both cells' agents have room for 8 of the flavor: draws go to both. With a host of
    room for some thousands more in cell2, nearly all go there; once cell2's agents
    stopped, its cell holds nothing and every draw, and a boot, goes to cell1."""
    monkeypatch.setattr(router, "FREE_READ_S", 0.0)  # each draw reads what was just beaten
    small = deployment.front.reader.flavors.get("small")
    for agent in deployment.agents:
        agent.heartbeat()
    draws = Counter(deployment.front.choose(None, small) for _ in range(200))
    assert set(draws) == {"cell1", "cell2"}  # all in one: a chance of 2 in 2**200
    big = deployment.stores("cell2").agents
    big.register_service("big")
    big.heartbeat("big", 30, free={"VCPU": 4000, "MEMORY_MB": 4000 * 512})
    draws = Counter(deployment.front.choose(None, small) for _ in range(200))
    assert draws["cell2"] >= 180  # 8 against 4,008: 1 draw in 500 goes to cell1
    big.forget("big")
    next(a for a in deployment.agents if a.host == "cell2-cn0").stop(timeout_s=5)
    assert deployment.stores("cell2").agents.free().get("VCPU", 0) == 0
    assert {deployment.front.choose(None, small) for _ in range(50)} == {"cell1"}
    vm = deployment.boot()
    deployment.placed([vm])
    assert deployment.front.cell_of(vm) == "cell1"


def test_a_burst_of_draws_reads_each_cells_free_capacity_once_a_second(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = deployment.front.reader.flavors.get("small")
    for agent in deployment.agents:
        agent.heartbeat()
    reads: Counter[str] = Counter()
    for name, compute in deployment.cells.items():
        read = compute.stores.agents.free
        monkeypatch.setattr(compute.stores.agents, "free",
                            lambda n=name, r=read: reads.update([n]) or r())  # fmt: skip
    assert {deployment.front.choose(None, small) for _ in range(100)} == {"cell1", "cell2"}
    assert reads == {"cell1": 1, "cell2": 1}
    big = deployment.stores("cell2").agents
    big.register_service("big")
    big.heartbeat("big", 30, free={"VCPU": 4000, "MEMORY_MB": 4000 * 512})
    monkeypatch.setattr(router, "FREE_READ_S", 0.05)
    time.sleep(0.05)
    draws = Counter(deployment.front.choose(None, small) for _ in range(100))
    assert draws["cell2"] >= 90 and reads["cell2"] >= 2  # read again: the big host counts
    big.forget("big")


def test_a_cells_free_capacity_is_what_its_live_open_agents_said(conf, ledger_url: str) -> None:
    """Each agent's part is its last beat's, counted once however often a beat runs,
    and leaves with a disabled service, an expired heartbeat (at the next beat of any
    agent) and a clean stop."""
    cell = f"free{uuid.uuid4().hex[:6]}"
    stores = open_stores(LedgerOptions.from_conf(conf).replace(cell=cell), url=ledger_url)
    agents = stores.agents
    try:
        for host in ("a", "b", "c"):
            agents.register_service(host)
        agents.heartbeat("a", 30, free={"VCPU": 8, "MEMORY_MB": 4096})
        agents.heartbeat("b", 30, free={"VCPU": 4})
        assert agents.free() == {"VCPU": 12, "MEMORY_MB": 4096}
        for _ in range(2):  # its part replaced, once
            agents.heartbeat("a", 30, free={"VCPU": 2, "MEMORY_MB": 1024})
        assert agents.free() == {"VCPU": 6, "MEMORY_MB": 1024}
        agents.update_service("b", disabled=True)
        agents.heartbeat("b", 30, free={"VCPU": 4})
        assert agents.free() == {"VCPU": 2, "MEMORY_MB": 1024}
        agents.heartbeat("c", 0.05, free={"VCPU": 100, "MEMORY_MB": -5})  # none below 0
        assert agents.free() == {"VCPU": 102, "MEMORY_MB": 1024}
        time.sleep(0.2)
        agents.heartbeat("a", 30, free={"VCPU": 2, "MEMORY_MB": 1024})
        assert agents.free() == {"VCPU": 2, "MEMORY_MB": 1024}
        agents.forget("a")
        assert agents.free() == {"VCPU": 0, "MEMORY_MB": 0}
    finally:
        stores.backend.forget_cell()
        stores.backend.close()


def test_a_multi_create_takes_what_the_quota_allows_between_min_and_max(
    deployment: Deployment,
) -> None:
    made = deployment.door.boot_many(USER, "vm", "small", availability_zone="az2",
                                      min_count=2, max_count=8)  # fmt: skip
    assert len(made.instances) == 5
    deployment.placed([i.uuid for i in made.instances])
    assert {deployment.front.cell_of(i.uuid) for i in made.instances} == {"cell2"}
    assert deployment.api.quota.get_usage("p1").instances == 5
    assert deployment.front.map.pending_count() == 0


def pages(deployment: Deployment, context, size: int, **asked) -> list[list[str]]:
    """Every page of a list through the front door, each from the last one's marker."""
    found: list[list[str]] = []
    marker = None
    while True:
        page = deployment.door.list(context, limit=size, marker=marker, **asked)
        if not page:
            return found
        found.append([i.uuid for i in page])
        marker = page[-1].uuid


def test_lists_merge_the_cells_and_page_across_them(deployment: Deployment) -> None:
    """Five servers, three in one cell and two in the other, listed in pages of two:
    newest first, then by name ascending; each page starts after a marker that may
    be the other cell's, and together they are every server once, in order."""
    names = ["e", "a", "d", "b", "c"]
    booted = [deployment.boot(zone, name) for zone, name in zip(
        ("az1", "az2", "az1", "az2", "az1"), names, strict=True)]  # fmt: skip
    deployment.placed(booted)
    records = [deployment.door.get(USER, u) for u in booted]
    newest = [r.uuid for r in sorted(records, key=lambda r: (r.created_at, r.uuid), reverse=True)]
    got = pages(deployment, USER, 2)
    assert [len(p) for p in got] == [2, 2, 1]
    assert [u for page in got for u in page] == newest
    by_name = pages(deployment, USER, 2, params={"sort_key": ["display_name"],
                                                 "sort_dir": ["asc"]})  # fmt: skip
    assert [u for page in by_name for u in page] == [booted[names.index(n)] for n in sorted(names)]
    admin = RequestContext.for_project("admin", "admin", ("admin", "member", "reader"))
    everyone = deployment.door.list(admin, params={"all_tenants": ["1"]})
    assert [i.uuid for i in everyone] == newest
    with pytest.raises(exception.MarkerNotFound):
        deployment.door.list(USER, marker=str(uuid.uuid4()))
    other = RequestContext.for_project("u9", "p9")
    with pytest.raises(exception.MarkerNotFound):  # not one of theirs
        deployment.door.list(other, marker=booted[0])


# -- built from the [cells] options, and the janitor's mover --


def test_the_front_door_is_built_from_the_options(deployment: Deployment) -> None:
    """Each cell on its keyspace and its bus prefix, joined; the API keyspace apart."""
    front = deployment.front
    assert list(front.cells) == ["cell1", "cell2"] and front.zones == ZONES
    assert redis_store(front.api).keys.cell == "api"
    for spec in deployment.options.specs():
        stores = deployment.stores(spec.name)
        assert redis_store(stores).keys.cell == spec.name
        assert stores.quota.default_limits()["instances"] == -1  # joined: the API's quota
        assert deployment.cells[spec.name].bus is deployment.buses.opened[spec.bus_prefix]
    assert sorted(deployment.buses.opened) == sorted(s.bus_prefix for s in
                                                     deployment.options.specs())  # fmt: skip
    assert deployment.buses.closed == []


def test_the_janitor_moves_a_release_to_the_api_keyspace(deployment: Deployment) -> None:
    """A delete in a cell gives its quota back in the API keyspace without anyone
    running the mover by hand: the janitor's pass does, and counts it."""
    vm = deployment.boot("az2")
    deployment.placed([vm])
    metrics = APIMetrics()
    tasks = deployment.housekeeping(metrics)
    try:
        assert [task.name for task in tasks] == ["cells-quota-mover"]
        deployment.deleted(vm)
        assert wait_until(lambda: deployment.api.quota.get_usage("p1").instances == 0, 10)

        def counted() -> float:  # once the pass that moved it has returned
            return value(parse(metrics.exposition())[0], "qsched_cells_quota_moved_total")

        assert wait_until(lambda: counted() == 1, 10)
    finally:
        for task in tasks:
            task.stop()
    samples, _families = parse(metrics.exposition())
    assert value(samples, "qsched_cells_quota_moved_total") == 1
    assert value(samples, "qsched_cells_boots_settled_total") == 0
    assert audit_cells(deployment.front)["ok"]


def test_a_failed_pass_of_the_mover_is_logged_and_the_next_one_moves(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """The API keyspace down: each pass logs the outage (no traceback) and the release
    waits in its cell; back up, the next pass moves it."""
    vm = deployment.boot("az1")
    deployment.placed([vm])
    deployment.deleted(vm)
    store = redis_store(deployment.api)
    live, store.client = store.client, DeadClient()  # type: ignore[assignment]
    tasks = deployment.housekeeping(APIMetrics())
    try:
        with caplog.at_level(logging.WARNING, logger="qsched.periodic"):
            assert wait_until(lambda: len(_outages(caplog)) >= 2, 10)
        assert deployment.front.maps["cell1"].ends_waiting() == 1  # the release waits
        store.client = live
        moved = deployment.front.maps["cell1"]
        # applied, then dropped from the index: a pass may be between the two (and
        # stopping the task lets a pass under way finish on its own)
        assert wait_until(lambda: deployment.api.quota.get_usage("p1").instances == 0
                          and moved.ends_waiting() == 0, 10)  # fmt: skip
    finally:
        store.client = live
        for task in tasks:
            task.stop()
    assert all(record.exc_info is None for record in _outages(caplog))
    assert audit_cells(deployment.front)["ok"]


def _outages(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(
        "periodic task cells-quota-mover: ") and "unreachable" in r.getMessage()]  # fmt: skip


def test_one_cell_has_no_mover_nor_front_door(conf) -> None:
    """No [cells] cell line: nothing opened, no mover; with cells, an interval of 0 is off."""
    options = qconf.Options.from_conf(conf)
    assert api_app.cells_front(options, lambda bus: pytest.fail("a bus was opened")) is None
    stores = open_stores(options.ledger, url=f"fakeredis://test-{uuid.uuid4().hex}")
    bus = KombuBus("memory://", prefix=f"t{uuid.uuid4().hex[:8]}")
    try:
        assert housekeeping.start_periodic_tasks(NO_HOUSEKEEPING, stores, bus) == []
        with pytest.raises(exception.Invalid, match=r"\[cells\] names no cell"):
            open_cells(options.cells, options.ledger, options.bus, Buses())
    finally:
        bus.close()


def test_a_bus_that_does_not_open_fails_the_build_and_closes_what_opened(conf) -> None:
    """(A cell whose ledger does not answer its join does not: tests/cells/test_cells_outage.py.)"""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    options = cells_options(f"fakeredis://test-{uuid.uuid4().hex}", prefix)
    buses = Buses(refused=f"{prefix}-cell2")
    with pytest.raises(exception.BackendUnavailable):
        open_cells(options, LedgerOptions.from_conf(conf), BusOptions.from_conf(conf),
                          buses)  # fmt: skip
    assert list(buses.opened) == [f"{prefix}-cell1"] and buses.closed == [f"{prefix}-cell1"]


def test_the_api_service_starts_the_mover_when_cells_are_named(
    conf, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qsched-api's entry point (:func:`qsched.api.app.serve`) builds the front door from
    [cells] and hands it to the janitor (HTTP serves it: tests/cells/test_cells_http.py)."""
    url = f"fakeredis://test-{uuid.uuid4().hex}"
    options = cells_options(url, f"t{uuid.uuid4().hex[:8]}", mover_interval_s=0.5)
    for name in ("cell", "zone"):
        conf.set_override(name, list(getattr(options, name)), group="cells")
    conf.set_override("api_url", url, group="cells")
    conf.set_override("mover_interval_s", 0.5, group="cells")
    conf.set_override("url", url, group="ledger")
    started: list[tuple] = []

    def start_periodic_tasks(*args) -> list:
        started.append(args)
        return []

    monkeypatch.setattr(qconf, "setup_logging", lambda conf: None)  # the test's own logging
    monkeypatch.setattr(housekeeping, "start_periodic_tasks", start_periodic_tasks)
    buses = Buses()
    _app, bus = api_app.serve(conf, buses, ["127.0.0.1"])
    ((*_single_cell, front, cells),) = started
    try:
        assert isinstance(front, CellsCompute) and list(front.cells) == ["cell1", "cell2"]
        assert cells == options
        assert sorted(buses.opened) == sorted([*(s.bus_prefix for s in options.specs()),
                                               "qsched"])  # fmt: skip
    finally:
        front.close()
        bus.close()
