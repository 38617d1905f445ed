"""Microversions: which one a request asks for, and which one a response answers with.

The API speaks every microversion from :data:`MIN` (2.1) to :data:`MAX` (2.79),
each with the request and response changes Nova made in it for the resources
qsched serves (``docs/api.rst`` lists them). The app reads the request's
microversion once (:func:`requested`: the ``OpenStack-API-Version`` header, or
Nova's legacy ``X-OpenStack-Nova-API-Version``, parsed by microversion-parse as
Nova parses them), keeps it for the handlers (:func:`current`, :func:`at_least`)
and records it with :func:`answer`, which the response's version headers then carry.
The legacy ``/v2`` API speaks no microversion and sends no version headers.
"""

from __future__ import annotations

import re

import falcon
import microversion_parse

Version = tuple[int, int]

#: the lowest microversion, what a request that names none gets
MIN: Version = (2, 1)
#: the latest microversion every served resource implements
MAX: Version = (2, 79)
#: what a request that names none gets (Nova's default)
BASE: Version = MIN

_FORM = re.compile(r"([1-9][0-9]*)\.(0|[1-9][0-9]*)").fullmatch
_LEGACY_HEADER = "X-OpenStack-Nova-API-Version"


def text(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def current(req: falcon.Request) -> Version:
    """The microversion the app read for ``req`` (2.1 before it did)."""
    version: Version = getattr(req.context, "microversion", BASE)
    return version


def at_least(req: falcon.Request, version: Version) -> bool:
    """Whether ``req`` speaks ``version`` or later."""
    return current(req) >= version


def requested(req: falcon.Request, maximum: Version = MAX) -> Version:
    """The microversion ``req`` asks for (2.1 when it names none; ``latest``: ``maximum``).

    ``OpenStack-API-Version`` may name several services (``compute 2.37, volume 3.0``)
    and comes first; a header that names no ``compute`` version is as none.

    :raises HTTPBadRequest: not ``MAJOR.MINOR``, in Nova's words.
    :raises HTTPNotAcceptable: below 2.1 or above ``maximum`` (406, Nova's words).
    """
    headers = {name.lower(): value for name, value in req.headers.items()}
    asked = microversion_parse.get_version(
        headers, "compute", legacy_headers=[_LEGACY_HEADER.lower()]
    )
    if not asked:
        return BASE
    asked = asked.strip().lower()
    if asked == "latest":
        return maximum
    match = _FORM(asked)
    if match is None:
        raise falcon.HTTPBadRequest(
            description=f"API Version String {asked} is of invalid format. Must be of format "
            "MajorNum.MinorNum."
        )
    version = (int(match.group(1)), int(match.group(2)))
    if not MIN <= version <= maximum:
        raise falcon.HTTPNotAcceptable(
            description=f"Version {asked} is not supported by the API. Minimum is "
            f"{text(MIN)} and maximum is {text(maximum)}."
        )
    return version


def answer(req: falcon.Request, version: Version | None) -> None:
    """Say that the response to ``req`` speaks ``version`` (None: the legacy v2 API,
    which sends no version headers)."""
    req.context.api_version = None if version is None else text(version)


def headers(req: falcon.Request) -> dict[str, str]:
    """The version headers of the response to ``req`` (none for the legacy v2 API)."""
    version = getattr(req.context, "api_version", text(BASE))
    if version is None:
        return {}
    return {
        "OpenStack-API-Version": f"compute {version}",
        "X-OpenStack-Nova-API-Version": version,
        "Vary": "OpenStack-API-Version, X-OpenStack-Nova-API-Version",
    }
