"""Which cell a call of the front door targets: :class:`CellsCompute`, the
several-cells :class:`~qsched.compute.target.Cells`.

The cell of an instance (its mapping in the API keyspace), of a host or a node (their
mappings, looked up in every cell the first time), of a zone (``[cells] zone``), or a
cell drawn in proportion to how many of the flavor its free capacity holds, among the
cells with hosts in the aggregates the boot asks for; a boot into the chosen cell
(quota reserved and mapped in the API keyspace first: :mod:`qsched.cells.booting`);
the cell of a listing's marker; the joined cells a write to every cell goes to. What
a call does in its cell is the front door's (:class:`qsched.compute.api.ComputeAPI`),
written once.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from qsched import exception
from qsched.aggregates import AggregateIndex
from qsched.cells.aggregates import aggregate_lock
from qsched.cells.booting import CellBoots
from qsched.cells.groups import GroupMappings
from qsched.cells.join import CellNotJoined, UnknownCell, join
from qsched.compute.cell import Cell
from qsched.compute.target import Done, never, write_every_cell
from qsched.flavors import Constraints, Flavor
from qsched.ledger import Stores
from qsched.ledger.base import LedgerUnavailable, QuotaStore
from qsched.ledger.cellmap import RedisCellMap, cell_map
from qsched.scheduling.request import flavor_demand

LOG = logging.getLogger(__name__)


#: How long a cell's free capacity read for a boot's draw is used again: half the
#: agents' default heartbeat (``[agent] heartbeat_interval_s``, 2 s), which it lags anyway.
FREE_READ_S = 1.0
T = TypeVar("T")


class CellsCompute(CellBoots, GroupMappings):
    """The cells behind one front door; see the module docstring.

    ``api``: the stores of the API keyspace (its quota is the deployment's);
    ``cells``: each :class:`~qsched.compute.cell.Cell` by cell name, every cell :func:`join`-ed but
    those of ``unjoined``, which no boot goes to until :meth:`join_waiting` joined
    them; ``zones``: availability zone -> the cell that serves it; ``opened``: what
    :meth:`close` closes (what :func:`open_cells` opened; nothing for given cells).
    """

    def __init__(
        self,
        api: Stores,
        cells: Mapping[str, Cell],
        zones: Mapping[str, str] | None = None,
        opened: Sequence[Callable[[], object]] = (),
        unjoined: Iterable[str] = (),
    ) -> None:
        if not cells:
            raise exception.Invalid(reason="several cells need at least one cell")
        self.api = api
        self.quota: QuotaStore = api.quota
        self.map: RedisCellMap = cell_map(api)
        self.cells = dict(cells)
        self.maps = {name: cell_map(compute.stores) for name, compute in self.cells.items()}
        self.zones = dict(zones or {})
        for zone, name in self.zones.items():
            if name not in self.cells:
                raise UnknownCell(cell=f"{name!r} (zone {zone})", known=", ".join(self.cells))
        self._unjoined = set(unjoined)
        if self._unjoined - set(self.cells):
            raise UnknownCell(cell=", ".join(sorted(self._unjoined - set(self.cells))),
                              known=", ".join(self.cells))  # fmt: skip
        self._joining = threading.Lock()
        self._opened = list(opened)
        self._draw = random.Random()
        self._free: dict[str, tuple[float, dict[str, int]]] = {}  # cell: (read at, free)

    def close(self) -> None:
        """Close the buses and ledger connections :func:`open_cells` opened."""
        close_all(self._opened)

    @property
    def reader(self) -> Cell:
        """The first joined cell (one not joined may be one whose ledger does not
        answer), the first cell when none is: where :meth:`read` reads first what every
        cell holds alike (the same flavors: ``[api] flavor`` and those the front door
        writes to every cell), and where the callers' rights are asked (every cell has
        the same rules)."""
        return next(iter(self.joined().values()), next(iter(self.cells.values())))

    def read(self, call: Callable[[Cell], T]) -> T:
        """``call`` of the first joined cell whose ledger answers (the first cell when
        none is joined), in the order of the ``[cells] cell`` lines: how what every cell
        holds alike, flavors and keypairs, is read, so that one cell down stops no read.
        What ``call`` raises but an outage is the answer (a flavor the first cell that
        answers does not have is not found).

        :raises BackendUnavailable: no joined cell answered (the first one's outage).
        """
        first: exception.BackendUnavailable | None = None
        for compute in list(self.joined().values()) or [self.reader]:
            try:
                return call(compute)
            except exception.BackendUnavailable as exc:
                first = first or exc
        assert first is not None
        raise first

    # -- joining --

    @property
    def unjoined(self) -> frozenset[str]:
        """The cells no boot goes to yet: their ledger did not answer their join."""
        return frozenset(self._unjoined)

    def joined(self) -> dict[str, Cell]:
        """The joined cells, the ones boots go to, by name in the order of the ``[cells]
        cell`` lines (in memory: no read)."""
        return {name: c for name, c in self.cells.items() if name not in self._unjoined}

    def join_waiting(self) -> tuple[list[str], dict[str, exception.BackendUnavailable]]:
        """Join the cells not joined yet (:func:`join`, idempotent); boots may go to
        each from then on. One call a cell not joined, nothing when every cell is.

        Returns the cells joined now, and those whose ledger still did not answer,
        each with its outage.
        """
        joined: list[str] = []
        failed: dict[str, exception.BackendUnavailable] = {}
        with self._joining:
            for name in sorted(self._unjoined):
                try:
                    join(self.cells[name].stores)
                    flavors = self._copy_flavors(name)
                    aggregates = self._copy_aggregates(name)
                except exception.BackendUnavailable as exc:
                    failed[name] = exc
                    continue
                self._unjoined.discard(name)
                joined.append(name)
                LOG.info("cells: cell %s joined (%d flavors and %d aggregates written there); "
                         "boots may go there from now on", name, flavors, aggregates)  # fmt: skip
        return joined, failed

    def _copy_flavors(self, name: str) -> int:
        """Write into cell ``name``, not joined yet, the flavors of the joined cells
        (those written while it was away, and ``[api] flavor``), as they are there
        (:meth:`read`); how many changed. Nothing when no cell is joined. One read, and a
        write a flavor that changed.

        :raises BackendUnavailable: a ledger did not answer: the cell is not joined yet.
        """
        if not self.joined():
            return 0
        into = self.cells[name].stores.flavors
        return sum(into.put(flavor) for flavor in self.read(lambda c: c.stores.flavors.list()))

    def _copy_aggregates(self, name: str) -> int:
        """Write into cell ``name``, not joined yet, every aggregate of the joined cells
        it lacks (:meth:`read`), with their id, uuid, name and metadata and none of
        their hosts (a cell's copy holds its own hosts only; :mod:`qsched.cells.aggregates`);
        how many were written. Nothing when no cell is joined. One read, and a script an
        aggregate (one that is there already writes nothing).

        An aggregate of the same id or name that is another one there, or this one with
        another name or metadata, is left as it is, named in a warning (and by
        :func:`audit`): that aggregate is not written there, and the cell is joined.

        :raises BackendUnavailable: a ledger did not answer: the cell is not joined yet.
        """
        if not self.joined():
            return 0
        into = self.cells[name].aggregates.store
        written = 0
        for aggregate in self.read(lambda c: c.aggregates.store.list()):
            try:
                written += into.put(aggregate)
            except exception.Conflict as exc:
                LOG.warning("cells: aggregate %d (%s, uuid %s) is not written into cell %s, "
                            "joined now, which holds another in its place: %s; boots there do "
                            "not see it (qsched.cells.audit.audit_cells names it)",
                            aggregate.id, aggregate.name, aggregate.uuid, name, exc)  # fmt: skip
        return written

    # -- where an instance is --

    def mapping(self, uuid: str) -> tuple[str, str]:
        """The cell an instance was booted in and its project: one read.

        :raises InstanceNotFound: no mapping (never booted here, or a bad uuid).
        """
        found = self.map.mapping(uuid)
        if found is None:
            raise exception.InstanceNotFound(instance=uuid)
        return found

    def cell_of_host(self, host: str, fresh: bool = False) -> str | None:
        """The cell of compute host ``host``: its host mapping (``host-map:<host>``, one
        read), else each cell asked in turn and the one that has it mapped (O(cells),
        once a host; ``fresh``: ask them even when it is mapped); None: no cell has it.

        :raises BackendUnavailable: a cell did not answer, and none that did has it.
        """
        mapped = None if fresh else self.map.host_cell(host)
        return self._located(mapped, lambda compute: has_host(compute, host),
                             lambda cell: self.map.map_host(host, cell))  # fmt: skip

    def cell_of_node(self, node: str, fresh: bool = False) -> str | None:
        """The cell of compute node ``node`` (a provider, by its name: 2.74's
        ``hypervisor_hostname``), as :meth:`cell_of_host` finds a host's, by its node
        mapping (``node-map:<node>``).

        :raises BackendUnavailable: a cell did not answer, and none that did has it.
        """
        mapped = None if fresh else self.map.node_cell(node)
        return self._located(mapped, lambda compute: has_node(compute, node),
                             lambda cell: self.map.map_node(node, cell))  # fmt: skip

    def _located(
        self,
        mapped: str | None,
        has: Callable[[Cell], bool],
        record: Callable[[str], None],
    ) -> str | None:
        """``mapped`` when it names a cell, else the first cell that ``has`` it, which is
        ``record``-ed; None: no cell has it. A cell whose ledger does not answer is
        passed over: a host or node is in one cell.

        :raises BackendUnavailable: a cell did not answer, and none that did has it.
        """
        if mapped in self.cells:
            return mapped
        down: exception.BackendUnavailable | None = None
        for name, compute in self.cells.items():
            try:
                found = has(compute)
            except exception.BackendUnavailable as exc:
                down = down or exc
                continue
            if found:
                record(name)
                return name
        if down is not None:
            raise down
        return None

    def cell_of(self, uuid: str) -> str:
        """The cell an instance was booted in (see :meth:`mapping`)."""
        return self.mapping(uuid)[0]

    def choose(
        self, availability_zone: str | None, flavor: Flavor, project: str | None = None
    ) -> str:
        """The cell of a boot: its zone's (``[cells] zone``); else a cell drawn among
        those that have hosts in the aggregates the boot's request filters ask for
        (:meth:`aggregate_cells`; all when none asks, or when no cell has such hosts:
        the boot then fails in its cell as in one), each in
        proportion to how many of ``flavor`` its free capacity holds (its free VCPU,
        MEMORY_MB, DISK_GB, ... each divided by what the flavor asks, the least of
        them). One read a cell at most, O(cells), never O(hosts): ``cell-free``, what
        the cell's live agents said they have free at their last heartbeat
        (:meth:`AgentRegistry.free`), read again after :data:`FREE_READ_S`
        (:meth:`free`).

        The draw, not the fullest cell every time, because those figures are a
        heartbeat old: every boot of a burst would go to the one cell that looked
        emptiest until its agents beat again. It is a sum over hosts, so a cell that
        holds a flavor in sum may not on any one host; its agents then leave the boot
        waiting, and it ends in NoValidHost at its deadline. A cell that holds none is
        drawn only when none holds one; a cell whose ledger does not answer, or that is
        not joined yet, never.

        :raises CellNotJoined: the zone's cell is not joined yet.
        :raises BackendUnavailable: no joined cell's ledger answered.
        """
        if availability_zone is not None and availability_zone in self.zones:
            cell = self.zones[availability_zone]
            if cell in self._unjoined:
                raise CellNotJoined(cell=cell)
            return cell
        among = self.aggregate_cells(project or "", availability_zone, flavor)
        return self.draw(flavor_demand(flavor), among)

    def aggregate_cells(
        self, project: str, availability_zone: str | None, flavor: Flavor
    ) -> set[str] | None:
        """The joined cells with hosts in the aggregates a boot's request filters ask
        for (its zone's aggregates, its project's, those its flavor's
        ``aggregate_instance_extra_specs`` name; :func:`serves`);
        None when they ask for none. Every cell holds every aggregate: the filters are
        run once, on the first joined cell's that answers (:meth:`read`); then one read
        of each cell's aggregate version (its index is kept in memory), O(cells). A
        cell whose ledger does not answer that read is kept among them: a draw passes
        it over, and a boot its hints send there meets its outage. A boot they send
        nowhere (the tenant filter required and the project in no aggregate) is None:
        its cell fails it.
        """
        constraints = Constraints(availability_zone=availability_zone)
        route = self.read(lambda compute: compute.aggregates.route(project, constraints, flavor))
        wanted = route.constraints.member_of_any
        if not wanted or route.unplaceable:
            return None
        return {name for name, compute in self.joined().items() if _serves(compute, wanted)}

    def draw(self, demand: Mapping[str, int], among: set[str] | None = None) -> str:
        """A joined cell drawn in proportion to how many of ``demand`` (resource class ->
        amount) its free capacity holds, as :meth:`choose` draws (one read a cell);
        ``among``: of those cells only, unless it is empty or None.

        :raises BackendUnavailable: no joined cell's ledger answered.
        """
        holds = {}
        for name in self.joined():
            if among and name not in among:
                continue
            try:
                free = self.free(name)
            except exception.BackendUnavailable as exc:
                LOG.warning("cells: cell %s passed over in a draw: %s", name, exc)
                continue
            holds[name] = min((free.get(rc, 0) // n for rc, n in demand.items()), default=0)
        if not holds:
            raise exception.BackendUnavailable(
                backend="ledger", reason="no cell's ledger answered: nothing to draw from"
            )
        names = list(holds)
        weights = [holds[n] for n in names] if any(holds.values()) else None
        return self._draw.choices(names, weights)[0]

    def free(self, name: str) -> dict[str, int]:
        """Cell ``name``'s free capacity (``cell-free``), read at most once every
        :data:`FREE_READ_S` by this process: what its agents beat in is up to a
        heartbeat old anyway, and a burst of boots then reads each cell once rather
        than once a boot.

        :raises BackendUnavailable: the cell's ledger did not answer (not kept: the
            next boot asks again).
        """
        now = time.monotonic()
        kept = self._free.get(name)
        if kept is not None and now - kept[0] < FREE_READ_S:
            return kept[1]
        free = self.cells[name].stores.agents.free()
        self._free[name] = (now, free)
        return free

    # -- what a call of the front door targets (qsched.compute.target.Cells) --

    def each(self) -> list[Cell]:
        """Every cell, in the order of the ``[cells] cell`` lines."""
        return list(self.cells.values())

    def of_instance(self, uuid: str) -> Cell:
        """The cell an instance was booted in (its mapping: one read); every call about
        one server goes there.

        :raises InstanceNotFound: no mapping (never booted here, or a bad uuid).
        """
        return self.cells[self.cell_of(uuid)]

    def every(self, write: Callable[[Cell], T], done: Done = never) -> T:
        """:func:`~qsched.compute.target.write_every_cell` of every cell."""
        return write_every_cell(self.cells, write, done)

    def place_of_marker(self, uuid: str) -> Cell | None:
        """A list's marker's cell (its mapping), whose record gives its place in the
        order every cell lists after.

        :raises InstanceNotFound: no mapping.
        """
        return self.of_instance(uuid)

    def host_cell(self, host: str, fresh: bool = False) -> Cell:
        """The cell of ``host``: its mapping (one read), else each cell asked in turn
        and the one that has it mapped (O(cells), once a host).

        :raises ComputeHostNotFound:
        """
        cell = self.cell_of_host(host, fresh)
        if cell is None:
            raise exception.ComputeHostNotFound(host=host)
        return self.cells[cell]

    def new_aggregate_id(self, floor: int) -> int:
        """The next aggregate id of the API keyspace (``agg-seq``), above ``floor``."""
        return self.map.next_aggregate_id(floor)

    def aggregate_writes(self, aggregate_id: int | None) -> contextlib.AbstractContextManager[None]:
        """The aggregate's lock in the API keyspace (:func:`aggregate_lock`)."""
        assert aggregate_id is not None  # the API keyspace gave it
        return aggregate_lock(self.map, aggregate_id)

    def keyspace_fault(self) -> str | None:
        """Why the API keyspace does not answer a PING (None: it does)."""
        try:
            self.api.backend.ping()
        except LedgerUnavailable as exc:
            LOG.warning("healthcheck: the API keyspace does not answer: %s", exc.reason)
            return exc.category
        return None


def serves(wanted: Sequence[frozenset[str]], index: AggregateIndex) -> bool:
    """Whether a cell whose aggregates are ``index`` has hosts for a boot that must be in
    one aggregate of each group of ``wanted`` (Placement's ``member_of=in:``): one of
    each group has a host there. O(aggregates asked); it does not ask whether one host
    is in one of each group (a boot of several groups whose aggregates share no host
    of the cell waits there, and ends in NoValidHost at its deadline)."""
    found = index.aggregates
    return all(any(u in found and found[u].hosts for u in group) for group in wanted)


def _serves(compute: Cell, wanted: Sequence[frozenset[str]]) -> bool:
    """:func:`serves` of ``compute``'s aggregates; True when its ledger does not answer
    (not known: see :meth:`CellsCompute.aggregate_cells`)."""
    try:
        return serves(wanted, compute.aggregates.index())
    except exception.BackendUnavailable:
        return True


def has_host(compute: Cell, host: str) -> bool:
    """Whether ``compute``'s cell has a compute service on ``host`` (one read)."""
    try:
        compute.stores.agents.service(host)
    except exception.NotFound:
        return False
    return True


def has_node(compute: Cell, node: str) -> bool:
    """Whether ``compute``'s cell has a provider named ``node`` (one read)."""
    return compute.stores.ledger.find_provider(node) is not None


def close_all(opened: Sequence[Callable[[], object]]) -> None:
    """Call each of ``opened`` (what opening the cells opened), last first; one that
    fails is logged and the others still close."""
    for close in reversed(opened):
        try:
            close()
        except Exception:  # the others still close
            LOG.exception("cells: closing %s failed", close)
