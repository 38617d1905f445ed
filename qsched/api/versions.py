"""Version discovery: ``/`` lists every version, ``/v2`` and ``/v2.1`` describe one
(Nova's versions documents); no token needed (:mod:`qsched.api.keystone` lets them
through)."""

from __future__ import annotations

import dataclasses
from typing import Any

import falcon

from qsched.api import API_VERSION, PREFIX, base_url, microversion

#: the legacy v2.0 API, served as v2.1 at 2.1 (``qsched.api.app``'s request middleware)
LEGACY_PREFIX = "/v2"


@dataclasses.dataclass(frozen=True)
class APIVersion:
    """One entry of the version documents."""

    id: str
    path: str
    status: str
    version: str
    min_version: str
    updated: str
    media_version: str

    def document(self, base: str, single: bool) -> dict[str, Any]:
        links = [{"rel": "self", "href": f"{base}{self.path}/"}]
        doc: dict[str, Any] = {"id": self.id, "links": links, "status": self.status,
                               "version": self.version, "min_version": self.min_version,
                               "updated": self.updated}  # fmt: skip
        if single:
            links.append({"rel": "describedby", "type": "text/html",
                          "href": "http://docs.openstack.org/"})  # fmt: skip
            doc["media-types"] = [
                {"base": "application/json",
                 "type": f"application/vnd.openstack.compute+json;version={self.media_version}"}
            ]  # fmt: skip
        return doc


LEGACY = APIVersion("v2.0", LEGACY_PREFIX, "DEPRECATED", "", "", "2025-07-04T12:00:00Z", "2")
CURRENT = APIVersion(
    "v2.1", PREFIX, "CURRENT", microversion.text(microversion.MAX),
    microversion.text(microversion.MIN), "2013-07-23T11:33:21Z", API_VERSION,
)  # fmt: skip


class Versions:
    """``/`` (every version), ``/v2`` and ``/v2.1`` (one): discovery, no token needed."""

    def __init__(self, public_endpoint: str | None, single: APIVersion | None = None) -> None:
        self.public_endpoint = public_endpoint
        self.single = single

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        base = base_url(req, self.public_endpoint)
        if self.single is None:
            resp.media = {"versions": [v.document(base, False) for v in (LEGACY, CURRENT)]}
        else:
            resp.media = {"version": self.single.document(base, True)}
