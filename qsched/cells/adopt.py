"""Carry over what a cell made alone into a deployment of several cells: ``qsched-admin
cells adopt`` (docs/admin.rst, docs/scale.rst), as Nova's ``nova-manage cell_v2
discover_hosts`` and its online data migrations.

A cell that ran alone and is then served with others by one front door
(:class:`qsched.cells.router.CellsCompute`) holds what the front door does not know:

* server groups without a **group mapping** (listed, but not found, not counted):
  each is mapped to its cell and project in the API keyspace and counted in the
  project's ``server_groups`` there (``group_adopt``, one step). Never refused: a
  project may end above its limit, as Nova lets one after a limit is lowered, and
  the report names it;
* aggregates in some cells only: copied to the others with their id, uuid, name and
  metadata, without hosts (each cell's copy holds that cell's hosts). One whose id or
  name is another aggregate's in a cell it is missing from cannot be copied: it is
  reported with what to rename or delete, and the others are copied. ``agg-seq``
  is raised to the highest id any cell gave, so the next id is above them all;
* hosts: each cell's compute services are mapped to it (``host-map:<host>``), so the
  first call about one reads its mapping instead of asking every cell.

What is adopted already is left as it is: a second run writes nothing. A cell whose
ledger does not answer is reported and passed over (what needs it waits for a run it
answers); the API keyspace not answering stops the run (BackendUnavailable).

Safe while the API serves. A group is mapped, then looked up in its cell again: one
deleted meanwhile has its mapping dropped again (a delete that found the mapping
drops it too). An aggregate is copied under its lock in the API keyspace
(``agg-lock:<id>``), which every write of the front door to it holds too
(:func:`qsched.cells.aggregates.aggregate_lock`): its copies are read again under the
lock, so a create, rename or delete going through the cells is never met half way
nor undone; one deleted or whose id or name was taken since the first read is not
copied, and the report says to run again, as for one whose lock stayed taken.

Cost: O(groups + aggregates + hosts) a cell, read in bulk: each cell's group index,
aggregates and services, their mappings a thousand a round trip; one script a group
adopted, O(cells) round trips an aggregate copied (two more for its lock), a thousand
hosts a round trip.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from qsched import exception
from qsched.aggregates import Aggregate, AggregateNotFound
from qsched.cells.aggregates import AGGREGATE_WAIT_S, AggregateBusy, aggregate_lock
from qsched.ledger import Stores
from qsched.ledger.base import ServerGroup
from qsched.ledger.cellmap import RedisCellMap, cell_map

T = TypeVar("T")
#: what a collision's fix ends with
AGAIN = "then run qsched-admin cells adopt again"
#: the results of an aggregate's copy that a later run may change
RETRY = ("busy", "changed meanwhile")
Progress = Callable[[str], None]


@dataclasses.dataclass
class CellPart:
    """One cell's part of a run: its groups and hosts, or why it was passed over."""

    cell: str
    groups: int = 0  # its server groups
    groups_adopted: int = 0  # mapped by this run (or, dry, that would be)
    hosts: int = 0  # its compute services
    hosts_mapped: int = 0  # mapped to it by this run: unmapped, or mapped to a cell without it
    error: str | None = None  # its ledger did not answer: passed over


@dataclasses.dataclass
class AdoptReport:
    """What :func:`adopt` did (or, ``dry_run``, would do); see :meth:`to_dict`."""

    dry_run: bool
    cells: list[CellPart]
    groups: list[dict[str, str]] = dataclasses.field(default_factory=list)
    groups_elsewhere: list[dict[str, str]] = dataclasses.field(default_factory=list)
    over_limit: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    hosts_elsewhere: list[dict[str, str]] = dataclasses.field(default_factory=list)
    aggregates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    collisions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    aggregate_seq: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    @property
    def down(self) -> list[str]:
        return [part.cell for part in self.cells if part.error is not None]

    @property
    def retry(self) -> list[int]:
        """Aggregates not copied because the API wrote them meanwhile (``busy``: its
        lock stayed taken; ``changed meanwhile``: deleted, or its id or name taken)."""
        return [a["id"] for a in self.aggregates if a["result"] in RETRY]

    @property
    def complete(self) -> bool:
        """Everything carried over: no cell passed over, no collision, nothing to retry."""
        return not (self.down or self.collisions or self.groups_elsewhere or self.retry)

    def to_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["complete"] = self.complete
        return found


