"""``qsched-admin archive-deleted``: ended servers out of the ledger, their history kept.

The command parses and renders; :func:`qsched.admin.archive.archive_deleted` does the work.
With ``[cells]`` cell lines it archives one of those cells (``--cell``, default the
``[ledger] cell``), or every one in turn (``--all-cells``), on its line's ledger
URL, and drops the archived servers' instance mappings in the API keyspace
(``[cells] api_url``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import click

from qsched import exception
from qsched.admin import archive, views
from qsched.admin.context import (
    Admin,
    AdminError,
    AdminUsageError,
    admin_command,
    explain,
    output_option,
)
from qsched.admin.views import SHOWS
from qsched.ledger.cellmap import cell_map
from qsched.urls import masked


@contextlib.contextmanager
def _history(output: str | None) -> Iterator[TextIO | None]:
    """Where the history goes: appended to a file (never truncated), stdout for ``-``."""
    if output is None:
        yield None
    elif output == "-":
        yield sys.stdout
    else:
        try:
            with Path(output).open("a", encoding="utf-8") as stream:
                yield stream
        except OSError as exc:
            raise AdminUsageError(
                f"--output {output}: {exc.strerror}; give a writable file"
            ) from None


def _unmap(admin: Admin, cell: str | None) -> archive.Unmap | None:
    """With ``[cells]`` cell lines: this run on that cell (:meth:`Admin.use_cell`), and
    what drops the archived servers' mappings in the API keyspace; None without."""
    if not admin.options.cells.enabled:
        if cell is not None:
            raise AdminUsageError(
                f"--cell {cell}: the configuration ({admin.where()}) has no [cells] cell "
                "line; archive the [ledger] cell without it"
            )
        return None
    admin.use_cell(cell)
    drop = cell_map(admin.api_stores).unmap

    def unmap(uuids: Sequence[str]) -> int:
        try:
            return drop(uuids)
        except exception.BackendUnavailable as exc:
            url = masked(admin.options.cells.api_url or "")
            reason = str(exc.kwargs.get("reason", exc)).rstrip(".")
            raise AdminError(
                f"the API keyspace (Redis at {url}) is unreachable: {reason}. Check [cells] "
                f"api_url ({admin.where()}) and that Redis runs; the servers archived so far "
                "are written, and the next run drops their mappings."
            ) from None

    return unmap


def _progress(report: archive.ArchiveReport) -> None:
    verb = "would archive" if report.dry_run else "archived"
    click.echo(
        f"step {report.steps}: {verb} {report.archived:,} so far, {report.held:,} held, "
        f"{report.left:,} deleted before the cut-off left",
        err=True,
    )


def _summary(report: archive.ArchiveReport) -> str:
    verb = "would archive" if report.dry_run else "archived"
    pairs = [
        ("before", views.when(report.before)),
        (verb, report.archived),
        ("of them left staged by an earlier run", report.recovered),
        *(
            [("their instance mappings dropped", report.unmapped)]
            if report.unmapped is not None
            else []
        ),
        ("held (still referred to, kept)", report.held),
        ("index entries without a record, dropped", report.stale),
        ("deleted before the cut-off, still kept", report.left),
        ("complete", "yes" if report.complete else "no: --max-rows reached"),
        ("steps", report.steps),
        ("seconds", report.seconds),
    ]
    lines = [views.key_values(pairs)]
    if report.held_named:
        lines.append("held:")
        lines += [f"  {uuid}  {why}" for uuid, why in sorted(report.held_named.items())]
    return "\n".join(lines)


@click.command("archive-deleted")
@click.option(
    "--before",
    required=True,
    metavar="TIME|AGE",
    help="Archive servers deleted before this: an ISO 8601 time (2024-05-01, "
    "2024-05-01T12:00:00Z; UTC without a zone) or an age (90d, 12h, 30m, 45s, 2w).",
)
@click.option(
    "--output",
    "-o",
    metavar="FILE|-",
    help="Append the history of every archived server to FILE as JSON lines ('-': "
    "stdout). Required unless --dry-run: what is archived is kept nowhere else.",
)
@click.option(
    "--max-rows",
    type=click.IntRange(1),
    help="Archive at most this many servers in this run [default: every one deleted "
    "before the cut-off].",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=1000,
    show_default=True,
    help="Servers per atomic step (the ledger runs nothing else during a step).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be archived; change nothing.")
