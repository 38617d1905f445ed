"""The front door's server groups: create, show, list, delete, and the ``group`` hint.

No HTTP here (:mod:`qsched.api.server_groups` parses and renders Nova's shapes).
Nova's rules and words: ``os_compute_api:os-server-groups:*`` (:mod:`qsched.policies.
server_groups`), "Only anti-affinity policy supports rules.", "Quota exceeded, too
many server groups.". A group of another project is not found (404, or 400 when a
boot names it) unless the caller is an admin, as in Nova, whose group lookups are
scoped to the caller's project; the rules are asked after that.

Where a member goes (:func:`route`): a member of an affinity group that already has a
host is sent to that host's own queue, so it never waits in a class queue that other
hosts consume; a soft-affinity member to the host holding most of its group, if that
host's agent is alive. Every other member goes to its class queue; the claim keeps the
hard policies (``docs/server-groups.rst``).
"""

from __future__ import annotations

import builtins
import heapq
import itertools
import uuid as uuidlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from qsched import exception
from qsched.compute.visible import may_see
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.records import (
    AFFINITY,
    ANTI_AFFINITY,
    GROUP_POLICIES,
    SOFT_AFFINITY,
    ServerGroup,
)
from qsched.policies import server_groups as rules
from qsched.policy import Policy
from qsched.resources import check_uuid

if TYPE_CHECKING:
    from qsched.compute.target import Cells


class RulesNeedAntiAffinity(exception.Invalid):
    msg_fmt = "Only anti-affinity policy supports rules."


class GroupRefNotFound(exception.Invalid):
    """A boot naming a group that does not exist, or one the caller may not see (400)."""

    msg_fmt = "Instance group {group} could not be found."


