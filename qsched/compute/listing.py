"""Servers as ``GET /servers`` lists them, for :class:`~qsched.compute.api.ComputeAPI`,
gathered over its cells (one cell's page: :func:`cell_page`).

A member's list reads their project's records only; an admin's list of every project
pages the cell's index of live servers a chunk at a time; a sort other than the
default, or deleted servers, read the whole index (admins only). The query itself is
pure: :mod:`qsched.compute.list_query`.
"""

from __future__ import annotations

import builtins
import heapq
import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from qsched import exception
from qsched.compute import list_query as server_list
from qsched.compute.visible import may_see
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import Instance
from qsched.policies import servers as servers_policy
from qsched.policy import Policy

if TYPE_CHECKING:
    from qsched.compute.target import Cells

LOG = logging.getLogger(__name__)

_SCAN_CHUNK = 1000  # records read per round trip when an admin's list scans the cell
_PAGE_CHUNK = 100  # the least read per round trip while an admin's filtered page fills


#: detail or not -> the rule of the list, and the rule of listing other projects
_LIST_RULES = {
    False: (servers_policy.INDEX, servers_policy.INDEX_ALL_TENANTS),
    True: (servers_policy.DETAIL, servers_policy.DETAIL_ALL_TENANTS),
}


class ServerListing:
    """The list calls of :class:`~qsched.compute.api.ComputeAPI`, which holds the cells,
    the policy and the page limit (a part of its class, kept apart)."""

    cells: Cells
    policy: Policy
    max_limit: int  # most items one list call returns

    def list(
        self,
        context: RequestContext,
        project_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        marker: str | None = None,
        detail: bool = False,
        reservation_id: str | None = None,
        params: Mapping[str, Sequence[str]] | None = None,
        version: tuple[int, int] = (2, 1),
    ) -> builtins.list[Instance]:
        """Servers as Nova's ``GET /servers`` lists them, newest first unless sorted.

        ``params``: the query, each parameter's values in order, read as
        :func:`qsched.compute.list_query.parse` says for ``version``; the keywords are
        short forms of the same parameters (``project_id`` asks for ``all_tenants``).
        A member's list reads their project's records only; an admin's list of
        every project pages the cell's index of live servers (a sort other than
        the default, or DELETED servers, reads the whole index: admins only).

        Over several cells, each cell lists its page after the same place in the
        query's order, and the pages are merged on that order and cut at the limit:
        O(cells x limit) beyond the cells' own work. A marker may be any cell's: its
        cell (:meth:`~qsched.compute.target.Cells.place_of_marker`) gives its record,
        whose place in the order every cell lists after (Nova's cross-cell marker).

        :raises Forbidden: ``os_compute_api:servers:index`` (``:detail``) refuses them,
            or ``...:get_all_tenants`` refuses ``all_tenants``; see also
            :func:`~qsched.compute.list_query.parse`.
        :raises MarkerNotFound: ``marker`` is not among them.
        :raises Invalid: a negative ``limit``; see :func:`~qsched.compute.list_query.parse`.
        """
        query = self.list_query(context, project_id, status, limit, marker, detail,
                                reservation_id, params, version)  # fmt: skip
        if query.empty:
            return []
        size = self.page_size(query.limit)
        after = self._after_marker(context, query) if query.marker else None
        pages = [cell_page(cell.stores, query, size, after) for cell in self.cells.each()]
        if len(pages) == 1:
            return pages[0]
        return builtins.list(itertools.islice(heapq.merge(*pages, key=query.sort_key), size))

    def _after_marker(
        self, context: RequestContext, query: server_list.ServerQuery
    ) -> tuple[Any, ...] | None:
        """Where the marker's record sorts, when the list gathers over several cells
        (None: one cell, whose page finds the marker itself).

        :raises MarkerNotFound: no server ``marker`` the caller may see.
        """
        marker = str(query.marker)
        try:
            cell = self.cells.place_of_marker(marker)
            if cell is None:
                return None
            record = cell.stores.instances.get(marker)
        except exception.InstanceNotFound:
            raise exception.MarkerNotFound(marker=marker) from None
        if not may_see(context, record):
            raise exception.MarkerNotFound(marker=marker)
        return query.sort_key(record)

    def list_query(
        self,
        context: RequestContext,
        project_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        marker: str | None = None,
        detail: bool = False,
        reservation_id: str | None = None,
        params: Mapping[str, Sequence[str]] | None = None,
        version: tuple[int, int] = (2, 1),
    ) -> server_list.ServerQuery:
        """The query of a :meth:`list` call, read and allowed (same arguments and errors
        but ``exception.MarkerNotFound``)."""
        rule, all_projects = _LIST_RULES[detail]
        self.policy.authorize(context, rule)
        if limit is not None and limit < 0:
            raise exception.Invalid(reason="limit must be an integer >= 0")
        asked = {k: list(v) for k, v in (params or {}).items()}
        shorthand = {"status": status, "marker": marker, "reservation_id": reservation_id,
                     "project_id": project_id}  # fmt: skip
        asked.update({k: [v] for k, v in shorthand.items() if v})
        if project_id:
            asked.setdefault("all_tenants", ["1"])
        all_filters = self.policy.allows(context, servers_policy.ALLOW_ALL_FILTERS)
        query, all_tenants = server_list.parse(
            asked, version, context.project_id, all_filters, context.is_admin, limit
        )
        if all_tenants:
            self.policy.authorize(context, all_projects)
        return query

    def shows_host(self, context: RequestContext) -> bool:
        """Whether the caller sees where servers run (Nova's extended server attributes)."""
        return self.policy.allows(context, servers_policy.EXTENDED_ATTRIBUTES)

    def page_size(self, limit: int | None) -> int:
        """How many items a list call returns at most for ``limit``."""
        return self.max_limit if limit is None else min(limit, self.max_limit)


