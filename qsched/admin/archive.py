"""archive-deleted: take ended instances out of the ledger, their history kept in a file.

In the spirit of ``nova-manage db archive_deleted_rows``: DELETED instances that
ended before a cut-off leave the cell a batch at a time
(:meth:`~qsched.ledger.base.ArchiveStore.step`), so that the ledger's memory
follows the live instances, not every instance there ever was. Their records and
histories are written as JSON lines (:func:`history_line`) to a file or a stream
that operators keep and read (``jq``), and only then cleared from the staging area.
So a run that stops anywhere loses nothing: what it staged and did not write, the
next run writes first; an instance appears twice in the history only when a run
stopped between its write and its clear, and both lines are the same.

A run is safe while the cloud runs: each step is atomic in the ledger, never takes
an instance something still refers to (those are counted as held, and stay), and
costs O(log n + batch). Runs resume by themselves: what was archived has left the
index the next run reads.

With several cells behind one API (:mod:`qsched.cells`) the API keyspace keeps an
instance mapping for every instance of a cell. A run given ``unmap`` drops the
mappings of what it archived, a batch a round trip, once their history is written
and before it is cleared from the staging area: a run that stops in between leaves
them staged, and the next run writes them again and drops what is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from qsched.ledger.base import ArchiveStep, ArchiveStore

#: fields of an instance record that hold JSON, decoded in the history
JSON_FIELDS = ("flavor", "extra", "fault", "tried_hosts", "hosts")
#: fields that hold numbers
FLOAT_FIELDS = ("created_at", "updated_at", "deleted_at", "launched_at", "deadline")
INT_FIELDS = ("attempts", "handbacks", "events_trimmed", "group_refusals", "soft_passes")
#: how many held instances a report names (it counts them all)
HELD_NAMED = 100

#: drops the instance mappings of archived instances; returns how many there were
Unmap = Callable[[Sequence[str]], int]

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_before(value: str, now: float) -> float:
    """The cut-off of ``--before`` in epoch seconds: an age (``90d``, ``12h``, ``30m``,
    ``45s``, ``2w``: that long before ``now``) or an ISO 8601 time (``2024-05-01``,
    ``2024-05-01T12:00:00+02:00``; without a zone, UTC).

    :raises ValueError: neither; the message says what is accepted.
    """
    age = _AGE.match(value)
    if age:
        return now - float(age.group(1)) * _UNIT_S[age.group(2)]
    try:
        when = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"{value!r} is neither an age (90d, 12h, 30m, 45s, 2w) nor an ISO 8601 time "
            "(2024-05-01, 2024-05-01T12:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def history_line(staged: str) -> dict[str, Any]:
    """One archived instance as its history line says it: uuid, project_id, deleted_at,
    archived_at, the record (its JSON fields decoded, its numbers as numbers) and its
    events, oldest first, as the ledger kept them."""
    raw = json.loads(staged)
    record: dict[str, Any] = dict(raw["record"])
    for name in JSON_FIELDS:
        if record.get(name):
            record[name] = json.loads(record[name])
    for name in FLOAT_FIELDS:
        if record.get(name):
            record[name] = float(record[name])
    for name in INT_FIELDS:
        if record.get(name):
            record[name] = int(record[name])
    return {
        "uuid": raw["uuid"],
        "project_id": record.get("project_id"),
        "deleted_at": record.get("deleted_at"),
        "archived_at": raw["archived_at"],
        "record": record,
        "events": raw["events"],
    }


@dataclasses.dataclass
class ArchiveReport:
    """What a run did; ``progress`` callbacks see it after every step."""

    before: float
    dry_run: bool
    batch: int
    max_rows: int | None
    archived: int = 0  # instances taken out and written (a dry run: it would take)
    recovered: int = 0  # of them, staged by an earlier run that stopped before writing
    unmapped: int | None = None  # their mappings dropped (None: no unmap, or a dry run)
    held: int = 0
    held_named: dict[str, str] = dataclasses.field(default_factory=dict)  # uuid -> why
    stale: int = 0  # index entries without a record, dropped
    steps: int = 0
    left: int = 0  # DELETED before the cut-off still in the cell after the run
    complete: bool = False  # every DELETED instance before the cut-off was looked at
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["held_named"] = dict(sorted(self.held_named.items()))
        return found


class HistoryWriter:
    """JSON lines to a stream, flushed (and, for a file, fsynced) after each batch:
    a batch is cleared from the staging area only once it is on disk."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, staged: Iterable[str]) -> None:
        for text in staged:
            self.out.write(json.dumps(history_line(text), sort_keys=True) + "\n")
        self.out.flush()
        # a pipe, a terminal or an in-memory stream cannot be synced: flushed is all
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.fsync(self.out.fileno())


