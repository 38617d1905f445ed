"""Which cell a call of the front door targets: the :class:`Cells` it is written over.

:class:`~qsched.compute.api.ComputeAPI` writes every Nova call once, as Nova's cells
v2 does (``target_cell``, ``scatter_gather_all_cells``): a call about one server runs
in the cell :meth:`Cells.of_instance` names; a listing gathers over
:meth:`Cells.each`; what every cell holds alike (flavors, keypairs, aggregates) is read
from the first cell that answers (:meth:`Cells.read`) and written to every cell
(:meth:`Cells.every`); a boot goes into the cell :meth:`Cells.boot_into` chooses.

One cell is the case of a single target: :class:`OneCell` answers each of those with
its cell and reads nothing. Several cells are
:class:`qsched.cells.router.CellsCompute`, which holds what is truly about cells (the
mappings in the API keyspace, the choice of a cell, the quota held there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from qsched import exception
from qsched.ledger.base import ServerGroup

if TYPE_CHECKING:
    from qsched.compute.boot import Reservation
    from qsched.compute.cell import Cell
    from qsched.compute.host_rules import HostRequest
    from qsched.context import RequestContext

LOG = logging.getLogger(__name__)
T = TypeVar("T")

#: a boot into a cell: (the cell, the servers' uuids or None for new ones, min, max)
Accept = Callable[["Cell", "Sequence[str] | None", int, int], "Reservation"]
#: whether a cell's error says that a write to every cell is there already
Done = Callable[["Cell", Exception], bool]


def never(cell: Cell, exc: Exception) -> bool:
    """The ``done`` of a write that no error says is there already."""
    return False


def gone(error: type[Exception]) -> Done:
    """A ``done`` of :meth:`Cells.every`: ``error`` says the write is there already."""
    return lambda cell, exc: isinstance(exc, error)


class Cells(Protocol):
    """The cells a front door serves; see the module docstring."""

    def each(self) -> Sequence[Cell]:
        """Every cell, in the order of the ``[cells] cell`` lines (a gather's order; a
        cell's place in it makes the integer ids it shows, :mod:`qsched.compute.parts`)."""
        ...

    @property
    def reader(self) -> Cell:
        """Where the caller's rights are asked (every cell has the same rules) and what
        every cell holds alike is read first."""
        ...

    def joined(self) -> Mapping[str, Cell]:
        """The cells boots go to, by name (a cell whose ledger did not answer its join
        is left out)."""
        ...

    @property
    def unjoined(self) -> frozenset[str]:
        """The cells no boot goes to yet: their ledger did not answer their join."""
        ...

    def of_instance(self, uuid: str) -> Cell:
        """The cell a server was booted in.

        :raises InstanceNotFound: no such server.
        """
        ...

    def read(self, call: Callable[[Cell], T]) -> T:
        """``call`` of the first cell whose ledger answers.

        :raises BackendUnavailable: no cell answered.
        """
        ...

    def every(self, write: Callable[[Cell], T], done: Done = never) -> T:
        """``write`` to every cell in order; the first cell's answer. ``done``: whether
        a cell's error says the write is there already (when every cell says so, the
        first cell's error is raised).

        :raises BackendUnavailable: a cell did not answer, once the others were written.
        """
        ...

    def boot_into(
        self,
        context: RequestContext,
        flavor_ref: str | int,
        availability_zone: str | None,
        counts: tuple[int, int],
        hints: BootHints,
        accept: Accept,
    ) -> Reservation:
        """Choose the boot's cell and hold what must be held beside it, then ``accept``
        the servers there; ``counts``: min and max."""
        ...

    def place_of_marker(self, uuid: str) -> Cell | None:
        """The cell of a list's marker when the list gathers over several cells (None:
        one cell, whose own list finds the marker).

        :raises InstanceNotFound: no such server.
        """
        ...

    def group_cell(self, uuid: str) -> Cell:
        """The cell of a server group.

        :raises GroupNotFound: no such group.
        """
        ...

    def new_group(self, group: ServerGroup, create: Callable[[Cell], ServerGroup]) -> ServerGroup:
        """``create`` the group in the cell it is given; its quota counted."""
        ...

    def group_gone(self, context: RequestContext, uuid: str, found: bool) -> None:
        """After a delete of a group in its cell (``found``: the cell had it): forget
        what was kept of it beside the cell."""
        ...

    def host_cell(self, host: str, fresh: bool = False) -> Cell:
        """The cell of compute host ``host`` (``fresh``: look it up again).

        :raises ComputeHostNotFound: no cell has it.
        """
        ...

    def new_aggregate_id(self, floor: int) -> int | None:
        """The id of a new aggregate above ``floor`` (None: the cell gives it)."""
        ...

    def aggregate_writes(self, aggregate_id: int | None) -> contextlib.AbstractContextManager[None]:
        """Held while an aggregate is written to the cells: no other writer interleaves."""
        ...

    def keyspace_fault(self) -> str | None:
        """Why the keyspace beside the cells does not answer (None: it does, or there is
        none)."""
        ...


@dataclasses.dataclass(frozen=True)
class BootHints:
    """What of a boot names its cell: its host rules (the servers to share a host with,
    the host or node asked for), its server group, its keypair (which the cell must
    hold)."""

    hosts: HostRequest | None = None
    group: str | None = None
    key_name: str | None = None


def write_every_cell(
    cells: Mapping[str, Cell], write: Callable[[Cell], T], done: Done = never
) -> T:
    """:meth:`Cells.every` of ``cells``: ``write`` to each in turn; one that does not
    answer fails the call with 503 once the others were written (every such write is
    idempotent, so the client's retry completes it). Any other error stops at the cell
    that raised it, unless ``done`` says it is there already: the same rules and checks
    run in every cell, so it is the first cell's.

    :raises BackendUnavailable: a cell did not answer.
    """
    results: list[T] = []
    repeated: list[Exception] = []
    down: exception.BackendUnavailable | None = None
    for name, cell in cells.items():
        try:
            results.append(write(cell))
        except exception.BackendUnavailable as exc:
            LOG.warning("cells: a write to every cell did not reach cell %s: %s", name, exc)
            down = down or exc
        except exception.QschedError as exc:
            if not done(cell, exc):
                raise
            repeated.append(exc)
    if down is not None:
        raise down
    if not results:
        raise repeated[0]
    return results[0]


def take_back(cells: Sequence[Cell], undo: Callable[[Cell], object]) -> None:
    """Take back what a write to every cell made or changed, where it did (logged if it
    fails: the client's error stands)."""
    for cell in cells:
        try:
            undo(cell)
        except Exception:
            LOG.exception("cells: taking back a write to every cell failed")


class OneCell:
    """The front door of one cell: every call targets ``cell``, and nothing is read to
    know it (a server of another cell does not exist here)."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell

    def each(self) -> Sequence[Cell]:
        return [self.cell]

    @property
    def reader(self) -> Cell:
        return self.cell

    def joined(self) -> Mapping[str, Cell]:
        return {"": self.cell}

    @property
    def unjoined(self) -> frozenset[str]:
        return frozenset()

    def of_instance(self, uuid: str) -> Cell:
        return self.cell

    def read(self, call: Callable[[Cell], T]) -> T:
        return call(self.cell)

    def every(self, write: Callable[[Cell], T], done: Done = never) -> T:
        return write_every_cell({"": self.cell}, write, done)

    def boot_into(
        self,
        context: RequestContext,
        flavor_ref: str | int,
        availability_zone: str | None,
        counts: tuple[int, int],
        hints: BootHints,
        accept: Accept,
    ) -> Reservation:
        """The cell's own create holds the quota and makes the uuids."""
        return accept(self.cell, None, *counts)

    def place_of_marker(self, uuid: str) -> Cell | None:
        return None

    def group_cell(self, uuid: str) -> Cell:
        return self.cell

    def new_group(self, group: ServerGroup, create: Callable[[Cell], ServerGroup]) -> ServerGroup:
        """The cell's create script counts the project's ``server_groups``."""
        return create(self.cell)

    def group_gone(self, context: RequestContext, uuid: str, found: bool) -> None:
        return None

    def host_cell(self, host: str, fresh: bool = False) -> Cell:
        """The cell, whose ledger refuses a host it does not have."""
        return self.cell

    def new_aggregate_id(self, floor: int) -> int | None:
        return None

    def aggregate_writes(self, aggregate_id: int | None) -> contextlib.AbstractContextManager[None]:
        """Nothing: one cell's aggregate is written in one script."""
        return contextlib.nullcontext()

    def keyspace_fault(self) -> str | None:
        return None
