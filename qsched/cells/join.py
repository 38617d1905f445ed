"""What makes a cell one of several behind one front door.

:func:`join` makes a cell's quota the API keyspace's (its own limits unlimited, each
release indexed for the quota mover); :func:`cell_ledger` and :func:`api_ledger` are
the ``[ledger]`` options of a cell and of the API keyspace; :class:`UnknownCell` and
:class:`CellNotJoined` the errors of a cell no ``[cells]`` line names, or not joined yet.
"""

from __future__ import annotations

import logging

from qsched import exception
from qsched.conf import CellsOptions, LedgerOptions
from qsched.conf.cells import API_CELL
from qsched.ledger import Stores
from qsched.ledger.cellmap import cell_map

LOG = logging.getLogger(__name__)


#: quota limits a joined cell leaves unlimited in its own keyspace: the API keyspace
#: counts instances, cores, RAM and a project's server groups (each group mapped there)
CELL_UNLIMITED = {"instances": -1, "cores": -1, "ram_mb": -1, "server_groups": -1}


class UnknownCell(exception.Invalid):
    msg_fmt = "No cell named {cell}: the cells are {known}"


class CellNotJoined(exception.BackendUnavailable):
    """A boot asked for a cell (by its zone) that is not joined yet: its ledger has not
    answered since this API process started (503: try again)."""

    msg_fmt = (
        "Cell {cell} is not joined yet: its ledger has not answered since this API "
        "process started; no boot goes there until the janitor joins it"
    )


def join(cell: Stores) -> None:
    """Make a cell's quota the API keyspace's: its own limits unlimited (the default
    quota class; a project's own limits in the cell must not be set) and each of its
    releases indexed for :class:`QuotaMover`. Idempotent.

    Until then a boot there would be counted twice (by the API keyspace and by the
    cell's own limits) and its release would never reach the API keyspace: no boot
    goes to a cell :class:`CellsCompute` has not joined.

    :raises BackendUnavailable: the cell's ledger did not answer.
    """
    cell.quota.update_default_limits(CELL_UNLIMITED)
    cell_map(cell).join()


def cell_ledger(
    options: CellsOptions, ledger: LedgerOptions, name: str | None = None
) -> LedgerOptions:
    """The ledger options of cell ``name`` (None: ``ledger.cell``, the ``[ledger]``
    one): its ``[cells] cell`` line's URL under its name, ``ledger``'s other options.

    :raises UnknownCell: no ``[cells] cell`` line names it.
    """
    name = ledger.cell if name is None else name
    for spec in options.specs():
        if spec.name == name:
            return ledger.replace(cell=spec.name, url=spec.ledger_url)
    raise UnknownCell(cell=repr(name), known=", ".join(s.name for s in options.specs()) or "none")


def api_ledger(options: CellsOptions, ledger: LedgerOptions) -> LedgerOptions:
    """The ledger options of the API keyspace: ``[cells] api_url`` under the cell name
    ``api``, ``ledger``'s other options.

    :raises Invalid: ``options`` names no cell (one cell has no API keyspace).
    """
    if not options.enabled or not options.api_url:
        raise exception.Invalid(reason="[cells] names no cell: one cell has no API keyspace")
    return ledger.replace(cell=API_CELL, url=options.api_url)
