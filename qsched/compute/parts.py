"""The front door's parts over its cells: keypairs, server actions, hypervisors,
services and availability zones (the HTTP routes call them as parts of
:class:`~qsched.compute.api.ComputeAPI`), each written once over
:class:`~qsched.compute.target.Cells`; what each does in one cell is that cell's part
(:class:`~qsched.compute.keypairs.KeypairAPI`, ...).

Keypairs are made once and written to every cell (a generated private key too); actions
go to the server's cell; hypervisors, services and zones are each cell's, merged, their
integer ids shown as ``place << ID_BITS | id`` (:func:`shown_id`) so that cells'
counters do not collide: the integer ids (a hypervisor's before microversion 2.53, a
service's ``id`` before 2.53) are each cell's own counters. ``place`` is the cell's
place among the ``[cells] cell`` lines from 0, so the first cell's ids (and one cell's)
are its own; a cell's ids thus depend on the order of those lines: append new cells,
never reorder them; a cell of more than 16,777,215 hypervisors or services would
overflow into the next cell's. The uuids of 2.53 on are unique as they are.
"""

from __future__ import annotations

import builtins
import dataclasses
import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from qsched import exception
from qsched.compute.hypervisors import (
    HypervisorNotFound,
    HypervisorView,
    NoHypervisorMatches,
    Statistics,
)
from qsched.compute.keypairs import SSH
from qsched.compute.migrations import MigrationFilter, order
from qsched.compute.moves import NOT_GIVEN
from qsched.compute.server_actions import Action, ActionFilter, Rebuild
from qsched.compute.services import Change, ServiceView
from qsched.compute.target import Cells, gone, take_back
from qsched.compute.zones import Zone
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger.base import Instance, Keypair, Migration

if TYPE_CHECKING:
    from qsched.compute.cell import Cell

LOG = logging.getLogger(__name__)
T = TypeVar("T")

#: an integer id shown over several cells: the cell's place above its own id's bits
ID_BITS = 24
_ID_MASK = (1 << ID_BITS) - 1


def shown_id(place: int, own: int) -> int:
    """The id a client sees of cell number ``place``'s id ``own`` (see the module docstring)."""
    return place << ID_BITS | own


def own_id(shown: int) -> tuple[int, int]:
    """The cell's place and its own id of an id a client sent (:func:`shown_id`'s inverse)."""
    return shown >> ID_BITS, shown & _ID_MASK