@click.option(
    "--cell",
    metavar="NAME",
    help="With [cells] cell lines: the cell to archive, one a line names, on its line's "
    "ledger URL [default: the [ledger] cell]; the archived servers' instance mappings "
    "are dropped in [cells] api_url. Refused without [cells] cell lines.",
)
@click.option(
    "--all-cells",
    is_flag=True,
    help="With [cells] cell lines: archive every cell in turn, in the order of the "
    "lines, as nova-manage's --all-cells; --max-rows is then the most of them all "
    "together. A cell whose ledger does not answer is reported and the next archived; "
    "the command then exits 1.",
)
@output_option(*SHOWS)
@admin_command()
def archive_deleted(
    admin: Admin,
    before: str,
    output: str | None,
    max_rows: int | None,
    batch: int,
    dry_run: bool,
    cell: str | None,
    all_cells: bool,
    fmt: str,
) -> None:
    """Take DELETED servers out of the ledger, as nova-manage db archive_deleted_rows
    does, so that the ledger's memory follows the live servers.

    Each server deleted before --before, oldest first, leaves the cell in an atomic
    step of --batch servers, and its record and history (the instance actions among
    it) are appended to --output as one JSON line:

    \b
      {"uuid": ..., "project_id": ..., "deleted_at": ..., "archived_at": ...,
       "record": {the instance record}, "events": [its history, oldest first]}

    Afterwards the API answers 404 for the server, as Nova does for a purged one,
    and changes-since lists no longer show it.

    Safe while the cloud runs: a server that something still refers to (allocations,
    quota, its host still deleting it or acting on it, the outbox) is held, counted
    and kept. A run that stops anywhere loses nothing: a step moves what it takes
    into a staging area of the ledger, which is cleared only once the lines are
    written and synced to disk, and the next run first writes what a stopped one
    left there. Run it again to go on; a run resumes where the last
    one ended, since archived servers have left the index it reads.

    With several cells behind one API ([cells] cell lines), it archives one cell,
    --cell (default: the [ledger] cell), on the ledger URL of that cell's line, and
    drops the archived servers' instance mappings in the API keyspace ([cells]
    api_url), a batch a round trip, once their lines are written: run it with the
    configuration that names the cells (qsched-api's), once per cell, or once with
    --all-cells.

    Progress goes to stderr after every step, the summary to stdout (to stderr when
    --output is '-').

    \b
    Examples:
      qsched-admin archive-deleted --before 90d --dry-run
      qsched-admin archive-deleted --before 90d -o /var/lib/qsched/archive.jsonl
      qsched-admin archive-deleted --before 2024-05-01 --max-rows 100000 -o - | gzip >> a.gz
      qsched-admin archive-deleted --before 90d --all-cells -o /var/lib/qsched/archive.jsonl
    """
    if output is None and not dry_run:
        raise AdminUsageError(
            "archive-deleted needs --output FILE (or - for stdout) to keep the history of "
            "what it archives; or --dry-run to only count"
        )
    try:
        cut = archive.parse_before(before, admin.now())
    except ValueError as exc:
        raise AdminUsageError(f"--before {exc}") from None
    to_stderr = output == "-" and not dry_run
    if all_cells:
        names = _every_cell(admin, cell)
        with _history(None if dry_run else output) as out:
            runs = _archive_cells(admin, names, out, cut, batch, max_rows, dry_run)
        if fmt == "json":
            text = views.to_json({"cells": [run.to_dict() for run in runs]})
        else:
            text = "\n\n".join(f"cell {run.cell}:\n{_cell_summary(run)}" for run in runs)
        click.echo(text, err=to_stderr)
        failed = [run.cell for run in runs if run.report is None]
        if failed:
            raise AdminError(f"{len(failed)} of {len(runs)} cells not archived: "
                             f"{', '.join(failed)} (above); run the command again")  # fmt: skip
        return
    unmap = _unmap(admin, cell)
    with _history(None if dry_run else output) as out:
        report = archive.archive_deleted(
            admin.stores.archive, out, cut, batch, max_rows, dry_run, _progress, unmap
        )
    text = views.to_json(report.to_dict()) if fmt == "json" else _summary(report)
    click.echo(text, err=to_stderr)


class CellRun(NamedTuple):
    """One cell's part of ``--all-cells``: its report, or why it has none."""

    cell: str
    report: archive.ArchiveReport | None
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        found = self.report.to_dict() if self.report is not None else None
        return {"cell": self.cell, "report": found, "error": self.error}


def _every_cell(admin: Admin, cell: str | None) -> list[str]:
    """The cells ``--all-cells`` archives: every ``[cells] cell`` line's, in order.

    :raises AdminUsageError: ``--cell`` given too, or no ``[cells] cell`` line.
    """
    if cell is not None:
        raise AdminUsageError(f"--cell {cell} and --all-cells: give one of them")
    if not admin.options.cells.enabled:
        raise AdminUsageError(
            f"--all-cells: the configuration ({admin.where()}) has no [cells] cell line; "
            "archive the [ledger] cell without it"
        )
    return [spec.name for spec in admin.options.cells.specs()]


def _archive_cells(
    admin: Admin,
    names: Sequence[str],
    out: TextIO | None,
    cut: float,
    batch: int,
    max_rows: int | None,
    dry_run: bool,
) -> list[CellRun]:
    """Archive each cell in turn, ``max_rows`` at most over them all; a cell whose
    ledger or the API keyspace does not answer is reported (on stderr too) and passed."""
    runs: list[CellRun] = []
    left = max_rows
    for name in names:
        if left == 0:
            runs.append(CellRun(name, None, "not archived: --max-rows reached"))
            continue
        click.echo(f"cell {name}:", err=True)
        try:
            unmap = _unmap(admin, name)
            report = archive.archive_deleted(
                admin.stores.archive, out, cut, batch, left, dry_run, _progress, unmap
            )
        except exception.BackendUnavailable as exc:
            error = explain(exc, admin).message
        except AdminError as exc:
            error = exc.message
        else:
            runs.append(CellRun(name, report, None))
            left = None if left is None else left - report.archived
            continue
        click.echo(f"cell {name}: {error}", err=True)
        runs.append(CellRun(name, None, error))
    return runs


def _cell_summary(run: CellRun) -> str:
    if run.report is None:
        return f"  {run.error}"
    return "\n".join(f"  {line}" for line in _summary(run.report).splitlines())


COMMANDS = (archive_deleted,)
