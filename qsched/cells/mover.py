"""The quota mover: what the cells release, applied to the API keyspace.

No script writes two slots, so a cell indexes each release of quota (``quota-ends``)
in the script that releases it, and :class:`QuotaMover` applies them to the API
keyspace, idempotently, before it drops them from the index. It also settles the
boots and server groups a front door left pending (its process died between the API
keyspace's reservation and the cell's record), and joins the cells not joined yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from qsched import exception
from qsched.cells.router import CellsCompute

LOG = logging.getLogger(__name__)


MOVE_BATCH = 500  # releases read from one cell per round trip


T = TypeVar("T")


class MoverReport(TypedDict):
    """What one pass of :class:`QuotaMover` did."""

    moved: int  # releases applied to the API keyspace
    settled: int  # pending boots settled
    groups_settled: int  # pending server groups settled
    joined: list[str]  # cells joined by this pass (:meth:`CellsCompute.join_waiting`)
    skipped: list[str]  # cells passed over: their ledger did not answer


class _CellDown(Exception):
    """A cell's ledger did not answer the mover: the pass goes on without that cell."""

    def __init__(self, cell: str, cause: exception.BackendUnavailable) -> None:
        super().__init__(f"{cell}: {str(cause).rstrip('.')}")
        self.cell = cell
        self.cause = cause


def _in_cell(cell: str, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``, a call to cell ``cell``'s keyspace: its outage is :class:`_CellDown`
    (a call to the API keyspace is made bare: its outage fails the pass)."""
    try:
        return call(*args)
    except exception.BackendUnavailable as exc:
        raise _CellDown(cell, exc) from exc


class QuotaMover:
    """Applies the cells' quota releases to the API keyspace, and settles boots left
    pending by an API process that died (see the module docstring). Run by the
    deployment's janitor; each pass is O(what it moves).

    A pass first joins the cells not joined yet. A cell whose ledger does not answer
    is passed over for the rest of the pass (its releases and pending boots wait in
    it, none is lost), logged once a pass; the other cells' releases are moved. The
    API keyspace not answering fails the pass: nothing can be moved.
    """

    def __init__(self, cells: CellsCompute, pending_grace_s: float) -> None:
        self.cells = cells
        self.pending_grace_s = pending_grace_s

    def run_once(self) -> MoverReport:
        """One pass: which cells were joined, how many releases were moved and pending
        boots settled, and which cells were passed over.

        :raises BackendUnavailable: the API keyspace did not answer.
        """
        joined, failed = self.cells.join_waiting()
        report = MoverReport(moved=0, settled=0, groups_settled=0, joined=joined, skipped=[])
        down = {name: _CellDown(name, exc) for name, exc in failed.items()}
        for name in self.cells.cells:
            if name in down:
                continue
            try:
                self._move(name, report)
            except _CellDown as exc:
                down[name] = exc
        self._settle_pending(report, down)
        self._settle_groups(report, down)
        report["skipped"] = list(down)
        if down:
            waiting = ", ".join(sorted(self.cells.unjoined))
            LOG.warning("cells: the quota mover passed over %s; their releases and pending "
                        "boots wait in them for a pass they answer%s",
                        "; ".join(str(exc) for exc in down.values()),
                        f"; not joined yet (no boot goes there): {waiting}" if waiting else "",
                        )  # fmt: skip
        if report["moved"] or report["settled"] or report["groups_settled"]:
            LOG.info("cells: %d releases of quota moved to the API keyspace, %d pending boots "
                     "and %d pending server groups settled", report["moved"], report["settled"],
                     report["groups_settled"])  # fmt: skip
        return report

    def _move(self, name: str, report: MoverReport) -> None:
        """Apply cell ``name``'s indexed releases, a batch a round trip to each keyspace.

        :raises _CellDown: the cell did not answer (what was applied stays applied: a
            release applied again is applied once).
        """
        records = self.cells.maps[name]
        while True:
            ends = _in_cell(name, records.ends, MOVE_BATCH)
            if not ends:
                return
            for _entry, project, holder in ends:
                self.cells.quota.release(project, holder)
            report["moved"] += len(ends)
            _in_cell(name, records.drop_ends, [entry for entry, _project, _holder in ends])

    def _settle_pending(self, report: MoverReport, down: dict[str, _CellDown]) -> None:
        """Pending boots older than the grace: confirmed if their cell has the record,
        else abandoned there (so a create still on its way refuses) and their quota
        and mapping dropped. Those of a cell in ``down`` wait; a cell that fails here
        joins it."""
        for uuid in self.cells.map.pending_before(time.time() - self.pending_grace_s):
            try:
                cell, project = self.cells.mapping(uuid)
            except exception.InstanceNotFound:
                self.cells.map.confirm([uuid])  # nothing mapped: nothing to settle
                continue
            if cell in down:
                continue
            if cell not in self.cells.cells:
                LOG.warning("cells: boot %s is pending in %s, a cell no [cells] cell line "
                            "names now; it waits for that cell's line", uuid, cell)  # fmt: skip
                continue
            try:
                self._settle(uuid, cell, project)
            except _CellDown as exc:
                down[cell] = exc
                continue
            report["settled"] += 1

    def _settle_groups(self, report: MoverReport, down: dict[str, _CellDown]) -> None:
        """Server groups pending past the grace (their API process died, or was told 503,
        between the mapping and the cell's create): kept if their cell has them, else
        abandoned there (a late create refuses) and their mapping and count dropped."""
        groups = self.cells.map
        for uuid in groups.groups_pending_before(time.time() - self.pending_grace_s):
            found = groups.group_mapping(uuid)
            if found is None:
                groups.confirm_groups([uuid])  # nothing mapped: nothing to settle
                continue
            cell, project = found
            if cell in down:
                continue
            if cell not in self.cells.cells:
                LOG.warning("cells: server group %s is pending in %s, a cell no [cells] "
                            "cell line names now; it waits for that line", uuid, cell)  # fmt: skip
                continue
            try:
                present = _in_cell(cell, self.cells.cells[cell].stores.groups.abandon, uuid)
            except _CellDown as exc:
                down[cell] = exc
                continue
            if present:
                groups.confirm_groups([uuid])
            else:
                groups.unmap_group(uuid, project)
                LOG.warning("cells: server group %s never reached its cell %s; its mapping "
                            "and count are dropped", uuid, cell)  # fmt: skip
            report["groups_settled"] += 1

    def _settle(self, uuid: str, cell: str, project: str) -> None:
        compute = self.cells.cells[cell]
        try:
            record = _in_cell(cell, compute.stores.instances.get, uuid)
        except exception.InstanceNotFound:
            record = None
        if record is None:
            why = "its API process died before its cell held it"
            _in_cell(cell, compute.abandon, uuid, why)
            self.cells._unmap(project, [uuid])
            LOG.warning("cells: boot %s never reached its cell; its quota is returned", uuid)
        else:
            self.cells.map.confirm([uuid])