class Keypairs:
    """Keypairs: the same key in every cell (see the module docstring)."""

    def __init__(self, cells: Cells) -> None:
        self.cells = cells

    def create(
        self, context: RequestContext, name: str, key_type: str = SSH, user_id: str | None = None
    ) -> tuple[Keypair, str]:
        """Generate a keypair for ``user_id`` (default: the caller), kept in every cell;
        it and its private key.

        :raises Invalid: a name outside Nova's rules, an unknown type.
        :raises Forbidden: the rule refuses the caller for that user (403).
        :raises KeypairExists: the user has one of that name (409).
        :raises KeypairLimitExceeded: the user holds the ``key_pairs`` quota of the caller's
            project already (403).
        :raises BackendUnavailable: a cell did not answer (503); the cells that kept
            the key give it back first (a retry makes a new key).
        """
        keypair, private_key = self.cells.reader.keypairs.generate(context, name, key_type,
                                                                   user_id)  # fmt: skip
        return self._keep(context, keypair, undo=True), private_key

    def import_public_key(
        self,
        context: RequestContext,
        name: str,
        public_key: str,
        key_type: str = SSH,
        user_id: str | None = None,
    ) -> Keypair:
        """Keep a public key (ssh) or certificate (x509, PEM) given by the caller in every
        cell; a cell that has the very key under that name already counts as written
        (a retry).

        :raises InvalidKeypair: the key does not parse (400, Nova's words).
        :raises: as :meth:`create` otherwise.
        """
        keypair = self.cells.reader.keypairs.imported(context, name, public_key, key_type,
                                                      user_id)  # fmt: skip
        return self._keep(context, keypair, undo=False)

    def _keep(self, context: RequestContext, keypair: Keypair, undo: bool) -> Keypair:
        kept: list[Cell] = []

        def keep(cell: Cell) -> Keypair:
            found = cell.keypairs.keep(context, keypair)
            kept.append(cell)
            return found

        def same(cell: Cell, exc: Exception) -> bool:
            if not isinstance(exc, exception.KeypairExists):
                return False
            there = cell.stores.keypairs.get(keypair.user_id, keypair.name)
            return (there.public_key, there.type) == (keypair.public_key, keypair.type)

        try:
            return self.cells.every(keep, same)
        except exception.BackendUnavailable:
            if undo:
                take_back(kept, lambda c: c.stores.keypairs.delete(keypair.user_id, keypair.name))
            raise

    def get(self, context: RequestContext, name: str, user_id: str | None = None) -> Keypair:
        """One keypair of ``user_id`` (default: the caller).

        :raises Forbidden: the rule refuses the caller for that user (403).
        :raises KeypairNotFound: none of that name (404).
        """
        return self.cells.read(lambda cell: cell.keypairs.get(context, name, user_id))

    def list(
        self,
        context: RequestContext,
        user_id: str | None = None,
        limit: int | None = None,
        marker: str | None = None,
    ) -> builtins.list[Keypair]:
        """The keypairs of ``user_id`` (default: the caller) by name: at most ``limit``,
        those after the one named ``marker``.

        :raises Forbidden: the rule refuses the caller for that user (403).
        :raises MarkerCouldNotBeFound: the user has no keypair named ``marker`` (400).
        """
        return self.cells.read(lambda cell: cell.keypairs.list(context, user_id, limit, marker))

    def delete(self, context: RequestContext, name: str, user_id: str | None = None) -> None:
        """Forget one keypair of ``user_id`` (default: the caller) in every cell.

        :raises Forbidden: the rule refuses the caller for that user (403).
        :raises KeypairNotFound: no cell had it (404).
        """
        self.cells.every(lambda cell: cell.keypairs.delete(context, name, user_id),
                         gone(exception.KeypairNotFound))  # fmt: skip


class Actions:
    """Stop, start, reboot and instance actions, in the server's cell
    (:class:`~qsched.compute.server_actions.ServerActions` says what each does)."""

    def __init__(self, cells: Cells) -> None:
        self.cells = cells
        self.max_limit = cells.reader.max_limit  # the most actions one list returns

    def stop(self, context: RequestContext, uuid: str) -> None:
        self.cells.of_instance(uuid).actions.stop(context, uuid)

    def start(self, context: RequestContext, uuid: str) -> None:
        self.cells.of_instance(uuid).actions.start(context, uuid)

    def reboot(self, context: RequestContext, uuid: str, hard: bool) -> None:
        self.cells.of_instance(uuid).actions.reboot(context, uuid, hard)

    def rebuild(
        self, context: RequestContext, uuid: str, image_ref: str, asked: Rebuild | None = None
    ) -> None:
        self.cells.of_instance(uuid).actions.rebuild(context, uuid, image_ref, asked)

    def shelve(self, context: RequestContext, uuid: str) -> None:
        self.cells.of_instance(uuid).actions.shelve(context, uuid)

    def shelve_offload(self, context: RequestContext, uuid: str) -> None:
        self.cells.of_instance(uuid).actions.shelve_offload(context, uuid)

    def list_actions(
        self,
        context: RequestContext,
        uuid: str,
        deleted: bool = False,
        filters: ActionFilter | None = None,
    ) -> tuple[Instance, list[Action]]:
        return self.cells.of_instance(uuid).actions.list_actions(context, uuid, deleted, filters)

    def get_action(
        self, context: RequestContext, uuid: str, request_id: str, deleted: bool = False
    ) -> tuple[Instance, Action]:
        return self.cells.of_instance(uuid).actions.get_action(context, uuid, request_id, deleted)

    def shows_events(self, context: RequestContext, instance: Instance) -> bool:
        return self.cells.reader.actions.shows_events(context, instance)


