"""The API service's housekeeping, over one cell or several.

:func:`start_periodic_tasks` starts, in each API process, the deadline reaper, the
janitor and the outbox pass (:mod:`qsched.recovery`) of every cell it serves, each
in turn (:func:`each_cell`: a cell whose ledger or bus does not answer is passed
over), and with several cells the quota mover (:mod:`qsched.cells.mover`) or, with the
mover off, a task that joins the cells not joined yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

from qsched import exception
from qsched.cells.mover import MoverReport, QuotaMover
from qsched.cells.router import CellsCompute
from qsched.conf import CellsOptions, SchedulerOptions
from qsched.ledger import Stores
from qsched.metrics import APIMetrics, NoMetrics
from qsched.notifications import NULL, Notifier
from qsched.periodic import Periodic
from qsched.recovery.janitor import OUTBOX_SETTLE_S, OutboxPass, run
from qsched.recovery.outbox import BootPublisher
from qsched.recovery.reaper import confirm_unconfirmed, reap_expired

LOG = logging.getLogger(__name__)


#: With the cells' mover off in this process, how often a cell not joined is asked again.
JOIN_INTERVAL_S = 5.0


class Served(NamedTuple):
    """A cell the housekeeping serves: its name (empty for the one cell), stores and bus."""

    name: str
    stores: Stores
    bus: BootPublisher


def start_periodic_tasks(
    options: SchedulerOptions,
    stores: Stores,
    bus: BootPublisher,
    metrics: APIMetrics | None = None,
    notifier: Notifier = NULL,
    front: CellsCompute | None = None,
    cells: CellsOptions | None = None,
) -> list[Periodic]:
    """The API service's housekeeping: the deadline reaper (which tells ``notifier`` of
    what it ends), this janitor and the outbox, of ``stores`` and ``bus`` (the
    ``[ledger]`` cell); with ``front`` (the cells ``cells`` names,
    :func:`qsched.cells.opening.open_cells`) of every cell it names instead, each in turn
    (:func:`each_cell`), and their quota mover, every ``[cells] mover_interval_s``.
    ``metrics`` count what each run did, summed over the cells (None: nowhere)."""
    counts = metrics or NoMetrics()
    served = [Served("", stores, bus)]
    if front is not None:
        served = [Served(name, c.stores, c.bus) for name, c in front.cells.items()]
    tasks = []
    if options.reap_interval_s:

        def reap(cell: Served) -> None:
            counts.no_valid_host("deadline", reap_expired(cell.stores, notifier=notifier))
            if options.resize_confirm_window:
                confirm_unconfirmed(cell.stores, options.resize_confirm_window)

        tasks.append(Periodic("reaper", options.reap_interval_s,
                              each_cell("reaper", served, reap, counts)))  # fmt: skip
    if options.janitor_interval_s:
        suspects: dict[str, dict[str, float]] = {cell.name: {} for cell in served}
        grace_s = options.janitor_grace_s

        def janitor(cell: Served) -> None:
            report = run(cell.stores, cell.bus, grace_s=grace_s, suspects=suspects[cell.name])
            counts.janitor_ran(len(report.requeued), len(report.failed))

        tasks.append(Periodic("janitor", options.janitor_interval_s,
                              each_cell("janitor", served, janitor, counts)))  # fmt: skip
    if options.outbox_interval_s:
        outboxes = {cell.name: OutboxPass(cell.stores, cell.bus, options.outbox_grace_s,
                                          OUTBOX_SETTLE_S) for cell in served}  # fmt: skip

        def outbox_pass(cell: Served) -> None:
            counts.outbox_published(len(outboxes[cell.name]()))

        tasks.append(Periodic("outbox", options.outbox_interval_s,
                              each_cell("outbox", served, outbox_pass, counts)))  # fmt: skip
    if front is not None:
        tasks += _cells_tasks(front, cells or CellsOptions.defaults(), counts)
    for task in tasks:
        task.start()
    return tasks


def each_cell(
    task: str,
    cells: Sequence[Served],
    step: Callable[[Served], None],
    counts: APIMetrics | None = None,
) -> Callable[[], None]:
    """A periodic task's run: ``step`` of each cell in turn. Over several cells, a cell
    whose ledger or bus does not answer is passed over (logged, and counted in
    ``counts``) and the others served; the run raises its outage only when no cell
    answered. One cell's outage is the run's, as :class:`~qsched.periodic.Periodic`
    logs it."""
    counted = counts or NoMetrics()

    def run_each() -> None:
        down: list[exception.BackendUnavailable] = []
        for cell in cells:
            try:
                step(cell)
            except exception.BackendUnavailable as exc:
                if len(cells) > 1:
                    LOG.warning("periodic task %s: cell %s passed over: %s", task, cell.name,
                                exc)  # fmt: skip
                    counted.cell_passed_over(task, cell.name)
                down.append(exc)
        if len(down) == len(cells):
            raise down[0]

    return run_each


def _cells_tasks(front: CellsCompute, cells: CellsOptions, counts: APIMetrics) -> list[Periodic]:
    """The cells' quota mover, unless ``[cells] mover_interval_s`` is 0; then, while a
    cell is not joined (its ledger did not answer at the start), a task that only joins
    it, every :data:`JOIN_INTERVAL_S`: else no boot of this process would go there."""
    if not cells.mover_interval_s:
        if not front.unjoined:
            return []

        def join_cells() -> list[str]:
            joined, failed = front.join_waiting()
            for name, exc in failed.items():
                LOG.warning("cells: cell %s is still not joined: %s", name, exc)
            return joined

        return [Periodic("cells-join", JOIN_INTERVAL_S, join_cells)]
    mover = QuotaMover(front, cells.pending_grace_s)

    def quota_mover() -> MoverReport:
        done = mover.run_once()
        counts.cells_mover_ran(done["moved"], done["settled"])
        for cell in done["skipped"]:
            counts.cell_passed_over("quota-mover", cell)
        return done

    return [Periodic("cells-quota-mover", cells.mover_interval_s, quota_mover)]
