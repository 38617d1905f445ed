"""Several cells behind one front door while one cell's ledger does not answer
(:mod:`qsched.cells`): the quota mover passes over that cell and moves the others'
releases; a cell down when the front door opens is not joined, no boot goes there,
and a later pass joins it. On fakeredis, a real Redis and a real Redis Cluster, as
``tests/cells/test_cells_api.py``, whose deployment (two cells, zones ``az1`` and ``az2``)
these tests use.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from qsched import exception
from qsched.aggregates import Aggregate
from qsched.cells import housekeeping
from qsched.cells.audit import audit_cells
from qsched.cells.join import CellNotJoined
from qsched.cells.mover import QuotaMover
from qsched.cells.opening import front_door, open_cells
from qsched.cells.router import CellsCompute
from qsched.compute.keypairs import InvalidKeyName
from qsched.conf import APIOptions, BusOptions, LedgerOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger.base import Keypair, State
from qsched.ledger.redis import connect
from qsched.metrics import APIMetrics
from qsched.net import free_port
from qsched.recovery import reaper
from qsched.scheduling.records import ServerFields
from tests.agents.test_agent import USER
from tests.cells.test_cells_api import (
    NO_HOUSEKEEPING,
    Buses,
    Deployment,
    cells_options,
    deployment,
    ledger_url,
)
from tests.helpers import wait_until
from tests.raw import DeadClient, redis_store
from tests.test_metrics import parse, total, value

__all__ = ["deployment", "ledger_url"]  # fixtures, see tests.cells.test_cells_api


def lost_boot(deployment: Deployment, cell: str) -> str:
    """A boot whose API process died after the reservation, before its cell heard of it."""
    lost = str(uuid.uuid4())
    deployment.front.map.map([lost], cell, "p1")
    deployment.api.quota.reserve("p1", lost, 1, 512)
    return lost


def used(deployment: Deployment) -> int:
    return deployment.api.quota.get_usage("p1").instances


def test_the_mover_passes_over_a_cell_that_does_not_answer_and_moves_the_others(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """A release and a lost boot in each cell, cell1's ledger down: the pass moves and
    settles cell2's, names cell1 in its report and once in its log, and leaves cell1's
    waiting; once cell1 answers, the next pass moves and settles them."""
    first, second = deployment.boot("az1"), deployment.boot("az2")
    deployment.placed([first, second])
    deployment.deleted(first)
    deployment.deleted(second)
    lost = {cell: lost_boot(deployment, cell) for cell in ("cell1", "cell2")}
    deployment.mover.pending_grace_s = 0.0
    assert used(deployment) == 4
    store = redis_store(deployment.stores("cell1"))
    live, store.client = store.client, DeadClient()  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING, logger="qsched.cells"):
            done = deployment.mover.run_once()
    finally:
        store.client = live
    assert done == {
        "moved": 1,
        "settled": 1,
        "groups_settled": 0,
        "joined": [],
        "skipped": ["cell1"],
    }
    assert used(deployment) == 2  # first and cell1's lost boot still held
    (passed,) = [r for r in caplog.records if "passed over" in r.getMessage()]
    assert passed.getMessage().startswith("cells: the quota mover passed over cell1: ")
    assert "cell2" not in passed.getMessage() and passed.exc_info is None
    assert deployment.front.maps["cell1"].ends_waiting() == 1
    assert deployment.front.mapping(lost["cell1"]) == ("cell1", "p1")
    with pytest.raises(exception.InstanceNotFound):
        deployment.front.mapping(lost["cell2"])
    assert deployment.mover.run_once() == {
        "moved": 1,
        "settled": 1,
        "groups_settled": 0,
        "joined": [],
        "skipped": [],
    }
    assert used(deployment) == 0
    assert deployment.front.map.pending_count() == 0


def test_the_api_keyspace_down_still_fails_the_pass(deployment: Deployment) -> None:
    """Nothing can be moved without it: the pass raises, as every periodic task's outage."""
    vm = deployment.boot("az2")
    deployment.placed([vm])
    deployment.deleted(vm)
    store = redis_store(deployment.api)
    live, store.client = store.client, DeadClient()  # type: ignore[assignment]
    try:
        with pytest.raises(exception.BackendUnavailable):
            deployment.mover.run_once()
    finally:
        store.client = live
    assert deployment.front.maps["cell2"].ends_waiting() == 1  # the release waits
    assert deployment.mover.run_once()["moved"] == 1


