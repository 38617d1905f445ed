"""Host aggregates for the API: the admin's actions, and the routing a boot takes from them.

:class:`Aggregates` checks ``os_compute_api:os-aggregates:*`` and writes the ledgers'
:class:`~qsched.ledger.base.AggregateStore` of every cell. Over several cells **every
aggregate is in every cell, with the same id and uuid**, and each cell's copy holds
that cell's hosts only: every cell's request filters need every aggregate's metadata,
not only those of its hosts (the tenant filter asks whether *any* aggregate names the
project, the isolating filter which aggregates *any* trait keeps out). So:

* create: the id comes from :meth:`~qsched.compute.target.Cells.new_aggregate_id`
  (over several cells the API keyspace's ``agg-seq``, above the highest id any cell
  gave itself; in one cell, the cell's own), the uuid is made once, and the aggregate
  is written to every cell in order, so the first cell decides between two creates
  racing for one name. A cell that refuses it or does not answer has the cells written
  before it give it back (a retry makes a new one).
* show and list: every cell's copy, merged: name and metadata from the first cell
  that has it, the hosts of every cell (O(cells) reads).
* update (name, zone) and set_metadata: every cell, in order. A cell that refuses
  (the new zone conflicts with another zone of one of its hosts) has the cells
  written before it put back as they were; one that does not answer fails the call
  with 503 once the others were written, and the retry completes it.
* delete: refused (400, Nova's words) while a cell's copy has a host, then removed
  from every cell.
* each of those writes is held by :meth:`~qsched.compute.target.Cells.aggregate_writes`
  (over several cells the aggregate's lock in the API keyspace,
  :func:`qsched.cells.aggregates.aggregate_lock`), so that two writers of one
  aggregate never interleave their cells.
* add_host and remove_host: in the host's cell only
  (:meth:`~qsched.compute.target.Cells.host_cell`); the zone check of an add runs in
  that cell, which holds every aggregate of the host.

Every call is O(cells) ledger work at most, never O(hosts).

:meth:`AggregateAPI.route` is the boot's side, in its cell: Nova's request filters
(:func:`qsched.aggregates.request_filters`) on an
:class:`~qsched.aggregates.AggregateIndex` kept in memory and rebuilt when the
ledger's aggregate version moves. A boot that needs no aggregate (no zone of
an aggregate, no filter switched on, no ``aggregate_instance_extra_specs``) does
not read the ledger for it at all; one that does reads one number.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from qsched import exception
from qsched.aggregates import (
    AGGREGATE_SPEC_PREFIX,
    ZONE_KEY,
    Aggregate,
    AggregateIndex,
    AggregateNotFound,
    FilterOptions,
    InvalidAggregateAction,
    NoHostsForTenant,
    request_filters,
)
from qsched.compute.target import gone, take_back
from qsched.context import RequestContext
from qsched.flavors import Constraints, Flavor, request_groups
from qsched.ledger import Stores
from qsched.policies import aggregates as aggregates_policy
from qsched.policy import Policy

if TYPE_CHECKING:
    from qsched.compute.cell import Cell
    from qsched.compute.target import Cells


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a boot may go: its constraints for routing, the zone it asked for, and
    why it cannot go anywhere (a NoValidHost to record at once), if so."""

    constraints: Constraints
    requested_zone: str | None
    unplaceable: str | None = None


