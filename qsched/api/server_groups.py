"""/v2.1/os-server-groups: create, list, show and delete, in Nova's shapes up to 2.64.

The shapes by microversion, as Nova's: 2.1 shows ``policies`` (a list of one) and an
empty ``metadata``; 2.13 adds ``project_id`` and ``user_id``; 2.15 accepts the soft
policies; 2.64 shows and takes ``policy`` and ``rules`` (``max_server_per_host``)
instead. These routes speak up to 2.64; ask for it with ``OpenStack-API-Version:
compute 2.64`` (``openstack --os-compute-api-version 2.64 server group create``).

The front door's ``groups`` (:class:`qsched.compute.server_groups.Groups`) keeps each
group in one cell, found by its group mapping over several.
"""

from __future__ import annotations

from typing import Any

import falcon

from qsched.api import Handler, context_of, microversion, read_json
from qsched.api.schemas import server_groups as schema
from qsched.api.schemas.validation import field_error, query_int, validate
from qsched.ledger.records import ServerGroup as Group


class ServerGroups(Handler):
    """``/v2.1/os-server-groups``: list and create."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        limit = _query_count(req, "limit")  # 0 or none: [api] max_limit, as in Nova
        found = self.compute.groups.list(
            context_of(req),
            all_projects=req.get_param("all_projects") is not None,
            limit=self.compute.page_size(limit or None),
            offset=_query_count(req, "offset") or 0,
        )
        version = microversion.current(req)
        resp.media = {"server_groups": [view(g, version) for g in found]}

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        raw = read_json(req, self.max_body)
        _check_words(raw, version)
        validator = next(v for since, v in schema.SERVER_GROUP_CREATE if version >= since)
        body = validate(validator, raw)["server_group"]
        if "policy" in body:
            policy, rules = body["policy"], _rules(body.get("rules") or {})
        else:
            policy, rules = body["policies"][0], {}
        group = self.compute.groups.create(context_of(req), body["name"], policy, rules)
        resp.media = {"server_group": view(group, version)}


class ServerGroup(Handler):
    """``/v2.1/os-server-groups/{group_id}``: show and delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, group_id: str) -> None:
        group = self.compute.groups.get(context_of(req), group_id)
        resp.media = {"server_group": view(group, microversion.current(req))}

    def on_delete(self, req: falcon.Request, resp: falcon.Response, group_id: str) -> None:
        self.compute.groups.delete(context_of(req), group_id)
        resp.status = falcon.HTTP_204


def view(group: Group, version: tuple[int, int]) -> dict[str, Any]:
    """A server group as Nova shows it at ``version``."""
    shown: dict[str, Any] = {"id": group.uuid, "name": group.name}
    if version >= (2, 64):
        shown.update(policy=group.policy, rules=group.rules)
    else:
        shown.update(policies=[group.policy], metadata={})
    shown["members"] = list(group.members)
    if version >= (2, 13):
        shown.update(project_id=group.project_id, user_id=group.user_id)
    return shown


def _check_words(body: Any, version: tuple[int, int]) -> None:
    """A body in the words of another microversion says which one it needs.

    :raises Invalid: ``policy`` or ``rules`` before 2.64, ``policies`` from 2.64.
    """
    group = body.get("server_group") if isinstance(body, dict) else None
    if not isinstance(group, dict):
        return  # the schema explains
    later = sorted({"policy", "rules"} & set(group))
    if version < (2, 64) and later:
        raise field_error(
            ["server_group"], group, f"{later} need microversion 2.64: send the header "
            "'OpenStack-API-Version: compute 2.64', or give 'policies': [<policy>].",
        )  # fmt: skip
    if version >= (2, 64) and "policies" in group:
        raise field_error(
            ["server_group"], group, "From microversion 2.64 a group takes 'policy': "
            "<policy> (and 'rules'), not 'policies'.",
        )  # fmt: skip


def _rules(rules: dict[str, Any]) -> dict[str, int]:
    """2.64's rules with their numbers as numbers (Nova takes ``"3"`` as well as ``3``)."""
    return {name: int(value) for name, value in rules.items()}


def _query_count(req: falcon.Request, name: str) -> int | None:
    value = req.get_param(name)
    return None if value is None else query_int(name, value)
