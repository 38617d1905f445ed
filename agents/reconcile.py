"""What a (re)starting agent does before it consumes: make the ledger match its nodes.

* Instances it had claimed but not made ACTIVE (it died in between): ACTIVE if
  the driver runs them, otherwise their claim is released and their request
  published again.
* Allocations on its nodes that no live instance of this host explains (a record
  gone, ended, or placed elsewhere): reported, and released unless
  ``[agent] release_leaked_allocations`` is off.
* ACTIVE instances of this host that the driver does not run: reported only; a
  hypervisor that lost a VM needs an operator, not a silent release.

It reads the consumers of its own providers only: O(its nodes), once at start, in
pipelined batches (a thousand reads per round trip).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from agents.views import NodeView
from agents.virt.base import VirtDriver
from qsched import exception
from qsched.bus.base import Bus
from qsched.janitor import requeue_orphan
from qsched.ledger import Stores
from qsched.ledger.base import Instance, State

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class ReconcileReport:
    activated: list[str] = dataclasses.field(default_factory=list)
    requeued: list[str] = dataclasses.field(default_factory=list)
    leaked: list[str] = dataclasses.field(default_factory=list)
    released: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    touched_nodes: set[str] = dataclasses.field(default_factory=set)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"touched_nodes": sorted(self.touched_nodes)}


def reconcile(
    stores: Stores,
    bus: Bus,
    driver: VirtDriver,
    host: str,
    views: Iterable[NodeView],
    release_leaked: bool = True,
) -> ReconcileReport:
    """Bring the ledger in line with what ``host`` runs; see the module docstring."""
    report = ReconcileReport()
    views = list(views)
    _finish_builds(stores, bus, driver, host, report)
    held = _Held.read(stores, views)
    _check_allocations(stores, host, views, held, release_leaked, report)
    _check_active(driver, host, views, held, report)
    if report.requeued or report.activated or report.leaked or report.missing:
        LOG.warning(
            "agent %s reconciled: %d builds made ACTIVE, %d requeued; %d leaked allocations "
            "(%d released); %d ACTIVE instances the driver does not run",
            host, len(report.activated), len(report.requeued), len(report.leaked),
            len(report.released), len(report.missing),
        )  # fmt: skip
    return report


def _finish_builds(
    stores: Stores, bus: Bus, driver: VirtDriver, host: str, report: ReconcileReport
) -> None:
    for uuid in sorted(stores.instances.building(host)):
        inst = stores.instances.get(uuid)
        node = inst.node or ""
        if inst.state == State.BUILD and node and uuid in _running(driver, node):
            stores.instances.set_active(uuid, host, node)
            report.activated.append(uuid)
        elif requeue_orphan(stores, bus, uuid, host, f"agent {host} restarted before it"
                            " finished the build"):  # fmt: skip
            report.requeued.append(uuid)
            report.touched_nodes.add(node)


@dataclasses.dataclass(frozen=True)
class _Held:
    """The consumers on each of the agent's providers, and the records of those consumers."""

    consumers: dict[str, set[str]]
    instances: dict[str, Instance]

    @classmethod
    def read(cls, stores: Stores, views: list[NodeView]) -> _Held:
        consumers = stores.ledger.providers_consumers([p.uuid for v in views for p in v.providers])
        uuids = sorted(set().union(*consumers.values()))
        return cls(consumers, stores.instances.get_many(uuids))


def _check_allocations(
    stores: Stores,
    host: str,
    views: list[NodeView],
    held: _Held,
    release: bool,
    report: ReconcileReport,
) -> None:
    for view in views:
        for provider in view.providers:
            for consumer in sorted(held.consumers[provider.uuid]):
                if _explained(held.instances.get(consumer), host):
                    continue
                report.leaked.append(consumer)
                if release and _release(stores, consumer):
                    report.released.append(consumer)
                    report.touched_nodes.add(view.name)


def _explained(inst: Instance | None, host: str) -> bool:
    return inst is not None and inst.state in (State.BUILD, State.ACTIVE) and inst.host == host


def _release(stores: Stores, consumer: str) -> bool:
    held = stores.ledger.get_allocations(consumer)
    if held.generation is None:
        return False
    try:
        stores.ledger.put_allocations(
            consumer, {}, held.generation, held.project_id or "", held.user_id or ""
        )
    except exception.ConsumerGenerationConflict:
        return False  # it changed under us: someone is using it after all
    return True


def _check_active(
    driver: VirtDriver, host: str, views: list[NodeView], held: _Held, report: ReconcileReport
) -> None:
    for view in views:
        running = set(_running(driver, view.name))
        for consumer in sorted(held.consumers[view.root.uuid]):
            inst = held.instances.get(consumer)
            active_here = inst is not None and (inst.state, inst.host) == (State.ACTIVE, host)
            if active_here and consumer not in running:
                report.missing.append(consumer)


def _running(driver: VirtDriver, node: str) -> list[str]:
    try:
        return driver.list_instances(node)
    except exception.NotFound:
        return []
