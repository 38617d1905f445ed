"""The flavor catalog (``/flavors``, ``os-flavor-manage``, ``os-flavor-access``,
``os-flavor-extra-specs``), as :class:`~qsched.compute.api.ComputeAPI` serves it over
its cells, and the flavors of ``[api] flavor``.

Reads are anyone's (a private flavor only for the projects granted it, and admins);
writes are admins' by default. Every write goes through the ledger's catalog
(:class:`~qsched.ledger.base.FlavorStore`), which drops the scheduling classes of a
flavor that changed, so that agents learn it anew.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from qsched import exception
from qsched.compute.target import Done, gone, never, take_back
from qsched.conf import APIOptions
from qsched.context import RequestContext
from qsched.exception import FlavorNotFound
from qsched.flavors import (
    Flavor,
    FlavorAccessExists,
    FlavorAccessNotFound,
    FlavorQuery,
    NoAccessListForPublic,
    check_flavor,
    check_flavor_id,
    grant,
    revoke,
    select,
)
from qsched.policies import flavors as flavors_policy
from qsched.policy import Policy

if TYPE_CHECKING:
    from qsched.compute.cell import Cell
    from qsched.compute.target import Cells

LOG = logging.getLogger(__name__)


class FlavorExtraSpecNotFound(exception.NotFound):
    msg_fmt = "Flavor {flavor} has no extra specs with key {key}."


def flavors_from_config(lines: Sequence[str], spec_lines: Sequence[str] = ()) -> list[Flavor]:
    """Parse ``[api] flavor`` (name:vcpus:ram_mb[:disk_gb[:id]]) and ``flavor_extra_spec``.

    :raises Invalid: naming the line that is wrong.
    """
    specs: dict[str, dict[str, str]] = {}
    for line in spec_lines:
        name, sep, spec = line.strip().partition(":")
        key, eq, value = spec.partition("=")
        if not (sep and eq and name and key.strip()):
            raise exception.Invalid(
                reason=f"[api] flavor_extra_spec {line!r}: use <flavor name>:<key>=<value>"
            )
        specs.setdefault(name, {})[key.strip()] = value.strip()
    flavors = [_config_flavor(line, specs) for line in lines]
    unknown = set(specs) - {f.name for f in flavors}
    if unknown:
        raise exception.Invalid(
            reason=f"[api] flavor_extra_spec names unconfigured flavors: {sorted(unknown)}"
        )
    return flavors


def _config_flavor(line: str, specs: Mapping[str, Mapping[str, str]]) -> Flavor:
    fields = [f.strip() for f in line.strip().split(":")]
    try:
        if not 3 <= len(fields) <= 5:
            raise ValueError(line)
        name, vcpus, ram_mb = fields[0], int(fields[1]), int(fields[2])
        disk_gb = int(fields[3]) if len(fields) > 3 and fields[3] else 0
    except ValueError:
        raise exception.Invalid(
            reason=f"[api] flavor {line!r}: use name:vcpus:ram_mb[:disk_gb[:id]]"
        ) from None
    flavor_id = fields[4] if len(fields) > 4 and fields[4] else name
    flavor = Flavor(name, vcpus, ram_mb, disk_gb, flavor_id, dict(specs.get(name, {})))
    try:
        check_flavor_id(flavor_id)
        return check_flavor(flavor)
    except exception.Invalid as exc:
        raise exception.Invalid(reason=f"[api] flavor {line!r}: {exc}") from None


class FlavorCatalog:
    """The flavor calls of :class:`~qsched.compute.api.ComputeAPI`, which holds the
    cells, the policy and the options (a part of its class, kept apart).

    Every cell holds every flavor: a read is the first cell's that answers
    (:meth:`~qsched.compute.target.Cells.read`), so one cell down stops no read; a write
    goes to every cell (:meth:`~qsched.compute.target.Cells.every`), and one a cell does
    not answer fails with 503 once the other cells were written: every such write is
    idempotent (a flavor by its id), so the client's retry completes it. A create whose
    id this call made is taken back from the cells that took it before the 503, so a
    retry does not meet a half-made one.
    """

    cells: Cells
    policy: Policy
    api: APIOptions

    if TYPE_CHECKING:  # the other parts of ComputeAPI

        def page_size(self, limit: int | None) -> int: ...

    def get_flavor(self, flavor_id: str, context: RequestContext | None = None) -> Flavor:
        """A flavor; with ``context``, only one the caller may see (public, granted to
        its project, or any for an admin), as Nova shows flavors.

        :raises FlavorNotFound:
        :raises BackendUnavailable: no cell answered.
        """
        flavor = self.cells.read(lambda cell: cell.flavors.get(flavor_id))
        if context is not None and not self.cells.reader.sees(context, flavor):
            raise FlavorNotFound(flavor=flavor_id)
        return flavor

    def flavor_extra_specs(self, context: RequestContext, flavor_id: str) -> Mapping[str, str]:
        """A flavor's extra specs (``os-flavor-extra-specs:index``: readers and admins).

        :raises Forbidden, FlavorNotFound:
        """
        self.policy.authorize(context, flavors_policy.SPECS_INDEX)
        return self.get_flavor(flavor_id, context).extra_specs

    def flavor_extra_spec(self, context: RequestContext, flavor_id: str, key: str) -> str:
        """One extra spec (``os-flavor-extra-specs:show``: readers and admins).

        :raises Forbidden, FlavorNotFound, FlavorExtraSpecNotFound:
        """
        self.policy.authorize(context, flavors_policy.SPECS_SHOW)
        specs = self.get_flavor(flavor_id, context).extra_specs
        if key not in specs:
            raise FlavorExtraSpecNotFound(flavor=flavor_id, key=key)
        return specs[key]

    def list_flavors(
        self, context: RequestContext | None = None, query: FlavorQuery | None = None
    ) -> builtins.list[Flavor]:
        """Every flavor sorted by id; with ``context``, the page of those the caller may
        list that ``query`` asks for (:func:`qsched.flavors.select`).

        :raises Invalid, MarkerNotFound: a bad query.
        """
        catalog = self.cells.read(lambda cell: cell.flavors.list())
        if context is None:
            return catalog
        query = query or FlavorQuery()
        query = dataclasses.replace(query, limit=self.page_size(query.limit))
        return select(catalog, query, context.project_id, self.policy.is_admin(context))

    def show_extra_specs_in_views(self, context: RequestContext) -> bool:
        """Whether flavor views carry extra specs (2.61+): ``os-flavor-extra-specs:index``."""
        return self.policy.allows(context, flavors_policy.SPECS_INDEX)

    def shows_extra_specs(self, context: RequestContext) -> bool:
        """Whether the caller sees a server's flavor's extra specs (2.47)."""
        return self.policy.allows(context, flavors_policy.SPECS_INDEX)

    def flavor_access(self, context: RequestContext, flavor_id: str) -> Flavor:
        """``os-flavor-access`` (admin by default): a private flavor, to list its grants.

        :raises Forbidden, FlavorNotFound, NoAccessListForPublic:
        """
        self.policy.authorize(context, flavors_policy.ACCESS)
        flavor = self.get_flavor(flavor_id, context)
        if flavor.is_public:
            raise NoAccessListForPublic()
        return flavor

    # -- writes: every cell --

    def update_flavor(
        self, context: RequestContext, flavor_id: str, description: str | None
    ) -> Flavor:
        """``os-flavor-manage:update`` (admin by default): set the description (2.55+).

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_UPDATE)
        return self._update(flavor_id, lambda f: dataclasses.replace(f, description=description))

    def add_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str, refuse_public: bool
    ) -> Flavor:
        """``os-flavor-access:add_tenant_access`` (admin by default): grant a project a
        private flavor; a public one is refused if ``refuse_public`` (2.7+).

        :raises Forbidden, FlavorNotFound, PublicFlavorAccess, FlavorAccessExists:
        """
        self.policy.authorize(context, flavors_policy.ACCESS_ADD, {})
        return self._update(flavor_id, lambda f: grant(f, project_id, refuse_public),
                            gone(FlavorAccessExists))  # fmt: skip

    def remove_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str
    ) -> Flavor:
        """``os-flavor-access:remove_tenant_access`` (admin by default). A server booting
        meanwhile with the flavor kept in memory is refused: the grants are part of the
        stored form that the create script checks.

        :raises Forbidden, FlavorNotFound, FlavorAccessNotFound:
        """
        self.policy.authorize(context, flavors_policy.ACCESS_REMOVE, {})
        return self._update(flavor_id, lambda f: revoke(f, project_id),
                            gone(FlavorAccessNotFound))  # fmt: skip

    def set_flavor_extra_spec(
        self, context: RequestContext, flavor_id: str, key: str, value: str
    ) -> Flavor:
        """``os-flavor-extra-specs:update`` (admin by default): add or change one spec,
        checked with the others.

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.SPECS_UPDATE, {})
        return self._update(
            flavor_id, lambda f: dataclasses.replace(f, extra_specs={**f.extra_specs, key: value})
        )

    def create_flavor(self, context: RequestContext, flavor: Flavor) -> Flavor:
        """``os-flavor-manage:create`` (admin by default). A flavor without an id gets a
        new UUID, as in Nova, made once for every cell. A cell that has the very flavor
        already counts as written (a retry).

        :raises Forbidden, FlavorExists, Invalid:
        :raises BackendUnavailable: a cell did not answer (503); the cells that took
            the flavor from this call give it back first when its id was made here.
        """
        self.policy.authorize(context, flavors_policy.MANAGE_CREATE)
        made_here = not flavor.id
        if made_here:
            flavor = dataclasses.replace(flavor, id=str(uuidlib.uuid4()))
        created: builtins.list[Cell] = []

        def create(cell: Cell) -> Flavor:
            found = cell.flavors.create(flavor)
            created.append(cell)
            return found

        def same(cell: Cell, exc: Exception) -> bool:
            return isinstance(exc, exception.FlavorExists) and _has_flavor(cell, flavor)

        try:
            return self.cells.every(create, same)
        except exception.BackendUnavailable:
            if made_here:
                take_back(created, lambda cell: cell.flavors.delete(flavor.id))
            raise

    def delete_flavor(self, context: RequestContext, flavor_id: str) -> Flavor:
        """``os-flavor-manage:delete`` (admin by default); servers keep the copy they
        were booted with.

        :raises Forbidden, FlavorNotFound:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_DELETE)
        return self.cells.every(lambda cell: cell.flavors.delete(flavor_id), gone(FlavorNotFound))

    def set_flavor_extra_specs(
        self, context: RequestContext, flavor_id: str, specs: Mapping[str, str]
    ) -> Flavor:
        """``os-flavor-extra-specs:create`` (admin by default): add or change extra specs
        (Nova syntax), checked as a whole.

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.SPECS_CREATE)
        return self._update(
            flavor_id, lambda f: dataclasses.replace(f, extra_specs={**f.extra_specs, **specs})
        )

    def delete_flavor_extra_spec(self, context: RequestContext, flavor_id: str, key: str) -> Flavor:
        """``os-flavor-extra-specs:delete`` (admin by default): remove one extra spec.

        :raises Forbidden, FlavorNotFound, FlavorExtraSpecNotFound:
        """
        self.policy.authorize(context, flavors_policy.SPECS_DELETE)

        def drop(flavor: Flavor) -> Flavor:
            if key not in flavor.extra_specs:
                raise FlavorExtraSpecNotFound(flavor=flavor_id, key=key)
            specs = {k: v for k, v in flavor.extra_specs.items() if k != key}
            return dataclasses.replace(flavor, extra_specs=specs)

        return self._update(flavor_id, drop, gone(FlavorExtraSpecNotFound))

    def _update(
        self, flavor_id: str, change: Callable[[Flavor], Flavor], done: Done = never
    ) -> Flavor:
        """``change`` flavor ``flavor_id`` in every cell (each cell's catalog checks it)."""
        return self.cells.every(lambda cell: cell.flavors.update(flavor_id, change), done)

    def seed_flavors(self) -> builtins.list[Flavor]:
        """Create or update the flavors of ``[api] flavor`` in every joined cell; return
        them. A cell not joined is skipped, logged: its ledger did not answer, and it
        gets them when it joins.

        :raises Invalid: a malformed option line, or a flavor that does not check.
        :raises FlavorExists: a configured name is taken by another id.
        """
        seeded = flavors_from_config(self.api.flavor, self.api.flavor_extra_spec)
        for name in sorted(self.cells.unjoined):
            LOG.warning("cells: cell %s is not joined; [api] flavor is not written there", name)
        for cell in self.cells.joined().values():
            for flavor in seeded:
                if cell.flavors.put(flavor):
                    LOG.info("flavor %s (%s) written from configuration", flavor.name, flavor.id)
        return seeded


def _has_flavor(cell: Cell, flavor: Flavor) -> bool:
    try:
        return cell.flavors.get(flavor.id) == flavor
    except FlavorNotFound:
        return False
