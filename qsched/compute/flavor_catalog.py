"""The flavor catalog (``/flavors``, ``os-flavor-manage``, ``os-flavor-access``,
``os-flavor-extra-specs``), as :class:`~qsched.compute.api.ComputeAPI` serves it, and
the flavors of ``[api] flavor``.

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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from qsched import exception
from qsched.conf import APIOptions
from qsched.context import RequestContext
from qsched.exception import FlavorNotFound
from qsched.flavors import (
    Flavor,
    FlavorQuery,
    NoAccessListForPublic,
    check_flavor,
    check_flavor_id,
    grant,
    revoke,
    select,
)
from qsched.ledger.base import (
    FlavorStore,
)
from qsched.policies import flavors as flavors_policy
from qsched.policy import Policy

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
    catalog, the policy and the options (a part of its class, kept apart)."""

    flavors: FlavorStore
    policy: Policy
    api: APIOptions

    if TYPE_CHECKING:  # the other parts of ComputeAPI

        def page_size(self, limit: int | None) -> int: ...

    def get_flavor(self, flavor_id: str, context: RequestContext | None = None) -> Flavor:
        """A flavor; with ``context``, only one the caller may see (public, granted to
        its project, or any for an admin), as Nova shows flavors.

        :raises FlavorNotFound:
        """
        flavor = self.flavors.get(flavor_id)
        if context is not None and not self._sees(context, flavor):
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
        catalog = self.flavors.list()
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

    def update_flavor(
        self, context: RequestContext, flavor_id: str, description: str | None
    ) -> Flavor:
        """``os-flavor-manage:update`` (admin by default): set the description (2.55+).

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_UPDATE)
        return self.flavors.update(
            flavor_id, lambda f: dataclasses.replace(f, description=description)
        )

    def flavor_access(self, context: RequestContext, flavor_id: str) -> Flavor:
        """``os-flavor-access`` (admin by default): a private flavor, to list its grants.

        :raises Forbidden, FlavorNotFound, NoAccessListForPublic:
        """
        self.policy.authorize(context, flavors_policy.ACCESS)
        flavor = self.get_flavor(flavor_id, context)
        if flavor.is_public:
            raise NoAccessListForPublic()
        return flavor

    def add_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str, refuse_public: bool
    ) -> Flavor:
        """``os-flavor-access:add_tenant_access`` (admin by default): grant a project a
        private flavor; a public one is refused if ``refuse_public`` (2.7+).

        :raises Forbidden, FlavorNotFound, PublicFlavorAccess, FlavorAccessExists:
        """
        self.policy.authorize(context, flavors_policy.ACCESS_ADD, {})
        return self.flavors.update(flavor_id, lambda f: grant(f, project_id, refuse_public))

    def remove_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str
    ) -> Flavor:
        """``os-flavor-access:remove_tenant_access`` (admin by default). A server booting
        meanwhile with the flavor kept in memory is refused: the grants are part of the
        stored form that the create script checks.

        :raises Forbidden, FlavorNotFound, FlavorAccessNotFound:
        """
        self.policy.authorize(context, flavors_policy.ACCESS_REMOVE, {})
        return self.flavors.update(flavor_id, lambda f: revoke(f, project_id))

    def set_flavor_extra_spec(
        self, context: RequestContext, flavor_id: str, key: str, value: str
    ) -> Flavor:
        """``os-flavor-extra-specs:update`` (admin by default): add or change one spec,
        checked with the others.

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.SPECS_UPDATE, {})
        return self.flavors.update(
            flavor_id,
            lambda f: dataclasses.replace(f, extra_specs={**f.extra_specs, key: value}),
        )

    def create_flavor(self, context: RequestContext, flavor: Flavor) -> Flavor:
        """``os-flavor-manage:create`` (admin by default). A flavor without an id gets a
        new UUID, as in Nova.

        :raises Forbidden, FlavorExists, Invalid:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_CREATE)
        if not flavor.id:
            flavor = dataclasses.replace(flavor, id=str(uuidlib.uuid4()))
        return self.flavors.create(flavor)

    def delete_flavor(self, context: RequestContext, flavor_id: str) -> Flavor:
        """``os-flavor-manage:delete`` (admin by default); servers keep the copy they
        were booted with.

        :raises Forbidden, FlavorNotFound:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_DELETE)
        return self.flavors.delete(flavor_id)

    def set_flavor_extra_specs(
        self, context: RequestContext, flavor_id: str, specs: Mapping[str, str]
    ) -> Flavor:
        """``os-flavor-extra-specs:create`` (admin by default): add or change extra specs
        (Nova syntax), checked as a whole.

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.SPECS_CREATE)
        return self.flavors.update(
            flavor_id,
            lambda f: dataclasses.replace(f, extra_specs={**f.extra_specs, **specs}),
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

        return self.flavors.update(flavor_id, drop)

    def seed_flavors(self) -> builtins.list[Flavor]:
        """Create or update the flavors of ``[api] flavor``; return them.

        :raises Invalid: a malformed option line, or a flavor that does not check.
        :raises FlavorExists: a configured name is taken by another id.
        """
        seeded = flavors_from_config(self.api.flavor, self.api.flavor_extra_spec)
        for flavor in seeded:
            if self.flavors.put(flavor):
                LOG.info("flavor %s (%s) written from configuration", flavor.name, flavor.id)
        return seeded

    def _sees(self, context: RequestContext, flavor: Flavor) -> bool:
        """Public, granted to the caller's project, or the caller is an admin (O(1))."""
        return flavor.visible_to(context.project_id) or self.policy.is_admin(context)