def cell_page(
    stores: Stores, query: server_list.ServerQuery, size: int, after: tuple[Any, ...] | None
) -> builtins.list[Instance]:
    """One cell's page of ``query``, at most ``size``; ``after``: what sorts after this
    :meth:`~qsched.compute.list_query.ServerQuery.sort_key` instead of after the
    marker (the marker is then another cell's).

    :raises MarkerNotFound: the marker is not among them.
    """
    fast = query.project_id is None and query.newest_first and not query.with_deleted
    if fast and after is None:
        return _page_all(stores, query, size)
    found = query.ordered(i for i in _candidates(stores, query) if query.matches(i))
    if after is not None:
        return [i for i in found if query.sort_key(i) > after][:size]
    if query.marker:
        index = next((n for n, i in enumerate(found) if i.uuid == query.marker), None)
        if index is None:
            raise exception.MarkerNotFound(marker=query.marker)
        found = found[index + 1 :]
    return found[:size]


def _candidates(stores: Stores, query: server_list.ServerQuery) -> builtins.list[Instance]:
    """The records a query looks at: one project's (and its recent deletions), or,
    for an admin, every live one and the cell's recent deletions."""
    instances = stores.instances
    if query.project_id is not None:
        found = [] if query.deleted else instances.list_project(query.project_id)
    else:
        found = [] if query.deleted else _all_live(stores)
    if query.with_deleted:
        since = query.changes_since or 0.0
        uuids = instances.deleted_since(since, query.project_id)
        found += [i for i in instances.get_many(uuids).values()
                  if query.project_id in (None, i.project_id)]  # fmt: skip
    return found


def _all_live(stores: Stores) -> builtins.list[Instance]:
    """Every live record of the cell (an admin's sorted list: it scans the index)."""
    found: builtins.list[Instance] = []
    after: str | None = None
    while True:
        uuids = stores.instances.newest(_SCAN_CHUNK, after)
        if not uuids:
            return found
        found += stores.instances.get_many(uuids).values()
        after = uuids[-1]


def _page_all(stores: Stores, query: server_list.ServerQuery, size: int) -> builtins.list[Instance]:
    """An admin's page of every project's servers, newest first: the live index
    read a chunk at a time from the marker until the page is full."""
    instances = stores.instances
    if query.marker and instances.newest(0, query.marker) is None:
        raise exception.MarkerNotFound(marker=query.marker)
    found: builtins.list[Instance] = []
    after = query.marker
    while len(found) < size:
        uuids = instances.newest(max(size - len(found), _PAGE_CHUNK), after) or []
        if not uuids:
            break
        records = instances.get_many(uuids)
        found += [records[u] for u in uuids if u in records and query.matches(records[u])]
        after = uuids[-1]
    return found[:size]
