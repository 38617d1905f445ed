"""A boot over several cells: which cell it goes to, and the quota and mappings held for
it in the API keyspace (:meth:`CellBoots.boot_into`, a part of
:class:`~qsched.cells.router.CellsCompute`).

A create goes to the cell its hints name (the cell of its ``same_host`` servers, of
its host or node, of its server group), else to its zone's, else to a cell drawn by
free capacity (:meth:`~qsched.cells.router.CellsCompute.choose`). A host or node is
found by its mapping in the API keyspace, looked up again when the boot is refused
while it is stale. The servers' uuids are made here and their quota held and mapped
in the API keyspace before the chosen cell records them (:meth:`RedisCellMap.hold`);
what the cell does not take is given back, and a cell that does not answer leaves them
pending for the quota mover to settle.
"""

from __future__ import annotations

import contextlib
import logging
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from qsched import exception
from qsched.cells.join import CellNotJoined, UnknownCell
from qsched.compute.boot import FlavorRefNotFound, Reservation
from qsched.compute.host_rules import HostRequest
from qsched.compute.server_groups import GroupRefNotFound
from qsched.compute.target import Accept, BootHints
from qsched.context import RequestContext
from qsched.flavors import Flavor, ref_id
from qsched.ledger.base import QuotaStore
from qsched.ledger.cellmap import RedisCellMap

if TYPE_CHECKING:
    from collections.abc import Mapping

    from qsched.compute.cell import Cell

LOG = logging.getLogger(__name__)
T = TypeVar("T")


