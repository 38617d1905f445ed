"""qsched-admin commands on the ledger: providers, allocations, usages, quota."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from qsched import exception
from qsched.admin import capacity, queries, sharing, views
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
    """A provider's name indented under its parent, as the listing draws the tree; a
    sharing provider's marked ``(shared)``."""
    depth = int(row.get("depth") or 0)
    name = f"{row['name']} (shared)" if row.get("sharing") else str(row["name"])
    return f"{'  ' * depth}└ {name}" if depth else name


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


@click.group("shared-provider")
def shared_provider() -> None:
    """Providers shared through aggregates (MISC_SHARES_VIA_AGGREGATE): shared storage
    serving every compute node of its aggregates (docs/shared-providers.rst)."""


SHARED_COLUMNS = (
    views.Column("name", "name"),
    views.number("generation", "gen"),
    *(_usage(rc) for rc in PLACEMENT_CLASSES),
    views.Column("other", "other used/capacity", pick=_other),
    views.number("consumers", "consumers"),
    views.Column("aggregates", "aggregates",
                 pick=lambda r: " ".join(n or a for n, a in zip(r["aggregate_names"],
                                                               r["aggregates"], strict=True))),
    views.Column("uuid", "uuid"),
)  # fmt: skip


def _inventories(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict:
    try:
        return dict(sharing.parse_inventory(v) for v in value)
    except exception.QschedError as exc:
        raise click.BadParameter(str(exc)) from None


@shared_provider.command("create")
@click.argument("name")
@click.option(
    "--inventory",
    "inventories",
    multiple=True,
    required=True,
    callback=_inventories,
    help="CLASS=TOTAL, e.g. DISK_GB=100000 (repeat for more classes).",
)
@click.option(
    "--allocation-ratio",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Allocation ratio of every inventory.",
)
@click.option(
    "--aggregate",
    "aggregates",
    multiple=True,
    required=True,
    help="An aggregate it serves: UUID, name or id (repeat).",
)
@click.option("--uuid", help="The provider's UUID (default: a new one).")
@output_option(*SHOWS)
@admin_command()
def shared_provider_create(
    admin: Admin,
    name: str,
    inventories: dict[str, int],
    allocation_ratio: float,
    aggregates: tuple[str, ...],
    uuid: str | None,
    fmt: str,
) -> None:
    """Create a shared provider NAME serving the compute nodes of its aggregates."""
    made = sharing.create(admin.stores, name, inventories, aggregates, allocation_ratio, uuid)
    _show_shared([r for r in sharing.rows(admin.stores) if r["uuid"] == made.uuid], fmt, True)


@shared_provider.command("list")
@output_option(*views.FORMATS)
@admin_command()
def shared_provider_list(admin: Admin, fmt: str) -> None:
    """Every shared provider: used/capacity, consumers, aggregates (O(shared providers))."""
    _show_shared(sharing.rows(admin.stores), fmt)


@shared_provider.command("delete")
@click.argument("provider_ref", metavar="UUID_OR_NAME")
@admin_command(not_found="List shared providers with: qsched-admin shared-provider list.")
def shared_provider_delete(admin: Admin, provider_ref: str) -> None:
    """Delete a shared provider that holds no allocations."""
    gone = sharing.delete(admin.stores, provider_ref)
    echo(f"deleted shared provider {gone.name} ({gone.uuid})")


def _show_shared(rows: list[dict[str, Any]], fmt: str, single: bool = False) -> None:
    if single and fmt == "json":
        echo(views.to_json(rows[0]))
        return
    echo(views.render_rows(rows, SHARED_COLUMNS, fmt, empty="no shared provider"))


COMMANDS = (providers, provider, allocations, usages, quota, shared_provider)
