"""/v2.1/os-migrations and /v2.1/servers/{server_id}/migrations[/{migration_id}]: the
ledger's migration records in Nova's shapes (docs/api.rst, "Migrations"); and what an
admin asks of a live migration in progress: ``force_complete`` (2.22) and abort
(``DELETE``, 2.24; one still waiting or preparing too from 2.65), docs/moves.rst.

``os-migrations`` (``os_compute_api:os-migrations:index``, admin) lists every cell's
migrations newest first, at every microversion: Nova's filters ``hidden``, ``host``,
``status``, ``instance_uuid``, ``source_compute`` and ``migration_type``; from 2.23
``migration_type`` on each item and ``links`` on a live migration in progress; from
2.59 ``uuid``, paging by ``limit`` and ``marker`` (a migration's uuid) with
``migrations_links``, and ``changes-since``; from 2.66 ``changes-before``; from 2.80
the ``user_id`` and ``project_id`` filters and fields (written for when
:data:`qsched.api.microversion.MAX` reaches 2.80). Any other query parameter is a 400
at every version, as on the other operators' views, where Nova ignores them before
2.59; before 2.59 a list holds at most ``[api] max_limit`` migrations (Nova's is whole).

A server's migrations, from 2.23 (404 before, as Nova): its live migrations in
progress (``os_compute_api:servers:migrations:index`` and ``:show``, admin), with
``uuid`` from 2.59 and ``user_id`` and ``project_id`` from 2.80.

Shown with fixed or derived values: ``dest_host`` (the destination's address) is
null, agents report none; ``old_instance_type_id`` and ``new_instance_type_id``
(Nova's internal integer flavor ids) are the flavor's id when it is an integer, else
null; a live migration's progress (``memory_*_bytes``, ``disk_*_bytes``) is null, no
driver reports it. Nova's schemas allow null for each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import falcon

from qsched import exception
from qsched.api import (
    PREFIX,
    Handler,
    context_of,
    links,
    microversion,
    read_json,
    usage_time,
)
from qsched.api.microversion import Version
from qsched.api.query import refuse_unknown, unknown_message
from qsched.api.schemas.parameter_types import FALSE, TRUE, to_bool
from qsched.api.schemas.validation import compiled, query_int, validate
from qsched.compute.list_query import query_time
from qsched.compute.migrations import MigrationFilter, live_in_progress
from qsched.ledger.base import Migration

FORCE_COMPLETE: Version = (2, 22)
MIGRATION_TYPE: Version = (2, 23)  # also: a server's migrations
ABORT: Version = (2, 24)
ABORT_IN_QUEUE: Version = (2, 65)
PAGING: Version = (2, 59)  # also: uuid, changes-since
CHANGES_BEFORE: Version = (2, 66)
USER_PROJECT: Version = (2, 80)

#: ``{"force_complete": null}``, Nova's schema
FORCE_COMPLETE_BODY = compiled(
    {
        "type": "object",
        "properties": {"force_complete": {"type": "null"}},
        "required": ["force_complete"],
        "additionalProperties": False,
    }
)
#: the filters of every version; given several times, the last one counts (as Nova)
FILTERS = ("hidden", "host", "status", "instance_uuid", "source_compute", "migration_type")
#: the parameters each version adds, each to be given once (Nova's ``single_param``)
_ADDED = (
    (PAGING, ("limit", "marker", "changes-since")),
    (CHANGES_BEFORE, ("changes-before",)),
    (USER_PROJECT, ("user_id", "project_id")),
)
#: what a query parameter holds as falcon reads it: one value, or the values repeated
Params = Mapping[str, str | list[str]]


@dataclasses.dataclass(frozen=True)
class ListQuery:
    """What an ``os-migrations`` request asks for: its filters and its page."""

    wanted: MigrationFilter
    limit: int | None = None
    marker: str | None = None


class Migrations(Handler):
    """``GET /v2.1/os-migrations``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        query = list_query(req.params, version)
        part = self.compute.migrations
        found = part.list(context_of(req), query.wanted, query.limit, query.marker)
        base = self.base(req)
        resp.media = {"migrations": [migration_view(m, version, base) for m in found]}
        if version < PAGING:
            return
        size = part.max_limit if query.limit is None else min(query.limit, part.max_limit)
        if size and len(found) == size:
            resp.media["migrations_links"] = [_next_link(req, base, found[-1].uuid)]


