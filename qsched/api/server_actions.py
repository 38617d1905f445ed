"""/v2.1/servers/{id}/action (``os-stop``, ``os-start``, ``reboot``; the moves
``resize``, ``confirmResize``, ``revertResize``, ``migrate``, ``os-migrateLive``,
``evacuate``, and ``shelve``, ``shelveOffload``, ``unshelve``: docs/moves.rst) and
/v2.1/servers/{id}/os-instance-actions, in Nova's shapes by microversion.

Instance actions: a deleted server's from 2.21; events for every reader of the
server from 2.51 (their traceback and host for those the ``events`` rule allows,
as before 2.51 only they saw events); ``updated_at`` and paging by ``limit`` and
``marker``, ``changes-since`` from 2.58 (``changes-before`` from 2.66); ``hostId``
on each event from 2.62 (and ``host`` for those the ``events`` rule allows).
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlencode

import falcon

from qsched import exception
from qsched.api import PREFIX, FrontDoor, Handler, context_of, microversion, read_json, usage_time
from qsched.api.boot import generate_password
from qsched.api.schemas import server_actions as schema
from qsched.api.schemas.parameter_types import TRUE
from qsched.api.schemas.validation import query_int, validate
from qsched.api.servers import changed
from qsched.compute.list_query import query_time
from qsched.compute.moves import NOT_GIVEN
from qsched.compute.server_actions import Action, ActionEvent, ActionFilter, Rebuild
from qsched.scheduling.records import details

#: the actions served, as the 400 for any other names them
SERVED = tuple(schema.SERVER_ACTIONS)


class _Handler(Handler):
    def __init__(self, compute: FrontDoor, public_endpoint: str | None, max_body: int) -> None:
        super().__init__(compute, public_endpoint, max_body)
        self.actions = compute.actions


class ServerAction(_Handler):
    """``POST /v2.1/servers/{server_id}/action``: 202 and no body, as Nova's."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        body = read_json(req, self.max_body)
        name = _action_name(body)
        if name == "migrate" and microversion.at_least(req, (2, 56)):
            validate(schema.MIGRATE_V256, body)
        elif name in _BY_VERSION:
            by_version = _BY_VERSION[name]
            since = max(v for v in by_version if microversion.at_least(req, v))
            validate(by_version[since], body)
        else:
            validate(schema.SERVER_ACTIONS[name], body)
        context, moves = context_of(req), self.compute.moves
        if name == "os-stop":
            self.actions.stop(context, server_id)
        elif name == "os-start":
            self.actions.start(context, server_id)
        elif name == "reboot":
            hard = body["reboot"]["type"].upper() == "HARD"
            self.actions.reboot(context, server_id, hard)
        elif name == "resize":
            moves.resize(context, server_id, str(body["resize"]["flavorRef"]))
        elif name == "confirmResize":
            moves.confirm(context, server_id)
            resp.status = falcon.HTTP_204  # Nova answers a confirm with 204
            return
        elif name == "revertResize":
            moves.revert(context, server_id)
        elif name == "os-migrateLive":
            live = body["os-migrateLive"]
            moves.live_migrate(context, server_id, live["host"], _auto(live["block_migration"]))
        elif name == "rebuild":
            self._rebuild(req, resp, server_id, body["rebuild"])
            return
        elif name == "shelve":
            self.actions.shelve(context, server_id)
        elif name == "shelveOffload":
            self.actions.shelve_offload(context, server_id)
        elif name == "unshelve":
            asked = body["unshelve"] if microversion.at_least(req, (2, 77)) else None
            asked = asked if isinstance(asked, dict) else {}
            zone = asked.get("availability_zone", NOT_GIVEN)
            moves.unshelve(context, server_id, zone, asked.get("host"))
        elif name == "evacuate":
            # No guest takes a password (a boot's adminPass is dropped too): 200 and no
            # body, as Nova's with enable_instance_password off. onSharedStorage and
            # force: the destination's claim checks every rule whatever they say.
            moves.evacuate(context, server_id, body["evacuate"].get("host"))
            resp.status = falcon.HTTP_200
            return
        else:
            moves.migrate(context, server_id, (body["migrate"] or {}).get("host"))
        resp.status = falcon.HTTP_202

    def _rebuild(
        self, req: falcon.Request, resp: falcon.Response, server_id: str, asked: dict[str, Any]
    ) -> None:
        """Nova's 202 with the server as it is now and, with ``[api]
        enable_instance_password`` on, ``adminPass``: the one given or a generated one,
        returned once and never kept, as a boot's (the fake driver sets no password).
        Personal files (up to 2.56) and trusted certificates are refused, as at a boot."""
        for refused, what in _NOT_SERVED.items():
            if asked.get(refused):
                raise exception.Invalid(message=f"qsched {what}; rebuild without {refused}.")
        server = {field: asked[key] for key, field in _REBUILD_FIELDS.items() if key in asked}
        rebuild = Rebuild(
            name=asked.get("name"), metadata=asked.get("metadata"), server=server,
            preserve_ephemeral=asked.get("preserve_ephemeral") in TRUE,
        )  # fmt: skip
        context = context_of(req)
        self.actions.rebuild(context, server_id, asked["imageRef"], rebuild)
        instance = self.compute.get(context, server_id)
        keys = frozenset({"key_name"} if microversion.at_least(req, (2, 54)) else ())
        view = changed(self.compute, req, context, instance, self.base(req), keys)
        if microversion.at_least(req, (2, 57)):
            view["user_data"] = details(instance).server.user_data
        if self.compute.api.enable_instance_password:
            view["adminPass"] = asked.get("adminPass") or generate_password()
        resp.media = {"server": view}
        resp.status = falcon.HTTP_202


