"""The front door of several cells, opened from the ``[cells]`` options.

:func:`open_cells` opens the API keyspace and every cell's stores and bus, joins the
cells that answer (the others are joined later by the quota mover) and builds the
:class:`~qsched.cells.router.CellsCompute` that routes among them. A service's entry
point calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from qsched import exception
from qsched.bus.base import Bus
from qsched.cells.join import api_ledger, cell_ledger, join
from qsched.cells.router import CellsCompute, close_all
from qsched.compute.api import ComputeAPI
from qsched.compute.cell import Cell
from qsched.compute.quotas import QuotaAPI
from qsched.conf import BusOptions, CellsOptions, LedgerOptions, QuotaOptions
from qsched.ledger import Stores, open_stores
from qsched.policy import Policy

LOG = logging.getLogger(__name__)


def open_cells(
    options: CellsOptions,
    ledger: LedgerOptions,
    bus: BusOptions,
    open_bus: Callable[[BusOptions], Bus],
    quota: QuotaOptions | None = None,
    **compute: Any,
) -> CellsCompute:
    """The front door of the cells ``options`` names, each :func:`join`-ed (idempotent).

    A cell whose ledger does not answer its join is left out of the boots, logged,
    until a pass of the janitor joins it (:meth:`CellsCompute.join_waiting`): the
    API starts with the cells that answer.

    The API keyspace's stores at ``api_url``, under the cell name ``api``; each cell's
    at its ledger URL, under its name, and its bus: ``open_bus`` of ``bus`` with the
    cell's prefix. ``ledger``: the options every keyspace opens with (its ``url`` and
    ``cell`` are replaced); ``quota``: the default limits, the deployment's in the API
    keyspace (a cell's own instances, cores, RAM and server groups are left
    unlimited, the API keyspace counting them; ``key_pairs``, ``metadata_items``,
    ``injected_file*`` and ``server_group_members`` are the API keyspace's too, which
    each cell reads when it checks them); ``compute``: the other
    arguments of each cell's :class:`ComputeAPI` (``scheduler``, ``api``, ``policy``,
    ...), which refuses a boot not given its uuids by the front door
    (``serves_boots`` off). Nothing else is opened or read; :meth:`CellsCompute.close`
    closes it all.

    :raises Invalid: ``options`` names no cell (one cell needs none of this).
    :raises BackendUnavailable: a ledger did not answer its opening (a Redis Cluster
        none of whose nodes answers, a ``[ledger] durability`` that must ask the
        server), or a bus did not open; what was opened is closed.
    """
    specs = options.specs()
    if not specs or not options.api_url:
        raise exception.Invalid(reason="[cells] names no cell: one cell needs no front door")
    opened: list[Callable[[], object]] = []
    try:
        api = open_stores(api_ledger(options, ledger), quota)
        opened.append(api.backend.close)
        # the limits a cell checks in code (key_pairs, metadata_items...): the deployment's
        deployment = QuotaAPI(api, compute.get("policy") or Policy())
        cells = {}
        for spec in specs:
            stores = open_stores(cell_ledger(options, ledger, spec.name), quota)
            opened.append(stores.backend.close)
            cell_bus = open_bus(bus.replace(prefix=spec.bus_prefix))
            opened.append(cell_bus.close)
            cells[spec.name] = Cell(stores, cell_bus, serves_boots=False, quotas=deployment,
                                    **compute)  # fmt: skip
        unjoined = [name for name, cell in cells.items() if not _joined(name, cell.stores)]
        return CellsCompute(api, cells, options.zones(), opened, unjoined)
    except BaseException:
        close_all(opened)
        raise


def _joined(name: str, cell: Stores) -> bool:
    """Join a cell at the start; False, logged, when its ledger did not answer."""
    try:
        join(cell)
    except exception.BackendUnavailable as exc:
        LOG.warning("cells: cell %s is not joined: %s; no boot goes there until a pass of "
                    "the janitor joins it", name, str(exc).rstrip("."))  # fmt: skip
        return False
    return True


def front_door(cells: CellsCompute) -> ComputeAPI:
    """The front door of ``cells`` (what :func:`qsched.api.app.create_cells_app`
    serves): each call targets its cell; the quota it reads is the API keyspace's."""
    return ComputeAPI.over(cells, QuotaAPI(cells.api, cells.reader.policy))