# -- a cell down when the front door opens --------------------------------------------


@pytest.fixture
def half_down(conf, ledger_url: str, caplog: pytest.LogCaptureFixture) -> Iterator[CellsCompute]:
    """The front door of cell1 (on the test's ledger) and cell2, whose ledger does not
    answer when it opens (nothing listens on its port); cell1 has flavor small."""
    conf.set_override("connect_timeout_s", 0.2, group="ledger")
    conf.set_override("timeout_s", 0.5, group="ledger")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    down = f"redis://127.0.0.1:{free_port()}/0"
    options = cells_options(ledger_url, prefix).replace(
        cell=(f"cell1 {ledger_url} {prefix}-cell1", f"cell2 {down} {prefix}-cell2")
    )
    with caplog.at_level(logging.WARNING, logger="qsched.cells"):
        front = open_cells(
            options, LedgerOptions.from_conf(conf), BusOptions.from_conf(conf), Buses(),
            scheduler=SchedulerOptions.from_conf(conf), api=APIOptions.from_conf(conf),
        )  # fmt: skip
    try:
        front.cells["cell1"].flavors.create(Flavor("small", 1, 512, 0))
        front.api.quota.set_limits("p1", instances=5, cores=-1, ram_mb=-1)
        yield front
    finally:
        front.close()


def comes_back(front: CellsCompute, ledger_url: str) -> None:
    """cell2's ledger answers from now on: its keyspace on the test's ledger."""
    redis_store(front.cells["cell2"].stores).client = connect(ledger_url)


