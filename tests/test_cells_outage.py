"""Several cells behind one front door while one cell's ledger does not answer
(:mod:`qsched.cells`): the quota mover passes over that cell and moves the others'
releases. On fakeredis, a real Redis and a real Redis Cluster, as
``tests/test_cells_api.py``, whose deployment (two cells, zones ``az1`` and ``az2``)
these tests use.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from qsched import exception
from tests.raw import DeadClient, redis_store
from tests.test_cells_api import Deployment, deployment, ledger_url

__all__ = ["deployment", "ledger_url"]  # fixtures, see tests.test_cells_api


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
    assert done == {"moved": 1, "settled": 1, "skipped": ["cell1"]}
    assert used(deployment) == 2  # first and cell1's lost boot still held
    (passed,) = [r for r in caplog.records if "passed over" in r.getMessage()]
    assert passed.getMessage().startswith("cells: the quota mover passed over cell1: ")
    assert "cell2" not in passed.getMessage() and passed.exc_info is None
    assert deployment.front.maps["cell1"].ends_waiting() == 1
    assert deployment.front.mapping(lost["cell1"]) == ("cell1", "p1")
    with pytest.raises(exception.InstanceNotFound):
        deployment.front.mapping(lost["cell2"])
    assert deployment.mover.run_once() == {"moved": 1, "settled": 1, "skipped": []}
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
