"""Microversions: which one a request asks for, and which one a response answers with.

The API speaks 2.1: the version document says so, and :mod:`qsched.api.app` answers
406 to a request for a later microversion, except on the routes of :data:`LATER`:
``os-services`` also speaks 2.11 (``forced_down``) and 2.53 (services named by
UUID), ``os-server-groups`` up to 2.64 (``policy`` and ``rules``). The app reads
the request's microversion once (:func:`requested`, within what its route speaks),
keeps it for the handlers (:func:`current`) and records it with :func:`answer`,
which the response's version headers then carry.
"""

from __future__ import annotations

import re

import falcon

from qsched.api import API_VERSION

Version = tuple[int, int]

#: What every resource speaks, and the lowest any does.
BASE: Version = (2, 1)

_FORM = re.compile(r"([1-9][0-9]*)\.(0|[1-9][0-9]*)").fullmatch

#: Routes that speak microversions after 2.1, and the latest each speaks.
LATER: dict[str, Version] = {
    "/v2.1/os-services": (2, 53),
    "/v2.1/os-server-groups": (2, 64),
}


def maximum(path: str) -> Version:
    """The latest microversion the route of ``path`` speaks."""
    return next(
        (top for prefix, top in LATER.items() if path == prefix or path.startswith(prefix + "/")),
        BASE,
    )


def current(req: falcon.Request) -> Version:
    """The microversion the app read for ``req`` (2.1 before it did)."""
    version: Version = getattr(req.context, "microversion", BASE)
    return version


def text(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def requested(req: falcon.Request, maximum: Version) -> Version:
    """The microversion ``req`` asks for (2.1 when it names none; ``latest``: ``maximum``).

    :raises HTTPBadRequest: not ``MAJOR.MINOR``, in Nova's words.
    :raises HTTPNotAcceptable: below 2.1 or above ``maximum`` (406, Nova's words).
    """
    asked = _header(req)
    if not asked:
        return BASE
    if asked == "latest":
        return maximum
    match = _FORM(asked)
    if match is None:
        raise falcon.HTTPBadRequest(
            description=f"API Version String {asked} is of invalid format. Must be of format "
            "MajorNum.MinorNum."
        )
    version = (int(match.group(1)), int(match.group(2)))
    if not BASE <= version <= maximum:
        raise falcon.HTTPNotAcceptable(
            description=f"Version {asked} is not supported by the API. Minimum is "
            f"{text(BASE)} and maximum is {text(maximum)}."
        )
    return version


def _header(req: falcon.Request) -> str:
    wanted = req.get_header("OpenStack-API-Version")
    if wanted:
        service, _sep, version = wanted.strip().partition(" ")
        if service.lower() == "compute":
            return version.strip().lower()
    return (req.get_header("X-OpenStack-Nova-API-Version") or "").strip().lower()


def answer(req: falcon.Request, version: Version) -> None:
    """Say that the response to ``req`` speaks ``version`` (its headers will say so)."""
    req.context.api_version = text(version)


def headers(req: falcon.Request) -> dict[str, str]:
    """The version headers of the response to ``req``."""
    version = getattr(req.context, "api_version", API_VERSION)
    return {
        "OpenStack-API-Version": f"compute {version}",
        "X-OpenStack-Nova-API-Version": version,
        "Vary": "OpenStack-API-Version, X-OpenStack-Nova-API-Version",
    }
