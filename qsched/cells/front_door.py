"""qsched-api over several cells: what the HTTP routes ask of a ComputeAPI, over a
:class:`~qsched.cells.router.CellsCompute` (docs/scale.rst, "Serving it over HTTP").

:func:`qsched.api.app.create_cells_app` gives :class:`CellsComputeAPI` to the same
routes that serve one cell; route by route:

* servers (create, show, list, update, delete), their metadata, actions and
  instance actions: the instance mapping names the cell (a uuid without one is
  404); a list merges every cell's page (:meth:`CellsCompute.list`). A create goes
  to the cell its hints name (the cell of its ``same_host`` servers, of its host or
  node, of its server group), else to its zone's, else to a cell drawn by free capacity;
  a host or node is found by its mapping in the API keyspace, looked up again when
  the boot is refused while it is stale.
* quotas, quota classes and limits: the API keyspace's, the deployment's limits;
  each cell reads from there the limits it checks in code (``key_pairs``,
  ``metadata_items``, ``injected_file*``; :func:`~qsched.cells.opening.open_cells`), and its
  own ``instances``, ``cores`` and ``ram`` stay unlimited.
* flavors, their extra specs and access: every write goes to every cell
  (:func:`qsched.cells.fanout.write_every_cell`); reads come from the first joined cell
  that answers (:meth:`CellsCompute.read`).
* keypairs: made once (a generated private key too) and the same key written to
  every cell, deleted from every cell; read as flavors are.
* hypervisors, services and availability zones: each cell's, merged. Their
  integer ids (a hypervisor's before microversion 2.53, a service's ``id``
  before 2.53) are each cell's own counters, which collide across cells, so they
  are shown as ``place << 24 | id``: ``place`` the cell's place among the ``[cells]
  cell`` lines from 0 (the first cell's ids are its own). A cell's ids thus depend
  on the order of those lines: append new cells, never reorder them; a cell of
  more than 16,777,215 hypervisors or services would overflow into the next
  cell's. The uuids of 2.53 on are unique as they are.
* server groups: each in one cell, found by its group mapping in the API keyspace;
  a create draws its cell, a boot with a ``group`` hint goes to the group's cell
  (:mod:`qsched.cells.groups`, which says where their quotas are counted).
* aggregates: every aggregate in every cell with one id and uuid, each cell's copy
  with that cell's hosts; a host's changes go to its cell, found by its host mapping
  (:mod:`qsched.cells.aggregates`).

A write to every cell that a cell does not answer fails with 503 once the other
cells were written; every such write is idempotent (a flavor by its id, a keypair
by its name and key), so the client's retry completes it. A create whose id or key
this call made (a flavor without an id, a generated keypair) is taken back from
the cells that took it before the 503, so a retry does not meet a half-made one.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from qsched import exception
from qsched.cells.aggregates import CellsAggregates
from qsched.cells.fanout import gone, take_back, write_every_cell
from qsched.cells.groups import CellsGroups
from qsched.cells.join import CellNotJoined
from qsched.cells.parts import (
    CellsHypervisors,
    CellsKeypairs,
    CellsServerActions,
    CellsServices,
    CellsZones,
)
from qsched.cells.router import CellsCompute
from qsched.compute.api import ComputeAPI
from qsched.compute.boot import Reservation, check_counts
from qsched.compute.flavor_catalog import FlavorExtraSpecNotFound
from qsched.compute.host_rules import HostRequest
from qsched.compute.quotas import FileLimits, QuotaAPI
from qsched.context import RequestContext
from qsched.flavors import Flavor, FlavorAccessExists, FlavorAccessNotFound, FlavorQuery
from qsched.ledger.base import Instance, LedgerUnavailable
from qsched.policies import server_metadata as metadata_policy
from qsched.scheduling.records import ServerFields

LOG = logging.getLogger(__name__)
T = TypeVar("T")


#: an integer id shown over several cells: the cell's place above its own id's bits
class CellsComputeAPI:
    """The front door of several cells with the surface of :class:`ComputeAPI` that
    :mod:`qsched.api` uses (see the module docstring). ``front``: the cells."""

    def __init__(self, front: CellsCompute) -> None:
        self.front = front
        first = next(iter(front.cells.values()))
        self.policy = first.policy
        self.api = first.api
        self.max_limit = first.max_limit
        self.quotas = QuotaAPI(front.api, self.policy)
        self.keypairs = CellsKeypairs(self)
        self.hypervisors = CellsHypervisors(self)
        self.services = CellsServices(self)
        self.zones = CellsZones(self)
        self.actions = CellsServerActions(self)
        self.groups = CellsGroups(front)
        self.aggregates = CellsAggregates(front)

    @property
    def cells(self) -> list[ComputeAPI]:
        """Every cell's front door, in the order of the ``[cells] cell`` lines."""
        return list(self.front.cells.values())

    @property
    def reader(self) -> ComputeAPI:
        """Where the caller's rights are asked (no read: every cell has the same rules):
        ``flavor_cell``. Flavors and keypairs are read by :meth:`CellsCompute.read`."""
        return self.front.flavor_cell

    # -- what the caller may see (policy only) --

    def page_size(self, limit: int | None) -> int:
        return self.reader.page_size(limit)

    def shows_host(self, context: RequestContext) -> bool:
        return self.reader.shows_host(context)

    def shows_extra_specs(self, context: RequestContext) -> bool:
        return self.reader.shows_extra_specs(context)

    def show_extra_specs_in_views(self, context: RequestContext) -> bool:
        return self.reader.show_extra_specs_in_views(context)

    def file_limits(self, context: RequestContext) -> FileLimits:
        """The caller's project's injected-file limits, the deployment's."""
        limit = self.quotas.limit_for
        project = context.project_id
        return FileLimits(limit(project, "injected_files"),
                          limit(project, "injected_file_path_bytes"),
                          limit(project, "injected_file_content_bytes"))  # fmt: skip

    # -- servers --

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
        """As :meth:`ComputeAPI.boot_many`, into the cell :meth:`hinted_cell` names or
        :meth:`CellsCompute.choose` draws; the quota is the API keyspace's.

        A ``group`` hint sends them to the group's cell (:mod:`qsched.cells.groups`).

        A host (2.74) whose host mapping names a cell that no longer has it (the host
        moved) is refused there, or by the hints' checks: its cell is then looked up
        afresh in every cell (O(cells), on a refusal only), its mapping written again,
        and the boot made once more if the host is in another cell now; so is a node
        (2.74) by its node mapping.

        :raises Invalid: the hints name servers, hosts or a group of several cells, or
            of another cell than the zone's (400).
        :raises GroupRefNotFound: no such group (400); nothing is held.
        """
        check_counts(min_count, max_count)

        def boot() -> Reservation:
            return self.front.boot_many(
                context, name, flavor_ref, image_ref, availability_zone, min_count=min_count,
                max_count=max_count, cell=self.hinted_cell(hosts, group), metadata=metadata,
                group=group, server=server, hosts=hosts,
            )  # fmt: skip

        try:
            return boot()
        except (exception.Invalid, CellNotJoined):  # nothing is held
            if not self._moved(hosts):
                raise
        return boot()  # its host's cell mapped again

    def _moved(self, hosts: HostRequest | None) -> bool:
        """Whether the host (else the node) a boot asks for is in another cell than its
        mapping named when the boot was refused: looked up afresh in every cell and
        mapped again."""
        front = self.front
        if hosts is None:
            return False
        if hosts.host is not None:
            mapped, found = front.map.host_cell(hosts.host), front.cell_of_host(hosts.host, True)
        elif hosts.node is not None:
            mapped, found = front.map.node_cell(hosts.node), front.cell_of_node(hosts.node, True)
        else:
            return False
        return found is not None and found != mapped

    def hinted_cell(self, hosts: HostRequest | None, group: str | None = None) -> str | None:
        """The cell a boot's hints name: that of its ``same_host`` servers (their
        mappings), of its host (its host mapping; O(cells) reads the first time) or
        else its node (its node mapping, the same) and of its ``group`` (its mapping); None when
        they name none (``different_host`` names none: a server of another cell is on
        another host).

        :raises Invalid: they name several cells: no host can satisfy them.
        :raises GroupRefNotFound: ``group`` is no group's (400).
        """
        named = {self.groups.cell_for_boot(group)} if group is not None else set()
        if hosts:
            mapping = self.front.map.mapping
            named |= {found[0] for server in hosts.same_host if (found := mapping(server))}
        if hosts and hosts.host is not None:  # its host mapping: one read once known
            named |= {cell for cell in [self.front.cell_of_host(hosts.host)] if cell}
        elif hosts and hosts.node is not None:  # its node mapping: the same
            named |= {cell for cell in [self.front.cell_of_node(hosts.node)] if cell}
        if len(named) > 1:
            raise exception.Invalid(
                reason=f"the scheduler hints and host name servers, hosts or a server group "
                f"of several cells ({', '.join(sorted(named))}): no host can satisfy them"
            )
        return next(iter(named), None)

    def list(
        self,
        context: RequestContext,
        detail: bool = False,
        params: Mapping[str, Sequence[str]] | None = None,
        version: tuple[int, int] = (2, 1),
        limit: int | None = None,
    ) -> builtins.list[Instance]:
        """Every cell's servers merged (:meth:`CellsCompute.list`)."""
        return self.front.list(context, limit=limit, params=params, version=version,
                               detail=detail)  # fmt: skip

    def get(self, context: RequestContext, uuid: str) -> Instance:
        instance: Instance = self.front.get(context, uuid)
        return instance

    def update(self, context: RequestContext, uuid: str, changes: Mapping[str, Any]) -> Instance:
        instance: Instance = self.front.update(context, uuid, changes)
        return instance

    def delete(self, context: RequestContext, uuid: str) -> Instance:
        instance: Instance = self.front.delete(context, uuid)
        return instance

    def metadata(
        self, context: RequestContext, uuid: str, key: str | None = None
    ) -> dict[str, str]:
        return self.front.compute_of(uuid).metadata(context, uuid, key)

    def set_metadata(
        self,
        context: RequestContext,
        uuid: str,
        items: Mapping[str, str],
        replace: bool = False,
        rule: str = metadata_policy.CREATE,
    ) -> dict[str, str]:
        return self.front.compute_of(uuid).set_metadata(context, uuid, items, replace, rule)

    def delete_metadata(self, context: RequestContext, uuid: str, key: str) -> None:
        self.front.compute_of(uuid).delete_metadata(context, uuid, key)

    def host_status(self, context: RequestContext, instance: Instance) -> str | None:
        """As :meth:`ComputeAPI.host_status`, in the server's cell (one more read: its
        mapping)."""
        return self.front.compute_of(instance.uuid).host_status(context, instance)

    # -- flavors: read from the first joined cell that answers, written to every cell --

    def get_flavor(self, flavor_id: str, context: RequestContext | None = None) -> Flavor:
        return self.front.get_flavor(flavor_id, context)

    def list_flavors(
        self, context: RequestContext | None = None, query: FlavorQuery | None = None
    ) -> builtins.list[Flavor]:
        return self.front.read(lambda compute: compute.list_flavors(context, query))

    def flavor_access(self, context: RequestContext, flavor_id: str) -> Flavor:
        return self.front.read(lambda compute: compute.flavor_access(context, flavor_id))

    def flavor_extra_specs(self, context: RequestContext, flavor_id: str) -> Mapping[str, str]:
        return self.front.read(lambda compute: compute.flavor_extra_specs(context, flavor_id))

    def flavor_extra_spec(self, context: RequestContext, flavor_id: str, key: str) -> str:
        return self.front.read(lambda compute: compute.flavor_extra_spec(context, flavor_id, key))

    def create_flavor(self, context: RequestContext, flavor: Flavor) -> Flavor:
        """As :meth:`ComputeAPI.create_flavor` in every cell: a new id is made once. A
        cell that has the very flavor already counts as written (a retry).

        :raises BackendUnavailable: a cell did not answer (503); the cells that took
            the flavor from this call give it back first when its id was made here.
        """
        made_here = not flavor.id
        if made_here:
            flavor = dataclasses.replace(flavor, id=str(uuid.uuid4()))
        created: list[ComputeAPI] = []

        def create(compute: ComputeAPI) -> Flavor:
            found = compute.create_flavor(context, flavor)
            created.append(compute)
            return found

        def same(compute: ComputeAPI, exc: Exception) -> bool:
            return isinstance(exc, exception.FlavorExists) and _has_flavor(compute, flavor)

        try:
            return self._everywhere(create, same)
        except exception.BackendUnavailable:
            if made_here:
                take_back(created, lambda compute: compute.flavors.delete(flavor.id))
            raise

    def update_flavor(
        self, context: RequestContext, flavor_id: str, description: str | None
    ) -> Flavor:
        return self._everywhere(lambda c: c.update_flavor(context, flavor_id, description))

    def delete_flavor(self, context: RequestContext, flavor_id: str) -> Flavor:
        return self._everywhere(lambda c: c.delete_flavor(context, flavor_id),
                                gone(exception.FlavorNotFound))  # fmt: skip

    def add_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str, refuse_public: bool
    ) -> Flavor:
        return self._everywhere(
            lambda c: c.add_flavor_access(context, flavor_id, project_id, refuse_public),
            gone(FlavorAccessExists),
        )

    def remove_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str
    ) -> Flavor:
        return self._everywhere(lambda c: c.remove_flavor_access(context, flavor_id, project_id),
                                gone(FlavorAccessNotFound))  # fmt: skip

    def set_flavor_extra_spec(
        self, context: RequestContext, flavor_id: str, key: str, value: str
    ) -> Flavor:
        return self._everywhere(lambda c: c.set_flavor_extra_spec(context, flavor_id, key, value))

    def set_flavor_extra_specs(
        self, context: RequestContext, flavor_id: str, specs: Mapping[str, str]
    ) -> Flavor:
        return self._everywhere(lambda c: c.set_flavor_extra_specs(context, flavor_id, specs))

    def delete_flavor_extra_spec(self, context: RequestContext, flavor_id: str, key: str) -> Flavor:
        return self._everywhere(lambda c: c.delete_flavor_extra_spec(context, flavor_id, key),
                                gone(FlavorExtraSpecNotFound))  # fmt: skip

    def seed_flavors(self) -> builtins.list[Flavor]:
        """Write ``[api] flavor`` to every joined cell (one not joined is skipped, logged:
        its ledger did not answer; a cell that joins later does not get them)."""
        seeded: builtins.list[Flavor] = []
        for name, compute in self.front.cells.items():
            if name in self.front.unjoined:
                LOG.warning("cells: cell %s is not joined; [api] flavor is not written there",
                            name)  # fmt: skip
                continue
            seeded = compute.seed_flavors()
        return seeded

    def _everywhere(
        self,
        write: Callable[[ComputeAPI], T],
        done: Callable[[ComputeAPI, Exception], bool] = lambda compute, exc: False,
    ) -> T:
        """:func:`~qsched.cells.fanout.write_every_cell` of this front door's cells."""
        return write_every_cell(self.front.cells, write, done)

    # -- the rest --

    def host_zones(self) -> dict[str, str]:
        """Every cell's host -> its aggregate's zone (a host is in one cell)."""
        zones: dict[str, str] = {}
        for compute in self.cells:
            zones.update(compute.host_zones())
        return zones

    def check_health(self) -> dict[str, str | None]:
        """As :meth:`ComputeAPI.check_health`: the ledger answers when the API keyspace
        and at least one cell answer, the bus when one cell's does (a cell down leaves
        the others served; its own calls answer 503)."""
        health: dict[str, str | None] = {"ledger": None, "bus": None}
        try:
            self.front.api.backend.ping()
        except LedgerUnavailable as exc:
            LOG.warning("healthcheck: the API keyspace does not answer: %s", exc.reason)
            health["ledger"] = exc.category
        found = [compute.check_health() for compute in self.cells]
        for part in health:
            if health[part] is None and all(cell[part] for cell in found):
                health[part] = found[0][part]
        return health


def _has_flavor(compute: ComputeAPI, flavor: Flavor) -> bool:
    try:
        return compute.flavors.get(flavor.id) == flavor
    except exception.FlavorNotFound:
        return False
