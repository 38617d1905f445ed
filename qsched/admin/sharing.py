"""Shared providers for operators: create one in aggregates, list them, delete one.

A shared provider is a resource provider with the trait ``MISC_SHARES_VIA_AGGREGATE``
(Placement's sharing provider): shared storage holding DISK_GB, say. It serves every
compute node whose root provider is in one of its aggregates (docs/shared-providers.rst).
Everything goes through the :class:`~qsched.ledger.base.Ledger` interface, as an
operator would through Placement's API: create, inventory, aggregates, then the trait,
so a provider that is not complete is never a sharing provider.
"""

from __future__ import annotations

import contextlib
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.admin import queries
from qsched.ledger import Stores
from qsched.ledger.base import Inventory, Provider
from qsched.resources import SHARES_VIA_AGGREGATE, check_resource_class, check_uuid


class UnknownAggregate(exception.NotFound):
    msg_fmt = (
        "No host aggregate {ref!r} (give its UUID, name or id; list them with: "
        "openstack aggregate list, or GET /v2.1/os-aggregates)."
    )


def parse_inventory(text: str) -> tuple[str, int]:
    """``DISK_GB=100000`` -> ``("DISK_GB", 100000)``.

    :raises Invalid: not ``CLASS=TOTAL`` with a resource class and a positive integer.
    """
    rc, sep, total = text.partition("=")
    if not sep or not total.strip().isdigit() or int(total) < 1:
        raise exception.Invalid(reason=f"inventory {text!r}: use CLASS=TOTAL, e.g. DISK_GB=1000")
    return check_resource_class(rc.strip()), int(total)


def resolve_aggregates(stores: Stores, refs: Iterable[str]) -> list[str]:
    """The UUIDs of aggregates named by UUID, name or integer id.

    A UUID no host aggregate has is taken as it is: an agent may register static
    aggregates (``[agent] aggregates``) that the API never made.

    :raises UnknownAggregate: a name or id that no aggregate has.
    """
    known = stores.aggregates.list()
    found = []
    for ref in refs:
        match = next((a.uuid for a in known if ref in (a.uuid, a.name, str(a.id))), None)
        if match is None:
            try:
                match = check_uuid(ref, "Aggregate UUID")
            except exception.Invalid:
                raise UnknownAggregate(ref=ref) from None
        found.append(match)
    return sorted(set(found))


def create(
    stores: Stores,
    name: str,
    inventories: Mapping[str, int],
    aggregates: Sequence[str],
    allocation_ratio: float = 1.0,
    uuid: str | None = None,
) -> Provider:
    """Create a sharing provider of ``inventories`` in ``aggregates`` (UUIDs, names, ids).

    Four ledger writes: create, inventory, aggregates, trait. If one fails the provider
    is deleted again, so nothing half-made is left.

    :raises Invalid: no inventory or no aggregate, or a bad value.
    :raises ProviderExists: the name or uuid is taken.
    :raises UnknownAggregate:
    """
    if not inventories:
        raise exception.Invalid(reason="a shared provider needs an inventory (--inventory)")
    if not aggregates:
        raise exception.Invalid(reason="a shared provider serves aggregates: give --aggregate")
    members = resolve_aggregates(stores, aggregates)
    ledger = stores.ledger
    specs = {rc: Inventory(total, allocation_ratio=allocation_ratio)
             for rc, total in inventories.items()}  # fmt: skip
    made = ledger.create_provider(uuid or str(uuidlib.uuid4()), name)
    try:
        generation = ledger.set_inventory(made.uuid, made.generation, specs)
        generation = ledger.set_aggregates(made.uuid, generation, members)
        ledger.set_traits(made.uuid, generation, [SHARES_VIA_AGGREGATE])
    except exception.QschedError:
        with contextlib.suppress(exception.QschedError):
            ledger.delete_provider(made.uuid, ledger.get_provider(made.uuid).generation)
        raise
    return ledger.get_provider(made.uuid)


def delete(stores: Stores, ref: str) -> Provider:
    """Delete a sharing provider by UUID or name; return what it was.

    :raises ProviderNotFound:
    :raises Invalid: ``ref`` is a provider but not a sharing one.
    :raises ProviderInUse: it still holds allocations.
    """
    provider = queries.find_provider(stores, ref)
    if SHARES_VIA_AGGREGATE not in provider.traits:
        raise exception.Invalid(
            reason=f"provider {provider.name} is not a shared provider (no trait "
            f"{SHARES_VIA_AGGREGATE}); qsched-admin provider show {provider.uuid}"
        )
    stores.ledger.delete_provider(provider.uuid, provider.generation)
    return provider


def rows(stores: Stores) -> list[dict[str, Any]]:
    """Every sharing provider with its aggregates (names where the API made them), its
    used/capacity and its consumers' count. O(sharing providers + aggregates)."""
    names = {a.uuid: a.name for a in stores.aggregates.list()}
    providers = sorted(stores.ledger.sharing_providers().values(), key=lambda p: p.name)
    consumers = stores.ledger.providers_consumers([p.uuid for p in providers])
    found = []
    for provider in providers:
        row = queries.provider_row(provider, {provider.uuid: provider.name})
        row["host"] = None
        row["aggregate_names"] = [names.get(a) for a in row["aggregates"]]
        row["consumers"] = len(consumers[provider.uuid])
        found.append(row)
    return found
