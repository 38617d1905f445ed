"""qsched-api: the Nova-shaped HTTP front door (falcon WSGI).

:mod:`qsched.api.app` builds the application; the handlers in
:mod:`~qsched.api.servers` and :mod:`~qsched.api.flavors` parse a request, call one
method of the front door (:class:`~qsched.compute.front_door.FrontDoor`, which
:class:`qsched.compute.api.ComputeAPI` is over one cell or several) and render Nova's
shapes. The helpers below are what every handler shares.
"""

from __future__ import annotations

import datetime
from typing import Any

import falcon

from qsched import exception
from qsched.api import jsonbody
from qsched.compute.front_door import FrontDoor
from qsched.context import RequestContext

API_VERSION = "2.1"
PREFIX = "/v2.1"


class Handler:
    """What every resource handler holds: the front door, where links point, the body limit."""

    def __init__(self, compute: FrontDoor, public_endpoint: str | None, max_body: int) -> None:
        self.compute = compute
        self.public_endpoint = public_endpoint
        self.max_body = max_body

    def base(self, req: falcon.Request) -> str:
        return base_url(req, self.public_endpoint)


def context_of(req: falcon.Request) -> RequestContext:
    """The caller, as the auth middleware found it."""
    context: RequestContext = req.context.compute
    return context


def base_url(req: falcon.Request, public_endpoint: str | None) -> str:
    """Where links point: ``[api] public_endpoint`` or the request's own scheme and host."""
    return (public_endpoint or req.prefix).rstrip("/")


def read_json(req: falcon.Request, limit: int) -> Any:
    """The request body parsed as strict JSON (:func:`qsched.api.jsonbody.parse`), at most
    ``limit`` bytes: the one way every handler reads a body.

    :raises HTTPContentTooLarge: over the limit (413), before reading it all.
    :raises HTTPUnsupportedMediaType: a Content-Type other than JSON.
    :raises Invalid: empty, malformed, too deeply nested, not UTF-8, ``NaN`` or a
        number out of range, or a lone surrogate in a string (400).
    """
    length = req.content_length
    if length is not None and length > limit:
        raise _too_large(length, limit)
    media_type = (req.content_type or "application/json").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise falcon.HTTPUnsupportedMediaType(
            description=f"Unsupported Content-Type {media_type!r}; send application/json."
        )
    raw = req.bounded_stream.read(limit + 1)
    if len(raw) > limit:
        raise _too_large(None, limit)
    if not raw.strip():
        raise exception.Invalid(message="The request body is empty; send a JSON object.")
    return jsonbody.parse(raw)


def _too_large(length: int | None, limit: int) -> falcon.HTTPError:
    size = f"{length} bytes" if length is not None else "larger than that"
    return falcon.HTTPContentTooLarge(
        description=f"Request is too large: the body is {size}; the limit is {limit} bytes."
    )


def iso8601(epoch_s: float | None) -> str | None:
    """Nova's timestamp form: ``2024-05-01T12:00:00Z``."""
    if not epoch_s:
        return None
    moment = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def usage_time(epoch_s: float | None) -> str | None:
    """Nova's ``OS-SRV-USG`` timestamps: ``2024-05-01T12:00:00.123456``, UTC, no zone."""
    if epoch_s is None:
        return None
    moment = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")


def links(base: str, collection: str, item_id: str) -> list[dict[str, str]]:
    """Nova's self and bookmark links of one item."""
    return [
        {"rel": "self", "href": f"{base}{PREFIX}/{collection}/{item_id}"},
        {"rel": "bookmark", "href": f"{base}/{collection}/{item_id}"},
    ]
