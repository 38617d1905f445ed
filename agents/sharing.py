"""The agent's views of the sharing providers its nodes reach: one per provider.

A sharing provider (trait ``MISC_SHARES_VIA_AGGREGATE``, shared storage) serves every
node whose root is in one of its aggregates. An agent may drive 100,000 nodes in one
aggregate, so it keeps ONE view of each such provider, not a copy per node, with the
generation that view was read at. :class:`agents.nodes.NodeIndex` owns the pool and
uses it under its lock; the fit takes the views as they are (docs/shared-providers.rst).

Generations: a claim passes the generation of every sharing provider it allocates on,
so a claim made on a stale view conflicts (``ProviderGenerationConflict``) and is
re-read and retried while it still fits; the re-read replaces the pool's view
(:meth:`SharingPool.replace`), so the next claim starts from it. The agent's own
claims and releases move a view's generation by exactly one, as the ledger does for a
consumer that did not hold the provider before (or leaves it). A view read from the
ledger replaces the pool's only when its generation is not older, so a read taken
before one of the agent's own writes cannot undo it.

Cost: every operation is O(sharing providers the agent reaches), a handful, whatever
the number of nodes or hosts.
"""

from __future__ import annotations

from collections.abc import Mapping

from qsched.ledger.base import Provider
from qsched.scheduling.views import ProviderView


class SharingPool:
    """Views of sharing providers by uuid, with their generations. Not thread-safe: the
    node index calls it under its own lock."""

    def __init__(self) -> None:
        self._views: dict[str, ProviderView] = {}
        self._generations: dict[str, int] = {}
        self.views: tuple[ProviderView, ...] = ()  # by name: the order the fit tries them

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._views

    def __len__(self) -> int:
        return len(self._views)

    def load(self, providers: Mapping[str, Provider]) -> bool:
        """Replace the pool by ``providers`` (read from the ledger); a view whose
        generation is older than the pool's is kept. True if what decides whether a
        node can use them changed (which providers, their inventories, traits or
        aggregates): the index must look at its nodes again."""
        before = {uuid: _shape(view) for uuid, view in self._views.items()}
        views: dict[str, ProviderView] = {}
        generations: dict[str, int] = {}
        for uuid, provider in providers.items():
            mine = self._generations.get(uuid)
            if mine is not None and provider.generation < mine:
                views[uuid], generations[uuid] = self._views[uuid], mine
            else:
                views[uuid] = ProviderView.from_provider(provider)
                generations[uuid] = provider.generation
        self._views, self._generations = views, generations
        self.views = tuple(sorted(views.values(), key=lambda v: (v.name, v.uuid)))
        return before != {uuid: _shape(view) for uuid, view in views.items()}

    def replace(self, provider: Provider) -> bool:
        """Take ``provider``, re-read after a claim met a generation conflict on it, as
        the pool's view, whatever generation the pool held (the ledger just said it is
        stale). True if what decides whether a node can use it changed."""
        old = self._views.get(provider.uuid)
        view = ProviderView.from_provider(provider)
        self._views[provider.uuid], self._generations[provider.uuid] = view, provider.generation
        self.views = tuple(sorted(self._views.values(), key=lambda v: (v.name, v.uuid)))
        return old is None or _shape(old) != _shape(view)

    def adjust(self, uuid: str, amounts: Mapping[str, int], sign: int) -> None:
        """Add (sign 1) or remove (-1) the agent's own allocation; the ledger bumped the
        provider's generation by one for it. Unknown uuids are ignored."""
        view = self._views.get(uuid)
        if view is None:
            return
        self._views[uuid] = view.adjusted(amounts, sign)
        self._generations[uuid] += 1
        self.views = tuple(self._views.get(v.uuid, v) for v in self.views)

    def adjust_all(self, allocations: Mapping[str, Mapping[str, int]], sign: int) -> None:
        """:meth:`adjust` for each provider of ``allocations``."""
        for uuid, amounts in allocations.items():
            self.adjust(uuid, amounts, sign)

    def generations(self, uuids: Mapping[str, object]) -> dict[str, int]:
        """The generations the pool read of those of ``uuids`` it holds."""
        return {uuid: self._generations[uuid] for uuid in uuids if uuid in self._generations}

    def generation(self, uuid: str) -> int | None:
        return self._generations.get(uuid)


def _shape(view: ProviderView) -> tuple[object, ...]:
    return (view.name, dict(view.inventories), view.traits, view.aggregates)