#: what a rebuild may ask that qsched cannot do, and why
_NOT_SERVED = {"personality": "injects no personality files",
               "trusted_image_certificates": "verifies no trusted image certificates"}  # fmt: skip
#: a rebuild's fields of the server, by Nova's names
_REBUILD_FIELDS = {"OS-DCF:diskConfig": "disk_config", "accessIPv4": "access_ipv4",
                   "accessIPv6": "access_ipv6", "description": "description",
                   "key_name": "key_name", "user_data": "user_data"}  # fmt: skip
#: the actions whose body's schema changes with the microversion
_BY_VERSION = {
    "rebuild": schema.REBUILD,
    "evacuate": schema.EVACUATE,
    "os-migrateLive": schema.MIGRATE_LIVE,
    "unshelve": schema.UNSHELVE,
}
_TRUE = {True, "True", "true", "1", "yes"}


def _auto(value: Any) -> bool | None:
    """A block_migration as the driver takes it: None for ``auto``."""
    return None if value == "auto" else value in _TRUE


def _action_name(body: Any) -> str:
    """The one action a body names. :raises Invalid: none of those served, or several."""
    if not isinstance(body, dict) or not body:
        raise exception.Invalid(
            message=f"The action body must be a JSON object naming one of {list(SERVED)}."
        )
    named = [key for key in body if key in schema.SERVER_ACTIONS]
    if len(body) == 1 and named:
        return named[0]
    others = sorted(str(key) for key in body if key not in schema.SERVER_ACTIONS)
    if others:
        raise exception.Invalid(
            message=f"There is no such action: {', '.join(others)}. qsched serves the "
            f"server actions {', '.join(SERVED)}."
        )
    raise exception.Invalid(message=f"Name one action per request, not {', '.join(named)}.")