class Moves:
    """Resize, its confirm and revert, cold migration and evacuation, in the server's cell (a move
    stays in its cell; :class:`~qsched.compute.moves.ServerMoves` says what each does).

    ``get_flavor``: the flavor of an id the caller may see (the front door's catalog).
    """

    def __init__(self, cells: Cells, get_flavor: Callable[[str, RequestContext], Flavor]) -> None:
        self.cells = cells
        self.get_flavor = get_flavor

    def resize(self, context: RequestContext, uuid: str, flavor_ref: str) -> None:
        self.cells.of_instance(uuid).moves.resize(context, uuid, flavor_ref, self.get_flavor)

    def confirm(self, context: RequestContext, uuid: str) -> None:
        self.cells.of_instance(uuid).moves.confirm(context, uuid)

    def revert(self, context: RequestContext, uuid: str) -> None:
        self.cells.of_instance(uuid).moves.revert(context, uuid)

    def migrate(self, context: RequestContext, uuid: str, host: str | None = None) -> None:
        self.cells.of_instance(uuid).moves.migrate(context, uuid, host)

    def evacuate(self, context: RequestContext, uuid: str, host: str | None = None) -> None:
        self.cells.of_instance(uuid).moves.evacuate(context, uuid, host)

    def live_migrate(
        self,
        context: RequestContext,
        uuid: str,
        host: str | None = None,
        block_migration: bool | None = None,
    ) -> None:
        self.cells.of_instance(uuid).moves.live_migrate(context, uuid, host, block_migration)

    def force_complete(self, context: RequestContext, uuid: str, migration_id: str) -> None:
        self.cells.of_instance(uuid).moves.force_complete(context, uuid, migration_id)

    def abort(
        self, context: RequestContext, uuid: str, migration_id: str, in_queue: bool = True
    ) -> None:
        self.cells.of_instance(uuid).moves.abort(context, uuid, migration_id, in_queue)

    def unshelve(
        self, context: RequestContext, uuid: str, zone: object = NOT_GIVEN, host: str | None = None
    ) -> None:
        self.cells.of_instance(uuid).moves.unshelve(context, uuid, zone, host)


