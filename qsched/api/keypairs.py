"""/v2.1/os-keypairs: create (generated or imported), list, show and delete, as Nova's.

The shapes by microversion, as Nova's: 2.1 creates with 200 and deletes with 202;
2.2 adds ``type`` (``ssh`` or ``x509``) to the body and the views, creates with 201
and deletes with 204; 2.10 lets an admin act for another user (``user_id`` in the
create body and the query of the others); 2.35 pages the list (``limit``,
``marker``, ``keypairs_links``); from 2.75 an unknown query parameter is a 400.
A query parameter of a later microversion than the request's is refused (400)
rather than ignored.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import falcon

from qsched import exception
from qsched.api import PREFIX, Handler, context_of, microversion, read_json, usage_time
from qsched.api.query import refuse_unknown
from qsched.api.schemas import keypairs as schema
from qsched.api.schemas.validation import query_int, validate
from qsched.ledger.base import SSH, Keypair

#: the query parameters each call reads, and the microversion each needs
_USER_QUERY = {"user_id": (2, 10)}
_LIST_QUERY = {**_USER_QUERY, "limit": (2, 35), "marker": (2, 35)}


class Keypairs(Handler):
    """``/v2.1/os-keypairs``: list and create (or import)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        query = _query(req, _LIST_QUERY)
        limit = query.get("limit")
        size = self.compute.page_size(None if limit is None else query_int("limit", limit))
        found = self.compute.keypairs.list(
            context_of(req), query.get("user_id"), size, query.get("marker")
        )
        resp.media = {"keypairs": [{"keypair": _index_view(k, version)} for k in found]}
        if version >= (2, 35) and size and len(found) == size:
            params = {k: v for k, v in req.params.items() if k != "marker"}
            params["marker"] = found[-1].name
            href = f"{self.base(req)}{PREFIX}/os-keypairs?{urlencode(sorted(params.items()))}"
            resp.media["keypairs_links"] = [{"rel": "next", "href": href}]

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        validator = next(v for since, v in schema.KEYPAIR_CREATE if version >= since)
        body = validate(validator, read_json(req, self.max_body))["keypair"]
        context, name = context_of(req), body["name"]
        key_type, user_id = body.get("type", SSH), body.get("user_id")
        if "public_key" in body:
            keypair = self.compute.keypairs.import_public_key(
                context, name, body["public_key"], key_type, user_id
            )
            shown = _create_view(keypair, version)
        else:
            keypair, private_key = self.compute.keypairs.create(context, name, key_type, user_id)
            shown = {**_create_view(keypair, version), "private_key": private_key}
        resp.status = falcon.HTTP_201 if version >= (2, 2) else falcon.HTTP_200
        resp.media = {"keypair": shown}


class KeypairItem(Handler):
    """``/v2.1/os-keypairs/{keypair_name}``: show and delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, keypair_name: str) -> None:
        version = microversion.current(req)
        user_id = _query(req, _USER_QUERY).get("user_id")
        keypair = self.compute.keypairs.get(context_of(req), keypair_name, user_id)
        resp.media = {"keypair": _show_view(keypair, version)}

    def on_delete(self, req: falcon.Request, resp: falcon.Response, keypair_name: str) -> None:
        version = microversion.current(req)
        user_id = _query(req, _USER_QUERY).get("user_id")
        self.compute.keypairs.delete(context_of(req), keypair_name, user_id)
        resp.status = falcon.HTTP_204 if version >= (2, 2) else falcon.HTTP_202


def _query(req: falcon.Request, known: dict[str, tuple[int, int]]) -> dict[str, str]:
    """The query parameters of ``known`` the request's microversion has (the first of
    repeated ones, as Nova takes).

    :raises Invalid: one of a later microversion; from 2.75 any other parameter.
    """
    refuse_unknown(req, known)
    version = microversion.current(req)
    found: dict[str, str] = {}
    for name in req.params:
        since = known.get(name)
        if since is None:
            continue  # Nova ignores other parameters before 2.75
        if version < since:
            raise exception.Invalid(
                message=f"Invalid input for query parameters {name}. It needs microversion "
                f"{microversion.text(since)}: send 'OpenStack-API-Version: compute "
                f"{microversion.text(since)}'."
            )
        values = req.get_param_as_list(name) or [""]
        found[name] = values[0]
    return found


def _index_view(keypair: Keypair, version: tuple[int, int]) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "name": keypair.name,
        "public_key": keypair.public_key,
        "fingerprint": keypair.fingerprint,
    }
    if version >= (2, 2):
        shown["type"] = keypair.type
    return shown


def _create_view(keypair: Keypair, version: tuple[int, int]) -> dict[str, Any]:
    return {**_index_view(keypair, version), "user_id": keypair.user_id}


def _show_view(keypair: Keypair, version: tuple[int, int]) -> dict[str, Any]:
    return {
        **_create_view(keypair, version),
        "created_at": usage_time(keypair.created_at),
        "deleted": False,
        "deleted_at": None,
        "id": keypair.id,
        "updated_at": None,
    }
