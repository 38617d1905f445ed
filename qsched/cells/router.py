"""Which cell a call targets, and a boot into it: :class:`CellsCompute`.

The cell of an instance (its mapping in the API keyspace), of a host or a node (their
mappings, looked up in every cell the first time), of a zone (``[cells] zone``), or a
cell drawn in proportion to how many of the flavor its free capacity holds, among the
cells with hosts in the aggregates the boot asks for; a boot into the chosen cell
(quota reserved and mapped in the API keyspace first); a listing merged over cells.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import random
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from qsched import exception
from qsched.aggregates import AggregateIndex
from qsched.cells.join import CellNotJoined, UnknownCell, join
from qsched.compute.api import ComputeAPI
from qsched.compute.boot import FlavorRefNotFound, Reservation, check_counts
from qsched.compute.list_query import ServerQuery
from qsched.compute.listing import MarkerNotFound
from qsched.context import RequestContext
from qsched.flavors import Constraints, Flavor, ref_id
from qsched.ledger import Stores
from qsched.ledger.base import Instance, QuotaStore
from qsched.ledger.cellmap import RedisCellMap, cell_map
from qsched.scheduling.request import flavor_demand

LOG = logging.getLogger(__name__)


#: How long a cell's free capacity read for a boot's draw is used again: half the
#: agents' default heartbeat (``[agent] heartbeat_interval_s``, 2 s), which it lags anyway.
FREE_READ_S = 1.0
T = TypeVar("T")


class CellsCompute:
    """The servers of several cells behind one front door; see the module docstring.

    ``api``: the stores of the API keyspace (its quota is the deployment's);
    ``cells``: each cell's front door by cell name, every cell :func:`join`-ed but
    those of ``unjoined``, which no boot goes to until :meth:`join_waiting` joined
    them; ``zones``: availability zone -> the cell that serves it; ``opened``: what
    :meth:`close` closes (what :func:`open_cells` opened; nothing for given cells).
    """

    def __init__(
        self,
        api: Stores,
        cells: Mapping[str, ComputeAPI],
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
    def flavor_cell(self) -> ComputeAPI:
        """The first joined cell (one not joined may be one whose ledger does not
        answer), the first cell when none is: where :meth:`read` reads first what every
        cell holds alike (the same flavors: ``[api] flavor`` and those written through
        :mod:`qsched.cells.front_door`, which writes every cell), and where the callers' rights
        are asked (every cell has the same rules)."""
        return next(iter(self.joined().values()), next(iter(self.cells.values())))

    def get_flavor(self, flavor_id: str, context: RequestContext | None = None) -> Flavor:
        """Flavor ``flavor_id`` as ``context`` may see it (:meth:`read`): one cell down
        does not stop the boots of the others.

        :raises FlavorNotFound: the first cell that answers has none.
        :raises BackendUnavailable: no joined cell answered.
        """
        return self.read(lambda compute: compute.get_flavor(flavor_id, context))

    def read(self, call: Callable[[ComputeAPI], T]) -> T:
        """``call`` of the first joined cell whose ledger answers (the first cell when
        none is joined), in the order of the ``[cells] cell`` lines: how what every cell
        holds alike, flavors and keypairs, is read, so that one cell down stops no read.
        What ``call`` raises but an outage is the answer (a flavor the first cell that
        answers does not have is not found).

        :raises BackendUnavailable: no joined cell answered (the first one's outage).
        """
        first: exception.BackendUnavailable | None = None
        for compute in list(self.joined().values()) or [self.flavor_cell]:
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

    def joined(self) -> dict[str, ComputeAPI]:
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

    def key_in(self, compute: ComputeAPI, user_id: str, key_name: str | None) -> None:
        """Make sure the cell of ``compute`` holds keypair ``key_name`` of ``user_id``,
        which a boot there names: copied from another joined cell when it is missing
        (a cell joined after it was made, or away when it was); nothing for no key, or
        a key no cell has (the cell's boot then refuses it, 400). One read when the
        cell has it.
        """
        if key_name is None:
            return
        keypairs = compute.stores.keypairs
        try:
            keypairs.get(user_id, key_name)
            return
        except exception.KeypairNotFound:
            pass
        for name, other in self.joined().items():
            if other is compute:
                continue
            try:
                found = other.stores.keypairs.get(user_id, key_name)
            except (exception.KeypairNotFound, exception.BackendUnavailable):
                continue
            with contextlib.suppress(exception.KeypairExists):  # a boot beside this one
                keypairs.create(found, limit=-1)  # counted against key_pairs when made
            LOG.info("cells: keypair %s of user %s copied from cell %s", key_name, user_id,
                     name)  # fmt: skip
            return

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
        has: Callable[[ComputeAPI], bool],
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

    def compute_of(self, uuid: str) -> ComputeAPI:
        """The front door of the instance's cell; every call about one server goes there."""
        return self.cells[self.cell_of(uuid)]

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

    # -- servers --

    def boot_many(
        self,
        context: RequestContext,
        name: str,
        flavor_ref: str | int,
        image_ref: str = "",
        availability_zone: str | None = None,
        min_count: int = 1,
        max_count: int = 1,
        cell: str | None = None,
        **asked: Any,
    ) -> Reservation:
        """Accept servers in one cell, their quota held in the API keyspace.

        As :meth:`ComputeAPI.boot_many` (``asked``: its other arguments), which the
        chosen cell runs with the uuids reserved here. ``cell``: the cell the boot's
        hints name (the cell of its ``same_host`` servers, of its host or of its
        server group), None: :meth:`choose` one.

        :raises QuotaExceeded: not even ``min_count`` fit the project's limits;
            nothing is held.
        :raises FlavorRefNotFound: no flavor ``flavor_ref`` the caller may boot (400).
        :raises Invalid: bad counts, or ``cell`` is not the cell of the zone asked for;
            nothing is held.
        :raises CellNotJoined: ``cell`` is not joined yet (503).
        """
        check_counts(min_count, max_count)  # before max_count uuids are made
        try:  # its cores and ram count
            flavor = self.get_flavor(ref_id(flavor_ref), context)
        except exception.FlavorNotFound:
            raise FlavorRefNotFound(flavor=ref_id(flavor_ref)) from None
        project = context.project_id
        cell = self._asked_cell(cell, availability_zone, project, flavor) or self.choose(
            availability_zone, flavor, project
        )
        compute = self.cells[cell]
        with self._read_again_if_down(cell):
            # before anything is held
            self.key_in(compute, context.user_id, getattr(asked.get("server"), "key_name", None))
            uuids = [str(uuidlib.uuid4()) for _ in range(max(max_count, 1))]
            held = self.map.hold(uuids, cell, project, flavor.vcpus, flavor.ram_mb, min_count)
            try:
                made = compute.boot_many(
                    context, name, flavor_ref, image_ref, availability_zone,
                    min_count=min(min_count, len(held)), max_count=len(held), uuids=held, **asked,
                )  # fmt: skip
            except exception.BackendUnavailable:
                raise  # the create may have run: the mover settles them from the cell
            except Exception:
                self._unmap(context.project_id, held)
                raise
        self.map.confirm(held)
        unused = [u for u in held if u not in {i.uuid for i in made.instances}]
        if unused:
            self._unmap(context.project_id, unused)
        return made

    @contextlib.contextmanager
    def _read_again_if_down(self, cell: str) -> Iterator[None]:
        """A boot into ``cell`` that a ledger did not answer drops the cell's free
        capacity kept by :meth:`free`: the next draw reads it again, and passes the cell
        over if it is down."""
        try:
            yield
        except exception.BackendUnavailable:
            self._free.pop(cell, None)
            raise

    def _asked_cell(
        self, cell: str | None, availability_zone: str | None, project: str, flavor: Flavor
    ) -> str | None:
        if cell is None:
            return None
        if cell not in self.cells:
            raise UnknownCell(cell=repr(cell), known=", ".join(self.cells))
        serving = self.aggregate_cells(project, availability_zone, flavor)
        if serving and cell not in serving:
            raise exception.Invalid(
                reason=f"the boot's hints name a server, host or server group of cell {cell}, "
                f"and the aggregates its availability zone or request filters ask for have "
                f"hosts in {', '.join(sorted(serving))} only"
            )
        zoned = self.zones.get(availability_zone or "")
        if zoned is not None and zoned != cell:
            raise exception.Invalid(
                reason=f"the boot's hints name a server, host or server group of cell "
                f"{cell}, and its availability zone {availability_zone} is served by cell "
                f"{zoned}"
            )
        if cell in self._unjoined:
            raise CellNotJoined(cell=cell)
        return cell

    def _unmap(self, project: str, uuids: Sequence[str]) -> None:
        """Give back what was reserved for instances that no cell holds."""
        for uuid in uuids:
            self.quota.release(project, uuid)
        self.map.unmap(uuids)

    def list(
        self,
        context: RequestContext,
        limit: int | None = None,
        marker: str | None = None,
        params: Mapping[str, Sequence[str]] | None = None,
        version: tuple[int, int] = (2, 1),
        **asked: Any,
    ) -> list[Instance]:
        """The servers of every cell as one cell would list them (the arguments and
        errors of :meth:`ComputeAPI.list`).

        Each cell lists its page after the same place in the query's order, and the
        pages are merged on that order and cut at the limit: O(cells x limit) beyond
        the cells' own work. A marker may be any cell's: its mapping gives its cell,
        and its record its place in the order (Nova's cross-cell marker).

        :raises MarkerNotFound: no instance ``marker`` the caller may see.
        """
        cells = list(self.cells.values())
        query = cells[0].list_query(context, limit=limit, marker=marker, params=params,
                                    version=version, **asked)  # fmt: skip
        if query.empty:
            return []
        after = self._place_of(context, query) if query.marker else None
        pages = [
            compute.list(context, limit=limit, marker=marker, params=params, version=version,
                         after=after, **asked)
            for compute in cells
        ]  # fmt: skip
        merged = heapq.merge(*pages, key=query.sort_key)
        return list(itertools.islice(merged, cells[0].page_size(query.limit)))

    def _place_of(self, context: RequestContext, query: ServerQuery) -> tuple[Any, ...]:
        marker = str(query.marker)
        try:
            record = self.compute_of(marker).stores.instances.get(marker)
        except exception.InstanceNotFound:
            raise MarkerNotFound(marker=marker) from None
        if not context.is_admin and record.project_id != context.project_id:
            raise MarkerNotFound(marker=marker)
        return query.sort_key(record)

    def get(self, context: RequestContext, uuid: str) -> Any:
        return self.compute_of(uuid).get(context, uuid)

    def update(self, context: RequestContext, uuid: str, changes: Mapping[str, Any]) -> Any:
        return self.compute_of(uuid).update(context, uuid, changes)

    def delete(self, context: RequestContext, uuid: str) -> Any:
        """Delete in the instance's cell; its quota comes back in the API keyspace
        through :class:`QuotaMover` once the cell ends it."""
        return self.compute_of(uuid).delete(context, uuid)


def serves(wanted: Sequence[frozenset[str]], index: AggregateIndex) -> bool:
    """Whether a cell whose aggregates are ``index`` has hosts for a boot that must be in
    one aggregate of each group of ``wanted`` (Placement's ``member_of=in:``): one of
    each group has a host there. O(aggregates asked); it does not ask whether one host
    is in one of each group (a boot of several groups whose aggregates share no host
    of the cell waits there, and ends in NoValidHost at its deadline)."""
    found = index.aggregates
    return all(any(u in found and found[u].hosts for u in group) for group in wanted)


def _serves(compute: ComputeAPI, wanted: Sequence[frozenset[str]]) -> bool:
    """:func:`serves` of ``compute``'s aggregates; True when its ledger does not answer
    (not known: see :meth:`CellsCompute.aggregate_cells`)."""
    try:
        return serves(wanted, compute.aggregates.index())
    except exception.BackendUnavailable:
        return True


def has_host(compute: ComputeAPI, host: str) -> bool:
    """Whether ``compute``'s cell has a compute service on ``host`` (one read)."""
    try:
        compute.stores.agents.service(host)
    except exception.NotFound:
        return False
    return True


def has_node(compute: ComputeAPI, node: str) -> bool:
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
