"""qsched-admin commands on compute services (os-services), through the API's domain.

``service set`` is ``openstack compute service set``: disable a host's agent for
maintenance (no new boots, what runs stays), enable it again, force it down or up.
``service drain`` then empties the disabled host (:mod:`qsched.admin.drain`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from qsched.admin import views
from qsched.admin.context import ADMIN_CONTEXT, Admin, AdminUsageError, admin_command, output_option
from qsched.admin.drain import Drain
from qsched.admin.views import SHOWS, echo
from qsched.compute.services import COMPUTE_BINARY, Change, ServiceAPI, ServiceView

SERVICE_COLUMNS = (
    views.number("seq", "id"),
    views.Column("host", "host"),
    views.Column("binary", "binary"),
    views.Column("zone", "zone"),
    views.Column("status", "status"),
    views.Column("state", "state"),
    views.Column("forced_down", "forced down"),
    views.Column("reported_at", "heartbeat", views.when),
    views.Column("disabled_reason", "disabled reason"),
    views.Column("uuid", "uuid"),
)
SERVICE_NOT_FOUND = "List services with: qsched-admin service list."


DRAIN_COLUMNS = (
    views.Column("name", "name"),
    views.Column("uuid", "uuid"),
    views.Column("kind", "move"),
    views.Column("outcome", "outcome"),
    views.Column("host", "host now"),
    views.Column("why", "why"),
)


@click.group()
def service() -> None:
    """Compute services: list them, disable or enable one, force one down or up, drain
    one."""


def service_row(view: ServiceView) -> dict[str, Any]:
    """One service as the listings show it."""
    svc = view.service
    return {
        "seq": svc.seq,
        "uuid": svc.id,
        "host": svc.host,
        "binary": view.binary,
        "zone": svc.zone,
        "status": "disabled" if svc.disabled else "enabled",
        "state": "up" if view.up else "down",
        "forced_down": svc.forced_down,
        "reported_at": view.reported_at,
        "disabled_reason": svc.disabled_reason,
    }


def _show(views_: Sequence[ServiceView], fmt: str, single: bool = False) -> None:
    rows = [service_row(v) for v in views_]
    if single and fmt == "json":
        echo(views.to_json(rows[0]))
        return
    echo(views.render_rows(rows, SERVICE_COLUMNS, fmt, empty="no compute service registered"))


@service.command("list")
@click.option("--host", help="Only this host's service.")
@output_option(*views.FORMATS)
@admin_command()
def service_list(admin: Admin, host: str | None, fmt: str) -> None:
    """Every compute service (one per agent host): enabled or disabled and why, up or
    down (its heartbeat, or forced down)."""
    _show(ServiceAPI(admin.stores).list(ADMIN_CONTEXT, host), fmt)


@service.command("set")
@click.argument("host")
@click.argument("binary", default=COMPUTE_BINARY)
@click.option("--enable/--disable", "enable", default=None,
              help="Take new boots again / stop taking them (the agent drains).")  # fmt: skip
@click.option("--disable-reason", help="Why it is disabled (with --disable).")
@click.option("--up/--down", "up", default=None,
              help="Force the service down (a host known dead or fenced: its instances are "
              "deleted locally, its claims taken back), or up again.")  # fmt: skip
@output_option(*SHOWS)
@admin_command(not_found=SERVICE_NOT_FOUND)
def service_set(
    admin: Admin,
    host: str,
    binary: str,
    enable: bool | None,
    disable_reason: str | None,
    up: bool | None,
    fmt: str,
) -> None:
    """Change HOST's compute service, as ``openstack compute service set`` does."""
    if disable_reason and enable is not False:
        raise AdminUsageError("--disable-reason needs --disable")
    if enable is None and up is None:
        raise AdminUsageError("nothing to change: give --enable, --disable, --up or --down")
    change = Change(
        disabled=None if enable is None else not enable,
        disabled_reason=disable_reason,
        forced_down=None if up is None else not up,
    )
    _show([ServiceAPI(admin.stores).update(ADMIN_CONTEXT, host, binary, change)], fmt, True)


@service.command("drain")
@click.argument("host")
@click.option("--concurrency", type=click.IntRange(1, 100), default=4, show_default=True,
              help="How many servers move at once.")  # fmt: skip
@click.option("--timeout", "timeout_s", type=click.FloatRange(1.0), default=600.0,
              show_default=True, help="Seconds to wait for every move to end.")  # fmt: skip
@output_option(*views.FORMATS)
@admin_command(not_found=SERVICE_NOT_FOUND)
def service_drain(admin: Admin, host: str, concurrency: int, timeout_s: float, fmt: str) -> None:
    """Empty HOST, whose compute service must be disabled, by moving its servers away:
    a running one by live migration, a stopped one by cold migration (confirmed once
    it is up elsewhere), CONCURRENCY at a time, through the queues as any move. Shows
    progress on stderr, then each server: moved (and where), failed or refused (and
    why: no host could take it, a task under way, a server in ERROR), or still moving
    when TIMEOUT ran out. Exit code 1 unless every server moved.

    \b
    Example:
      qsched-admin service set cn7 --disable --disable-reason "new disks"
      qsched-admin service drain cn7 --concurrency 8
    """
    drain = Drain(admin.compute.cell, ADMIN_CONTEXT)
    servers = drain.servers(host)
    if not servers:
        click.echo(f"{host} holds no server: nothing to move", err=True)
        return
    with click.progressbar(length=len(servers), label=f"draining {host}", file=sys.stderr) as bar:
        results = drain.run(servers, concurrency, timeout_s, lambda _done: bar.update(1))
    echo(views.render_rows([r.to_dict() for r in results], DRAIN_COLUMNS, fmt))
    left = [r for r in results if r.outcome != "moved"]
    click.echo(f"{len(results) - len(left)} of {len(results)} servers moved off {host}", err=True)
    if left:
        raise click.exceptions.Exit(1)


COMMANDS = (service,)