class _CellDown(Exception):
    """A cell's ledger did not answer: the run goes on without it."""

    def __init__(self, cell: str, cause: exception.BackendUnavailable) -> None:
        super().__init__(cell)
        self.cell = cell
        self.cause = cause


def _in(cell: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call`` to cell ``cell``'s keyspace: its outage is :class:`_CellDown` (a call to
    the API keyspace is made bare: its outage stops the run)."""
    try:
        return call(*args, **kwargs)
    except exception.BackendUnavailable as exc:
        raise _CellDown(cell, exc) from exc


def adopt(
    api: Stores,
    cells: Mapping[str, Stores],
    dry_run: bool = False,
    down: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    describe: Callable[[str, exception.BackendUnavailable], str] | None = None,
    lock_wait_s: float = AGGREGATE_WAIT_S,
) -> AdoptReport:
    """Adopt into the API keyspace ``api`` what ``cells`` (name -> stores, in the order
    of the ``[cells] cell`` lines) made alone: see the module docstring.

    ``down``: cells that could not even be opened, with why (reported, passed over);
    ``progress``: told a line after each step; ``describe``: a cell's outage as the
    report words it (default: the error's text); ``lock_wait_s``: how long a copy
    waits for an aggregate the front door is writing.

    :raises BackendUnavailable: the API keyspace did not answer.
    """
    started = time.monotonic()
    down = dict(down or {})
    run = _Run(api, cells, set(down), dry_run, progress or (lambda line: None),
               describe or (lambda cell, exc: str(exc)), lock_wait_s)  # fmt: skip
    report = run.report
    report.cells += [CellPart(name, error=why) for name, why in down.items()]
    for name in cells:
        try:
            run.cell(name)
        except _CellDown as exc:
            run.passed_over(exc)
    run.count_over_limit()
    run.aggregates()
    order = list(cells) + list(down)
    report.cells.sort(key=lambda part: order.index(part.cell))
    report.seconds = round(time.monotonic() - started, 3)
    return report


class _Run:
    """One run of :func:`adopt`: its report, and the cells that still answer."""

    def __init__(
        self,
        api: Stores,
        cells: Mapping[str, Stores],
        unopened: set[str],
        dry_run: bool,
        progress: Progress,
        describe: Callable[[str, exception.BackendUnavailable], str],
        lock_wait_s: float,
    ) -> None:
        self.map: RedisCellMap = cell_map(api)
        self.cells = dict(cells)
        self.unopened = unopened  # cells named that could not be opened
        self.answering = dict(cells)
        self.dry_run = dry_run
        self.progress = progress
        self.describe = describe
        self.report = AdoptReport(dry_run, [])
        self.parts: dict[str, CellPart] = {}
        self.projects: dict[str, list[int]] = {}  # project: [held before, limit, adopted]
        self.lock_wait_s = lock_wait_s

    def passed_over(self, down: _CellDown) -> None:
        """Cell ``down.cell`` did not answer: reported, and left out from now on."""
        part = self._part(down.cell)
        part.error = self.describe(down.cell, down.cause)
        self.answering.pop(down.cell, None)
        self.progress(f"{down.cell}: passed over: {part.error}")

    # -- a cell's groups and hosts --

    def _part(self, name: str) -> CellPart:
        if name not in self.parts:
            self.parts[name] = CellPart(name)
            self.report.cells.append(self.parts[name])
        return self.parts[name]

    def cell(self, name: str) -> None:
        """Adopt cell ``name``'s groups and hosts (nothing if it was passed over already:
        another cell's host asked about it)."""
        part = self._part(name)
        if name in self.answering:
            self._groups(name, part)
            self._hosts(name, part)

    def _groups(self, name: str, part: CellPart) -> None:
        """Map the cell's groups that have no mapping; a group mapped to another cell or
        project is reported."""
        groups = _in(name, self.cells[name].groups.list_all)
        part.groups = len(groups)
        mapped = self.map.group_mappings_of([g.uuid for g in groups])
        adopted = []
        for group in groups:
            found = mapped[group.uuid]
            if found is None:
                found = self._adopt_group(name, group)
            if found is None:
                adopted.append(group)
            elif found != (name, group.project_id):
                self._elsewhere(name, group, found)
        if not self.dry_run:
            adopted = [g for g in adopted if self._still_there(name, g)]
        part.groups_adopted = len(adopted)
        self.report.groups += [{"uuid": g.uuid, "name": g.name, "project_id": g.project_id,
                                "cell": name} for g in adopted]  # fmt: skip
        self.progress(f"{name}: {part.groups} server groups, {len(adopted)} "
                      f"{'to adopt' if self.dry_run else 'adopted'}")  # fmt: skip

    def _adopt_group(self, name: str, group: ServerGroup) -> tuple[str, str] | None:
        """Map one group (None: done, or would be); the mapping it has if it has one."""
        done = self.map.adopt_group(group.uuid, name, group.project_id, not self.dry_run)
        if done.state != "adopted":
            return (str(done.cell), str(done.project))
        count = self.projects.setdefault(group.project_id, [done.held, done.limit, 0])
        count[2] += 1
        return None

    def _still_there(self, name: str, group: ServerGroup) -> bool:
        """Whether its cell still has an adopted group; its mapping dropped if not (a
        delete in the cell while it was adopted)."""
        try:
            _in(name, self.cells[name].groups.get, group.uuid, members=False)
        except exception.GroupNotFound:
            self.map.unmap_group(group.uuid, group.project_id)
            self.projects[group.project_id][2] -= 1
            return False
        return True

    def count_over_limit(self) -> None:
        """The projects this run's groups put (or, dry, would put) above their
        ``server_groups``: Nova lets a project hold more after a limit is lowered."""
        for project, (held, limit, adopted) in sorted(self.projects.items()):
            if adopted and 0 <= limit < held + adopted:
                self.report.over_limit.append({"project_id": project,
                                               "server_groups": held + adopted,
                                               "limit": limit})  # fmt: skip

    def _elsewhere(self, name: str, group: ServerGroup, found: tuple[str, str]) -> None:
        cell, project = found
        self.report.groups_elsewhere.append({
            "uuid": group.uuid, "project_id": group.project_id, "cell": name,
            "mapped_cell": cell, "mapped_project": project,
            "fix": f"server group {group.uuid} of {group.project_id} is in {name} and mapped "
                   f"to {cell} for {project}: if {cell} holds it too, delete one of the two in "
                   f"its cell; if it does not, a delete of it through the API drops that "
                   f"mapping (it answers 404); {AGAIN}",
        })  # fmt: skip

    def _hosts(self, name: str, part: CellPart) -> None:
        """Map the cell's hosts: those with no mapping, and those mapped to a cell that
        does not have them (a host that moved); one that two cells have is reported."""
        hosts = sorted(s.host for s in _in(name, self.cells[name].agents.services))
        part.hosts = len(hosts)
        for start in range(0, len(hosts), 1000):
            self._host_batch(name, part, hosts[start : start + 1000])
            if len(hosts) > 1000:
                self.progress(f"{name}: {min(start + 1000, len(hosts)):,} of {len(hosts):,} "
                              "hosts looked at")  # fmt: skip
        self.progress(f"{name}: {part.hosts} hosts, {part.hosts_mapped} "
                      f"{'to map' if self.dry_run else 'mapped now'}")  # fmt: skip

    def _host_batch(self, name: str, part: CellPart, hosts: list[str]) -> None:
        mapped = self.map.host_cells(hosts)
        unmapped = [h for h in hosts if mapped[h] is None]
        moved = []
        for host in hosts:
            other = mapped[host]
            if other is None or other == name:
                continue
            if self._has_host(other, host):
                self.report.hosts_elsewhere.append({"host": host, "cell": name,
                                                    "mapped_cell": other})  # fmt: skip
            else:
                moved.append(host)
        if self.dry_run:
            part.hosts_mapped += len(unmapped) + len(moved)
            return
        part.hosts_mapped += self.map.map_hosts(unmapped, name)
        for host in moved:
            self.map.map_host(host, name)
        part.hosts_mapped += len(moved)

    def _has_host(self, cell: str, host: str) -> bool:
        """Whether cell ``cell`` has a service on ``host``: True when it cannot say (a
        cell passed over: the mapping is kept), False for a cell no line names now."""
        stores = self.answering.get(cell)
        if stores is None:
            return cell in self.cells or cell in self.unopened
        try:
            _in(cell, stores.agents.service, host)
        except exception.ComputeHostNotFound:
            return False
        except _CellDown as exc:
            self.passed_over(exc)
            return True
        return True

    # -- aggregates, over every cell that answers --

    def aggregates(self) -> None:
        copies = self._read_aggregates()
        if copies is None:
            return
        clashes: set[frozenset[str]] = set()
        for uuid in sorted(copies, key=lambda u: (min(a.id for a in copies[u].values()), u)):
            held = copies[uuid]
            missing = [c for c in self.answering if c not in held]
            if not missing:
                continue
            found = self._collisions(uuid, copies, missing)
            for kind, theirs in found:
                key = frozenset([kind, uuid, theirs[1].uuid])
                if key not in clashes:
                    clashes.add(key)
                    self.report.collisions.append(_collision(kind, held, theirs, self.cells))
            if not found:
                self._copy(held, missing)
        self._raise_seq()

    def _read_aggregates(self) -> dict[str, dict[str, Aggregate]] | None:
        """uuid -> cell -> that cell's copy, of every cell that answers; None: none does."""
        copies: dict[str, dict[str, Aggregate]] = {}
        for name in list(self.answering):
            try:
                listed = _in(name, self.answering[name].aggregates.list)
            except _CellDown as exc:
                self.passed_over(exc)
                continue
            for found in listed:
                copies.setdefault(found.uuid, {})[name] = found
        return copies if self.answering else None

    def _collisions(
        self, uuid: str, copies: Mapping[str, Mapping[str, Aggregate]], missing: list[str]
    ) -> list[tuple[str, tuple[str, Aggregate]]]:
        """What keeps aggregate ``uuid`` out of the cells it is missing from: another
        aggregate of its id or name there (kind ``id`` or ``name``), with its cell."""
        mine = next(iter(copies[uuid].values()))
        found = []
        for other, held in copies.items():
            for cell, theirs in held.items():
                if other == uuid or cell not in missing:
                    continue
                if theirs.id == mine.id:
                    found.append(("id", (cell, theirs)))
                elif theirs.name == mine.name:
                    found.append(("name", (cell, theirs)))
        return found

    def _copy(self, held: Mapping[str, Aggregate], missing: list[str]) -> None:
        source, first = next(iter(held.items()))
        result, into = "would copy", missing
        if not self.dry_run:
            try:
                with aggregate_lock(self.map, first.id, self.lock_wait_s):
                    result, into = self._copied(first)
            except AggregateBusy:
                result = "busy"
            except _CellDown as exc:
                self.passed_over(exc)  # the copies made stay: the next run completes them
                result = "passed over"
        self.report.aggregates.append({
            "id": first.id, "uuid": first.uuid, "name": first.name, "source": source,
            "into": into, "result": result})  # fmt: skip
        self.progress(f"aggregate {first.id} ({first.name}): {result} from {source} into "
                      f"{', '.join(into) or 'none'}")  # fmt: skip

    def _copied(self, first: Aggregate) -> tuple[str, list[str]]:
        """Copy ``first`` into the cells without it, as the first cell that has it holds
        it now, read again under its lock (no writer of it runs meanwhile); the result
        and the cells it went to. Nothing is copied when it was deleted, or its id taken
        by another, since the cells were read.

        :raises _CellDown: a cell did not answer.
        """
        now = {cell: self._aggregate(cell, first.id) for cell in list(self.answering)}
        if any(copy is not None and copy.uuid != first.uuid for copy in now.values()):
            return "changed meanwhile", []
        base = next((copy for copy in now.values() if copy is not None), None)
        if base is None:
            return "changed meanwhile", []  # deleted through the API since the read
        made: list[str] = []
        for cell in [c for c, copy in now.items() if copy is None]:
            store = self.answering[cell].aggregates
            try:
                _in(cell, store.put, base)
            except exception.Conflict:  # its name taken there since the read
                for done in made:
                    _in(done, self.answering[done].aggregates.delete, base.id)
                return "changed meanwhile", []
            made.append(cell)
        return "copied", made

    def _aggregate(self, cell: str, aggregate_id: int) -> Aggregate | None:
        try:
            return _in(cell, self.answering[cell].aggregates.get, aggregate_id)
        except AggregateNotFound:
            return None

    def _raise_seq(self) -> None:
        """``agg-seq`` at least the highest id any cell that answers gave."""
        floor = 0
        for name in list(self.answering):
            try:
                floor = max(floor, _in(name, self.answering[name].aggregates.last_id))
            except _CellDown as exc:
                self.passed_over(exc)
        if self.dry_run:
            before = self.map.aggregate_seq()
            self.report.aggregate_seq = {"before": before, "after": max(before, floor)}
            return
        before, after = self.map.raise_aggregate_seq(floor)
        self.report.aggregate_seq = {"before": before, "after": after}


def _collision(
    kind: str,
    held: Mapping[str, Aggregate],
    theirs: tuple[str, Aggregate],
    cells: Mapping[str, Stores],
) -> dict[str, Any]:
    """A collision as the report gives it: both aggregates, and the fix."""
    cell, other = theirs
    home, mine = next(iter(held.items()))
    order = list(cells)
    # the aggregate of the cell named later (most often the newcomer) is the one to change
    first, later = ((home, mine), (cell, other))
    if order.index(home) > order.index(cell):
        first, later = later, first
    (keep_cell, keep), (fix_cell, fix) = first, later
    both = [{"cell": c, "id": a.id, "uuid": a.uuid, "name": a.name}
            for c, a in (first, later)]  # fmt: skip
    if kind == "id":
        text = (
            f"aggregate id {fix.id} is {keep.name!r} ({keep.uuid}) in {keep_cell} and "
            f"{fix.name!r} ({fix.uuid}) in {fix_cell}: the API can show one of them only. "
            f"Give {fix.name!r} an id of every cell: in {fix_cell} alone (with that cell's own "
            f"configuration, no [cells]), remove its hosts and delete it, then create it again "
            f"through the API and add its hosts back; {AGAIN}"
        )
    else:
        text = (
            f"aggregate {keep.id} {keep.name!r} ({keep_cell}) and aggregate {fix.id} "
            f"{fix.name!r} ({fix_cell}) have one name, which one aggregate holds in a cell: "
            f"rename aggregate {fix.id} through the API (openstack aggregate set --name "
            f"<new name> {fix.id}), or delete it; {AGAIN}"
        )
    return {"kind": kind, "aggregates": both, "fix": text}