class Hypervisors:
    """Every cell's hypervisors, ordered by the id a client sees (:func:`shown_id`):
    the first cell's, then the next one's. A page reads from the marker's cell on."""

    def __init__(self, cells: Cells) -> None:
        self.cells = cells

    def authorize(self, context: RequestContext, rule: str) -> None:
        self.cells.reader.hypervisors.authorize(context, rule)

    def page(
        self,
        limit: int | None,
        marker: int | str | None = None,
        with_servers: bool = False,
    ) -> builtins.list[HypervisorView]:
        """As :meth:`HypervisorAPI.page` over every cell.

        :raises MarkerNotFound: no hypervisor is ``marker`` (400).
        """
        start, own = (0, None) if marker is None else self._locate(marker)
        views: builtins.list[HypervisorView] = []
        for place, cell in enumerate(self.cells.each()):
            if place < start:
                continue
            want = None if limit is None else limit - len(views)
            if want is not None and want <= 0:
                break
            found = cell.hypervisors.page(want, own if place == start else None,
                                             with_servers)  # fmt: skip
            views += [_shown(place, view) for view in found]
        return views

    def search(self, pattern: str, with_servers: bool = False) -> builtins.list[HypervisorView]:
        """:raises NoHypervisorMatches: no cell has one (404)."""
        views: builtins.list[HypervisorView] = []
        for place, cell in enumerate(self.cells.each()):
            try:
                found = cell.hypervisors.search(pattern, with_servers)
            except NoHypervisorMatches:
                continue
            views += [_shown(place, view) for view in found]
        if not views:
            raise NoHypervisorMatches(pattern=pattern)
        return views

    def get(self, ref: int | str, with_servers: bool = False) -> HypervisorView:
        """By the id a client sees, or from 2.53 by uuid (asked of each cell in turn).

        :raises HypervisorNotFound: (404).
        """
        cells = self.cells.each()
        if isinstance(ref, int):
            place, own = own_id(ref)
            if place >= len(cells):
                raise HypervisorNotFound(id=ref)
            try:
                return _shown(place, cells[place].hypervisors.get(own, with_servers))
            except HypervisorNotFound:
                raise HypervisorNotFound(id=ref) from None
        for place, cell in enumerate(cells):
            try:
                return _shown(place, cell.hypervisors.get(ref, with_servers))
            except HypervisorNotFound:
                continue
        raise HypervisorNotFound(id=ref)

    def statistics(self) -> Statistics:
        """The sums of every cell's."""
        found = [cell.hypervisors.statistics() for cell in self.cells.each()]
        fields = [f.name for f in dataclasses.fields(Statistics)]
        return Statistics(**{name: sum(getattr(s, name) for s in found) for name in fields})

    def _locate(self, marker: int | str) -> tuple[int, int | str]:
        """The marker's cell (its place) and its id there."""
        cells = self.cells.each()
        if isinstance(marker, int):
            place, own = own_id(marker)
            if place >= len(cells):
                raise exception.MarkerNotFound(marker=marker)
            return place, own
        for place, cell in enumerate(cells):
            if cell.stores.ledger.hypervisor_ids([marker]):
                return place, marker
        raise exception.MarkerNotFound(marker=marker)


def _shown(place: int, view: HypervisorView) -> HypervisorView:
    """A cell's hypervisor with the ids a client sees (its own and its service's)."""
    return dataclasses.replace(view, id=shown_id(place, view.id),
                               service=_shown_service(place, view.service))  # fmt: skip


def _shown_service(place: int, service: Any) -> Any:
    return dataclasses.replace(service, seq=shown_id(place, service.seq))


def _shown_view(place: int, view: ServiceView) -> ServiceView:
    return dataclasses.replace(view, service=_shown_service(place, view.service))


class Services:
    """Every cell's compute services, by cell then id; a change goes to the cell that
    has the service (asked of each cell in turn: O(cells))."""

    def __init__(self, cells: Cells) -> None:
        self.cells = cells

    def list(
        self, context: RequestContext, host: str | None = None, binary: str | None = None
    ) -> builtins.list[ServiceView]:
        return [
            _shown_view(place, view)
            for place, cell in enumerate(self.cells.each())
            for view in cell.services.list(context, host, binary)
        ]

    def views(self) -> builtins.list[ServiceView]:
        return [
            _shown_view(place, view)
            for place, cell in enumerate(self.cells.each())
            for view in cell.services.views()
        ]

    def authorize_update(self, context: RequestContext) -> None:
        self.cells.reader.services.authorize_update(context)

    def update(
        self, context: RequestContext, host: str, binary: str, change: Change
    ) -> ServiceView:
        """:raises HostBinaryNotFound: no cell has the service (404)."""
        missing: exception.HostBinaryNotFound | None = None
        for place, cell in enumerate(self.cells.each()):
            try:
                return _shown_view(place, cell.services.update(context, host, binary, change))
            except exception.HostBinaryNotFound as exc:
                missing = exc
        assert missing is not None
        raise missing

    def update_by_id(self, context: RequestContext, service_id: str, change: Change) -> ServiceView:
        """:raises ServiceNotFound: no cell has the service (404)."""
        missing: exception.ServiceNotFound | None = None
        for place, cell in enumerate(self.cells.each()):
            try:
                view = cell.services.update_by_id(context, service_id, change)
            except exception.ServiceNotFound as exc:
                missing = exc
                continue
            return _shown_view(place, view)
        assert missing is not None
        raise missing


