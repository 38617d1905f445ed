"""qsched-admin commands on compute services (os-services), through the API's domain.

``service set`` is ``openstack compute service set``: disable a host's agent for
maintenance (it drains: no new boots, what runs stays), enable it again, force it
down or up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from qsched.admin import views
from qsched.admin.context import ADMIN_CONTEXT, Admin, AdminUsageError, admin_command, output_option
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


@click.group()
def service() -> None:
    """Compute services: list them, disable or enable one, force one down or up."""


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


COMMANDS = (service,)