class CellBoots:
    """The boots of :class:`~qsched.cells.router.CellsCompute` (see the module docstring),
    which holds what they use."""

    cells: dict[str, Cell]
    map: RedisCellMap
    quota: QuotaStore
    zones: dict[str, str]
    _unjoined: set[str]
    _free: dict[str, tuple[float, dict[str, int]]]

    if TYPE_CHECKING:  # the other parts of CellsCompute

        @property
        def reader(self) -> Cell: ...

        def read(self, call: Callable[[Cell], T]) -> T: ...

        def joined(self) -> Mapping[str, Cell]: ...

        def choose(
            self, availability_zone: str | None, flavor: Flavor, project: str | None = None
        ) -> str: ...

        def aggregate_cells(
            self, project: str, availability_zone: str | None, flavor: Flavor
        ) -> set[str] | None: ...

        def cell_of_host(self, host: str, fresh: bool = False) -> str | None: ...

        def cell_of_node(self, node: str, fresh: bool = False) -> str | None: ...

        def group_mapping(self, uuid: str) -> tuple[str, str]: ...

    def boot_into(
        self,
        context: RequestContext,
        flavor_ref: str | int,
        availability_zone: str | None,
        counts: tuple[int, int],
        hints: BootHints,
        accept: Accept,
    ) -> Reservation:
        """``accept`` the servers in the cell the hints name or :meth:`choose` draws,
        with their uuids made here and their quota held in the API keyspace.

        A host (2.74) whose host mapping names a cell that no longer has it (the host
        moved) is refused there, or by the hints' checks: its cell is then looked up
        afresh in every cell (O(cells), on a refusal only), its mapping written again,
        and the boot made once more if the host is in another cell now; so is a node
        (2.74) by its node mapping.

        :raises QuotaExceeded: not even the least of ``counts`` fit the project's
            limits; nothing is held.
        :raises FlavorRefNotFound: no flavor ``flavor_ref`` the caller may boot (400).
        :raises Invalid: the hints name servers, hosts or a group of several cells, or
            of another cell than the zone's (400); nothing is held.
        :raises GroupRefNotFound: no such group (400); nothing is held.
        :raises CellNotJoined: the cell asked for is not joined yet (503).
        """

        def boot() -> Reservation:
            cell = self._hinted_cell(hints)
            return self._boot(context, flavor_ref, availability_zone, counts, hints, cell, accept)

        try:
            return boot()
        except (exception.Invalid, CellNotJoined):  # nothing is held
            if not self._moved(hints.hosts):
                raise
        return boot()  # its host's cell mapped again

    def _boot(
        self,
        context: RequestContext,
        flavor_ref: str | int,
        availability_zone: str | None,
        counts: tuple[int, int],
        hints: BootHints,
        cell: str | None,
        accept: Accept,
    ) -> Reservation:
        least, most = counts
        try:  # its cores and ram count
            flavor_id = ref_id(flavor_ref)
            flavor = self.read(lambda c: c.flavors.get(flavor_id))
        except exception.FlavorNotFound:
            raise FlavorRefNotFound(flavor=ref_id(flavor_ref)) from None
        if not self.reader.sees(context, flavor):
            raise FlavorRefNotFound(flavor=flavor_id)
        project = context.project_id
        cell = self._asked_cell(cell, availability_zone, project, flavor) or self.choose(
            availability_zone, flavor, project
        )
        target = self.cells[cell]
        with self._read_again_if_down(cell):
            self._key_in(target, context.user_id, hints.key_name)  # before anything is held
            uuids = [str(uuidlib.uuid4()) for _ in range(max(most, 1))]
            held = self.map.hold(uuids, cell, project, flavor.vcpus, flavor.ram_mb, least)
            try:
                made = accept(target, held, min(least, len(held)), len(held))
            except exception.BackendUnavailable:
                raise  # the create may have run: the mover settles them from the cell
            except Exception:
                self._unmap(project, held)
                raise
        self.map.confirm(held)
        unused = [u for u in held if u not in {i.uuid for i in made.instances}]
        if unused:
            self._unmap(project, unused)
        return made

    def _moved(self, hosts: HostRequest | None) -> bool:
        """Whether the host (else the node) a boot asks for is in another cell than its
        mapping named when the boot was refused: looked up afresh in every cell and
        mapped again."""
        if hosts is None:
            return False
        if hosts.host is not None:
            mapped, found = self.map.host_cell(hosts.host), self.cell_of_host(hosts.host, True)
        elif hosts.node is not None:
            mapped, found = self.map.node_cell(hosts.node), self.cell_of_node(hosts.node, True)
        else:
            return False
        return found is not None and found != mapped

    def _hinted_cell(self, hints: BootHints) -> str | None:
        """The cell a boot's hints name: that of its ``same_host`` servers (their
        mappings), of its host (its host mapping; O(cells) reads the first time) or
        else its node (its node mapping, the same) and of its ``group`` (its mapping);
        None when they name none (``different_host`` names none: a server of another
        cell is on another host).

        :raises Invalid: they name several cells: no host can satisfy them.
        :raises GroupRefNotFound: ``group`` is no group's (400).
        """
        named: set[str] = set()
        if hints.group is not None:
            try:
                named.add(self.group_mapping(hints.group)[0])
            except exception.GroupNotFound:
                raise GroupRefNotFound(group=hints.group) from None
        hosts = hints.hosts
        if hosts:
            mapping = self.map.mapping
            named |= {found[0] for server in hosts.same_host if (found := mapping(server))}
        if hosts and hosts.host is not None:  # its host mapping: one read once known
            named |= {cell for cell in [self.cell_of_host(hosts.host)] if cell}
        elif hosts and hosts.node is not None:  # its node mapping: the same
            named |= {cell for cell in [self.cell_of_node(hosts.node)] if cell}
        if len(named) > 1:
            raise exception.Invalid(
                reason=f"the scheduler hints and host name servers, hosts or a server group "
                f"of several cells ({', '.join(sorted(named))}): no host can satisfy them"
            )
        return next(iter(named), None)

    @contextlib.contextmanager
    def _read_again_if_down(self, cell: str) -> Iterator[None]:
        """A boot into ``cell`` that a ledger did not answer drops the cell's free
        capacity kept by :meth:`free`: the next draw reads it again, and passes the cell
        over if it is down."""
        try:
            yield
        except exception.BackendUnavailable:
            self._free.pop(cell, None)
            raise

    def _asked_cell(
        self, cell: str | None, availability_zone: str | None, project: str, flavor: Flavor
    ) -> str | None:
        if cell is None:
            return None
        if cell not in self.cells:
            raise UnknownCell(cell=repr(cell), known=", ".join(self.cells))
        serving = self.aggregate_cells(project, availability_zone, flavor)
        if serving and cell not in serving:
            raise exception.Invalid(
                reason=f"the boot's hints name a server, host or server group of cell {cell}, "
                f"and the aggregates its availability zone or request filters ask for have "
                f"hosts in {', '.join(sorted(serving))} only"
            )
        zoned = self.zones.get(availability_zone or "")
        if zoned is not None and zoned != cell:
            raise exception.Invalid(
                reason=f"the boot's hints name a server, host or server group of cell "
                f"{cell}, and its availability zone {availability_zone} is served by cell "
                f"{zoned}"
            )
        if cell in self._unjoined:
            raise CellNotJoined(cell=cell)
        return cell

    def _unmap(self, project: str, uuids: Sequence[str]) -> None:
        """Give back what was reserved for instances that no cell holds."""
        for uuid in uuids:
            self.quota.release(project, uuid)
        self.map.unmap(uuids)

    def _key_in(self, cell: Cell, user_id: str, key_name: str | None) -> None:
        """Make sure ``cell`` holds keypair ``key_name`` of ``user_id``, which a boot
        there names: copied from another joined cell when it is missing (a cell joined
        after it was made, or away when it was); nothing for no key, or a key no cell
        has (the cell's boot then refuses it, 400). One read when the cell has it.
        """
        if key_name is None:
            return
        keypairs = cell.stores.keypairs
        try:
            keypairs.get(user_id, key_name)
            return
        except exception.KeypairNotFound:
            pass
        for name, other in self.joined().items():
            if other is cell:
                continue
            try:
                found = other.stores.keypairs.get(user_id, key_name)
            except (exception.KeypairNotFound, exception.BackendUnavailable):
                continue
            with contextlib.suppress(exception.KeypairExists):  # a boot beside this one
                keypairs.create(found, limit=-1)  # counted against key_pairs when made
            LOG.info("cells: keypair %s of user %s copied from cell %s", key_name, user_id,
                     name)  # fmt: skip
            return
