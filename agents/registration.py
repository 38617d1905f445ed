"""Put an agent's nodes in the ledger and read back what the ledger holds for them.

Registration is idempotent: a restarted agent finds its providers (their uuids
derive from host and node names), updates what changed and keeps their usages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agents.fit import NodeView, ProviderView
from agents.virt.base import NodeInfo, ProviderInfo
from qsched import exception
from qsched.ledger.base import Inventory, Ledger, Provider


def register_node(
    ledger: Ledger, node: NodeInfo, availability_zone: str | None, aggregates: Iterable[str]
) -> NodeView:
    """Create or update every provider of ``node``; return its view with current usages."""
    aggs = frozenset(aggregates)
    providers = [
        _register_provider(ledger, info, aggs if info.parent_uuid is None else frozenset())
        for info in node.providers
    ]
    return NodeView(
        node.name, tuple(ProviderView.from_provider(p) for p in providers), availability_zone
    )


def _register_provider(ledger: Ledger, info: ProviderInfo, aggregates: frozenset[str]) -> Provider:
    try:
        provider = ledger.get_provider(info.uuid)
    except exception.ProviderNotFound:
        provider = ledger.create_provider(info.uuid, info.name, info.parent_uuid)
    generation = provider.generation
    if _normal(provider.inventories) != _normal(info.inventories):
        generation = ledger.set_inventory(info.uuid, generation, info.inventories)
    if provider.traits != info.traits:
        generation = ledger.set_traits(info.uuid, generation, info.traits)
    if provider.aggregates != aggregates:
        generation = ledger.set_aggregates(info.uuid, generation, aggregates)
    if generation != provider.generation:
        provider = ledger.get_provider(info.uuid)
    return provider


def _normal(inventories: Mapping[str, Inventory]) -> dict[str, tuple[float, ...]]:
    return {
        rc: (i.total, i.reserved, i.min_unit, i.effective_max_unit, i.step_size,
             float(i.allocation_ratio))
        for rc, i in inventories.items()
    }  # fmt: skip


def read_node(ledger: Ledger, view: NodeView) -> list[ProviderView]:
    """Fresh views of a node's providers, as the ledger holds them now."""
    return [ProviderView.from_provider(ledger.get_provider(p.uuid)) for p in view.providers]
