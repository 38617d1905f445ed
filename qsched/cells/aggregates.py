"""Host aggregates over several cells: the lock that keeps two writers of one
aggregate from interleaving their cells (docs/scale.rst, "Serving it over HTTP").

Every aggregate is in every cell with the same id and uuid, each cell's copy holding
that cell's hosts (:mod:`qsched.compute.aggregates` writes them). Each write of the
front door holds the aggregate's lock in the API keyspace (``agg-lock:<id>``,
:func:`aggregate_lock`: two more round trips), as ``qsched-admin cells adopt`` does
while copying it into the cells it is missing from (:mod:`qsched.cells.adopt`), which
then never undoes a rename or a delete. A writer waits for the lock a few seconds at
most, then answers 409. The id of a new aggregate comes from the API keyspace
(``agg-seq``, above the highest id any cell gave itself); a host's cell from its
**host mapping** (``host-map:<host>``, Nova's ``host_mappings``): the first time the
front door meets a host it asks each cell (O(cells), once) and records the one that
has it. The agent does not write it: it knows its own cell's ledger only, and a host
is mapped before any call needs it (Nova's ``discover_hosts`` step, made implicit).
A cell joined late gets every aggregate of the joined cells, without their hosts, at
its join (:meth:`qsched.cells.router.CellsCompute.join_waiting`).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid as uuidlib
from collections.abc import Iterator

from qsched import exception
from qsched.ledger.cellmap import RedisCellMap

LOG = logging.getLogger(__name__)
#: How long a writer of an aggregate holds its lock at most (a write to every cell
#: takes a few round trips; the lock outlives a writer that died by this much), and
#: how long another waits for it (:func:`aggregate_lock`).
AGGREGATE_LOCK_S = 30.0
AGGREGATE_WAIT_S = 5.0


class AggregateBusy(exception.Conflict):
    msg_fmt = "Aggregate {aggregate_id} is being changed by another call; try again."


@contextlib.contextmanager
def aggregate_lock(
    cells_map: RedisCellMap, aggregate_id: int, wait_s: float | None = None
) -> Iterator[None]:
    """Hold aggregate ``aggregate_id``'s lock in the API keyspace (``agg-lock:<id>``)
    while writing it to the cells, so that no two writers of one aggregate interleave:
    the front door's writes and the copies of ``qsched-admin cells adopt``
    (:mod:`qsched.cells.adopt`). It expires after :data:`AGGREGATE_LOCK_S`, should its
    holder die. Two round trips, and a wait while another holds it.

    :raises AggregateBusy: another writer held it for ``wait_s`` (None:
        :data:`AGGREGATE_WAIT_S`).
    :raises BackendUnavailable: the API keyspace did not answer.
    """
    token = uuidlib.uuid4().hex
    deadline = time.monotonic() + (AGGREGATE_WAIT_S if wait_s is None else wait_s)
    while not cells_map.lock_aggregate(aggregate_id, token, AGGREGATE_LOCK_S):
        if time.monotonic() >= deadline:
            raise AggregateBusy(aggregate_id=aggregate_id)
        time.sleep(0.01)
    try:
        yield
    finally:
        try:
            cells_map.unlock_aggregate(aggregate_id, token)
        except exception.BackendUnavailable as exc:  # the writer's own error stands
            LOG.warning("cells: aggregate %s's lock is left to expire: %s", aggregate_id, exc)
