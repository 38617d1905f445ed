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
  (:meth:`qsched.compute.boot.Boot._members_limit`), which checks it against the
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

from collections.abc import Callable
from typing import TYPE_CHECKING

from qsched import exception
from qsched.context import RequestContext
from qsched.ledger.base import ServerGroup
from qsched.ledger.cellmap import RedisCellMap
from qsched.resources import VCPU

if TYPE_CHECKING:
    from collections.abc import Mapping

    from qsched.compute.cell import Cell

#: what a group's cell is drawn by: its members' flavors are not known at its creation
GROUP_DEMAND = {VCPU: 1}


class GroupMappings:
    """The server groups of :class:`~qsched.cells.router.CellsCompute` (see the module
    docstring), which holds the cells and the mappings."""

    cells: dict[str, Cell]
    map: RedisCellMap

    if TYPE_CHECKING:  # the other parts of CellsCompute

        def draw(self, demand: Mapping[str, int], among: set[str] | None = None) -> str: ...

    def group_mapping(self, uuid: str) -> tuple[str, str]:
        """A group's cell and project (its mapping: one read).

        :raises GroupNotFound: no mapping, or one to a cell not configured.
        """
        found = self.map.group_mapping(uuid)
        if found is None or found[0] not in self.cells:
            raise exception.GroupNotFound(group=uuid)
        return found

    def group_cell(self, uuid: str) -> Cell:
        """The cell of a group (its mapping: one read).

        :raises GroupNotFound: no mapping.
        """
        return self.cells[self.group_mapping(uuid)[0]]

    def new_group(self, group: ServerGroup, create: Callable[[Cell], ServerGroup]) -> ServerGroup:
        """``create`` the group in a cell drawn for it, mapped (and counted) first,
        pending, and confirmed once the cell wrote it.

        :raises ServerGroupLimitExceeded: the project holds its ``server_groups`` in
            every cell together (403); nothing is held.
        :raises BackendUnavailable: the API keyspace or the cell did not answer (503);
            a group left pending is settled by the janitor's mover.
        """
        cell = self.draw(GROUP_DEMAND)
        self.map.map_group(group.uuid, cell, group.project_id)
        try:
            made = create(self.cells[cell])
        except exception.BackendUnavailable:
            raise  # the create may have run: the mover settles it from the cell
        except Exception:
            self.map.unmap_group(group.uuid, group.project_id)
            raise
        self.map.confirm_groups([group.uuid])
        return made

    def group_gone(self, context: RequestContext, uuid: str, found: bool) -> None:
        """After a delete in the group's cell: its mapping and count dropped. A group
        its cell no longer had (``found`` False), whose mapping is not pending, was
        deleted by a call cut short: its mapping and count are dropped too, when the
        caller may see it."""
        mapped = self.map.group_mapping(uuid)
        if mapped is None:
            return
        project = mapped[1]
        if found or (
            (context.is_admin or project == context.project_id)
            and not (self.map.group_pending(uuid))
        ):
            self.map.unmap_group(uuid, project)