class AggregateAPI:
    """The aggregates of one cell as a boot is routed by them (see the module
    docstring); the admin's calls are :class:`Aggregates`'."""

    def __init__(self, stores: Stores, policy: Policy, filters: FilterOptions) -> None:
        self.store = stores.aggregates
        self.policy = policy
        self.filters = filters
        self._index = AggregateIndex(())
        self._version = -1
        self._lock = threading.Lock()

    # -- a boot's routing --

    def has_zone(self, zone: str) -> bool:
        """Whether some aggregate makes ``zone`` (reads the version once)."""
        return zone in self.index().by_zone

    def route(self, project_id: str, constraints: Constraints, flavor: Flavor) -> Route:
        """The constraints a boot is routed by, once the aggregates had their say.

        A zone some aggregate makes becomes "one of the zone's aggregates"
        (``member_of_any``) and leaves the constraints, so that hosts join a zone
        by joining its aggregate; the zone is still what the boot asked for.
        """
        zone = constraints.availability_zone
        specs = flavor.extra_specs
        wanted = (
            zone
            or self.filters.limit_tenants_to_placement_aggregate
            or self.filters.enable_isolated_aggregate_filtering
            or any(key.startswith(AGGREGATE_SPEC_PREFIX) for key in specs)
        )
        if not wanted:
            return Route(constraints, zone)
        index = self.index()
        flavor_traits = frozenset().union(*(g.required_traits for g in request_groups(flavor)))
        try:
            routed = request_filters(
                index, self.filters, project_id, constraints, flavor_traits, specs
            )
        except NoHostsForTenant as exc:
            nowhere = dataclasses.replace(constraints, member_of_any=(frozenset(),))
            return Route(nowhere, zone, unplaceable=str(exc))
        if zone and zone in index.by_zone:
            routed = dataclasses.replace(routed, availability_zone=None)
        return Route(routed, zone)

    def index(self) -> AggregateIndex:
        """The aggregates as the filters read them, rebuilt when the ledger's version moved."""
        version = self.store.version()
        if version != self._version:
            with self._lock:
                if version != self._version:
                    self._index = AggregateIndex(self.store.list())
                    self._version = version
        return self._index


