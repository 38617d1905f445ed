"""``qsched-admin cells adopt``: what a cell made alone, carried over into a deployment of
several cells behind one API (``[cells]`` cell lines).

The command opens the API keyspace and every cell its configuration names, then
:func:`qsched.cells.adopt.adopt` does the work; it parses and renders.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click

from qsched import exception
from qsched.admin import views
from qsched.admin.context import Admin, AdminError, AdminUsageError, admin_command, output_option
from qsched.admin.views import SHOWS
from qsched.cells import adopt as cells_adopt
from qsched.cells.join import cell_ledger
from qsched.ledger import Stores, open_stores
from qsched.urls import masked

#: the longest lists the table shows (--format json has them all)
SHOWN = 20


@click.group()
def cells() -> None:
    """Several cells behind one API ([cells] cell lines)."""


def _unreachable(admin: Admin, what: str, url: str, option: str, exc: Exception) -> str:
    reason = str(getattr(exc, "kwargs", {}).get("reason", exc)).rstrip(".")
    return (f"{what} (Redis at {masked(url)}) is unreachable: {reason}. Check {option} "
            f"({admin.where()}) and that Redis runs.")  # fmt: skip


def _open(admin: Admin) -> tuple[dict[str, Stores], dict[str, str]]:
    """Every cell's stores, in the order of the lines, and the cells that could not be
    opened (a Redis Cluster none of whose nodes answers), with why."""
    opened: dict[str, Stores] = {}
    down: dict[str, str] = {}
    for spec in admin.options.cells.specs():
        ledger = cell_ledger(admin.options.cells, admin.options.ledger, spec.name)
        try:
            opened[spec.name] = open_stores(ledger, admin.options.quota)
        except exception.BackendUnavailable as exc:
            down[spec.name] = _cell_error(admin, spec.name, exc)
    return opened, down


def _cell_error(admin: Admin, name: str, exc: Exception) -> str:
    (spec,) = [s for s in admin.options.cells.specs() if s.name == name]
    return _unreachable(admin, "the ledger", spec.ledger_url, f"[cells] cell {name}", exc)


def _progress(line: str) -> None:
    click.echo(line, err=True)


@cells.command("adopt")
@click.option("--dry-run", is_flag=True, help="Say what would be adopted; write nothing.")
@output_option(*SHOWS)
@admin_command()
def adopt(admin: Admin, dry_run: bool, fmt: str) -> None:
    """Carry over what a cell made before it was served with the others, as
    nova-manage cell_v2 discover_hosts and its online data migrations do.

    \b
    * server groups without a group mapping: mapped to their cell and project in
      the API keyspace ([cells] api_url), counted in the project's server_groups
      (never refused: a project may end above its limit, as Nova allows after a
      limit is lowered; the summary names it);
    * aggregates that only some cells hold: copied to the others with the same
      id, uuid, name and metadata, no hosts; agg-seq raised above every id. One
      whose id or name is another aggregate's in another cell is not copied: it is
      reported with what to rename or delete, and the others are copied;
    * hosts: each cell's compute services recorded in the host mapping.

    Idempotent (a second run writes nothing) and safe while the API serves. A cell
    whose ledger does not answer is reported and passed over. Exits 1 when anything
    was not carried over (a cell passed over, a collision, an aggregate the API
    was writing meanwhile): fix what the summary says and run it again.
    Progress goes to stderr, the summary to stdout.

    \b
    Examples:
      qsched-admin --config-file /etc/qsched/qsched.conf cells adopt --dry-run
      qsched-admin --config-file /etc/qsched/qsched.conf cells adopt -f json
    """
    if not admin.options.cells.enabled:
        raise AdminUsageError(f"cells adopt: the configuration ({admin.where()}) has no "
                              "[cells] cell line; give qsched-api's, which names the "
                              "cells and [cells] api_url")  # fmt: skip
    opened, down = _open(admin)
    try:
        report = cells_adopt.adopt(admin.api_stores, opened, dry_run, down, _progress,
                                   lambda name, exc: _cell_error(admin, name, exc))  # fmt: skip
    except exception.BackendUnavailable as exc:
        url = admin.options.cells.api_url or ""
        raise AdminError(_unreachable(admin, "the API keyspace", url, "[cells] api_url", exc)
                         + " Nothing more was adopted; run it again.") from None  # fmt: skip
    finally:
        for stores in opened.values():
            stores.backend.close()
    click.echo(views.to_json(report.to_dict()) if fmt == "json" else _summary(report))
    if not report.complete:
        raise AdminError(_incomplete(report))


def _incomplete(report: cells_adopt.AdoptReport) -> str:
    why = []
    if report.down:
        why.append(f"{', '.join(report.down)} passed over")
    if report.collisions:
        why.append(f"{len(report.collisions)} aggregate collisions")
    if report.groups_elsewhere:
        why.append(f"{len(report.groups_elsewhere)} server groups mapped elsewhere")
    if report.retry:
        why.append(f"aggregates {', '.join(map(str, report.retry))} written through the API "
                   "meanwhile")  # fmt: skip
    return (f"not everything was carried over: {'; '.join(why)} (above); fix what it says and run "
            "qsched-admin cells adopt again")  # fmt: skip


def _summary(report: cells_adopt.AdoptReport) -> str:
    return "\n".join([*_cell_lines(report), *_group_lines(report), *_aggregate_lines(report),
                      *_host_lines(report), "", *_totals(report)])  # fmt: skip


def _cell_lines(report: cells_adopt.AdoptReport) -> Iterator[str]:
    verb = "to adopt" if report.dry_run else "adopted"
    mapped = "to map" if report.dry_run else "mapped now"
    for part in report.cells:
        if part.error is not None:
            yield f"cell {part.cell}: passed over: {part.error}"
        else:
            yield (f"cell {part.cell}: {part.groups} server groups, {part.groups_adopted} "
                   f"{verb}; {part.hosts} hosts, {part.hosts_mapped} {mapped}")  # fmt: skip


def _some(title: str, rows: list[Any], line: Any) -> Iterator[str]:
    if not rows:
        return
    yield ""
    yield title
    yield from (f"  {line(row)}" for row in rows[:SHOWN])
    if len(rows) > SHOWN:
        yield f"  ... and {len(rows) - SHOWN} more (--format json lists them all)"


def _group_lines(report: cells_adopt.AdoptReport) -> Iterator[str]:
    verb = "to adopt" if report.dry_run else "adopted"
    yield from _some(f"server groups {verb}:", report.groups,
                     lambda g: f"{g['uuid']}  {g['name']}  project {g['project_id']}  in "
                               f"{g['cell']}")  # fmt: skip
    yield from _some("over their server_groups limit (as Nova allows after a limit is "
                     "lowered; the project makes no new group until it is under):",
                     report.over_limit,
                     lambda o: f"project {o['project_id']}: {o['server_groups']} groups, "
                               f"limit {o['limit']}")  # fmt: skip
    yield from _some("server groups not adopted: mapped to another cell or project:",
                     report.groups_elsewhere, lambda g: g["fix"])  # fmt: skip


def _aggregate_lines(report: cells_adopt.AdoptReport) -> Iterator[str]:
    yield from _some("aggregates copied into the cells that did not hold them:",
                     report.aggregates,
                     lambda a: f"{a['id']}  {a['name']}  ({a['uuid']}) from {a['source']} "
                               f"into {', '.join(a['into'])}: {a['result']}")  # fmt: skip
    yield from _some("aggregates not carried over (fix them, then run this again):",
                     report.collisions, lambda c: c["fix"])  # fmt: skip


def _host_lines(report: cells_adopt.AdoptReport) -> Iterator[str]:
    yield from _some("hosts with a compute service in two cells (mapping kept; delete the "
                     "service of the cell the host left):", report.hosts_elsewhere,
                     lambda h: f"{h['host']}: in {h['cell']}, mapped to "
                               f"{h['mapped_cell']}")  # fmt: skip


def _totals(report: cells_adopt.AdoptReport) -> Iterator[str]:
    seq = report.aggregate_seq
    pairs = [
        ("dry run", "yes: nothing written" if report.dry_run else "no"),
        ("agg-seq", f"{seq['before']} -> {seq['after']}" if seq else "-"),
        ("complete", "yes" if report.complete else "no"),
        ("seconds", report.seconds),
    ]
    yield views.key_values(pairs)


COMMANDS = (cells,)