class Zones:
    """Every cell's availability zones merged by name: available if it is in one cell;
    the detail's hosts are every cell's."""

    def __init__(self, cells: Cells) -> None:
        self.cells = cells

    def list(self, context: RequestContext) -> builtins.list[Zone]:
        return _merged([cell.zones.list(context) for cell in self.cells.each()])

    def detail(self, context: RequestContext) -> builtins.list[Zone]:
        return _merged([cell.zones.detail(context) for cell in self.cells.each()])


def _merged(found: Sequence[Sequence[Zone]]) -> builtins.list[Zone]:
    zones: dict[str, Zone] = {}
    for zone in (z for cell in found for z in cell):
        known = zones.get(zone.name)
        if known is None:
            zones[zone.name] = zone
            continue
        hosts = None
        if known.hosts is not None or zone.hosts is not None:
            hosts = {**(known.hosts or {}), **(zone.hosts or {})}
        available = known.available or zone.available
        zones[zone.name] = Zone(zone.name, available, hosts if available else None)
    return sorted(zones.values(), key=lambda zone: (not zone.available, zone.name))


class Migrations:
    """Every cell's migrations, newest first (``os-migrations``), and a server's live
    migrations in progress, in its cell (:class:`~qsched.compute.migrations.MigrationsAPI`
    says what each reads).

    A migration's integer ``id`` is its cell's own, as in Nova (each cell's database
    counts its own): it names a migration of one server, whose cell is known. Pages go
    by uuid: each cell gives up to a page from the marker's place in Nova's order
    (:func:`~qsched.compute.migrations.order`), merged in that order. The marker's own
    cell reads on from it; any other cell reads past the migrations it has that are
    newer than the marker, so a deep page costs those reads there.
    """

    def __init__(self, cells: Cells) -> None:
        self.cells = cells
        self.max_limit = cells.reader.max_limit  # the most migrations one list returns

    def list(
        self,
        context: RequestContext,
        wanted: MigrationFilter | None = None,
        limit: int | None = None,
        marker: str | None = None,
    ) -> builtins.list[Migration]:
        """Those ``wanted`` finds, newest first: at most ``limit`` (``[api] max_limit``
        at most and when None; 0: none, as Nova), after the one whose uuid is ``marker``.

        :raises Forbidden: ``os_compute_api:os-migrations:index`` refuses the caller.
        :raises MarkerCouldNotBeFound: no cell has a migration ``marker`` (400).
        """
        self.cells.reader.migrations.authorize(context)
        wanted = wanted or MigrationFilter()
        size = self.max_limit if limit is None else min(limit, self.max_limit)
        cells = self.cells.each()
        place, after = (-1, None) if marker is None else _marker_place(cells, marker)
        pages = [
            cell.migrations.page(wanted, size, None, after.id)
            if after is not None and n == place
            else cell.migrations.page(wanted, size, after)
            for n, cell in enumerate(cells)
        ]
        return builtins.list(itertools.islice(heapq.merge(*pages, key=order), size))

    def list_live(self, context: RequestContext, uuid: str) -> builtins.list[Migration]:
        return self.cells.of_instance(uuid).migrations.live(context, uuid)

    def get_live(self, context: RequestContext, uuid: str, migration_id: str) -> Migration:
        return self.cells.of_instance(uuid).migrations.live_one(context, uuid, migration_id)


def _marker_place(cells: Sequence[Cell], marker: str) -> tuple[int, Migration]:
    """The place of the cell that has the migration ``marker``, and that migration.

    :raises MarkerCouldNotBeFound: no cell has it.
    """
    for place, cell in enumerate(cells):
        found = cell.migrations.find(marker)
        if found is not None:
            return place, found
    raise exception.MarkerCouldNotBeFound(marker=marker)
