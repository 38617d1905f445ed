"""Put an agent's nodes in the ledger and read back what the ledger holds for them.

Registration is idempotent: a restarted agent finds its providers (their uuids
derive from host and node names), updates what changed and keeps their usages.
Nodes go in batches, one atomic script per batch, so an agent with 100,000
simulated nodes registers in seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agents.virt.base import NodeInfo
from qsched.ledger.base import Ledger, ProviderSpec
from qsched.scheduling.views import NodeView, ProviderView

BATCH = 500  # providers per script: long enough to amortise, short enough not to stall Redis


def register_nodes(
    ledger: Ledger,
    nodes: Sequence[NodeInfo],
    availability_zone: str | None,
    aggregates: Iterable[str],
    batch: int = BATCH,
    host: str | None = None,
) -> list[NodeView]:
    """Create or update every provider of ``nodes``; their views with current usages.

    Aggregates go on root providers, with those the aggregate API put ``host`` in;
    a batch never splits a node's tree.
    """
    aggs = frozenset(aggregates)
    views: list[NodeView] = []
    chunk: list[NodeInfo] = []
    for node in nodes:
        chunk.append(node)
        if sum(len(n.providers) for n in chunk) >= batch:
            views += _register(ledger, chunk, availability_zone, aggs, host)
            chunk = []
    return views + _register(ledger, chunk, availability_zone, aggs, host)


def _register(
    ledger: Ledger,
    nodes: list[NodeInfo],
    zone: str | None,
    aggs: frozenset[str],
    host: str | None,
) -> list[NodeView]:
    specs = [
        ProviderSpec(p.uuid, p.name, p.inventories, p.traits,
                     aggs if p.parent_uuid is None else frozenset(), p.parent_uuid, host)
        for node in nodes
        for p in node.providers
    ]  # fmt: skip
    providers = iter(ledger.register_providers(specs))
    return [
        NodeView(
            node.name,
            tuple(ProviderView.from_provider(next(providers)) for _ in node.providers),
            zone,
        )
        for node in nodes
    ]
