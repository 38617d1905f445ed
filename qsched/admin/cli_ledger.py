"""qsched-admin commands on the ledger: providers, allocations, usages, quota."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from qsched.admin import capacity, queries, views
from qsched.admin.context import Admin, admin_command, output_option
from qsched.admin.views import SHOWS, echo

PLACEMENT_CLASSES = capacity.STANDARD


def _usage(rc: str) -> views.Column:
    def pick(row: Mapping[str, Any]) -> str | None:
        inv = row["inventories"].get(rc)
        return f"{row['usages'].get(rc, 0)}/{inv['capacity']}" if inv else None

    return views.Column(rc, rc, right=True, pick=pick)


def _other(row: Mapping[str, Any]) -> str:
    others = [rc for rc in row["inventories"] if rc not in PLACEMENT_CLASSES]
    caps = row["inventories"]
    return " ".join(f"{rc}={row['usages'].get(rc, 0)}/{caps[rc]['capacity']}" for rc in others)


def tree_name(row: Mapping[str, Any]) -> str:
    """A provider's name indented under its parent, as the listing draws the tree."""
    depth = int(row.get("depth") or 0)
    return f"{'  ' * depth}└ {row['name']}" if depth else str(row["name"])


PROVIDER_COLUMNS = (
    views.Column("name", "name", pick=tree_name),
    views.Column("host", "host"),
    views.number("generation", "gen"),
    *(_usage(rc) for rc in PLACEMENT_CLASSES),
    views.Column("other", "other used/capacity", pick=_other),
    views.Column("traits", "traits"),
    views.Column("uuid", "uuid"),
)


@click.command()
@click.option("--host", help="Only the providers of this agent host.")
@click.option("--trait", "traits", multiple=True, help="Only providers with this trait (repeat).")
@click.option(
    "--aggregate", "aggregates", multiple=True, help="Only providers in this aggregate (repeat)."
)
@output_option(*views.FORMATS)
@admin_command()
def providers(
    admin: Admin, host: str | None, traits: tuple[str, ...], aggregates: tuple[str, ...], fmt: str
) -> None:
    """Resource providers as trees (children under their parents): used/capacity per class,
    generation, traits. Scans them all."""
    rows = queries.provider_rows(admin.stores, host, traits, aggregates)
    echo(views.render_rows(rows, PROVIDER_COLUMNS, fmt, empty="no provider matches"))


@click.group()
def provider() -> None:
    """One resource provider."""


INVENTORY_COLUMNS = (
    views.Column("resource_class", "class"),
    *(views.number(k, k.replace("_", " ")) for k in ("total", "reserved", "min_unit",
                                                      "max_unit", "step_size")),
    views.number("allocation_ratio", "ratio"),
    views.number("capacity", "capacity"),
    views.number("used", "used"),
    views.number("free", "free"),
)  # fmt: skip


@provider.command("show")
@click.argument("provider_ref", metavar="UUID_OR_NAME")
@output_option(*SHOWS)
@admin_command(not_found="List providers with: qsched-admin providers.")
def provider_show(admin: Admin, provider_ref: str, fmt: str) -> None:
    """Inventories, usages, traits, aggregates and consumers of one provider."""
    doc = queries.provider_doc(admin.stores, provider_ref)
    if fmt == "json":
        echo(views.to_json(doc))
        return
    inventory = [{"resource_class": rc, **inv, "used": doc["usages"].get(rc, 0),
                  "free": inv["capacity"] - doc["usages"].get(rc, 0)}
                 for rc, inv in doc["inventories"].items()]  # fmt: skip
    keys = ("uuid", "name", "host", "generation", "parent_uuid", "root_uuid", "traits",
            "aggregates")  # fmt: skip
    echo(views.key_values([(k, doc[k]) for k in keys] + [("consumers", len(doc["consumers"]))]))
    echo("\n" + views.table(inventory, INVENTORY_COLUMNS))


ALLOCATION_COLUMNS = (
    views.Column("provider_name", "provider"),
    views.Column("resource_class", "class"),
    views.number("amount", "amount"),
    views.Column("provider", "provider uuid"),
)


@click.command()
@click.argument("consumer")
@output_option(*views.FORMATS)
@admin_command(not_found="A consumer is an instance: qsched-admin server show ID.")
def allocations(admin: Admin, consumer: str, fmt: str) -> None:
    """What one consumer (an instance) holds, provider by provider."""
    doc = queries.allocations_doc(admin.stores, consumer)
    if fmt != "table":
        rows = doc["allocations"]
        echo(views.to_json(doc) if fmt == "json" else views.to_csv(rows, ALLOCATION_COLUMNS))
        return
    keys = ("consumer", "generation", "project_id", "user_id")
    echo(views.key_values([(k, doc[k]) for k in keys]))
    echo("\n" + views.table(doc["allocations"], ALLOCATION_COLUMNS))


QUOTA_COLUMNS = (
    views.Column("resource", "resource"),
    views.number("used", "used"),
    views.Column("limit", "limit", lambda v: "unlimited" if v == -1 else views.text(v), True),
)
USAGE_COLUMNS = (views.Column("resource_class", "class"), views.number("used", "allocated"))


@click.command()
@click.option("--project", required=True, help="Project id.")
@output_option(*SHOWS)
@admin_command()
def usages(admin: Admin, project: str, fmt: str) -> None:
    """A project's allocations per resource class, and its quota."""
    doc = queries.usages_doc(admin.stores, project)
    if fmt == "json":
        echo(views.to_json(doc))
        return
    echo(views.render_rows(doc["usages"], USAGE_COLUMNS, fmt, empty="no allocations"))
    echo("\n" + views.table(doc["quota"], QUOTA_COLUMNS))


@click.group()
def quota() -> None:
    """Per-project limits on instances, cores and RAM."""


@quota.command("show")
@click.argument("project")
@output_option(*views.FORMATS)
@admin_command()
def quota_show(admin: Admin, project: str, fmt: str) -> None:
    """Limits and use of one project (-1: no limit)."""
    _show_quota(queries.quota_doc(admin.stores, project), fmt)


def _show_quota(doc: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        echo(views.to_json(doc))
    else:
        echo(views.render_rows(doc["resources"], QUOTA_COLUMNS, fmt))


@quota.command("set")
@click.argument("project")
@click.option("--instances", type=click.IntRange(-1), help="Instances; -1: no limit.")
@click.option("--cores", type=click.IntRange(-1), help="VCPUs; -1: no limit.")
@click.option("--ram-mb", type=click.IntRange(-1), help="MiB of RAM; -1: no limit.")
@output_option(*views.FORMATS)
@admin_command()
def quota_set(
    admin: Admin,
    project: str,
    instances: int | None,
    cores: int | None,
    ram_mb: int | None,
    fmt: str,
) -> None:
    """Override some limits of one project; prints the limits after."""
    if instances is None and cores is None and ram_mb is None:
        raise click.UsageError("give at least one of --instances, --cores, --ram-mb")
    admin.stores.quota.set_limits(project, instances=instances, cores=cores, ram_mb=ram_mb)
    _show_quota(queries.quota_doc(admin.stores, project), fmt)


COMMANDS = (providers, provider, allocations, usages, quota)
