"""Host aggregates over several cells (docs/scale.rst, "Serving it over HTTP").

Nova keeps aggregates in its API database, one set for the cloud; qsched keeps them
in a cell's keyspace, where that cell's request filters read them (a boot's zone,
tenant isolation, isolated aggregates, ``aggregate_instance_extra_specs``) and its
providers carry them. Over several cells **every aggregate is in every cell, with the
same id and uuid**, and each cell's copy holds that cell's hosts only. Every cell
needs every aggregate's metadata, not only those of its hosts: the tenant filter asks
whether *any* aggregate names the project, and the isolating filter which aggregates
*any* trait keeps out. So:

* create: the id comes from the API keyspace (``agg-seq``, above the highest id any
  cell gave itself), the uuid is made once, and the aggregate is written to every
  cell in the order of the ``[cells] cell`` lines, so the first cell decides between
  two creates racing for one name. A cell that refuses it or does not answer has the
  cells written before it give it back (a retry makes a new one).
* show and list: every cell's copy, merged: name and metadata from the first cell
  that has it, the hosts of every cell (O(cells) reads).
* update (name, zone) and set_metadata: every cell, in order. A cell that refuses
  (the new zone conflicts with another zone of one of its hosts) has the cells
  written before it put back as they were; one that does not answer fails the call
  with 503 once the others were written, and the retry completes it.
* delete: refused (400, Nova's words) while a cell's copy has a host, then removed
  from every cell.
* each of those writes holds the aggregate's lock in the API keyspace
  (``agg-lock:<id>``, :func:`aggregate_lock`: two more round trips), so
  that two writers of one aggregate never interleave their cells: another call, or
  ``qsched-admin cells adopt`` copying it into the cells it is missing from
  (:mod:`qsched.cells.adopt`), which then never undoes a rename or a delete. A
  writer waits for the lock a few seconds at most, then answers 409.
* add_host and remove_host: in the host's cell only, found by the **host mapping**
  (``host-map:<host>`` in the API keyspace, Nova's ``host_mappings``): the first time
  the front door meets a host it asks each cell (O(cells), once) and records the one
  that has it; then one read. The agent does not write it: it knows its own cell's
  ledger only, not the API keyspace, and a host is mapped before any call needs it
  (Nova's ``discover_hosts`` step, made implicit). The zone check of an add runs in
  that cell, which holds every aggregate of the host.
* a cell joined late (its ledger did not answer when the API started) gets every
  aggregate of the joined cells, without their hosts, at its join
  (:meth:`qsched.cells.router.CellsCompute.join_waiting`); one of its own in the way is
  left as it is and named.
* a boot's cell (:meth:`qsched.cells.router.CellsCompute.choose`): among the cells where the
  aggregates its request filters ask for have hosts (:func:`serves`), one read of
  each cell's aggregate version; a boot the filters leave alone reads nothing.

Every call is O(cells) ledger work at most, never O(hosts).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from qsched import exception
from qsched.aggregates import (
    ZONE_KEY,
    Aggregate,
    AggregateNotFound,
    InvalidAggregateAction,
)
from qsched.cells.fanout import gone, take_back, write_every_cell
from qsched.cells.router import CellsCompute
from qsched.compute.api import ComputeAPI
from qsched.context import RequestContext
from qsched.ledger.cellmap import RedisCellMap
from qsched.policies import aggregates as aggregates_policy

T = TypeVar("T")
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


class CellsAggregates:
    """The aggregates of several cells with the surface of
    :class:`~qsched.compute.aggregates.AggregateAPI` that :mod:`qsched.api` uses (see the
    module docstring). ``front``: the cells."""

    def __init__(self, front: CellsCompute) -> None:
        self.front = front

    @property
    def _cells(self) -> builtins.list[ComputeAPI]:
        return builtins.list(self.front.cells.values())

    def _authorize(self, context: RequestContext, rule: str) -> None:
        self.front.flavor_cell.aggregates.policy.authorize(context, rule)

    # -- reads --

    def list(self, context: RequestContext) -> builtins.list[Aggregate]:
        """Every aggregate, by id, each merged from every cell's copy."""
        self._authorize(context, aggregates_policy.INDEX)
        copies: dict[int, builtins.list[Aggregate]] = {}
        for compute in self._cells:
            for found in compute.aggregates.store.list():
                copies.setdefault(found.id, []).append(found)
        return [_merged(copies[i]) for i in sorted(copies)]

    def get(self, context: RequestContext, aggregate_id: int) -> Aggregate:
        """:raises AggregateNotFound: no cell has it (404)."""
        self._authorize(context, aggregates_policy.SHOW)
        return self._get(aggregate_id)

    def _get(self, aggregate_id: int) -> Aggregate:
        copies = []
        for compute in self._cells:
            try:
                copies.append(compute.aggregates.store.get(aggregate_id))
            except AggregateNotFound:
                continue
        if not copies:
            raise AggregateNotFound(aggregate_id=aggregate_id)
        return _merged(copies)

    # -- writes to every cell --

    def create(self, context: RequestContext, name: str, zone: str | None) -> Aggregate:
        """A new aggregate in every cell, one id and uuid (see the module docstring).

        :raises AggregateNameExists: the name is taken (409); nothing is kept.
        :raises BackendUnavailable: a cell did not answer (503); nothing is kept where
            it could be given back.
        :raises AggregateBusy: its id's lock stayed taken (409).
        """
        self._authorize(context, aggregates_policy.CREATE)
        floor = max(compute.aggregates.store.last_id() for compute in self._cells)
        aggregate_id = self.front.map.next_aggregate_id(floor)
        uuid = str(uuidlib.uuid4())
        written: builtins.list[ComputeAPI] = []

        def create(compute: ComputeAPI) -> Aggregate:
            made = compute.aggregates.create(context, name, zone, aggregate_id, uuid)
            written.append(compute)
            return made

        with aggregate_lock(self.front.map, aggregate_id):
            try:
                return self._everywhere(create)
            except exception.QschedError:
                take_back(written, lambda compute: compute.aggregates.store.delete(aggregate_id))
                raise

    def update(
        self, context: RequestContext, aggregate_id: int, changes: Mapping[str, str | None]
    ) -> Aggregate:
        """Rename it or move it to a zone in every cell (:meth:`AggregateAPI.update`).

        :raises AggregateNotFound: no cell has it (404).
        :raises AggregateNameExists, InvalidAggregateAction: a cell refused (409, 400);
            the cells written before it are put back.
        :raises BackendUnavailable: a cell did not answer (503), once the others were
            written: the retry completes it.
        :raises AggregateBusy: another writer held it (409).
        """
        self._authorize(context, aggregates_policy.UPDATE)
        with aggregate_lock(self.front.map, aggregate_id):
            before = self._get(aggregate_id)
            back: dict[str, str | None] = {}
            if "name" in changes:
                back["name"] = before.name
            if ZONE_KEY in changes:
                back[ZONE_KEY] = before.availability_zone
            return self._change(
                aggregate_id,
                lambda compute: compute.aggregates.update(context, aggregate_id, changes),
                lambda compute: compute.aggregates.store.update(aggregate_id, back),
            )

    def set_metadata(
        self, context: RequestContext, aggregate_id: int, changes: Mapping[str, str | None]
    ) -> Aggregate:
        """Set and remove metadata keys in every cell (:meth:`AggregateAPI.set_metadata`);
        raises as :meth:`update`."""
        self._authorize(context, aggregates_policy.SET_METADATA)
        with aggregate_lock(self.front.map, aggregate_id):
            before = self._get(aggregate_id)
            back = {key: before.metadata.get(key) for key in changes}
            return self._change(
                aggregate_id,
                lambda compute: compute.aggregates.set_metadata(context, aggregate_id, changes),
                lambda compute: compute.aggregates.store.set_metadata(aggregate_id, back),
            )

    def delete(self, context: RequestContext, aggregate_id: int) -> None:
        """Delete it from every cell, once no cell's copy has a host.

        :raises AggregateNotFound: no cell has it (404).
        :raises InvalidAggregateAction: it has hosts (400, Nova's words).
        :raises BackendUnavailable: a cell did not answer (503), once the others
            deleted it: the retry completes it.
        :raises AggregateBusy: another writer held it (409).
        """
        self._authorize(context, aggregates_policy.DELETE)
        with aggregate_lock(self.front.map, aggregate_id):
            if self._get(aggregate_id).hosts:
                raise InvalidAggregateAction(action="remove host from aggregate",
                                             aggregate_id=aggregate_id,
                                             reason="Host aggregate is not empty")  # fmt: skip
            self._everywhere(lambda compute: compute.aggregates.delete(context, aggregate_id),
                             absent=True)  # fmt: skip

    def _change(
        self,
        aggregate_id: int,
        write: Callable[[ComputeAPI], object],
        undo: Callable[[ComputeAPI], object],
    ) -> Aggregate:
        written: builtins.list[ComputeAPI] = []

        def change(compute: ComputeAPI) -> object:
            done = write(compute)
            written.append(compute)
            return done

        try:
            self._everywhere(change, absent=True)
        except exception.BackendUnavailable:
            raise  # what was written stays: the retry completes it
        except exception.QschedError:
            take_back(written, undo)
            raise
        return self._get(aggregate_id)

    def _everywhere(self, write: Callable[[ComputeAPI], T], absent: bool = False) -> T:
        """:func:`~qsched.cells.fanout.write_every_cell`; ``absent``: a cell without the
        aggregate (a call cut short before) is passed over, unless none has it."""
        never = lambda compute, exc: False  # noqa: E731
        return write_every_cell(self.front.cells, write,
                                gone(AggregateNotFound) if absent else never)  # fmt: skip

    # -- hosts: in their cell --

    def add_host(self, context: RequestContext, aggregate_id: int, host: str) -> Aggregate:
        """Add ``host`` to the aggregate in the host's cell (:meth:`AggregateAPI.add_host`);
        the aggregate of every cell merged.

        :raises ComputeHostNotFound: no cell has the host (404).
        """
        self._authorize(context, aggregates_policy.ADD_HOST)
        try:
            self._cell_of(host).aggregates.add_host(context, aggregate_id, host)
        except exception.ComputeHostNotFound:
            # mapped to a cell that no longer has it: ask every cell again, once
            self._cell_of(host, fresh=True).aggregates.add_host(context, aggregate_id, host)
        return self._get(aggregate_id)

    def remove_host(self, context: RequestContext, aggregate_id: int, host: str) -> Aggregate:
        """Take ``host`` out of the aggregate in its cell (:meth:`AggregateAPI.remove_host`).

        :raises ComputeHostNotFound: no cell has the host (404).
        """
        self._authorize(context, aggregates_policy.REMOVE_HOST)
        self._cell_of(host).aggregates.remove_host(context, aggregate_id, host)
        return self._get(aggregate_id)

    def _cell_of(self, host: str, fresh: bool = False) -> ComputeAPI:
        """The cell of ``host``: its mapping (one read), else each cell asked in turn
        and the one that has it mapped (O(cells), once a host).

        :raises ComputeHostNotFound:
        """
        cell = self.front.cell_of_host(host, fresh)
        if cell is None:
            raise exception.ComputeHostNotFound(host=host)
        return self.front.cells[cell]


def _merged(copies: Sequence[Aggregate]) -> Aggregate:
    """One aggregate from its cells' copies: the first one's name and metadata, every
    cell's hosts, the latest change."""
    changed = [copy.updated_at for copy in copies if copy.updated_at is not None]
    hosts = frozenset().union(*(copy.hosts for copy in copies))
    return dataclasses.replace(copies[0], hosts=hosts, updated_at=max(changed, default=None))
