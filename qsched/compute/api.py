"""The front door's domain: :class:`ComputeAPI`, each Nova call written once and run in
the cell it targets.

No HTTP here: :mod:`qsched.api` parses requests, calls one method of
:class:`ComputeAPI` (what it calls is :class:`qsched.compute.front_door.FrontDoor`) and
maps its errors; a benchmark or the demo can call it straight. A call about one
server runs in the cell :meth:`~qsched.compute.target.Cells.of_instance` names (one
cell: that cell, with no read), a listing gathers over every cell, a boot goes into
the cell :meth:`~qsched.compute.target.Cells.boot_into` chooses; one cell is the case of
a single target (:class:`~qsched.compute.target.OneCell`), several cells are
:class:`qsched.cells.router.CellsCompute`. Every call does O(1) ledger work in one cell
except the project-scoped list and the admin's views and writes.

The class is read in parts, one module each: the list (:mod:`qsched.compute.listing`),
the flavor catalog (:mod:`qsched.compute.flavor_catalog`), the parts it holds
(keypairs, actions, hypervisors, services and zones: :mod:`qsched.compute.parts`; server
groups: :mod:`qsched.compute.server_groups`; aggregates: :mod:`qsched.compute.aggregates`);
a cell's own steps are :class:`qsched.compute.cell.Cell`'s.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.bus.base import Publisher
from qsched.compute import list_query as server_list
from qsched.compute.aggregates import Aggregates
from qsched.compute.boot import Reservation, check_counts, check_name
from qsched.compute.cell import Cell
from qsched.compute.flavor_catalog import FlavorCatalog
from qsched.compute.host_rules import HostRequest
from qsched.compute.listing import ServerListing
from qsched.compute.parts import Actions, Hypervisors, Keypairs, Migrations, Moves, Services, Zones
from qsched.compute.quotas import FileLimits, QuotaAPI
from qsched.compute.server_actions import record_delete
from qsched.compute.server_groups import Groups
from qsched.compute.target import BootHints, Cells, OneCell
from qsched.compute.zones import aggregate_zones
from qsched.conf import APIOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.images.base import ImageService
from qsched.ledger import Stores
from qsched.ledger.base import Instance, State
from qsched.metrics import APIMetrics
from qsched.notifications import NULL, Notifier
from qsched.policies import server_metadata as metadata_policy
from qsched.policies import servers as servers_policy
from qsched.policy import Policy
from qsched.scheduling.records import ServerFields, details, metadata_change, server_change

LOG = logging.getLogger(__name__)


class MetadataItemNotFound(exception.NotFound):
    msg_fmt = "Metadata item was not found"


class MetadataLimitExceeded(exception.Forbidden):
    """Over the project's ``metadata_items`` quota (403, Nova's words)."""

    msg_fmt = "Maximum number of metadata items exceeds {allowed}"


#: what an update may change of a server -> its name in the record's ServerFields
_UPDATABLE = {"description": "description", "access_ip_v4": "access_ipv4",
              "access_ip_v6": "access_ipv6", "disk_config": "disk_config"}  # fmt: skip


class ComputeAPI(ServerListing, FlavorCatalog):
    """Servers, flavors and the operators' views, over the cells of ``cells``.

    ``ComputeAPI(stores, bus, ...)`` serves one cell (the arguments of
    :class:`~qsched.compute.cell.Cell`); :meth:`over` serves several.
    """

    def __init__(
        self,
        stores: Stores,
        bus: Publisher,
        scheduler: SchedulerOptions | None = None,
        api: APIOptions | None = None,
        policy: Policy | None = None,
        images: ImageService | None = None,
        metrics: APIMetrics | None = None,
        notifier: Notifier = NULL,
    ) -> None:
        cell = Cell(stores, bus, scheduler, api, policy, images, metrics, notifier)
        self._serve(OneCell(cell), cell.quotas)

    @classmethod
    def over(cls, cells: Cells, quotas: QuotaAPI) -> ComputeAPI:
        """The front door of several ``cells``; ``quotas``: the deployment's (the API
        keyspace's), which every cell checks its limits in code against."""
        door = cls.__new__(cls)
        door._serve(cells, quotas)
        return door

    def _serve(self, cells: Cells, quotas: QuotaAPI) -> None:
        reader = cells.reader
        self.cells = cells
        self.policy = reader.policy
        self.api = reader.api
        self.max_limit: int = reader.max_limit  # most items one list call returns
        self.quotas = quotas
        self.keypairs = Keypairs(cells)
        self.actions = Actions(cells)
        self.moves = Moves(cells, self.get_flavor)
        self.migrations = Migrations(cells)
        self.hypervisors = Hypervisors(cells)
        self.services = Services(cells)
        self.zones = Zones(cells)
        self.groups = Groups(cells)
        self.aggregates = Aggregates(cells)

    @property
    def cell(self) -> Cell:
        """A one-cell front door's cell (over several: the first joined one, where what
        every cell holds alike is read first)."""
        return self.cells.reader

    # -- servers --

    def boot(
        self,
        context: RequestContext,
        name: str,
        flavor_ref: str | int,
        image_ref: str = "",
        availability_zone: str | None = None,
        metadata: Mapping[str, str] | None = None,
        group: str | None = None,
    ) -> Instance:
        """Accept one server; see :meth:`boot_many`, which raises the same."""
        found = self.boot_many(context, name, flavor_ref, image_ref, availability_zone,
                               metadata, group)  # fmt: skip
        return found.instances[0]

    def boot_many(
        self,
        context: RequestContext,
        name: str,
        flavor_ref: str | int,
        image_ref: str = "",
        availability_zone: str | None = None,
        metadata: Mapping[str, str] | None = None,
        group: str | None = None,
        min_count: int = 1,
        max_count: int = 1,
        server: ServerFields | None = None,
        hosts: HostRequest | None = None,
    ) -> Reservation:
        """Accept servers into the cell :meth:`~qsched.compute.target.Cells.boot_into`
        chooses: quota reserved, recorded BUILD, boot requests published. The arguments
        and errors are :meth:`qsched.compute.cell.Cell.accept`'s (the ``group`` hint, a
        multi-create's counts, the ``server`` fields, the ``hosts`` rules); over several
        cells also those of :meth:`qsched.cells.router.CellsCompute.boot_into`.
        """
        check_counts(min_count, max_count)

        def accept(cell: Cell, uuids: Sequence[str] | None, least: int, most: int) -> Reservation:
            return cell.accept(context, name, flavor_ref, image_ref, availability_zone,
                               metadata, group, least, most, server, hosts,
                               uuids)  # fmt: skip

        hints = BootHints(hosts, group, server.key_name if server is not None else None)
        return self.cells.boot_into(context, flavor_ref, availability_zone,
                                    (min_count, max_count), hints, accept)  # fmt: skip

    def get(self, context: RequestContext, uuid: str) -> Instance:
        """One server the caller may see; DELETED ones are not found, as in Nova.

        :raises InstanceNotFound: unknown, malformed uuid, deleted, or another
            project's and the caller is no admin.
        :raises Forbidden: ``os_compute_api:servers:show`` refuses the caller.
        """
        instance = self.cells.of_instance(uuid).visible(context, uuid)
        self.policy.authorize(context, servers_policy.SHOW, _target(instance))
        return instance

    def update(self, context: RequestContext, uuid: str, changes: Mapping[str, Any]) -> Instance:
        """Change what a client may change of a server (``os_compute_api:servers:update``):
        ``name``, and ``description``, ``access_ip_v4``, ``access_ip_v6``,
        ``disk_config`` of its boot details. O(1): one read, one script.

        :raises InstanceNotFound: as :meth:`get`, or deleted meanwhile.
        :raises Forbidden: the rule refuses the caller.
        :raises Invalid: another field, or a bad name.
        """
        unknown = sorted(set(changes) - {"name", *_UPDATABLE})
        if unknown:
            raise exception.Invalid(reason=f"a server update cannot change {unknown}")
        if "name" in changes:
            check_name("name", changes["name"])
        cell = self.cells.of_instance(uuid)
        instance = cell.visible(context, uuid)
        self.policy.authorize(context, servers_policy.UPDATE, _target(instance))
        fields = {_UPDATABLE[k]: v for k, v in changes.items() if k in _UPDATABLE}
        return cell.stores.instances.update(
            instance.uuid, changes.get("name"), server_change(fields)
        )

    def metadata(
        self, context: RequestContext, uuid: str, key: str | None = None
    ) -> dict[str, str]:
        """A server's metadata, or its item ``key`` (``server-metadata:index``/``show``).

        :raises InstanceNotFound: as :meth:`get`.
        :raises MetadataItemNotFound: no item ``key``.
        :raises Forbidden:
        """
        instance = self.cells.of_instance(uuid).visible(context, uuid)
        rule = metadata_policy.INDEX if key is None else metadata_policy.SHOW
        self.policy.authorize(context, rule, _target(instance))
        found = dict(details(instance).metadata)
        if key is None:
            return found
        if key not in found:
            raise MetadataItemNotFound()
        return {key: found[key]}

    def set_metadata(
        self,
        context: RequestContext,
        uuid: str,
        items: Mapping[str, str],
        replace: bool = False,
        rule: str = metadata_policy.CREATE,
    ) -> dict[str, str]:
        """Add or change metadata items (``replace``: the items become the whole of it);
        return the metadata after. The project's ``metadata_items`` quota counts the result.

        :raises InstanceNotFound: as :meth:`get`.
        :raises InstanceInvalidState: not ACTIVE, or a task under way (409, Nova's words).
        :raises MetadataLimitExceeded: over the ``metadata_items`` quota (403).
        :raises Forbidden: ``rule`` (``server-metadata:create``, ``update`` or
            ``update_all``) refuses the caller.
        """
        cell = self.cells.of_instance(uuid)
        instance = cell.visible(context, uuid)
        self.policy.authorize(context, rule, _target(instance))
        allowed = self.quotas.limit_for(instance.project_id, "metadata_items")
        _check_metadata_state(instance, "update metadata")
        change = metadata_change(items, replace=replace, limit=allowed)
        try:
            updated = cell.stores.instances.update(instance.uuid, extra=change)
        except exception.ItemLimitExceeded:
            raise MetadataLimitExceeded(allowed=allowed) from None
        return dict(details(updated).metadata)

    def delete_metadata(self, context: RequestContext, uuid: str, key: str) -> None:
        """Remove one metadata item (``server-metadata:delete``).

        :raises InstanceNotFound, Forbidden, InstanceInvalidState:
        :raises MetadataItemNotFound: no item ``key``.
        """
        cell = self.cells.of_instance(uuid)
        instance = cell.visible(context, uuid)
        self.policy.authorize(context, metadata_policy.DELETE, _target(instance))
        if key not in details(instance).metadata:
            raise MetadataItemNotFound()
        _check_metadata_state(instance, "delete metadata")
        cell.stores.instances.update(instance.uuid, extra=metadata_change(removed=(key,)))

    def host_status(self, context: RequestContext, instance: Instance) -> str | None:
        """Nova's ``host_status`` of a server (2.16): UP, DOWN (forced down), MAINTENANCE
        (disabled), UNKNOWN (heartbeat expired), "" (no host); None when neither
        ``...:show:host_status`` nor (for UNKNOWN) ``...:host_status:unknown-only``
        lets the caller see it. Two O(1) reads of the host's service in its cell.
        """
        full = self.policy.allows(context, servers_policy.SHOW_HOST_STATUS, _target(instance))
        if not full and not self.policy.allows(
            context, servers_policy.SHOW_HOST_STATUS_UNKNOWN, _target(instance)
        ):
            return None
        status = self.cells.of_instance(instance.uuid).host_status(instance.host)
        return status if full or status == "UNKNOWN" else None

    def delete(self, context: RequestContext, uuid: str) -> Instance:
        """Delete a server in its cell (:meth:`qsched.compute.cell.Cell.remove` says how);
        return its record after. Over several cells its quota comes back in the API
        keyspace once the cell ends it (:class:`qsched.cells.mover.QuotaMover`).

        :raises InstanceNotFound: as :meth:`get`.
        :raises Forbidden: ``os_compute_api:servers:delete`` refuses the caller.
        :raises BusUnavailable: the broker did not confirm (503); the instance
            stays deleting and a retried delete publishes again.
        """
        cell = self.cells.of_instance(uuid)
        instance = cell.visible(context, uuid)
        self.policy.authorize(context, servers_policy.DELETE, _target(instance))
        deleted = cell.remove(instance, context.request_id)
        record_delete(cell.stores, context, instance.uuid)  # its instance action
        return deleted

    def file_limits(self, context: RequestContext) -> FileLimits:
        """The caller's project quotas on injected files (a create that injects some)."""
        limit = functools.partial(self.quotas.limit_for, context.project_id)
        return FileLimits(limit("injected_files"), limit("injected_file_path_bytes"),
                          limit("injected_file_content_bytes"))  # fmt: skip

    # -- the rest --

    def host_zones(self) -> dict[str, str]:
        """Host -> the availability zone its aggregate makes (what ``os-services`` shows
        over the agent's own zone); one read of each cell's aggregate index (a host is
        in one cell)."""
        zones: dict[str, str] = {}
        for cell in self.cells.each():
            zones.update(aggregate_zones(cell.aggregates.index()))
        return zones

    def check_health(self) -> dict[str, str | None]:
        """Each part a boot needs, and why it does not answer (None: it does):
        :meth:`qsched.compute.cell.Cell.health`. Over several cells the ledger answers
        when the API keyspace and at least one cell answer, the bus when one cell's does
        (a cell down leaves the others served; its own calls answer 503)."""
        health: dict[str, str | None] = {"ledger": self.cells.keyspace_fault(), "bus": None}
        found = [cell.health() for cell in self.cells.each()]
        for part in health:
            if health[part] is None and all(cell[part] for cell in found):
                health[part] = found[0][part]
        return health


def _check_metadata_state(instance: Instance, action: str) -> None:
    """Nova changes metadata of a server that is ACTIVE (or stopped) with no task."""
    if instance.state != State.ACTIVE:
        raise exception.InstanceInvalidState(
            action=action, instance=instance.uuid, attr="vm_state",
            state=server_list.VM_STATES[instance.state],
        )  # fmt: skip
    if instance.task_state.value:
        raise exception.InstanceInvalidState(
            action=action,
            instance=instance.uuid,
            attr="task_state",
            state=instance.task_state.value,
        )


def _target(instance: Instance) -> dict[str, str]:
    """A server as a policy target: the project and user that own it."""
    return {"project_id": instance.project_id, "user_id": instance.user_id}
