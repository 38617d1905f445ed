"""The agent's node index: which classes fit somewhere now, and which node to pick, without scans.

An agent may drive up to about 100,000 (simulated) nodes and knows a few tens of scheduling
classes. Per request it must not look at every node, so the index keeps, per class, the nodes
where the class fits now, grouped into buckets by :func:`qsched.scheduling.fit.room` (how many
more copies of the class the node could hold), and a heap over the bucket keys.

Policy
------
``pack`` (the default) picks a node with the least room left for the class, that is the
most-used node that still fits. It fills nodes one after another, which keeps large holes open
for large flavors (less fragmentation), leaves whole nodes empty for maintenance or power
saving, and lets a class go unfittable, and its queue be cancelled, as late as possible.
``spread`` picks a node with the most room. Ties go to the last node of the bucket, which is
deterministic for a given sequence of operations.
On a single-provider node room is exact; on a tree it is an upper bound, so packing there is
approximate, while whether a class fits is always decided by
:func:`qsched.scheduling.fit.fit_request`.

Notifications
-------------
Every change returns :class:`ClassChanges`: the classes that went from fittable by no node to
fittable by some (start consuming their queue) and back (cancel it). The optional
``on_change(class_name, fittable)`` callback hears the same transitions, in order, under the
index's lock: keep it short and do not block in it.

Convergence
-----------
The ledger is the truth; the index is the agent's copy, kept by its own claims and releases
and brought back to the ledger by the agent's reconcile, which reads a node and replaces its
view with :meth:`NodeIndex.refresh_if`. That replacement must not undo a change the agent
makes meanwhile: every ledger write of the agent on a node runs inside
:meth:`NodeIndex.writing` (the ledger write, then the matching index change), and
:meth:`NodeIndex.sync_token`, taken before the read, is refused by ``refresh_if`` if any
such write started or was running since. A refused refresh waits for the next pass.
:meth:`NodeIndex.digest` sums the usages up (see :func:`qsched.scheduling.views.usage_term`) so that
a harness can compare an agent's index with the ledger from outside the process.

Complexity (N nodes, K classes, B distinct room values of one class, fit = one fit_request)
--------------------------------------------------------------------------------------------
- ``pick(C)``: O(log B) amortised, plus one fit on the chosen node to build its allocations.
- ``fittable()`` O(K); ``can_fit(C)`` O(1).
- ``claim(node, allocations)``: O(K' x (fit + log B)) where K' is the classes that fit the node
  before the claim (a claim never makes a class fit). On a single-provider node a class that
  fitted before needs no fit, only ``room``.
- ``release``, ``refresh``, ``add_node``, ``remove_node``: O(K x (fit + log B)).
- ``add_class(C)``: O(N x fit), once per class: the only scan, and classes are long-lived.
- ``writing``, ``sync_token``, ``digest``: O(1); ``refresh_if`` as ``refresh``; ``names(start,
  count)``: O(count) (plus the ids of removed nodes it skips).
- Memory: O(N x providers) for the views plus two machine integers per node and class.
Nothing per request depends on N.

Sharing providers
-----------------
The index holds one view of each sharing provider its nodes reach (:mod:`agents.sharing`),
not a copy per node. Nodes are ranked by their own room: a class the node takes from a
sharing provider does not count in its bucket key, and the sharing provider's free amount
is checked at :meth:`NodeIndex.pick` (one fit, as before), which answers None, keeping the
node, when the sharing provider has no room. A change of which sharing providers the nodes
reach (:meth:`NodeIndex.set_sharing`, an admin action) looks at every node again, as
``add_class`` does; a change of their usage costs nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from agents.buckets import Buckets
from agents.sharing import SharingPool
from qsched import exception
from qsched.flavors import Constraints, RequestGroup
from qsched.ledger.base import Provider
from qsched.scheduling.fit import Allocations, fit_request, room, shared_classes
from qsched.scheduling.request import NO_CONSTRAINTS, Refusal, Request
from qsched.scheduling.views import NodeView, ProviderView, usage_term

POLICIES = ("pack", "spread")


@dataclasses.dataclass(frozen=True)
class ClassChanges:
    """Classes that became fittable by some node, and classes that no node fits any more."""

    now_fittable: frozenset[str] = frozenset()
    now_unfittable: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.now_fittable or self.now_unfittable)


@dataclasses.dataclass(frozen=True)
class Pick:
    """A node chosen for a class, and the allocations that satisfy the class there."""

    node: str
    allocations: Allocations


class _Changes:
    """Transitions collected during one operation; each is told to the callback at once."""

    __slots__ = ("_callback", "fittable", "unfittable")

    def __init__(self, callback: Callable[[str, bool], None] | None) -> None:
        self._callback = callback
        self.fittable: set[str] = set()
        self.unfittable: set[str] = set()

    def note(self, name: str, fittable: bool) -> None:
        (self.fittable if fittable else self.unfittable).add(name)
        if self._callback is not None:
            self._callback(name, fittable)

    def result(self) -> ClassChanges:
        if not (self.fittable or self.unfittable):
            return _NO_CHANGES
        return ClassChanges(frozenset(self.fittable), frozenset(self.unfittable))


@dataclasses.dataclass
class _Class:
    name: str
    request: Request
    buckets: Buckets


class NodeIndex:
    """Nodes and scheduling classes of one agent; thread-safe.

    :param policy: ``pack`` (most-used node that fits) or ``spread`` (least-used).
    :param on_change: called as ``on_change(class_name, fittable)`` on every transition.
    :raises Invalid: an unknown policy.
    """

    def __init__(
        self,
        policy: str = "pack",
        on_change: Callable[[str, bool], None] | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise exception.Invalid(reason=f"policy {policy!r}: use one of {', '.join(POLICIES)}")
        self.policy = policy
        self._sign = 1 if policy == "pack" else -1
        self._on_change = on_change
        self._lock = threading.RLock()
        self._ids: dict[str, int] = {}
        self._views: list[NodeView | None] = []
        self._free_ids: list[int] = []
        self._classes: dict[str, _Class] = {}
        self._capacity: Counter[str] = Counter()  # over all nodes, kept as views change
        self._used: Counter[str] = Counter()
        self._version = array("q")  # per node id: bumped on every change of its view
        self._writing = array("q")  # per node id: ledger writes of the agent in flight
        self._digest = 0
        self._sharing = SharingPool()
        self._root_aggregates: Counter[str] = Counter()  # over every node's root

    # -- nodes ---------------------------------------------------------------------------

    def add_node(self, view: NodeView) -> ClassChanges:
        """Add a node, or replace the whole view of a node already known (same name)."""
        with self._lock:
            nid = self._ids.get(view.name)
            if nid is None:
                nid = self._new_id(view.name)
            self._set_view(nid, view)
            return self._reindex(nid, view, self._classes.values(), fitted_before=False)

    def remove_node(self, name: str) -> ClassChanges:
        """Forget a node. :raises NotFound: an unknown node."""
        with self._lock:
            nid = self._id(name)
            changes = _Changes(self._on_change)
            for entry in self._classes.values():
                self._move(entry, nid, 0, changes)
            del self._ids[name]
            self._account(self._views[nid], -1)
            self._views[nid] = None
            self._free_ids.append(nid)
            return changes.result()

    def node(self, name: str) -> NodeView:
        """The current view of one node. :raises NotFound:"""
        with self._lock:
            view = self._views[self._id(name)]
            assert view is not None
            return view

    def names(self, start: int = 0, count: int | None = None) -> tuple[list[str], int]:
        """Up to ``count`` node names from position ``start`` on, and where to go on from.

        Positions wrap around, so repeated calls walk every node in turn.
        """
        with self._lock:
            size = len(self._views)
            wanted = len(self._ids) if count is None else min(count, len(self._ids))
            found: list[str] = []
            position = start % size if size else 0
            for _ in range(size):
                if len(found) >= wanted:
                    break
                view = self._views[position]
                if view is not None:
                    found.append(view.name)
                position = (position + 1) % size
            return found, position

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, name: object) -> bool:
        return name in self._ids

    # -- classes -------------------------------------------------------------------------

    def add_class(
        self,
        name: str,
        groups: Sequence[RequestGroup],
        constraints: Constraints = NO_CONSTRAINTS,
        *,
        isolate: bool = False,
    ) -> ClassChanges:
        """Know a scheduling class (replacing one of the same name); scans the nodes once."""
        return self.add_request(name, Request(tuple(groups), constraints, isolate))

    def add_request(self, name: str, request: Request) -> ClassChanges:
        """Like :meth:`add_class` with a compiled request."""
        with self._lock:
            old = self._classes.get(name)
            if old is not None and old.request == request:
                return ClassChanges()
            was_fittable = old is not None and old.buckets.size > 0
            entry = _Class(name, request, Buckets(len(self._views)))
            self._classes[name] = entry
            for nid, view in enumerate(self._views):
                if view is not None:
                    entry.buckets.set(nid, self._key(view, request, fitted_before=False))
            changes = _Changes(self._on_change)
            if was_fittable != (entry.buckets.size > 0):
                changes.note(name, not was_fittable)
            return changes.result()

    def remove_class(self, name: str) -> ClassChanges:
        """Forget a class; reported unfittable if some node fitted it. No-op if unknown."""
        with self._lock:
            entry = self._classes.pop(name, None)
            changes = _Changes(self._on_change)
            if entry is not None and entry.buckets.size:
                changes.note(name, False)
            return changes.result()

    def classes(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._classes)

    def request(self, name: str) -> Request:
        """The compiled request of a class. :raises NotFound:"""
        with self._lock:
            return self._class(name).request

    # -- queries -------------------------------------------------------------------------

    def fittable(self) -> frozenset[str]:
        """The classes at least one node fits now (what to consume). O(K)."""
        with self._lock:
            return frozenset(name for name, e in self._classes.items() if e.buckets.size)

    def can_fit(self, name: str) -> bool:
        """Whether some node fits class ``name`` now; False for an unknown class."""
        with self._lock:
            entry = self._classes.get(name)
            return entry is not None and entry.buckets.size > 0

    def pick(self, name: str) -> Pick | None:
        """A node for class ``name`` by the policy, with its allocations; None if none fits.

        Nothing is held: call :meth:`claim` with the allocations to account for them.
        :raises NotFound: an unknown class.
        """
        with self._lock:
            entry = self._class(name)
            while (nid := entry.buckets.first()) is not None:
                view = self._views[nid]
                assert view is not None
                result = fit_request(view, entry.request, self._sharing.views)
                if not isinstance(result, Refusal):
                    return Pick(view.name, result)
                if result.provider in self._sharing:
                    return None  # the sharing provider is short: the node keeps its place
                # only if a view was mutated behind the index's back: drop the node, go on
                self._move(entry, nid, 0, _Changes(self._on_change))
            return None

    # -- updates -------------------------------------------------------------------------

    def claim(self, node: str, allocations: Mapping[str, Mapping[str, int]]) -> ClassChanges:
        """Add allocations to a node's usages (after a claim, or to hold a pick).

        :raises NotFound: an unknown node.
        :raises ProviderNotFound: an allocation outside the node.
        """
        with self._lock:
            nid = self._id(node)
            own, shared = self._split(allocations)
            view = self._set_view(nid, self._view(nid).adjusted(own, 1))
            self._sharing.adjust_all(shared, 1)
            fitting = [e for e in self._classes.values() if e.buckets.key(nid)]
            return self._reindex(nid, view, fitting, fitted_before=True)

    def release(self, node: str, allocations: Mapping[str, Mapping[str, int]]) -> ClassChanges:
        """Take allocations off a node's usages (never below zero). Raises as :meth:`claim`."""
        with self._lock:
            nid = self._id(node)
            own, shared = self._split(allocations)
            view = self._set_view(nid, self._view(nid).adjusted(own, -1))
            self._sharing.adjust_all(shared, -1)
            return self._reindex(nid, view, self._classes.values(), fitted_before=None)

    # -- sharing providers ---------------------------------------------------------------

    def set_sharing(self, providers: Mapping[str, Provider]) -> ClassChanges:
        """Replace the views of the sharing providers the nodes reach, as read from the
        ledger (:meth:`~qsched.ledger.base.Ledger.sharing_providers`). A view older than
        the index's is kept. O(sharing providers), plus O(N x K x fit) when which
        providers, or their inventories, traits or aggregates, changed."""
        with self._lock:
            if not self._sharing.load(providers):
                return _NO_CHANGES
            return self._reindex_all()

    def _reindex_all(self) -> ClassChanges:
        """Every node and class again: O(N x K x fit), after the sharing providers changed."""
        changes = _Changes(self._on_change)
        for nid, view in enumerate(self._views):
            if view is not None:
                for entry in self._classes.values():
                    key = self._key(view, entry.request, fitted_before=False)
                    self._move(entry, nid, key, changes)
        return changes.result()

    def sharing(self) -> tuple[ProviderView, ...]:
        """The views of the sharing providers, by name."""
        with self._lock:
            return self._sharing.views

    def shared_generations(self, allocations: Mapping[str, object]) -> dict[str, int]:
        """The generations the index read of the sharing providers in ``allocations``:
        what a claim passes, so that it conflicts when they are stale."""
        with self._lock:
            return self._sharing.generations(allocations)

    def generations(self, node: str, allocations: Mapping[str, object]) -> dict[str, int]:
        """The generations the index holds of every provider ``allocations`` names: the
        node's own (root, children) and the sharing providers'. What a claim passes, so
        that it conflicts on any view another writer made stale, as Placement checks
        every provider an allocation writes. O(providers of the node's tree).

        :raises NotFound: an unknown node.
        """
        with self._lock:
            found = self._sharing.generations(allocations)
            for provider in self._view(self._id(node)).providers:
                if provider.uuid in allocations and provider.generation is not None:
                    found[provider.uuid] = provider.generation
            return found

    def reread(self, node: str, provider: Provider) -> ClassChanges:
        """Take ``provider``, re-read after a claim on ``node`` met a generation conflict
        on it, as the index's view: one of the node's providers (as :meth:`refresh`) or
        a sharing provider (O(1), or as :meth:`set_sharing` if its shape changed).

        :raises NotFound: an unknown node. :raises ProviderNotFound: neither.
        """
        with self._lock:
            if provider.uuid in self._sharing:
                return self._reindex_all() if self._sharing.replace(provider) else _NO_CHANGES
            return self.refresh(node, [ProviderView.from_provider(provider)])

    def root_aggregates(self) -> frozenset[str]:
        """The aggregates of every node's root: where sharing providers may be. O(them)."""
        with self._lock:
            return frozenset(a for a, n in self._root_aggregates.items() if n > 0)

    def fit(self, node: str, name: str) -> Allocations | Refusal:
        """Fit class ``name`` on ``node`` now, sharing providers included (to say why not).

        :raises NotFound: an unknown node or class.
        """
        with self._lock:
            return fit_request(self.node(node), self._class(name).request, self._sharing.views)

    def _split(
        self, allocations: Mapping[str, Mapping[str, int]]
    ) -> tuple[Mapping[str, Mapping[str, int]], dict[str, Mapping[str, int]]]:
        """``allocations`` on the node's own providers, and those on sharing providers."""
        shared = {u: a for u, a in allocations.items() if u in self._sharing}
        if not shared:
            return allocations, shared
        return {u: a for u, a in allocations.items() if u not in shared}, shared

    @contextlib.contextmanager
    def writing(self, node: str) -> Iterator[None]:
        """Wrap a ledger write of the agent on ``node`` and the index change that follows.

        A refresh read before or during it is refused (see the module docstring).
        :raises NotFound: an unknown node.
        """
        with self._lock:
            nid = self._id(node)
            self._writing[nid] += 1
            self._version[nid] += 1
        try:
            yield
        finally:
            with self._lock:
                self._writing[nid] -= 1
                self._version[nid] += 1

    def sync_token(self, node: str) -> int | None:
        """Take before reading ``node`` from the ledger; None while a write is in flight."""
        with self._lock:
            nid = self._ids.get(node)
            if nid is None or self._writing[nid]:
                return None
            return self._version[nid]

    def refresh_if(
        self, node: str, providers: Iterable[ProviderView], token: int | None
    ) -> ClassChanges | None:
        """:meth:`refresh` unless the node changed since ``token`` was taken; None then."""
        with self._lock:
            nid = self._ids.get(node)
            if token is None or nid is None or self._version[nid] != token:
                return None
            return self.refresh(node, providers)

    def digest(self) -> str:
        """Every node's usage digest (:func:`qsched.scheduling.views.usage_term`), in hex."""
        with self._lock:
            return f"{self._digest:016x}"

    def refresh(self, node: str, providers: Iterable[ProviderView]) -> ClassChanges:
        """Replace some providers of a node with fresher views, e.g. read after a conflict.

        Use :meth:`ProviderView.from_provider` on what the ledger returned.
        :raises NotFound: an unknown node. :raises ProviderNotFound: a provider not in it.
        """
        with self._lock:
            nid = self._id(node)
            view = self._set_view(nid, self._view(nid).replaced(providers))
            return self._reindex(nid, view, self._classes.values(), fitted_before=False)

    # -- internals -----------------------------------------------------------------------

    def _new_id(self, name: str) -> int:
        if self._free_ids:
            nid = self._free_ids.pop()
        else:
            nid = len(self._views)
            self._views.append(None)
            self._version.append(0)
            self._writing.append(0)
            for entry in self._classes.values():
                entry.buckets.grow(nid + 1)
        self._ids[name] = nid
        return nid

    def _id(self, name: str) -> int:
        nid = self._ids.get(name)
        if nid is None:
            raise exception.NotFound(what=f"node {name!r} in this agent")
        return nid

    def _view(self, nid: int) -> NodeView:
        view = self._views[nid]
        assert view is not None
        return view

    def _set_view(self, nid: int, view: NodeView) -> NodeView:
        self._account(self._views[nid], -1)
        self._views[nid] = view
        self._account(view, 1)
        self._version[nid] += 1
        return view

    def _account(self, view: NodeView | None, sign: int) -> None:
        if view is None:
            return
        for aggregate in view.providers[0].aggregates:
            self._root_aggregates[aggregate] += sign
        for provider in view.providers:
            for rc, inventory in provider.inventories.items():
                used = provider.usages.get(rc, 0)
                self._capacity[rc] += sign * inventory.capacity
                self._used[rc] += sign * used
                if used:
                    self._digest ^= usage_term(provider.uuid, rc, used)

    def totals(self) -> dict[str, tuple[int, int]]:
        """(used, capacity) per resource class over every node: O(classes), kept up to date."""
        with self._lock:
            return {rc: (self._used[rc], self._capacity[rc]) for rc in sorted(self._capacity)}

    def _class(self, name: str) -> _Class:
        entry = self._classes.get(name)
        if entry is None:
            raise exception.NotFound(what=f"scheduling class {name!r} in this agent")
        return entry

    def _key(self, view: NodeView, request: Request, fitted_before: bool | None) -> int:
        """The bucket key of a node for a class: 0 if it does not fit.

        ``fitted_before``: True if the class fitted the node before a usage change (then,
        on a single-provider node, only room can have changed); None: look it up.
        """
        sharing = self._sharing.views
        shared = shared_classes(view, request, sharing) if sharing else _NOTHING_SHARED
        copies = room(view, request, shared)
        if not copies:
            return 0
        known = fitted_before and len(view.providers) == 1
        if not known and isinstance(
            fit_request(view, request, sharing, shared_room=False), Refusal
        ):
            return 0
        return self._sign * copies

    def _reindex(
        self, nid: int, view: NodeView, entries: Iterable[_Class], fitted_before: bool | None
    ) -> ClassChanges:
        changes = _Changes(self._on_change)
        for entry in list(entries):
            before = fitted_before
            if before is None:
                before = entry.buckets.key(nid) != 0
            self._move(entry, nid, self._key(view, entry.request, before), changes)
        return changes.result()

    @staticmethod
    def _move(entry: _Class, nid: int, key: int, changes: _Changes) -> None:
        was_fittable = entry.buckets.size > 0
        entry.buckets.set(nid, key)
        if was_fittable != (entry.buckets.size > 0):
            changes.note(entry.name, not was_fittable)


_NO_CHANGES = ClassChanges()
_NOTHING_SHARED: frozenset[str] = frozenset()