class ServerMigrations(Handler):
    """``GET /v2.1/servers/{server_id}/migrations``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        version = _server_version(req, "/servers/{server_id}/migrations")
        found = self.compute.migrations.list_live(context_of(req), server_id)
        resp.media = {"migrations": [server_migration_view(m, version) for m in found]}


class ServerMigration(Handler):
    """``GET /v2.1/servers/{server_id}/migrations/{migration_id}``."""

    def on_get(
        self, req: falcon.Request, resp: falcon.Response, server_id: str, migration_id: str
    ) -> None:
        version = _server_version(req, "/servers/{server_id}/migrations/{migration_id}")
        found = self.compute.migrations.get_live(context_of(req), server_id, migration_id)
        resp.media = {"migration": server_migration_view(found, version)}

    def on_delete(
        self, req: falcon.Request, resp: falcon.Response, server_id: str, migration_id: str
    ) -> None:
        """Abort a live migration (2.24): 202, no body."""
        version = microversion.current(req)
        if version < ABORT:
            raise falcon.HTTPNotFound(
                description="DELETE /servers/{server_id}/migrations/{migration_id} is served "
                "from microversion 2.24."
            )
        in_queue = version >= ABORT_IN_QUEUE
        self.compute.moves.abort(context_of(req), server_id, migration_id, in_queue)
        resp.status = falcon.HTTP_202


class ServerMigrationAction(Handler):
    """``POST /v2.1/servers/{server_id}/migrations/{migration_id}/action``:
    ``{"force_complete": null}`` from 2.22, 202 and no body."""

    def on_post(
        self, req: falcon.Request, resp: falcon.Response, server_id: str, migration_id: str
    ) -> None:
        if microversion.current(req) < FORCE_COMPLETE:
            raise falcon.HTTPNotFound(
                description="POST /servers/{server_id}/migrations/{migration_id}/action is "
                "served from microversion 2.22."
            )
        validate(FORCE_COMPLETE_BODY, read_json(req, self.max_body))
        self.compute.moves.force_complete(context_of(req), server_id, migration_id)
        resp.status = falcon.HTTP_202


def _server_version(req: falcon.Request, route: str) -> Version:
    """The request's microversion, 2.23 or later; no query parameter.

    :raises HTTPNotFound: before 2.23 (Nova has no such route there).
    :raises Invalid: a query parameter (400).
    """
    version = microversion.current(req)
    if version < MIGRATION_TYPE:
        raise falcon.HTTPNotFound(description=f"GET {route} is served from microversion 2.23.")
    refuse_unknown(req, (), since=microversion.MIN)
    return version


# -- the query of os-migrations --


def list_query(params: Params, version: Version) -> ListQuery:
    """The filters and page of an ``os-migrations`` request at ``version``.

    :raises Invalid: a parameter the version does not take, one of 2.59's or later
        given twice, a ``limit`` that is no whole number, a time that is none,
        ``changes-before`` before ``changes-since``, a ``hidden`` that is no boolean
        (400, Nova's words where it has some).
    """
    added = [name for since, names in _ADDED if version >= since for name in names]
    unknown = sorted(set(params) - {*FILTERS, *added})
    if unknown:
        raise exception.Invalid(message=unknown_message(unknown))
    single = {name: _once(params, name) for name in added}
    since = query_time("changes-since", single.get("changes-since"))
    before = query_time("changes-before", single.get("changes-before"))
    if since is not None and before is not None and before < since:
        raise exception.Invalid(
            message="The value of changes-since must be less than or equal to changes-before."
        )
    wanted = MigrationFilter(
        hidden=_hidden(_last(params, "hidden")),
        host=_last(params, "host"),
        status=_last(params, "status"),
        instance_uuid=_last(params, "instance_uuid"),
        source_compute=_last(params, "source_compute"),
        migration_type=_last(params, "migration_type"),
        user_id=single.get("user_id"),
        project_id=single.get("project_id"),
        changes_since=since,
        changes_before=before,
    )
    limit = single.get("limit")
    return ListQuery(wanted, None if limit is None else query_int("limit", limit),
                     single.get("marker"))  # fmt: skip


def _last(params: Params, name: str) -> str | None:
    value = params.get(name)
    return value[-1] if isinstance(value, list) else value


def _once(params: Params, name: str) -> str | None:
    value = params.get(name)
    if isinstance(value, list):
        raise exception.Invalid(
            message=f"Invalid input for query parameters {name}. Value: {value!r}. "
            "It must be given once."
        )
    return value


def _hidden(value: str | None) -> bool | None:
    """``hidden``: Nova's 0 or 1 (any boolean word passes)."""
    if value is None:
        return None
    if value not in (*TRUE, *FALSE):
        raise exception.Invalid(
            message=f"Invalid input for query parameters hidden. Value: {value[:100]}. "
            "It must be 0 or 1."
        )
    return to_bool(value)


def _next_link(req: falcon.Request, base: str, marker: str) -> dict[str, str]:
    """Nova's ``migrations_links``: the request's own parameters, the last uuid as marker."""
    query = {k: v for k, v in req.params.items() if k != "marker"}
    query["marker"] = marker
    href = f"{base}{PREFIX}/os-migrations?{urlencode(sorted(query.items()), doseq=True)}"
    return {"rel": "next", "href": href}


# -- the views --


def migration_view(migration: Migration, version: Version, base: str) -> dict[str, Any]:
    """One item of ``os-migrations`` at ``version``; ``base``: where links point."""
    view: dict[str, Any] = {
        "created_at": usage_time(migration.created_at),
        "dest_compute": migration.dest_compute,
        "dest_host": None,
        "dest_node": migration.dest_node,
        "id": migration.id,
        "instance_uuid": migration.instance_uuid,
        "new_instance_type_id": _flavor_id(migration.new_flavor),
        "old_instance_type_id": _flavor_id(migration.old_flavor),
        "source_compute": migration.source_compute or None,
        "source_node": migration.source_node or None,
        "status": migration.status,
        "updated_at": usage_time(migration.updated_at),
    }
    if version >= MIGRATION_TYPE:
        view["migration_type"] = migration.kind
        if live_in_progress(migration):
            path = f"servers/{migration.instance_uuid}/migrations"
            view["links"] = links(base, path, str(migration.id))
    return _later_fields(view, migration, version)


def server_migration_view(migration: Migration, version: Version) -> dict[str, Any]:
    """One live migration of a server at ``version`` (2.23 or later)."""
    view: dict[str, Any] = {
        "created_at": usage_time(migration.created_at),
        "dest_compute": migration.dest_compute,
        "dest_host": None,
        "dest_node": migration.dest_node,
        "id": migration.id,
        "server_uuid": migration.instance_uuid,
        "source_compute": migration.source_compute or None,
        "source_node": migration.source_node or None,
        "status": migration.status,
        "updated_at": usage_time(migration.updated_at),
        **{f"{part}_{amount}_bytes": None for part in ("memory", "disk")
           for amount in ("total", "processed", "remaining")},
    }  # fmt: skip
    return _later_fields(view, migration, version)


def _later_fields(view: dict[str, Any], migration: Migration, version: Version) -> dict[str, Any]:
    """2.59's ``uuid``; 2.80's ``user_id`` and ``project_id``: who asked for the move."""
    if version >= PAGING:
        view["uuid"] = migration.uuid
    if version >= USER_PROJECT:
        view["user_id"] = migration.user_id or None
        view["project_id"] = migration.caller_project_id or None
    return view


def _flavor_id(flavor: Mapping[str, Any]) -> int | None:
    """Nova's ``*_instance_type_id``, an integer: the flavor's id when it is one."""
    found = str(flavor.get("id", ""))
    return int(found) if found.isascii() and found.isdigit() else None