def test_a_cell_down_at_the_start_gets_no_boot_until_a_pass_joins_it(
    half_down: CellsCompute, ledger_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The front door opens with cell1 alone joined, and says so; a boot into cell2's
    zone is refused (503) and holds nothing, one without a zone goes to cell1. A pass
    of the mover while cell2 is down passes over it; once it answers, the next joins
    it (its own limits unlimited) and boots go there, each counted once."""
    front = half_down
    door = front_door(front)
    assert front.unjoined == {"cell2"}
    opening = caplog.get_records("setup")
    (said,) = [r.getMessage() for r in opening if "not joined" in r.getMessage()]
    assert said.startswith("cells: cell cell2 is not joined: ") and "janitor joins it" in said
    with pytest.raises(CellNotJoined, match="Cell cell2 is not joined yet"):
        door.boot_many(USER, "vm", "small", availability_zone="az2")
    assert front.api.quota.get_usage("p1").instances == 0 and front.map.pending_count() == 0
    drawn = [door.boot_many(USER, "vm", "small").instances[0].uuid for _ in range(3)]
    assert {front.cell_of(u) for u in drawn} == {"cell1"}
    mover = QuotaMover(front, 60.0)
    assert mover.run_once() == {
        "moved": 0,
        "settled": 0,
        "groups_settled": 0,
        "joined": [],
        "skipped": ["cell2"],
    }
    comes_back(front, ledger_url)
    assert mover.run_once() == {
        "moved": 0,
        "settled": 0,
        "groups_settled": 0,
        "joined": ["cell2"],
        "skipped": [],
    }
    assert front.unjoined == frozenset()
    cell2 = front.cells["cell2"]
    assert cell2.stores.quota.default_limits()["instances"] == -1  # the API's quota now
    # the flavors written while it was away are written there at its join
    assert cell2.stores.flavors.list() == front.cells["cell1"].stores.flavors.list()
    # a keypair made while it was away is copied there by the first boot that names it
    cell1_keys = front.cells["cell1"].stores.keypairs
    cell1_keys.create(Keypair(USER.user_id, "k1", "ssh-ed25519 AAAA k1", "fp"))
    with pytest.raises(exception.KeypairNotFound):
        cell2.stores.keypairs.get(USER.user_id, "k1")
    cell2.stores.agents.add_zone("az2")  # as its agents would
    (vm,) = door.boot_many(USER, "vm", "small", availability_zone="az2",
                            server=ServerFields(key_name="k1")).instances  # fmt: skip
    assert front.cell_of(vm.uuid) == "cell2"
    assert cell2.stores.keypairs.get(USER.user_id, "k1").public_key == "ssh-ed25519 AAAA k1"
    with pytest.raises(InvalidKeyName):  # a key no cell has: the cell refuses it
        door.boot_many(USER, "vm", "small", availability_zone="az2",
                        server=ServerFields(key_name="nosuch"))  # fmt: skip
    assert front.api.quota.get_usage("p1").instances == 4  # the refused one holds nothing
    assert mover.run_once()["joined"] == []  # joined once
    assert audit_cells(front)["ok"]


def a_host(front: CellsCompute, cell: str) -> None:
    """Host ``<cell>-cn0`` in ``cell``, as its agent registers and beats it."""
    agents = front.cells[cell].stores.agents
    agents.register_service(f"{cell}-cn0")
    agents.heartbeat(f"{cell}-cn0", 30)


def made_while_away(front: CellsCompute, name: str, **metadata: str) -> Aggregate:
    """An aggregate in cell1 alone, with the id and uuid the front door would give it
    (a cell whose ledger comes back without it, restored from before it was made or new,
    lacks it as cell2 does here)."""
    cell1 = front.cells["cell1"].aggregates.store
    made = cell1.create(name, None, front.map.next_aggregate_id(cell1.last_id()),
                        str(uuid.uuid4()))  # fmt: skip
    return cell1.set_metadata(made.id, metadata)


def test_a_cell_joined_late_gets_the_aggregates_of_the_joined_cells_at_its_join(
    half_down: CellsCompute, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An aggregate made while cell2 was away, with a zone, more metadata and a host of
    cell1, is written into cell2 by the pass that joins it, before it is joined: its id,
    uuid, name and metadata, no host; a host of cell2 is then added to it through the
    front door (in cell2's copy alone), and the audit is clean. A second copy writes
    nothing."""
    front = half_down
    a_host(front, "cell1")
    agg = made_while_away(front, "agg", availability_zone="agz", ssd="true")
    front.cells["cell1"].aggregates.store.add_host(agg.id, "cell1-cn0")
    comes_back(front, ledger_url)
    a_host(front, "cell2")
    into = front.cells["cell2"].aggregates.store
    put, joined_then = into.put, []
    monkeypatch.setattr(into, "put", lambda a: joined_then.append("cell2" not in front.unjoined)
                        or put(a))  # fmt: skip
    assert QuotaMover(front, 60.0).run_once()["joined"] == ["cell2"]
    assert joined_then == [False]  # written before a boot could go there
    copy = into.get(agg.id)
    assert (copy.uuid, copy.name, dict(copy.metadata), copy.hosts) == (
        agg.uuid, "agg", {"availability_zone": "agz", "ssd": "true"}, frozenset())  # fmt: skip
    aggregates = front_door(front).aggregates
    admin = RequestContext.for_project("admin", "admin", roles=("admin",))
    added = aggregates.add_host(admin, agg.id, "cell2-cn0")
    assert (added.uuid, added.hosts) == (agg.uuid, {"cell1-cn0", "cell2-cn0"})
    assert into.get(agg.id).hosts == {"cell2-cn0"}
    assert front.map.host_cell("cell2-cn0") == "cell2"
    assert front._copy_aggregates("cell2") == 0  # a repeat writes nothing
    assert audit_cells(front)["problems"] == [] and audit_cells(front)["ok"]


def test_an_aggregate_in_the_way_in_a_cell_joined_late_is_named_not_overwritten(
    half_down: CellsCompute, ledger_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """cell2 comes back holding an aggregate of its own under the name of one made while
    it was away: that one is not written there, cell2's is left as it was, a warning
    names both and the audit names the difference; the others are written, and cell2
    is joined."""
    front = half_down
    kept = made_while_away(front, "kept")
    taken = made_while_away(front, "taken", ssd="true")
    comes_back(front, ledger_url)
    own = front.cells["cell2"].aggregates.store.create("taken", "az9", 50)
    with caplog.at_level(logging.WARNING, logger="qsched.cells"):
        assert QuotaMover(front, 60.0).run_once()["joined"] == ["cell2"]
    (warned,) = [r.getMessage() for r in caplog.records if "not written into" in r.getMessage()]
    assert warned.startswith(f"cells: aggregate {taken.id} (taken, uuid {taken.uuid}) is "
                             "not written into cell cell2, joined now")  # fmt: skip
    assert "Aggregate taken already exists" in warned
    cell2 = front.cells["cell2"].aggregates.store
    assert cell2.get(kept.id).uuid == kept.uuid
    assert cell2.get(50) == own
    problems = audit_cells(front)["problems"]
    assert f"aggregate {taken.id}: not in cell2" in problems
    assert "aggregate 50: not in cell1" in problems


def test_with_the_mover_off_a_task_of_its_own_joins_the_cell(
    half_down: CellsCompute, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[cells] mover_interval_s = 0 in this process: the janitor still joins cell2 once it
    answers, else no boot of this process would ever go there."""
    monkeypatch.setattr(housekeeping, "JOIN_INTERVAL_S", 0.05)
    front = half_down
    off = cells_options(ledger_url, "x").replace(mover_interval_s=0)
    stores, bus = front.cells["cell1"].stores, front.cells["cell1"].bus
    tasks = housekeeping.start_periodic_tasks(NO_HOUSEKEEPING, stores, bus, front=front, cells=off)
    try:
        assert [task.name for task in tasks] == ["cells-join"]
        comes_back(front, ledger_url)
        assert wait_until(lambda: not front.unjoined, 10)
    finally:
        for task in tasks:
            task.stop()
    started = housekeeping.start_periodic_tasks(
        NO_HOUSEKEEPING, stores, bus, front=front, cells=off
    )
    assert started == []


def test_the_housekeeping_serves_every_cell_and_passes_over_one_that_does_not_answer(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The deadline reaper of qsched-api with cells named: a boot no host fits in each
    cell, their deadlines passed; with cell1's ledger down, a run ends cell2's and
    names cell1 in a warning; the next, cell1 back, ends cell1's. With every cell down
    the run raises (the periodic task logs it); the janitor and the outbox run the same."""
    for compute in deployment.cells.values():
        compute.flavors.create(Flavor("huge", 64, 512, 0))
    boot = deployment.door.boot_many
    waiting = {cell: boot(USER, "vm", "huge", availability_zone=zone).instances[0].uuid
               for zone, cell in (("az1", "cell1"), ("az2", "cell2"))}  # fmt: skip
    passed = functools.partial(reaper.reap_expired, now=time.time() + 3600)
    monkeypatch.setattr(housekeeping, "reap_expired", passed)
    options = NO_HOUSEKEEPING.replace(reap_interval_s=3600, janitor_interval_s=3600,
                                      outbox_interval_s=3600)  # fmt: skip
    cells = deployment.options.replace(mover_interval_s=3600)
    metrics = APIMetrics()
    tasks = housekeeping.start_periodic_tasks(options, deployment.stores("cell1"),
                                         deployment.bus("cell1"), metrics,
                                         front=deployment.front, cells=cells)  # fmt: skip
    try:
        assert [t.name for t in tasks] == ["reaper", "janitor", "outbox", "cells-quota-mover"]

        def state(cell: str) -> State:
            return deployment.stores(cell).instances.get(waiting[cell]).state

        with down("cell1", deployment), caplog.at_level(logging.WARNING, housekeeping.__name__):
            tasks[0].fn()
            tasks[3].fn()
        assert (state("cell1"), state("cell2")) == (State.BUILD, State.ERROR)
        (warned,) = [r.getMessage() for r in caplog.records if r.name == housekeeping.__name__
                     and "passed over" in r.getMessage()]  # fmt: skip
        assert warned.startswith("periodic task reaper: cell cell1 passed over: ")
        tasks[0].fn()
        assert state("cell1") == State.ERROR
        samples, _families = parse(metrics.exposition())
        passed = "qsched_cells_passed_over_total"
        assert value(samples, passed, task="reaper", cell="cell1") == 1
        assert value(samples, passed, task="quota-mover", cell="cell1") == 1
        assert total(samples, passed) == 2
        assert value(samples, "qsched_no_valid_host_total", reason="deadline") == 2
        with down("cell1", deployment), down("cell2", deployment):
            for task in tasks[:3]:
                with pytest.raises(exception.BackendUnavailable):
                    task.fn()
    finally:
        for task in tasks:
            task.stop()


@contextlib.contextmanager
def down(cell: str, deployment: Deployment) -> Iterator[None]:
    """``cell``'s ledger does not answer, in the block."""
    store = redis_store(deployment.stores(cell))
    live, store.client = store.client, DeadClient()  # type: ignore[assignment]
    try:
        yield
    finally:
        store.client = live


def test_each_cell_raises_a_single_cells_outage_as_it_is() -> None:
    """One cell (no [cells]): its outage is the run's, with no warning of its own."""
    outage = exception.BackendUnavailable(backend="ledger", url="redis://", reason="down")

    def step(cell: housekeeping.Served) -> None:
        raise outage

    run = housekeeping.each_cell("reaper", [housekeeping.Served("", None, None)], step)  # type: ignore[arg-type]
    with pytest.raises(exception.BackendUnavailable) as raised:
        run()
    assert raised.value is outage


def test_a_boot_into_a_cell_gone_down_since_its_room_was_read_makes_the_next_draws_pass_it_over(
    deployment: Deployment,
) -> None:
    """The draws use a cell's free capacity for a second (qsched.cells.router.FREE_READ_S): a
    cell whose ledger went down meanwhile can be drawn, and that boot fails (503, its
    quota settled by the mover); the draws after it read the cell again and pass it over."""
    deployment.api.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    small = deployment.front.reader.flavors.get("small")
    for agent in deployment.agents:
        agent.heartbeat()
    assert {deployment.front.choose(None, small) for _ in range(60)} == {"cell1", "cell2"}
    with down("cell2", deployment):
        for _ in range(40):  # into cell2 with a chance of one in two each
            try:
                deployment.boot()
            except exception.BackendUnavailable:
                break
        else:
            pytest.fail("no boot was drawn into cell2 in 40")
        assert {deployment.front.choose(None, small) for _ in range(60)} == {"cell1"}


def test_a_boot_reads_its_flavor_in_the_next_cell_when_the_first_does_not_answer(
    deployment: Deployment,
) -> None:
    with down("cell1", deployment):
        assert deployment.door.get_flavor("small").name == "small"
        vm = deployment.boot("az2")
        deployment.placed([vm])
        with down("cell2", deployment), pytest.raises(exception.BackendUnavailable):
            deployment.door.get_flavor("small")
    with pytest.raises(exception.FlavorNotFound):
        deployment.door.get_flavor("nosuch")
