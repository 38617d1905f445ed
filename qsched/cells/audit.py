"""The audit of a deployment of cells (an admin scan of every keyspace).

The API keyspace's quota against the cells' instances, the server group mappings
against the cells' groups, and each aggregate's copies (the same in every cell, each
with that cell's hosts only).
"""

from __future__ import annotations

import logging
from typing import Any

from qsched import exception
from qsched.aggregates import Aggregate
from qsched.cells.router import CellsCompute, has_host

LOG = logging.getLogger(__name__)


def audit_cells(front: CellsCompute) -> dict[str, Any]:
    """The API keyspace's quota against the cells', once the mover ran and no boot is
    on its way (an admin scan of every keyspace): every holder of the API's quota is
    held by the cell its mapping names, for the same amounts, and every holder of a
    cell's quota by the API's; no release waits in a cell and no boot is pending. Every
    server group is in the cell its mapping names and counted there; every aggregate
    is in every cell alike, each copy with hosts of its cell only
    (:func:`_aggregate_problems`).

    ``ok`` and what was found: ``problems`` (the first 20), ``ends_waiting``,
    ``pending``, ``groups_pending``.
    """
    problems: list[str] = []
    held_by_cells: dict[tuple[str, str], tuple[str, Any]] = {}
    waiting = 0
    for name, compute in front.cells.items():
        for project, holders in compute.stores.inspector.quota_held().items():
            for holder, usage in holders.items():
                held_by_cells[(project, holder)] = (name, usage)
        waiting += front.maps[name].ends_waiting()
    for project, holders in front.api.inspector.quota_held().items():
        for holder, usage in holders.items():
            found = held_by_cells.pop((project, holder), None)
            if found is None:
                problems.append(f"{holder} ({project}): held by the API, by no cell")
                continue
            cell, amounts = found
            try:
                mapped = front.cell_of(holder)
            except exception.InstanceNotFound:
                mapped = None
            if mapped != cell:
                problems.append(f"{holder} ({project}): held in {cell}, mapped to {mapped}")
            if amounts != usage:
                problems.append(f"{holder} ({project}): {usage} in the API, {amounts} in {cell}")
    for (project, holder), (cell, _usage) in held_by_cells.items():
        problems.append(f"{holder} ({project}): held by {cell}, not by the API")
    problems += _group_problems(front)
    problems += _aggregate_problems(front)
    pending = front.map.pending_count()
    groups_pending = front.map.groups_pending_count()
    return {"ok": not problems and not waiting and not pending and not groups_pending,
            "problems": problems[:20], "ends_waiting": waiting, "pending": pending,
            "groups_pending": groups_pending}  # fmt: skip


def _group_problems(front: CellsCompute) -> list[str]:
    """Every server group is mapped to the cell that holds it, for its project, and
    counted there; every mapping's group is in its cell (an admin scan)."""
    problems: list[str] = []
    mapped = front.map.group_mappings()
    counted: dict[str, set[str]] = {}  # project: its counted groups, read once
    for name, compute in front.cells.items():
        for group in compute.stores.groups.list_all():
            project = group.project_id
            found = mapped.pop(group.uuid, None)
            if found != (name, project):
                problems.append(f"group {group.uuid} ({project}): in {name}, "
                                f"mapped to {found}")  # fmt: skip
                continue
            if project not in counted:
                counted[project] = front.map.counted_groups(project)
            if group.uuid not in counted[project]:
                problems.append(f"group {group.uuid} ({project}): not counted")
    for uuid, (cell, project) in mapped.items():
        problems.append(f"group {uuid} ({project}): mapped to {cell}, in no cell")
    return problems


def _aggregate_problems(front: CellsCompute) -> list[str]:
    """Every aggregate is in every cell with the same uuid, name and metadata, and each
    cell's copy holds hosts of that cell only, as their host mappings say (an admin
    scan: O(cells x aggregates))."""
    problems: list[str] = []
    copies: dict[int, dict[str, Aggregate]] = {}
    for name, compute in front.cells.items():
        for found in compute.aggregates.store.list():
            copies.setdefault(found.id, {})[name] = found
            for host in sorted(found.hosts):
                mapped = front.map.host_cell(host)
                if mapped not in (None, name) or not has_host(compute, host):
                    problems.append(f"aggregate {found.id}: host {host} in {name}'s copy, "
                                    f"mapped to {mapped}")  # fmt: skip
    for aggregate_id, in_cells in sorted(copies.items()):
        missing = sorted(set(front.cells) - set(in_cells))
        if missing:
            problems.append(f"aggregate {aggregate_id}: not in {', '.join(missing)}")
        shapes = {(a.uuid, a.name, tuple(sorted(a.metadata.items()))) for a in in_cells.values()}
        if len(shapes) > 1:
            problems.append(f"aggregate {aggregate_id}: the cells' copies differ: {shapes}")
    return problems