class ServerGroups:
    """Server groups in one cell: its stores and the rules of who may do what."""

    def __init__(self, stores: Stores, policy: Policy) -> None:
        self.stores = stores
        self.policy = policy

    def checked(
        self,
        context: RequestContext,
        name: str,
        policy: str,
        rules_: Mapping[str, int] | None = None,
    ) -> ServerGroup:
        """The group :meth:`Groups.create` writes, with a new uuid, once the caller and
        the request are checked; nothing is written.

        :raises Forbidden: ``os-server-groups:create`` refuses the caller (403).
        :raises RulesNeedAntiAffinity: rules for another policy (400).
        :raises Invalid: an unknown policy or rule (the API's schema says so first).
        """
        self.policy.authorize(context, rules.CREATE)
        wanted = dict(rules_ or {})
        if policy not in GROUP_POLICIES:
            raise exception.Invalid(reason=f"policy {policy!r}: use one of {GROUP_POLICIES}")
        if wanted and policy != ANTI_AFFINITY:
            raise RulesNeedAntiAffinity()
        most = wanted.pop("max_server_per_host", None)
        if wanted or (most is not None and (type(most) is not int or most < 1)):
            raise exception.Invalid(reason="rules may only set max_server_per_host >= 1")
        return ServerGroup(str(uuidlib.uuid4()), name, context.project_id, context.user_id,
                           policy, most)  # fmt: skip

    def get(self, context: RequestContext, uuid: str) -> ServerGroup:
        """One group, with its members (servers not DELETED).

        :raises GroupNotFound: unknown, malformed uuid, or another project's and the
            caller is no admin (404).
        :raises Forbidden: ``os-server-groups:show`` refuses the caller (403).
        """
        group = self._find(context, uuid)
        self.policy.authorize(context, rules.SHOW, {"project_id": group.project_id})
        return group

    def list(
        self,
        context: RequestContext,
        all_projects: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> builtins.list[ServerGroup]:
        """The caller's project's groups, oldest first; every project's for those
        ``os-server-groups:index:all_projects`` allows (others get their own, as in Nova).

        :raises Forbidden: ``os-server-groups:index`` refuses the caller.
        """
        self.policy.authorize(context, rules.INDEX)
        if all_projects and self.policy.allows(context, rules.INDEX_ALL_PROJECTS):
            found = self.stores.groups.list_all()
        else:
            found = self.stores.groups.list_project(context.project_id)
        return found[offset:] if limit is None else found[offset : offset + limit]

    def delete(self, context: RequestContext, uuid: str) -> None:
        """Delete a group; its servers live on in no group, as in Nova.

        :raises GroupNotFound, Forbidden: as :meth:`get`.
        """
        group = self._find(context, uuid, members=False)
        self.policy.authorize(context, rules.DELETE, {"project_id": group.project_id})
        self.stores.groups.delete(group.uuid)

    def for_boot(self, context: RequestContext, uuid: str) -> ServerGroup:
        """The group a boot's ``group`` hint names, if the caller may see it (O(1)).

        :raises GroupRefNotFound: unknown, malformed, or another project's (400).
        """
        try:
            return self._find(context, uuid, members=False)
        except exception.GroupNotFound:
            raise GroupRefNotFound(group=uuid) from None

    def route(self, group: ServerGroup) -> str | None:
        """The host a new member of ``group`` is sent to, or None for its class queue.

        Reads the group's hosts (at most its member limit) and, for soft-affinity,
        whether that host's agent is alive: O(1) in the number of hosts.
        """
        if group.policy not in (AFFINITY, SOFT_AFFINITY):
            return None
        hosts = self.stores.groups.hosts(group.uuid)
        if not hosts:
            return None
        host = max(sorted(hosts), key=lambda h: hosts[h])
        if group.policy == SOFT_AFFINITY and not self.stores.agents.alive(host):
            return None  # a preference never waits for a dead host
        return host

    def _find(self, context: RequestContext, uuid: str, members: bool = True) -> ServerGroup:
        """A group the caller may see, before any rule is asked (404 otherwise)."""
        try:
            group = self.stores.groups.get(check_uuid(uuid, "Server group UUID"), members)
        except exception.InvalidUUID:
            raise exception.GroupNotFound(group=uuid) from None
        if not may_see(context, group):
            raise exception.GroupNotFound(group=uuid)
        return group


class Groups:
    """The server groups of the front door's cells: each group in one cell, whose claim
    scripts keep its policy and where every member boots (over several cells, its
    group mapping in the API keyspace names it: :mod:`qsched.cells.groups`)."""

    def __init__(self, cells: Cells) -> None:
        self.cells = cells

    def create(
        self,
        context: RequestContext,
        name: str,
        policy: str,
        rules_: Mapping[str, int] | None = None,
    ) -> ServerGroup:
        """A new group of the caller's project, in the cell
        :meth:`~qsched.compute.target.Cells.new_group` gives it.

        :raises Forbidden: ``os-server-groups:create`` refuses the caller (403).
        :raises RulesNeedAntiAffinity: rules for another policy (400).
        :raises Invalid: an unknown policy or rule (the API's schema says so first).
        :raises ServerGroupLimitExceeded: ``[quota] server_groups`` (403); nothing is held.
        :raises BackendUnavailable: a ledger did not answer (503).
        """
        group = self.cells.reader.groups.checked(context, name, policy, rules_)
        return self.cells.new_group(group, lambda cell: cell.stores.groups.create(group))

    def get(self, context: RequestContext, uuid: str) -> ServerGroup:
        """As :meth:`ServerGroups.get`, in the group's cell.

        :raises GroupNotFound: no such group, or as :meth:`ServerGroups.get` (404).
        """
        return self.cells.group_cell(uuid).groups.get(context, uuid)

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
        found = [cell.groups.list(context, all_projects, most) for cell in self.cells.each()]
        merged = heapq.merge(*found, key=lambda group: (group.created_at, group.uuid))
        return builtins.list(itertools.islice(merged, offset, most))

    def delete(self, context: RequestContext, uuid: str) -> None:
        """As :meth:`ServerGroups.delete` in the group's cell; then what was kept of it
        beside the cell is forgotten (:meth:`~qsched.compute.target.Cells.group_gone`).

        :raises GroupNotFound, Forbidden: as :meth:`ServerGroups.delete`.
        """
        try:
            self.cells.group_cell(uuid).groups.delete(context, uuid)
        except exception.GroupNotFound:
            self.cells.group_gone(context, uuid, found=False)
            raise
        self.cells.group_gone(context, uuid, found=True)
