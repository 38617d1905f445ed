"""The agent's view of its nodes: provider trees with their inventories, usages and traits.

Immutable snapshots: :mod:`agents.nodes` replaces a node's view when a claim or a
release changes it, and :mod:`qsched.scheduling.fit` reads them to decide what fits.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping

from qsched import exception
from qsched.ledger.base import Inventory, Provider


@dataclasses.dataclass(frozen=True, slots=True)
class ProviderView:
    """One provider as the agent sees it. Treat the mappings as read-only.

    ``generation``: the provider's generation this view stands for (None: never read
    from the ledger); a claim passes it, so that a view made stale by another writer
    conflicts (docs/pipeline.rst, "Generations").
    """

    uuid: str
    name: str
    inventories: Mapping[str, Inventory]
    usages: Mapping[str, int] = dataclasses.field(default_factory=dict)
    traits: frozenset[str] = frozenset()
    aggregates: frozenset[str] = frozenset()
    parent_uuid: str | None = None
    generation: int | None = dataclasses.field(default=None, compare=False)
    free_by_rc: Mapping[str, int] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # fits read free amounts far more often than usages change: compute them once
        free = {rc: inv.capacity - self.usages.get(rc, 0) for rc, inv in self.inventories.items()}
        object.__setattr__(self, "free_by_rc", free)

    def free(self, resource_class: str) -> int:
        """Capacity minus usage; 0 without inventory, negative when over-used."""
        return self.free_by_rc.get(resource_class, 0)

    def adjusted(self, amounts: Mapping[str, int], sign: int) -> ProviderView:
        """A copy with ``sign * amounts`` added to usages, never below zero, and the
        generation one higher: the ledger bumps a provider's generation once when a
        consumer comes onto it or leaves it (``allocate.lua``, ``drop_allocations``)."""
        usages = dict(self.usages)
        for rc, amount in amounts.items():
            usages[rc] = max(0, usages.get(rc, 0) + sign * amount)
        return ProviderView(
            self.uuid,
            self.name,
            self.inventories,
            usages,
            self.traits,
            self.aggregates,
            self.parent_uuid,
            None if self.generation is None else self.generation + 1,
        )

    @classmethod
    def from_provider(cls, provider: Provider) -> ProviderView:
        """The view of a provider read from the ledger."""
        return cls(
            provider.uuid,
            provider.name,
            dict(provider.inventories),
            dict(provider.usages),
            provider.traits,
            provider.aggregates,
            provider.parent_uuid,
            provider.generation,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    """A node's provider tree in tree order (root first, parents before children).

    :raises Invalid: no providers, a root with a parent, a child whose parent is not
        earlier in the tuple, or a repeated uuid.
    """

    name: str
    providers: tuple[ProviderView, ...]
    availability_zone: str | None = None
    uuids: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uuids", _check_tree(self.name, self.providers))

    @property
    def root(self) -> ProviderView:
        return self.providers[0]

    def adjusted(self, allocations: Mapping[str, Mapping[str, int]], sign: int) -> NodeView:
        """A copy with allocations added (sign 1) or removed (sign -1) from usages.

        :raises ProviderNotFound: an allocation names a provider outside this node.
        """
        for uuid in allocations:
            if uuid not in self.uuids:
                raise exception.ProviderNotFound(provider=uuid)
        providers = tuple(
            p.adjusted(allocations[p.uuid], sign) if p.uuid in allocations else p
            for p in self.providers
        )
        return NodeView(self.name, providers, self.availability_zone)

    def replaced(self, providers: Iterable[ProviderView]) -> NodeView:
        """A copy with some providers replaced by fresher views of the same uuid.

        :raises ProviderNotFound: a view names a provider outside this node.
        """
        fresh = {p.uuid: p for p in providers}
        for uuid in fresh:
            if uuid not in self.uuids:
                raise exception.ProviderNotFound(provider=uuid)
        return NodeView(
            self.name,
            tuple(fresh.get(p.uuid, p) for p in self.providers),
            self.availability_zone,
        )


def _check_tree(node: str, providers: tuple[ProviderView, ...]) -> frozenset[str]:
    if not providers:
        raise exception.Invalid(reason=f"node {node} has no providers")
    if providers[0].parent_uuid is not None:
        raise exception.Invalid(reason=f"node {node}: the first provider must be the root")
    seen: set[str] = set()
    for p in providers:
        if p.uuid in seen:
            raise exception.Invalid(reason=f"node {node}: provider {p.uuid} appears twice")
        if seen and p.parent_uuid not in seen:
            raise exception.Invalid(
                reason=f"node {node}: provider {p.uuid} comes before its parent {p.parent_uuid}"
            )
        seen.add(p.uuid)
    return frozenset(seen)


def usage_term(provider_uuid: str, resource_class: str, used: int) -> int:
    """One provider's usage of one class, as a 64-bit term of a usage digest.

    The digest of a set of providers is the XOR of the terms of their non-zero
    usages: equal usages give equal digests whatever the order, and the node index
    keeps its own up to date in O(1) per change. A harness compares an agent's
    digest with one computed from the ledger to check that the two agree.
    """
    key = f"{provider_uuid} {resource_class} {used}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def usage_digest(providers: Iterable[ProviderView]) -> str:
    """The usage digest of some providers, as :meth:`agents.nodes.NodeIndex.digest` gives it."""
    digest = 0
    for provider in providers:
        for rc in provider.inventories:
            used = provider.usages.get(rc, 0)
            if used:
                digest ^= usage_term(provider.uuid, rc, used)
    return f"{digest:016x}"


def same_usage(a: ProviderView, b: ProviderView) -> bool:
    """Whether two views of a provider agree on everything the ledger holds for it."""
    return (
        a.inventories == b.inventories
        and {rc: n for rc, n in a.usages.items() if n} == {rc: n for rc, n in b.usages.items() if n}
        and a.traits == b.traits
        and a.aggregates == b.aggregates
        and a.parent_uuid == b.parent_uuid
    )