class Aggregates:
    """The aggregates of the front door's cells (see the module docstring)."""

    def __init__(self, cells: Cells) -> None:
        self.cells = cells

    def _authorize(self, context: RequestContext, rule: str) -> None:
        self.cells.reader.policy.authorize(context, rule)

    # -- reads --

    def list(self, context: RequestContext) -> builtins.list[Aggregate]:
        """Every aggregate, by id, each merged from every cell's copy."""
        self._authorize(context, aggregates_policy.INDEX)
        copies: dict[int, builtins.list[Aggregate]] = {}
        for cell in self.cells.each():
            for found in cell.aggregates.store.list():
                copies.setdefault(found.id, []).append(found)
        return [_merged(copies[i]) for i in sorted(copies)]

    def get(self, context: RequestContext, aggregate_id: int) -> Aggregate:
        """:raises AggregateNotFound: no cell has it (404)."""
        self._authorize(context, aggregates_policy.SHOW)
        return self._get(aggregate_id)

    def _get(self, aggregate_id: int) -> Aggregate:
        copies = []
        for cell in self.cells.each():
            try:
                copies.append(cell.aggregates.store.get(aggregate_id))
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
        cells = self.cells.each()
        floor = max(cell.aggregates.store.last_id() for cell in cells) if len(cells) > 1 else 0
        aggregate_id = self.cells.new_aggregate_id(floor)
        uuid = str(uuidlib.uuid4())
        written: builtins.list[Cell] = []
        made: builtins.list[Aggregate] = []

        def create(cell: Cell) -> Aggregate:
            made.append(cell.aggregates.store.create(name, zone, aggregate_id, uuid))
            written.append(cell)
            return made[-1]

        with self.cells.aggregate_writes(aggregate_id):
            try:
                return self.cells.every(create)
            except exception.QschedError:
                if made:  # one id in every cell
                    take_back(written, lambda cell: cell.aggregates.store.delete(made[0].id))
                raise

    def update(
        self, context: RequestContext, aggregate_id: int, changes: Mapping[str, str | None]
    ) -> Aggregate:
        """Rename it or move it to a zone in every cell.

        :raises AggregateNotFound: no cell has it (404).
        :raises AggregateNameExists, InvalidAggregateAction: a cell refused (409, 400);
            the cells written before it are put back.
        :raises BackendUnavailable: a cell did not answer (503), once the others were
            written: the retry completes it.
        :raises AggregateBusy: another writer held it (409).
        """
        self._authorize(context, aggregates_policy.UPDATE)
        with self.cells.aggregate_writes(aggregate_id):
            before = self._get(aggregate_id)
            back: dict[str, str | None] = {}
            if "name" in changes:
                back["name"] = before.name
            if ZONE_KEY in changes:
                back[ZONE_KEY] = before.availability_zone
            return self._change(
                aggregate_id,
                lambda cell: cell.aggregates.store.update(aggregate_id, changes),
                lambda cell: cell.aggregates.store.update(aggregate_id, back),
            )

    def set_metadata(
        self, context: RequestContext, aggregate_id: int, changes: Mapping[str, str | None]
    ) -> Aggregate:
        """Set and remove metadata keys in every cell; raises as :meth:`update`."""
        self._authorize(context, aggregates_policy.SET_METADATA)
        with self.cells.aggregate_writes(aggregate_id):
            before = self._get(aggregate_id)
            back = {key: before.metadata.get(key) for key in changes}
            return self._change(
                aggregate_id,
                lambda cell: cell.aggregates.store.set_metadata(aggregate_id, changes),
                lambda cell: cell.aggregates.store.set_metadata(aggregate_id, back),
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
        with self.cells.aggregate_writes(aggregate_id):
            if self._get(aggregate_id).hosts:
                raise InvalidAggregateAction(action="remove host from aggregate",
                                             aggregate_id=aggregate_id,
                                             reason="Host aggregate is not empty")  # fmt: skip
            self.cells.every(lambda cell: cell.aggregates.store.delete(aggregate_id),
                             gone(AggregateNotFound))  # fmt: skip

    def _change(
        self,
        aggregate_id: int,
        write: Callable[[Cell], object],
        undo: Callable[[Cell], object],
    ) -> Aggregate:
        written: builtins.list[Cell] = []

        def change(cell: Cell) -> object:
            done = write(cell)
            written.append(cell)
            return done

        try:
            self.cells.every(change, gone(AggregateNotFound))
        except exception.BackendUnavailable:
            raise  # what was written stays: the retry completes it
        except exception.QschedError:
            take_back(written, undo)
            raise
        return self._get(aggregate_id)

    # -- hosts: in their cell --

    def add_host(self, context: RequestContext, aggregate_id: int, host: str) -> Aggregate:
        """Add ``host`` to the aggregate in the host's cell; the aggregate of every cell
        merged.

        :raises ComputeHostNotFound: no cell has the host (404).
        """
        self._authorize(context, aggregates_policy.ADD_HOST)
        try:
            self.cells.host_cell(host).aggregates.store.add_host(aggregate_id, host)
        except exception.ComputeHostNotFound:
            # mapped to a cell that no longer has it: ask every cell again, once
            again = self.cells.host_cell(host, fresh=True)
            again.aggregates.store.add_host(aggregate_id, host)
        return self._get(aggregate_id)

    def remove_host(self, context: RequestContext, aggregate_id: int, host: str) -> Aggregate:
        """Take ``host`` out of the aggregate in its cell.

        :raises ComputeHostNotFound: no cell has the host (404).
        """
        self._authorize(context, aggregates_policy.REMOVE_HOST)
        self.cells.host_cell(host).aggregates.store.remove_host(aggregate_id, host)
        return self._get(aggregate_id)


def _merged(copies: Sequence[Aggregate]) -> Aggregate:
    """One aggregate from its cells' copies: the first one's name and metadata, every
    cell's hosts, the latest change."""
    changed = [copy.updated_at for copy in copies if copy.updated_at is not None]
    hosts = frozenset().union(*(copy.hosts for copy in copies))
    return dataclasses.replace(copies[0], hosts=hosts, updated_at=max(changed, default=None))
