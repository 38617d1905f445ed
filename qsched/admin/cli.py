"""``qsched-admin``: the operator's view of queues, agents and the ledger, and "why".

Thin commands: each parses its options, calls one library function of
:mod:`qsched.admin` and renders the answer (table by default, ``--format json``
and, for listings, ``csv``). Shared options come from
:func:`~qsched.admin.context.admin_command` and
:func:`~qsched.admin.context.output_option`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import click

from qsched.admin import (
    cli_archive,
    cli_bus,
    cli_cells,
    cli_flavors,
    cli_ledger,
    cli_services,
    queries,
    top,
    views,
    why,
)
from qsched.admin.cli_ledger import PLACEMENT_CLASSES
from qsched.admin.context import Admin, admin_command, config_option, output_option
from qsched.admin.views import SHOWS, echo
from qsched.recovery import janitor as qjanitor

LIST_SERVERS = "List a project's servers with: qsched-admin server list --project PROJECT."


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qsched", prog_name="qsched-admin")
@config_option(envvar="QSCHED_CONFIG")
@click.pass_context
def cli(ctx: click.Context, config_files: tuple[str, ...]) -> None:
    """Inspect and operate qsched: queues, agents, the ledger, and why a request
    was not placed.

    Every command reads the same configuration as the services: --config-file
    (before or after the command name) or $QSCHED_CONFIG.
    """
    ctx.obj = {"config_files": config_files}


for _command in (
    *cli_ledger.COMMANDS,
    *cli_bus.COMMANDS,
    *cli_flavors.COMMANDS,
    *cli_services.COMMANDS,
    *cli_archive.COMMANDS,
    *cli_cells.COMMANDS,
):
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="qsched-admin")


# -- queues, agents and zones -----------------------------------------------------------------

QUEUE_COLUMNS = (
    top.CLASS_COLUMN,
    views.number("ready", "ready"),
    views.number("unacked", "unacked"),
    views.number("consumers", "consumers"),
    views.number("agents", "agents"),
    views.number("waiting", "waiting"),
    views.Column("oldest_s", "oldest", views.age, right=True),
    views.Column("queue", "queue"),
)


@cli.command()
@output_option(*views.FORMATS)
@admin_command()
def queues(admin: Admin, fmt: str) -> None:
    """One row per scheduling class, then the dead letters.

    READY, UNACKED and CONSUMERS are what the broker tells ('-' where it cannot:
    RabbitMQ's passive declare gives no unacked count, memory:// and Redis no
    consumers). AGENTS: live agents whose heartbeat says they consume the class.
    WAITING and OLDEST come from the ledger: requests of the class not placed
    yet, and how long the oldest has waited.
    """
    rows = queries.queue_rows(admin.stores, admin.bus, admin.now())
    echo(views.render_rows(rows, QUEUE_COLUMNS, fmt))


def _free(rc: str) -> views.Column:
    return views.Column(f"free_{rc}", f"free {rc}", right=True,
                        pick=lambda row: row["free"].get(rc))  # fmt: skip


def _largest(row: Mapping[str, Any]) -> str | None:
    best = row["largest_free"].get("VCPU")
    return f"{best['amount']} on {best['provider']}" if best else None


AGENT_COLUMNS = (
    views.Column("host", "host"),
    views.Column("alive", "alive"),
    views.Column("age_s", "heartbeat", views.age, right=True),
    views.number("nodes", "nodes"),
    views.number("building", "building"),
    views.Column("placed", "placed", right=True, pick=lambda r: r["counters"].get("active", 0)),
    views.Column("refused", "refused", right=True, pick=lambda r: r["counters"].get("refused", 0)),
    *(_free(rc) for rc in PLACEMENT_CLASSES),
    views.Column("largest_vcpu", "largest VCPU", pick=_largest),
    views.Column("classes", "classes"),
)


@cli.command()
@output_option(*views.FORMATS)
@admin_command()
def agents(admin: Admin, fmt: str) -> None:
    """Every agent seen: alive or not (heartbeat age), what it drives and consumes,
    what its nodes have free (from the ledger's providers named <host>-<n>)."""
    rows = queries.agent_rows(admin.stores, admin.now())
    echo(views.render_rows(rows, AGENT_COLUMNS, fmt, empty="no agent has ever heartbeated"))


ZONE_COLUMNS = (views.Column("zone", "zone"), views.number("agents", "agents"))


@cli.command()
@output_option(*views.FORMATS)
@admin_command()
def zones(admin: Admin, fmt: str) -> None:
    """The availability zones agents have registered: the only ones a boot may name.
    AGENTS: live agents whose heartbeat says they are in the zone. A zone stays
    when its agents stop, as in Nova."""
    rows = queries.zone_rows(admin.stores)
    echo(views.render_rows(rows, ZONE_COLUMNS, fmt, empty="no agent has registered a zone"))


# -- servers ------------------------------------------------------------------------------


SERVER_COLUMNS = (
    views.Column("uuid", "uuid"),
    views.Column("name", "name"),
    views.Column("state", "state"),
    views.Column("task_state", "task"),
    views.Column("host", "host"),
    views.Column("node", "node"),
    views.Column("flavor", "flavor"),
    views.number("attempts", "attempts"),
    views.Column("created_at", "created", views.when),
)


@cli.group()
def server() -> None:
    """Instances: list, show, and why one was (not) placed."""


@server.command("list")
@click.option("--project", required=True, help="Project id.")
@click.option(
    "--status",
    type=click.Choice(["BUILD", "ACTIVE", "ERROR"], case_sensitive=False),
    help="Only servers in this state.",
)
@output_option(*views.FORMATS)
@admin_command()
def server_list(admin: Admin, project: str, status: str | None, fmt: str) -> None:
    """A project's servers, oldest first (DELETED ones are not listed)."""
    rows = queries.server_rows(admin.stores, project, status)
    what = f"servers in {status.upper()}" if status else "servers"
    echo(views.render_rows(rows, SERVER_COLUMNS, fmt, empty=f"project {project} has no {what}"))


@server.command("show")
@click.argument("uuid")
@output_option(*SHOWS)
@admin_command(not_found=LIST_SERVERS)
def server_show(admin: Admin, uuid: str, fmt: str) -> None:
    """The instance record and its whole history."""
    doc = queries.server_doc(admin.stores, uuid)
    if fmt == "json":
        echo(views.to_json(doc))
        return
    keys = ("uuid", "name", "project_id", "user_id", "state", "task_state", "host", "node",
            "scheduling_class", "attempts", "fault")  # fmt: skip
    pairs = [(k, doc[k]) for k in keys] + [
        ("flavor", views.flavor_text(doc["flavor"])),
        ("created", views.when(doc["created_at"])),
        ("deadline", views.when(doc["deadline"])),
        ("launched", views.when(doc["launched_at"])),
    ]
    echo(views.key_values(pairs) + "\n\nhistory:")
    if doc["events_trimmed"]:
        echo(f"  ({doc['events_trimmed']} older events trimmed)")
    echo("\n".join(f"  {views.when(e['time'])}  {e['text']}" for e in doc["events"]))


@server.command("why")
@click.argument("uuid")
@output_option(*SHOWS)
@admin_command(not_found=LIST_SERVERS)
def server_why(admin: Admin, uuid: str, fmt: str) -> None:
    """Why a request was placed where it was, or not at all.

    From the instance's history: when it was published, each host that refused
    it and why, conflicts and retries, failed spawns, the deadline. For a
    request still waiting (or ended by its deadline): how many live agents
    consume its class now, and what the largest free capacity among live
    agents' nodes is.
    """
    diagnosis = queries.diagnose(admin.stores, uuid, admin.now(), admin.max_attempts)
    echo(views.to_json(diagnosis.to_dict()) if fmt == "json" else why.render(diagnosis))


# -- top ----------------------------------------------------------------------------------


@cli.command("top")
@click.option(
    "--interval",
    type=click.FloatRange(0.05),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--iterations",
    type=click.IntRange(1),
    default=None,
    help="Stop after this many refreshes [default: until Ctrl-C].",
)
@click.option(
    "--no-fill",
    is_flag=True,
    help="Skip the cluster fill (it scans every provider on each refresh).",
)
@output_option(*SHOWS)
@admin_command()
def top_command(
    admin: Admin, interval: float, iterations: int | None, no_fill: bool, fmt: str
) -> None:
    """A live view for watching a burst: queue depths and rates, placements and
    refusals per second, agents alive, cluster fill. --format json prints one
    JSON object per refresh (JSON lines)."""

    def show(frame: dict[str, Any]) -> None:
        if fmt == "json":
            echo(json.dumps(frame, sort_keys=True))
        else:
            click.clear()
            echo(top.render(frame, interval))

    with contextlib.suppress(KeyboardInterrupt):
        top.watch(admin.stores, admin.bus, show, interval, iterations, with_fill=not no_fill)


# -- the janitor --------------------------------------------------------------------------


@cli.group()
def janitor() -> None:
    """The fault-recovery janitor (the API service also runs it periodically)."""


@janitor.command("run")
@click.option("--dry-run", is_flag=True, help="Report what it would requeue; change nothing.")
@output_option(*SHOWS)
@admin_command()
def janitor_run(admin: Admin, dry_run: bool, fmt: str) -> None:
    """Once: release the unfinished claims of agents whose heartbeat has expired and
    publish their requests again; publish the boot requests that stayed in the outbox
    longer than [scheduler] outbox_grace_s (recorded, never confirmed by the broker)."""
    bus = None if dry_run else admin.bus
    report = qjanitor.run(
        admin.stores, bus, now=admin.now(), dry_run=dry_run,
        outbox_grace_s=admin.options.scheduler.outbox_grace_s,
    ).to_dict()  # fmt: skip
    echo(views.to_json(report) if fmt == "json" else views.key_values(sorted(report.items())))