def archive_deleted(
    store: ArchiveStore,
    out: TextIO | None,
    before: float,
    batch: int = 1000,
    max_rows: int | None = None,
    dry_run: bool = False,
    progress: Callable[[ArchiveReport], None] | None = None,
    unmap: Unmap | None = None,
) -> ArchiveReport:
    """Archive DELETED instances deleted before ``before``, ``batch`` a step, at most
    ``max_rows`` in all (None: until none is left), their history to ``out``.

    ``dry_run``: change nothing, write nothing; count what would go. ``unmap``: drops
    the instance mappings of what was archived (several cells behind one API), once
    their history is written, before it is cleared.
    :raises ValueError: no ``out`` for a run that is not a dry run.
    :raises BackendUnavailable: the ledger (or ``unmap``'s) stopped answering; what was
        written stays written, what was staged waits for the next run.
    """
    if out is None and not dry_run:
        raise ValueError("archive-deleted writes the history it takes out: give it a stream")
    began = time.monotonic()
    report = ArchiveReport(before, dry_run, batch, max_rows)
    writer = HistoryWriter(out) if out is not None else None
    if unmap is None or dry_run:
        unmap = None
    else:
        report.unmapped = 0
    if writer is not None and not dry_run:
        _write_staged(store, writer, report, batch, unmap)
    cursor: str | None = None
    while not _reached(report):
        size = batch if max_rows is None else min(batch, max_rows - report.archived)
        step = store.step(before, size, cursor, dry_run)
        cursor = step.cursor
        if writer is not None and not dry_run:
            report.archived += _write(store, writer, store.staged(step.archived), report, unmap)
        elif dry_run:
            report.archived += len(step.archived)
        _count(report, step)
        if progress is not None:
            progress(report)
        if step.done:
            report.complete = True
            break
    report.left = store.deleted_count(before)
    report.seconds = round(time.monotonic() - began, 3)
    return report


def _reached(report: ArchiveReport) -> bool:
    return report.max_rows is not None and report.archived >= report.max_rows


def _count(report: ArchiveReport, step: ArchiveStep) -> None:
    report.steps += 1
    report.held += len(step.held)
    report.stale += len(step.stale)
    report.left = step.left
    for uuid, why in step.held:
        if len(report.held_named) < HELD_NAMED:
            report.held_named[uuid] = why


def _write_staged(store: ArchiveStore, writer: HistoryWriter, report: ArchiveReport,
                  batch: int, unmap: Unmap | None) -> None:  # fmt: skip
    """Write what an earlier run staged and did not write, a batch at a time."""
    while staged := store.staged(limit=batch):
        written = _write(store, writer, staged, report, unmap)
        report.archived += written
        report.recovered += written


def _write(store: ArchiveStore, writer: HistoryWriter, staged: dict[str, str],
           report: ArchiveReport, unmap: Unmap | None) -> int:  # fmt: skip
    """Write staged histories, drop their mappings, then clear them; return how many
    this run cleared (a run beside it may have written some of them too: the same
    lines)."""
    if not staged:
        return 0
    writer.write(staged.values())
    if unmap is not None:
        report.unmapped = (report.unmapped or 0) + unmap(list(staged))
    return store.clear(list(staged))
