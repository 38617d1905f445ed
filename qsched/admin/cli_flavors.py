"""qsched-admin commands on the flavor catalog, through the API's domain (as admin)."""

from __future__ import annotations

from collections.abc import Sequence

import click

from qsched.admin import queries, views
from qsched.admin.context import ADMIN_CONTEXT, Admin, admin_command, output_option
from qsched.admin.views import SHOWS, echo
from qsched.flavors import Flavor

FLAVOR_COLUMNS = (
    views.Column("id", "id"),
    views.Column("name", "name"),
    views.number("vcpus", "vcpus"),
    views.number("ram_mb", "ram mb"),
    views.number("disk_gb", "disk gb"),
    views.Column("is_public", "public"),
    views.Column("extra_specs", "extra specs"),
)
FLAVOR_NOT_FOUND = "List flavors with: qsched-admin flavor list."


@click.group()
def flavor() -> None:
    """The flavor catalog (what the API's flavor calls do, as admin)."""


def _show_flavors(flavors: Sequence[Flavor], fmt: str, single: bool = False) -> None:
    rows = [queries.flavor_row(f) for f in flavors]
    if single and fmt == "json":
        echo(views.to_json(rows[0]))
        return
    echo(views.render_rows(rows, FLAVOR_COLUMNS, fmt, empty="no flavors"))


@flavor.command("list")
@output_option(*views.FORMATS)
@admin_command()
def flavor_list(admin: Admin, fmt: str) -> None:
    """Every flavor, by id."""
    _show_flavors(admin.compute.list_flavors(), fmt)


@flavor.command("show")
@click.argument("flavor_id")
@output_option(*SHOWS)
@admin_command(not_found=FLAVOR_NOT_FOUND)
def flavor_show(admin: Admin, flavor_id: str, fmt: str) -> None:
    """One flavor."""
    _show_flavors([admin.compute.get_flavor(flavor_id)], fmt, single=True)


def _specs(pairs: Sequence[str]) -> dict[str, str]:
    specs = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(f"{pair!r}: use KEY=VALUE", param_hint="extra spec")
        specs[key.strip()] = value.strip()
    return specs


@flavor.command("create")
@click.argument("name")
@click.option("--vcpus", type=click.IntRange(1), required=True)
@click.option("--ram-mb", type=click.IntRange(1), required=True)
@click.option("--disk-gb", type=click.IntRange(0), default=0, show_default=True)
@click.option("--id", "flavor_id", default="", help="Flavor id [default: the name].")
@click.option(
    "--spec",
    "specs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra spec in Nova syntax, e.g. trait:HW_CPU_X86_AVX2=required (repeat).",
)
@click.option("--private", is_flag=True, help="Not public.")
@output_option(*SHOWS)
@admin_command()
def flavor_create(
    admin: Admin,
    name: str,
    vcpus: int,
    ram_mb: int,
    disk_gb: int,
    flavor_id: str,
    specs: tuple[str, ...],
    private: bool,
    fmt: str,
) -> None:
    """Add a flavor."""
    new = Flavor(name, vcpus, ram_mb, disk_gb, flavor_id or name, _specs(specs), not private)
    _show_flavors([admin.compute.create_flavor(ADMIN_CONTEXT, new)], fmt, single=True)


@flavor.command("delete")
@click.argument("flavor_id")
@admin_command(not_found=FLAVOR_NOT_FOUND)
def flavor_delete(admin: Admin, flavor_id: str) -> None:
    """Remove a flavor; servers keep the copy they were booted with."""
    gone = admin.compute.delete_flavor(ADMIN_CONTEXT, flavor_id)
    echo(f"deleted flavor {gone.flavor_id} ({gone.name})")


@flavor.command("set-spec")
@click.argument("flavor_id")
@click.argument("specs", nargs=-1, required=True, metavar="KEY=VALUE...")
@output_option(*SHOWS)
@admin_command(not_found=FLAVOR_NOT_FOUND)
def flavor_set_spec(admin: Admin, flavor_id: str, specs: tuple[str, ...], fmt: str) -> None:
    """Add or change extra specs (checked as a whole)."""
    changed = admin.compute.set_flavor_extra_specs(ADMIN_CONTEXT, flavor_id, _specs(specs))
    _show_flavors([changed], fmt, single=True)


@flavor.command("unset-spec")
@click.argument("flavor_id")
@click.argument("key")
@output_option(*SHOWS)
@admin_command(not_found=FLAVOR_NOT_FOUND)
def flavor_unset_spec(admin: Admin, flavor_id: str, key: str, fmt: str) -> None:
    """Remove one extra spec."""
    _show_flavors(
        [admin.compute.delete_flavor_extra_spec(ADMIN_CONTEXT, flavor_id, key)], fmt, True
    )


COMMANDS = (flavor,)
