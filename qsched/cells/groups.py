"""Server groups over several cells (docs/scale.rst, "Serving it over HTTP").

A group lives in one cell: its policy is kept by that cell's claim scripts, in the
step that takes the resources, and every member of it boots there. Its cell is drawn
at its creation as a boot's is (:meth:`CellsCompute.draw`, by free VCPU: its members'
flavors are not known yet; Nova's create names no zone) and recorded in the API
keyspace as a **group mapping** (``group-map:<uuid>``: cell and project), which show,
delete and a boot's ``group`` hint read (one read). A list merges every cell's groups
(O(cells)).

Quota, so that a project's limits hold across cells (invariant 3):

* ``server_groups`` is counted in the API keyspace: the script that writes the
  mapping (``group_map``) checks the project's mapped groups against the
  deployment's limit and adds the new one in the same step, so two creates racing in
  two cells cannot both pass the last place. A joined cell counts no group
  (:data:`qsched.cells.join.CELL_UNLIMITED`).
* ``server_group_members`` is counted by the group's cell: every member is there, so
  its count of the group's members is the group's. The limit is the deployment's,
  read from the API keyspace and given to the cell's create script as final
  (:meth:`qsched.compute.api.ComputeAPI._members_limit`), which checks it against the
  members in the step that records the server.

A create maps (and counts) the group first, pending, then has the cell write it,
then confirms it. A cell that refuses it gives its count back; one that does not
answer leaves it pending (503), and the janitor's mover settles it past its grace:
kept if the cell has it, else abandoned there (a create arriving late refuses) and
its mapping and count dropped. A delete removes the group from its cell, then its
mapping and count; a delete that a cell finds already done (an earlier delete cut
short after the cell's step) drops them too.
"""

from __future__ import annotations

import builtins
import heapq
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from qsched import exception
from qsched.compute.api import ComputeAPI
from qsched.compute.server_groups import GroupRefNotFound, ServerGroups
from qsched.context import RequestContext
from qsched.ledger.base import ServerGroup
from qsched.resources import VCPU

if TYPE_CHECKING:
    from qsched.cells.router import CellsCompute

#: what a group's cell is drawn by: its members' flavors are not known at its creation
GROUP_DEMAND = {VCPU: 1}


class CellsGroups:
    """The server groups of several cells with the surface of
    :class:`~qsched.compute.server_groups.ServerGroups` that :mod:`qsched.api` uses (see the
    module docstring). ``front``: the cells."""

    def __init__(self, front: CellsCompute) -> None:
        self.front = front

    @property
    def checker(self) -> ServerGroups:
        """Where a create's caller and request are checked (every cell has the same rules)."""
        return self.front.flavor_cell.groups

    def create(
        self,
        context: RequestContext,
        name: str,
        policy: str,
        rules_: Mapping[str, int] | None = None,
    ) -> ServerGroup:
        """A new group of the caller's project, in a cell drawn for it.

        :raises Forbidden, RulesNeedAntiAffinity, Invalid: as
            :meth:`ServerGroups.create`; nothing is held.
        :raises ServerGroupLimitExceeded: the project holds its ``server_groups`` in
            every cell together (403); nothing is held.
        :raises BackendUnavailable: the API keyspace or the cell did not answer (503);
            a group left pending is settled by the janitor's mover.
        """
        group = self.checker.checked(context, name, policy, rules_)
        cell = self.front.draw(GROUP_DEMAND)
        self.front.map.map_group(group.uuid, cell, group.project_id)
        try:
            made = self.front.cells[cell].stores.groups.create(group)
        except exception.BackendUnavailable:
            raise  # the create may have run: the mover settles it from the cell
        except Exception:
            self.front.map.unmap_group(group.uuid, group.project_id)
            raise
        self.front.map.confirm_groups([group.uuid])
        return made

    def get(self, context: RequestContext, uuid: str) -> ServerGroup:
        """As :meth:`ServerGroups.get`, in the group's cell (its mapping: one read).

        :raises GroupNotFound: no mapping, or as :meth:`ServerGroups.get` (404).
        """
        return self._cell(uuid).groups.get(context, uuid)

    def list(
        self,
        context: RequestContext,
        all_projects: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> builtins.list[ServerGroup]:
        """Every cell's groups as one cell lists them (oldest first, then by uuid), the
        page ``offset``, ``limit``: each cell lists its first ``offset + limit``, and the
        lists are merged (O(cells x (offset + limit)) beyond the cells' own reads).

        :raises Forbidden: as :meth:`ServerGroups.list`.
        """
        most = None if limit is None else offset + limit
        found = [compute.groups.list(context, all_projects, most) for compute in self._cells]
        merged = heapq.merge(*found, key=lambda group: (group.created_at, group.uuid))
        return builtins.list(itertools.islice(merged, offset, most))

    def delete(self, context: RequestContext, uuid: str) -> None:
        """As :meth:`ServerGroups.delete` in the group's cell, then its mapping and count
        dropped. A group its cell no longer has, whose mapping is not pending, was
        deleted by a call cut short: its mapping and count are dropped, and it is 404.

        :raises GroupNotFound, Forbidden: as :meth:`ServerGroups.delete`.
        """
        cell, project = self._mapping(uuid)
        try:
            self.front.cells[cell].groups.delete(context, uuid)
        except exception.GroupNotFound:
            if (context.is_admin or project == context.project_id) and not (
                self.front.map.group_pending(uuid)
            ):
                self.front.map.unmap_group(uuid, project)
            raise
        self.front.map.unmap_group(uuid, project)

    def cell_for_boot(self, uuid: str) -> str:
        """The cell of the group a boot's ``group`` hint names (one read); the cell's
        boot then checks that the caller may use it.

        :raises GroupRefNotFound: no such group (400), as one cell answers.
        """
        try:
            return self._mapping(uuid)[0]
        except exception.GroupNotFound:
            raise GroupRefNotFound(group=uuid) from None

    @property
    def _cells(self) -> builtins.list[ComputeAPI]:
        return builtins.list(self.front.cells.values())

    def _mapping(self, uuid: str) -> tuple[str, str]:
        found = self.front.map.group_mapping(uuid)
        if found is None or found[0] not in self.front.cells:
            raise exception.GroupNotFound(group=uuid)
        return found

    def _cell(self, uuid: str) -> ComputeAPI:
        return self.front.cells[self._mapping(uuid)[0]]
