"""What the live agents' nodes could take now, from the ledger's providers (an admin scan).

The ledger does not record which agent drives which provider. Nodes are named
``<host>-<n>`` (the fake driver's names, and the ``[agent] host`` help's
promise), so a root provider belongs to the agent whose host is its name less
the last ``-<digits>``; child providers go with their root. Whether a request
fits a node is decided by :func:`qsched.scheduling.fit.fit_request`, the agent's own
check, so this view and the agents cannot disagree on the rules.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.ledger.base import Provider
from qsched.resources import SHARES_VIA_AGGREGATE
from qsched.scheduling.fit import fit_request
from qsched.scheduling.request import Refusal, RefusalKind, Request
from qsched.scheduling.views import NodeView, ProviderView

STANDARD = ("VCPU", "MEMORY_MB", "DISK_GB")

#: Refusals that depend on usage: the request may fit once something is released.
USAGE_KINDS = frozenset({RefusalKind.CAPACITY, RefusalKind.COMBINATION})


def host_of(node_name: str) -> str | None:
    """The agent host of a node named ``<host>-<digits>``; None for other names."""
    host, sep, index = node_name.rpartition("-")
    return host if sep and host and index.isdigit() else None


def nodes_by_host(
    providers: Iterable[Provider], zones: Mapping[str, str | None] | None = None
) -> dict[str, list[NodeView]]:
    """Provider trees grouped by the host driving them, nodes sorted by name.

    ``zones`` gives the availability zone of a host's nodes when it is known.
    Trees that do not check (a child without its parent, say) are left out.
    """
    trees: defaultdict[str, list[Provider]] = defaultdict(list)
    for p in providers:
        trees[p.root_uuid or p.uuid].append(p)
    by_host: defaultdict[str, list[NodeView]] = defaultdict(list)
    for root_uuid, members in trees.items():
        ordered = _tree_order(root_uuid, members)
        host = host_of(ordered[0].name) if ordered else None
        if host is None or SHARES_VIA_AGGREGATE in ordered[0].traits:
            continue  # a sharing provider is no host's node, whatever its name
        zone = (zones or {}).get(host)
        try:
            views = tuple(ProviderView.from_provider(p) for p in ordered)
            by_host[host].append(NodeView(ordered[0].name, views, zone))
        except exception.Invalid:
            continue
    return {host: sorted(nodes, key=lambda n: n.name) for host, nodes in by_host.items()}


def _tree_order(root_uuid: str, members: list[Provider]) -> list[Provider]:
    """Root first, every parent before its children."""
    children: defaultdict[str | None, list[Provider]] = defaultdict(list)
    for p in members:
        children[p.parent_uuid].append(p)
    ordered = [p for p in members if p.uuid == root_uuid and p.parent_uuid is None]
    for p in ordered:  # grows while it is walked: a breadth-first walk
        ordered.extend(sorted(children[p.uuid], key=lambda c: c.name))
    return ordered


@dataclasses.dataclass(frozen=True)
class Free:
    """The most of one resource class free on one provider."""

    amount: int
    provider: str  # its name

    def to_dict(self) -> dict[str, Any]:
        return {"amount": self.amount, "provider": self.provider}


def largest_free(nodes: Iterable[NodeView]) -> dict[str, Free]:
    """Per resource class, the provider with the most free (capacity minus usage)."""
    best: dict[str, Free] = {}
    for node in nodes:
        for p in node.providers:
            for rc in p.inventories:
                amount = max(p.free(rc), 0)
                if rc not in best or amount > best[rc].amount:
                    best[rc] = Free(amount, p.name)
    return dict(sorted(best.items(), key=lambda item: class_order(item[0])))


def class_order(rc: str) -> tuple[int, str]:
    """Sort key: VCPU, MEMORY_MB, DISK_GB first, then the others by name."""
    return (STANDARD.index(rc) if rc in STANDARD else len(STANDARD), rc)


def total_free(nodes: Iterable[NodeView]) -> dict[str, int]:
    """Per resource class, what all providers have free together."""
    total: defaultdict[str, int] = defaultdict(int)
    for node in nodes:
        for p in node.providers:
            for rc in p.inventories:
                total[rc] += max(p.free(rc), 0)
    return dict(sorted(total.items(), key=lambda item: class_order(item[0])))


@dataclasses.dataclass
class FitReport:
    """Which live nodes fit a request now, and why the others do not."""

    nodes: int
    demand: dict[str, int]
    fitting: list[str]
    refusals: dict[RefusalKind, list[Refusal]]
    largest: dict[str, Free]
    zone_checked: bool = True

    def short(self) -> list[dict[str, Any]]:
        """Resource classes no single provider has enough of, with the largest free."""
        found = []
        for rc, needed in self.demand.items():
            free = self.largest.get(rc)
            if free is None or free.amount < needed:
                found.append({"resource_class": rc, "needed": needed,
                              "largest_free": free.to_dict() if free else None})  # fmt: skip
        return found

    def explain(self) -> str:
        """Why no node fits, in plain words (only meaningful when ``fitting`` is empty).

        First what no single provider has enough of, with the largest free; then
        the other reasons nodes gave, each with how many nodes gave it.
        """
        if not self.nodes:
            return "no live agent drives any node"
        parts = [_short_text(item) for item in self.short()]
        usage = [r for k in USAGE_KINDS for r in self.refusals.get(k, [])]
        if usage and not parts:
            wanted = ", ".join(f"{n} {rc}" for rc, n in self.demand.items())
            parts.append(f"no node has {wanted} free at once (e.g. {usage[0].reason})")
        for kind, refusals in self.refusals.items():
            if kind not in USAGE_KINDS:
                parts.append(f"{refusals[0].reason} ({len(refusals)} of {self.nodes} nodes)")
        if self.refusals and not usage:
            parts.append("no live node could take it even empty: add nodes that can, or change it")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "demand": dict(self.demand),
            "fitting_nodes": len(self.fitting),
            "fitting_sample": self.fitting[:5],
            "refusals": {
                k.value: {"nodes": len(v), "sample": v[0].reason} for k, v in self.refusals.items()
            },
            "largest_free": {rc: f.to_dict() for rc, f in self.largest.items()},
            "short": self.short(),
            "zone_checked": self.zone_checked,
        }


def _short_text(item: Mapping[str, Any]) -> str:
    rc, needed, free = item["resource_class"], item["needed"], item["largest_free"]
    if free is None:
        return f"no node has {rc} inventory (needed: {needed} {rc})"
    return (
        f"no node has {needed} {rc} free "
        f"(largest free: {free['amount']} {rc} on {free['provider']})"
    )


def fit_report(
    nodes: Sequence[NodeView],
    request: Request,
    zone_checked: bool = True,
    sharing: Sequence[ProviderView] = (),
) -> FitReport:
    """Fit ``request`` on every node (with the ``sharing`` providers they reach): an
    O(nodes) scan, for admin views only."""
    fitting: list[str] = []
    refusals: defaultdict[RefusalKind, list[Refusal]] = defaultdict(list)
    for node in nodes:
        result = fit_request(node, request, sharing)
        if isinstance(result, Refusal):
            refusals[result.kind].append(result)
        else:
            fitting.append(node.name)
    return FitReport(
        nodes=len(nodes),
        demand=dict(request.demand),
        fitting=fitting,
        refusals=dict(refusals),
        # a sharing provider counts where the nodes lack the class (shared storage)
        largest=largest_free([*nodes, *(NodeView(p.name, (p,)) for p in sharing)]),
        zone_checked=zone_checked,
    )