class InstanceActions(_Handler):
    """``GET /v2.1/servers/{server_id}/os-instance-actions``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        filters = _list_filters(req)
        _instance, found = self.actions.list_actions(
            context_of(req), server_id, microversion.at_least(req, (2, 21)), filters
        )
        paged = microversion.at_least(req, (2, 58))
        resp.media = {"instanceActions": [_action(a, paged) for a in found]}
        size = self.actions.max_limit if filters.limit is None else filters.limit
        if paged and found and len(found) >= min(size, self.actions.max_limit):
            query = {k: v for k, v in req.params.items() if k != "marker"}
            query.update(limit=str(len(found)), marker=found[-1].request_id)
            path = f"{PREFIX}/servers/{server_id}/os-instance-actions"
            href = f"{self.base(req)}{path}?{urlencode(sorted(query.items()), doseq=True)}"
            resp.media["links"] = [{"rel": "next", "href": href}]


class InstanceAction(_Handler):
    """``GET /v2.1/servers/{server_id}/os-instance-actions/{request_id}``."""

    def on_get(
        self, req: falcon.Request, resp: falcon.Response, server_id: str, request_id: str
    ) -> None:
        if req.params:
            raise exception.Invalid(
                message=f"Query parameters {sorted(req.params)} are not allowed here."
            )
        context = context_of(req)
        instance, action = self.actions.get_action(
            context, server_id, request_id, microversion.at_least(req, (2, 21))
        )
        view = _action(action, microversion.at_least(req, (2, 58)))
        full = self.actions.shows_events(context, instance)
        if full or microversion.at_least(req, (2, 51)):
            project = action.project_id or instance.project_id
            view["events"] = [_event(e, project, full, req) for e in action.events]
        resp.media = {"instanceAction": view}


_QUERY_V258 = ("limit", "marker", "changes-since")
_QUERY_V266 = (*_QUERY_V258, "changes-before")


def _list_filters(req: falcon.Request) -> ActionFilter:
    """2.58's ``limit``, ``marker``, ``changes-since`` and 2.66's ``changes-before``;
    any other parameter, or these before their version, is refused (400)."""
    allowed: tuple[str, ...] = ()
    if microversion.at_least(req, (2, 66)):
        allowed = _QUERY_V266
    elif microversion.at_least(req, (2, 58)):
        allowed = _QUERY_V258
    unknown = sorted(set(req.params) - set(allowed))
    if unknown:
        where = f"only {', '.join(allowed)}" if allowed else "none before microversion 2.58"
        raise exception.Invalid(
            message=f"Invalid query parameters {unknown}: this list takes {where}."
        )
    for name, value in req.params.items():
        if not isinstance(value, str):
            raise exception.Invalid(message=f"Give the query parameter {name} once.")
    limit = req.get_param("limit")
    since = query_time("changes-since", req.get_param("changes-since"))
    before = query_time("changes-before", req.get_param("changes-before"))
    if since is not None and before is not None and before < since:
        raise exception.Invalid(
            message="The value of changes-since must be less than or equal to changes-before."
        )
    return ActionFilter(
        limit=None if limit is None else query_int("limit", limit),
        marker=req.get_param("marker"),
        changes_since=since,
        changes_before=before,
    )


def _action(action: Action, with_updated: bool) -> dict[str, Any]:
    view: dict[str, Any] = {
        "action": action.action,
        "instance_uuid": action.instance_uuid,
        "request_id": action.request_id,
        "user_id": action.user_id,
        "project_id": action.project_id,
        "start_time": usage_time(action.start_time),
        "message": action.message,
    }
    if with_updated:
        view["updated_at"] = usage_time(action.updated_at)
    return view


def _event(event: ActionEvent, project_id: str, full: bool, req: falcon.Request) -> dict[str, Any]:
    """An event; its traceback for those the ``events`` rule allows, and from 2.62 its
    hashed ``hostId`` for everyone and ``host`` for them."""
    view: dict[str, Any] = {
        "event": event.event,
        "start_time": usage_time(event.start_time),
        "finish_time": usage_time(event.finish_time),
        "result": event.result,
    }
    if full:
        view["traceback"] = event.traceback
    if microversion.at_least(req, (2, 62)):
        if full:
            view["host"] = event.host or ""
        view["hostId"] = _host_id(project_id, event.host)
    return view


def _host_id(project_id: str, host: str | None) -> str:
    """Nova's hashed host id (as a server's ``hostId``): "" without a host."""
    if not host:
        return ""
    return hashlib.sha224((project_id + host).encode()).hexdigest()
