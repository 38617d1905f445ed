"""Writes that go to every cell (flavors, keypairs, aggregates).

:func:`write_every_cell` writes to each joined cell in turn; one that does not answer
fails the call with 503 once the others were written (every such write is idempotent,
so the client's retry completes it). A create whose id or key the call made is taken
back (:func:`take_back`) from the cells that took it before the failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from qsched import exception
from qsched.compute.api import ComputeAPI

LOG = logging.getLogger(__name__)


T = TypeVar("T")


def write_every_cell(
    cells: Mapping[str, ComputeAPI],
    write: Callable[[ComputeAPI], T],
    done: Callable[[ComputeAPI, Exception], bool] = lambda compute, exc: False,
) -> T:
    """``write`` to every cell, in order; the first cell's answer (the front doors of
    :mod:`qsched.cells.front_door` and :mod:`qsched.cells.aggregates` write so).

    ``done``: whether an error of a cell says the write is there already (a retry's,
    or a call cut short before); when every cell says so the first cell's error is
    raised, as one cell answers a repeated write. Any other error stops at the cell
    that raised it: the same rules and checks run in every cell, so it is the first
    cell's.

    :raises BackendUnavailable: a cell did not answer (503), once every other cell
        was written: the client's retry completes the write.
    """
    results: list[T] = []
    repeated: list[Exception] = []
    down: exception.BackendUnavailable | None = None
    for name, compute in cells.items():
        try:
            results.append(write(compute))
        except exception.BackendUnavailable as exc:
            LOG.warning("cells: a write to every cell did not reach cell %s: %s", name, exc)
            down = down or exc
        except exception.QschedError as exc:
            if not done(compute, exc):
                raise
            repeated.append(exc)
    if down is not None:
        raise down
    if not results:
        raise repeated[0]
    return results[0]


def gone(error: type[Exception]) -> Callable[[ComputeAPI, Exception], bool]:
    """A ``done`` of :func:`write_every_cell`: ``error`` says it is done."""
    return lambda compute, exc: isinstance(exc, error)


def take_back(cells: Sequence[ComputeAPI], undo: Callable[[ComputeAPI], object]) -> None:
    """Take back what a write to every cell made or changed, where it did (logged if it
    fails: the client's error stands)."""
    for compute in cells:
        try:
            undo(compute)
        except Exception:
            LOG.exception("cells: taking back a write to every cell failed")
