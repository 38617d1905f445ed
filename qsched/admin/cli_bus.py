"""qsched-admin commands on the bus: dead letters and boot queues."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from qsched.admin import deadletters, views
from qsched.admin.context import Admin, admin_command, output_option
from qsched.admin.views import SHOWS, echo

LETTER_COLUMNS = (
    views.Column("id", "id"),
    views.Column("age_s", "age", views.age, right=True),
    views.Column("queue", "from queue"),
    views.Column("kind", "kind"),
    views.Column("instance", "instance"),
    views.Column("reason", "reason", lambda v: views.short(v, 70)),
)
LIMIT_HELP = "Read at most this many dead letters."


@click.group("dead-letters")
def dead_letters() -> None:
    """Messages no agent could handle, with why (<prefix>.dead)."""


def _limit_option(fn: Any) -> Any:
    return click.option("--limit", type=click.IntRange(1), default=deadletters.DEFAULT_LIMIT,
                        show_default=True, help=LIMIT_HELP)(fn)  # fmt: skip


@dead_letters.command("list")
@_limit_option
@output_option(*views.FORMATS)
@admin_command()
def dead_letters_list(admin: Admin, limit: int, fmt: str) -> None:
    """Dead letters, oldest first. Reading never loses one (see docs/admin.rst)."""
    now = admin.now()
    letters = deadletters.DeadLetterBox(admin.bus, limit).read()
    rows = sorted((letter.row(now) for letter in letters), key=lambda r: r["dead_at"] or 0)
    echo(views.render_rows(rows, LETTER_COLUMNS, fmt, empty="no dead letters"))


@dead_letters.command("show")
@click.argument("letter_id", metavar="ID")
@_limit_option
@output_option(*SHOWS)
@admin_command(not_found="List them with: qsched-admin dead-letters list.")
def dead_letters_show(admin: Admin, letter_id: str, limit: int, fmt: str) -> None:
    """One dead letter: why it died, its headers and the message it carries."""
    doc = deadletters.DeadLetterBox(admin.bus, limit).find(letter_id).doc(admin.now())
    if fmt == "json":
        echo(views.to_json(doc))
        return
    keys = ("id", "reason", "queue", "routing_key", "kind", "instance", "bytes", "problem")
    pairs = [(k, doc[k]) for k in keys] + [("dead at", views.when(doc["dead_at"]))]
    message = doc["message"] or {}
    pairs += [(f"message.{k}", v) for k, v in message.items() if k not in ("extra", "flavor")]
    if doc["body_hex"]:
        pairs.append(("body (hex)", views.short(doc["body_hex"], 80)))
    echo(views.key_values(pairs))


def _outcome_rows(outcomes: Sequence[deadletters.Outcome], done: str) -> list[dict[str, Any]]:
    return [o.row(done) for o in outcomes if o.kept != deadletters.NOT_SELECTED]


OUTCOME_COLUMNS = (
    views.Column("id", "id"),
    views.Column("instance", "instance"),
    views.Column("result", "result"),
)


def _selection(ids: tuple[str, ...], every: bool) -> set[str] | None:
    if bool(ids) == every:
        raise click.UsageError("give dead letter ids, or --all")
    return None if every else set(ids)


@dead_letters.command("requeue")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "every", is_flag=True, help="Every dead letter (up to --limit).")
@_limit_option
@output_option(*views.FORMATS)
@admin_command()
def dead_letters_requeue(
    admin: Admin, ids: tuple[str, ...], every: bool, limit: int, fmt: str
) -> None:
    """Publish dead letters back to their queue.

    Only what can still help goes back: a boot request whose instance still
    waits for a host, a delete request. The others stay, and the output says why.
    """
    selected = _selection(ids, every)
    outcomes = deadletters.DeadLetterBox(admin.bus, limit).requeue(admin.stores, selected)
    rows = _outcome_rows(outcomes, "requeued")
    echo(views.render_rows(rows, OUTCOME_COLUMNS, fmt, empty="no dead letter matched"))


@dead_letters.command("purge")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "every", is_flag=True, help="Every dead letter (up to --limit).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_limit_option
@output_option(*views.FORMATS)
@admin_command()
def dead_letters_purge(
    admin: Admin, ids: tuple[str, ...], every: bool, yes: bool, limit: int, fmt: str
) -> None:
    """Drop dead letters for good."""
    selected = _selection(ids, every)
    what = "every dead letter" if selected is None else f"{len(selected)} dead letter(s)"
    if not yes:
        click.confirm(f"Drop {what} for good?", abort=True)
    outcomes = deadletters.DeadLetterBox(admin.bus, limit).purge(selected)
    rows = _outcome_rows(outcomes, "purged")
    echo(views.render_rows(rows, OUTCOME_COLUMNS, fmt, empty="no dead letter matched"))


@click.group()
def queue() -> None:
    """One boot queue."""


@queue.command("purge")
@click.argument("scheduling_class", metavar="CLASS")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@admin_command(not_found="List the classes with: qsched-admin queues.")
def queue_purge(admin: Admin, scheduling_class: str, yes: bool) -> None:
    """Drop every request waiting in one class queue.

    Their instances stay in BUILD until their deadline ends them in ERROR
    (NoValidHost) and returns their quota; delete them to end them at once.
    """
    if not yes:
        click.confirm(f"Drop every request waiting in class {scheduling_class}?", abort=True)
    dropped = admin.bus.purge_queue(scheduling_class)
    echo(f"dropped {dropped} message(s) from {admin.bus.names.boot_queue(scheduling_class)}")


COMMANDS = (dead_letters, queue)
