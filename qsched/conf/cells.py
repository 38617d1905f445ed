"""The [cells] section: several cells behind one API (docs/scale.rst, :mod:`qsched.cells`).

No ``cell`` line: one cell, the ``[ledger]`` one, as ever, and nothing here is used.
With ``cell`` lines, each names a cell (its ledger and its bus prefix) and
``api_url`` the ledger of the API keyspace, which holds the deployment's quota and
the instance mappings. The lines are checked when the section is read
(:class:`CellsOptions`), each error naming the line and how to write it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NoReturn

from oslo_config import cfg

from qsched import exception
from qsched.conf.base import Section
from qsched.urls import masked

GROUP = "cells"
#: The cell name of the API keyspace (``qsched:{api}:``): no cell may take it.
API_CELL = "api"
CELL_FORM = "<name> <ledger url> <bus prefix>"
CELL_EXAMPLE = "cell = cell1 redis://10.0.0.11:6379/0 cell1"
HOW = f"write it as {CELL_FORM}, e.g. {CELL_EXAMPLE!r}"
ZONE_FORM = "<availability zone> <cell name>"

cells_opts = [
    cfg.MultiStrOpt(
        "cell",
        default=[],
        secret=True,
        help=f"A cell of this deployment, one per line: {CELL_FORM}, e.g. '{CELL_EXAMPLE}'. "
        "The name is the hash tag of every key of the cell ({<name>}, so that a Redis "
        "Cluster keeps the cell on one master): no braces or ':', and not 'api', the API "
        "keyspace's. The ledger URL is written as "
        "[ledger] url is (the [ledger] section's other options apply to every cell); the "
        "bus prefix is the one the cell's agents have as [bus] prefix, its own, on the "
        "deployment's transport_url. Unset (the default): one cell, the [ledger] one, "
        "with no API keyspace. With cells named, the janitor of the API service moves "
        "their releases of quota to the API keyspace ([cells] mover_interval_s); its HTTP "
        "API still serves the [ledger] cell alone (several cells are served by the "
        "qsched.cells library, not yet over HTTP).",
    ),
    cfg.StrOpt(
        "api_url",
        secret=True,
        help="The ledger URL of the API keyspace (hash tag {api}), which holds the "
        "quota of every project across the cells and the cell of every instance. It may "
        "be a Redis of its own or one the cells use. Required once a cell is named; "
        "unused without one.",
    ),
    cfg.MultiStrOpt(
        "zone",
        default=[],
        help=f"An availability zone served by a named cell, one per line: {ZONE_FORM}, "
        "e.g. 'zone = az1 cell1'; the zone may hold spaces, the cell name is the last "
        "word. A boot into that zone goes to that cell; a boot into a zone no line names, "
        "or into none, goes to a cell drawn in proportion to the room its agents said "
        "they have for the flavor (docs/scale.rst).",
    ),
    cfg.FloatOpt(
        "pending_grace_s",
        default=60.0,
        min=1.0,
        help="A boot whose quota the API keyspace holds and whose cell has not confirmed "
        "its record for this long (its API process died in between) is settled by the "
        "janitor: confirmed if the cell has the record, else abandoned in the cell and its "
        "quota returned. Keep it above a create's worst case (about [ledger] timeout_s plus "
        "[bus] confirm_timeout_s): a boot still on its way would be refused.",
    ),
    cfg.FloatOpt(
        "mover_interval_s",
        default=5.0,
        min=0.0,
        help="With cells named, seconds between the janitor's passes that apply the cells' "
        "releases of quota to the API keyspace and settle the boots pending past "
        "pending_grace_s; 0: off (run it somewhere, or the quota of deleted instances "
        "stays held). Safe in every API worker: a release applied twice is applied once. "
        "A pass first joins the cells whose ledger did not answer when the service started "
        "(no boot goes to a cell until it is joined; with the mover off, a task of its own "
        "joins them); a cell that does not answer is passed over, the others' releases "
        "moved.",
    ),
]


@dataclasses.dataclass(frozen=True)
class CellSpec:
    """One ``[cells] cell`` line."""

    name: str
    ledger_url: str
    bus_prefix: str


@dataclasses.dataclass(frozen=True)
class CellsOptions(Section):
    """The ``[cells]`` options, checked when made (:meth:`specs`, :meth:`zones`).

    :raises Invalid: a line that does not parse, a name or bus prefix given twice, a
        zone of no named cell, cells without ``api_url``; the message names the line
        (its password masked) and the fix.
    """

    GROUPS = ((GROUP, cells_opts),)

    cell: tuple[str, ...]
    api_url: str | None
    zone: tuple[str, ...]
    pending_grace_s: float
    mover_interval_s: float

    def __post_init__(self) -> None:
        specs = self.specs()
        if specs and not self.api_url:
            raise exception.Invalid(
                reason="[cells] names cells but no api_url: set [cells] api_url to the "
                "ledger URL of the API keyspace (e.g. api_url = redis://10.0.0.10:6379/0)"
            )
        self.zones()

    @property
    def enabled(self) -> bool:
        """True when cells are named: several cells behind one API."""
        return bool(self.cell)

    def specs(self) -> tuple[CellSpec, ...]:
        """The cells, in the order of their lines."""
        specs: list[CellSpec] = []
        for line in self.cell:
            spec = _cell(line)
            for other in specs:
                if spec.name == other.name:
                    _refuse(line, f"the name {spec.name!r} is another line's too; give every "
                            "cell one line and its own name")  # fmt: skip
                if spec.bus_prefix == other.bus_prefix:
                    _refuse(line, f"the bus prefix {spec.bus_prefix!r} is cell "
                            f"{other.name!r}'s too, whose agents would take this cell's boots; "
                            "give every cell its own bus prefix")  # fmt: skip
            specs.append(spec)
        return tuple(specs)

    def zones(self) -> dict[str, str]:
        """Availability zone -> the cell that serves it."""
        names = [_cell(line).name for line in self.cell]
        found: dict[str, str] = {}
        for line in self.zone:
            zone, cell = _zone(line)
            if cell not in names:
                raise exception.Invalid(
                    reason=f"[cells] zone {line!r}: no [cells] cell line names {cell!r} (the "
                    f"cells: {', '.join(names) or 'none'}); write it as {ZONE_FORM}, the cell "
                    "one a cell line names"
                )
            if found.get(zone, cell) != cell:
                raise exception.Invalid(
                    reason=f"[cells] zone {line!r}: zone {zone!r} is served by "
                    f"{found[zone]!r} already; give each zone one line"
                )
            found[zone] = cell
        return found


def _cell(line: str) -> CellSpec:
    fields = line.split()
    if len(fields) != 3:
        _refuse(line, f"{len(fields)} fields, not 3; {HOW}")
    name, url, prefix = fields
    if name == API_CELL:
        _refuse(line, f"{API_CELL!r} is the API keyspace's name; give the cell another")
    if re.search(r"[{}:]", name):
        _refuse(line, f"the name {name!r} holds a brace or ':'; give the cell another")
    if "://" not in url:
        _refuse(line, f"the second field, {masked(url)!r}, is not a ledger URL; {HOW}")
    return CellSpec(name, url, prefix)


def _refuse(line: str, why: str) -> NoReturn:
    raise exception.Invalid(reason=f"[cells] cell {masked(line)!r}: {why}")


def _zone(line: str) -> tuple[str, str]:
    fields = line.rsplit(None, 1)
    if len(fields) != 2:
        raise exception.Invalid(
            reason=f"[cells] zone {line!r}: write it as {ZONE_FORM}, e.g. 'zone = az1 cell1'"
        )
    return fields[0].strip(), fields[1]
