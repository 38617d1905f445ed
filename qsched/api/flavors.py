"""/v2.1/flavors and their os-extra_specs, in Nova's 2.1 shapes."""

from __future__ import annotations

from typing import Any

import falcon

from qsched.api import Handler, context_of, links, read_json, schemas
from qsched.flavors import Flavor


class Flavors(Handler):
    """``/v2.1/flavors``: list (id, name, links) and, for admins, create."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        base = self.base(req)
        resp.media = {"flavors": [brief(f, base) for f in self.compute.list_flavors()]}

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = schemas.validate(schemas.FLAVOR_CREATE, read_json(req, self.max_body))
        flavor = self.compute.create_flavor(context_of(req), flavor_from_body(body["flavor"]))
        resp.media = {"flavor": detail(flavor, self.base(req))}


class FlavorsDetail(Handler):
    """``/v2.1/flavors/detail``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        base = self.base(req)
        resp.media = {"flavors": [detail(f, base) for f in self.compute.list_flavors()]}


class FlavorItem(Handler):
    """``/v2.1/flavors/{flavor_id}``: show and, for admins, delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        resp.media = {"flavor": detail(self.compute.get_flavor(flavor_id), self.base(req))}

    def on_delete(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        self.compute.delete_flavor(context_of(req), flavor_id)
        resp.status = falcon.HTTP_202


class ExtraSpecs(Handler):
    """``/v2.1/flavors/{flavor_id}/os-extra_specs``: show and, for admins, add or change."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        specs = self.compute.flavor_extra_specs(context_of(req), flavor_id)
        resp.media = {"extra_specs": dict(specs)}

    def on_post(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        body = schemas.validate(schemas.EXTRA_SPECS_SET, read_json(req, self.max_body))
        specs = _strings(body["extra_specs"])
        self.compute.set_flavor_extra_specs(context_of(req), flavor_id, specs)
        resp.media = {"extra_specs": specs}


class ExtraSpec(Handler):
    """``/v2.1/flavors/{flavor_id}/os-extra_specs/{key}``: show and, for admins, delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, flavor_id: str, key: str) -> None:
        resp.media = {key: self.compute.flavor_extra_spec(context_of(req), flavor_id, key)}

    def on_delete(
        self, req: falcon.Request, resp: falcon.Response, flavor_id: str, key: str
    ) -> None:
        self.compute.delete_flavor_extra_spec(context_of(req), flavor_id, key)


def flavor_from_body(body: dict[str, Any]) -> Flavor:
    """A Flavor from a validated create body (sizes may come as digit strings)."""
    public = body.get("os-flavor-access:is_public", True)
    return Flavor(
        name=body["name"],
        vcpus=int(body["vcpus"]),
        ram_mb=int(body["ram"]),
        disk_gb=int(body["disk"]),
        id=body.get("id") or "",
        extra_specs=_strings(body.get("extra_specs") or {}),
        is_public=public if isinstance(public, bool) else str(public).lower() != "false",
    )


def _strings(specs: dict[str, Any]) -> dict[str, str]:
    # Nova stores extra spec values as strings whatever JSON type they came in.
    return {key: value if isinstance(value, str) else str(value) for key, value in specs.items()}


def brief(flavor: Flavor, base: str) -> dict[str, Any]:
    return {
        "id": flavor.flavor_id,
        "name": flavor.name,
        "links": links(base, "flavors", flavor.flavor_id),
    }


def detail(flavor: Flavor, base: str) -> dict[str, Any]:
    return {
        "id": flavor.flavor_id,
        "name": flavor.name,
        "vcpus": flavor.vcpus,
        "ram": flavor.ram_mb,
        "disk": flavor.disk_gb,
        "swap": "",
        "OS-FLV-EXT-DATA:ephemeral": 0,
        "OS-FLV-DISABLED:disabled": False,
        "os-flavor-access:is_public": flavor.is_public,
        "rxtx_factor": 1.0,
        "links": links(base, "flavors", flavor.flavor_id),
    }
