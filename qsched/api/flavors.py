"""/v2.1/flavors, their os-extra_specs and os-flavor-access, in Nova's shapes.

Per microversion: 2.7 refuses granting a public flavor (409); 2.55 adds
``description`` to every view, to create, and ``PUT /flavors/{id}``; 2.61 adds
``extra_specs`` to the detailed views when ``os-flavor-extra-specs:index`` allows
the caller; 2.75 shows ``swap`` 0 rather than ``""`` and refuses unknown query
parameters of the listings.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import falcon

from qsched import exception
from qsched.api import PREFIX, Handler, context_of, links, microversion, read_json
from qsched.api.query import refuse_unknown
from qsched.api.schemas import flavors as schema
from qsched.api.schemas.parameter_types import TRUE
from qsched.api.schemas.validation import query_int, validate
from qsched.flavors import SORT_KEYS, UNRECORDED_SORT_KEYS, Flavor, FlavorQuery

_QUERY_KEYS = frozenset(
    {"limit", "marker", "is_public", "minRam", "minDisk", "sort_key", "sort_dir"}
)
_SORT_DIRS = ("asc", "desc")
# oslo.utils' bool_from_string, strict, as Nova reads ``is_public`` (any case)
_TRUE_WORDS = frozenset({"1", "t", "true", "on", "y", "yes"})
_FALSE_WORDS = frozenset({"0", "f", "false", "off", "n", "no"})


class _FlavorHandler(Handler):
    def page(self, req: falcon.Request) -> list[Flavor]:
        """The flavors a listing asks for, as the caller may see them."""
        context = context_of(req)
        query = list_query(req, self.compute.policy.is_admin(context))
        return self.compute.list_flavors(context, query)

    def next_link(
        self, req: falcon.Request, resp: falcon.Response, found: list[Flavor], path: str
    ) -> None:
        """Nova's ``flavors_links`` when the page is full, so clients fetch the next one."""
        limit = _param(req, "limit")
        size = self.compute.page_size(None if limit is None else int(limit))
        if not found or len(found) < size:
            return
        query = {k: v for k, v in req.params.items() if k != "marker"}
        query.update(marker=found[-1].flavor_id)
        href = f"{self.base(req)}{PREFIX}{path}?{urlencode(sorted(query.items()), doseq=True)}"
        resp.media["flavors_links"] = [{"rel": "next", "href": href}]

    def shown(self, req: falcon.Request, flavor: Flavor) -> dict[str, Any]:
        """One flavor's detailed view at the request's microversion."""
        return detail(flavor, self.base(req), microversion.current(req), self.specs_shown(req))

    def specs_shown(self, req: falcon.Request) -> bool:
        return microversion.at_least(req, (2, 61)) and self.compute.show_extra_specs_in_views(
            context_of(req)
        )


class Flavors(_FlavorHandler):
    """``/v2.1/flavors``: list (id, name, links) and, for admins, create."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        found = self.page(req)
        base, version = self.base(req), microversion.current(req)
        resp.media = {"flavors": [brief(f, base, version) for f in found]}
        self.next_link(req, resp, found, "/flavors")

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        validator = next(v for since, v in schema.FLAVOR_CREATE if version >= since)
        body = validate(validator, read_json(req, self.max_body))
        flavor = self.compute.create_flavor(context_of(req), flavor_from_body(body["flavor"]))
        resp.media = {"flavor": self.shown(req, flavor)}


class FlavorsDetail(_FlavorHandler):
    """``/v2.1/flavors/detail``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        found = self.page(req)
        resp.media = {"flavors": [self.shown(req, f) for f in found]}
        self.next_link(req, resp, found, "/flavors/detail")


class FlavorItem(_FlavorHandler):
    """``/v2.1/flavors/{flavor_id}``: show, and for admins, update (2.55+) and delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        flavor = self.compute.get_flavor(flavor_id, context_of(req))
        resp.media = {"flavor": self.shown(req, flavor)}

    def on_put(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        if not microversion.at_least(req, (2, 55)):
            raise falcon.HTTPNotFound()  # Nova: no such method before 2.55
        body = validate(schema.FLAVOR_UPDATE, read_json(req, self.max_body))
        description = body["flavor"]["description"]
        flavor = self.compute.update_flavor(context_of(req), flavor_id, description)
        resp.media = {"flavor": self.shown(req, flavor)}

    def on_delete(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        self.compute.delete_flavor(context_of(req), flavor_id)
        resp.status = falcon.HTTP_202


class FlavorAction(Handler):
    """``/v2.1/flavors/{flavor_id}/action``: addTenantAccess, removeTenantAccess."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        body = read_json(req, self.max_body)
        if not isinstance(body, dict) or len(body) != 1:
            raise exception.Invalid(message="Malformed request body")
        action = str(next(iter(body)))
        validator = schema.FLAVOR_ACTIONS.get(action)
        if validator is None:
            raise exception.Invalid(message=f"There is no such action: {action}")
        tenant = validate(validator, body)[action]["tenant"]
        context = context_of(req)
        if action == "addTenantAccess":
            refuse_public = microversion.at_least(req, (2, 7))
            flavor = self.compute.add_flavor_access(context, flavor_id, tenant, refuse_public)
        else:
            flavor = self.compute.remove_flavor_access(context, flavor_id, tenant)
        resp.media = access_view(flavor)


class FlavorAccess(Handler):
    """``/v2.1/flavors/{flavor_id}/os-flavor-access``: the projects granted a private flavor."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        resp.media = access_view(self.compute.flavor_access(context_of(req), flavor_id))


class ExtraSpecs(Handler):
    """``/v2.1/flavors/{flavor_id}/os-extra_specs``: show and, for admins, add or change."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        specs = self.compute.flavor_extra_specs(context_of(req), flavor_id)
        resp.media = {"extra_specs": dict(specs)}

    def on_post(self, req: falcon.Request, resp: falcon.Response, flavor_id: str) -> None:
        body = validate(schema.EXTRA_SPECS_SET, read_json(req, self.max_body))
        specs = _strings(body["extra_specs"])
        self.compute.set_flavor_extra_specs(context_of(req), flavor_id, specs)
        resp.media = {"extra_specs": specs}


class ExtraSpec(Handler):
    """``/v2.1/flavors/{flavor_id}/os-extra_specs/{key}``: show and, for admins, set and
    delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, flavor_id: str, key: str) -> None:
        resp.media = {key: self.compute.flavor_extra_spec(context_of(req), flavor_id, key)}

    def on_put(self, req: falcon.Request, resp: falcon.Response, flavor_id: str, key: str) -> None:
        body = validate(schema.EXTRA_SPEC_UPDATE, read_json(req, self.max_body))
        if key not in body:
            raise exception.Invalid(message="Request body and URI mismatch")
        value = _strings(body)[key]
        self.compute.set_flavor_extra_spec(context_of(req), flavor_id, key, value)
        resp.media = {key: value}

    def on_delete(
        self, req: falcon.Request, resp: falcon.Response, flavor_id: str, key: str
    ) -> None:
        self.compute.delete_flavor_extra_spec(context_of(req), flavor_id, key)


def flavor_from_body(body: dict[str, Any]) -> Flavor:
    """A Flavor from a validated create body (sizes may come as digit strings)."""
    public = body.get("os-flavor-access:is_public", True)
    flavor_id = body.get("id")
    return Flavor(
        name=body["name"],
        vcpus=int(body["vcpus"]),
        ram_mb=int(body["ram"]),
        disk_gb=int(body["disk"]),
        id="" if flavor_id is None else str(flavor_id),
        extra_specs=_strings(body.get("extra_specs") or {}),
        is_public=public in TRUE,
        swap_mb=int(body.get("swap", 0)),
        ephemeral_gb=int(body.get("OS-FLV-EXT-DATA:ephemeral", 0)),
        rxtx_factor=float(body.get("rxtx_factor", 1.0)),
        description=body.get("description"),
    )


def list_query(req: falcon.Request, admin: bool) -> FlavorQuery:
    """A listing's query as Nova's flavor index schema reads it.

    ``is_public`` is read for admins only (``true``, ``false`` or ``none``); a member
    lists public flavors and those granted to its project whatever it says, as in
    Nova. Before 2.75 other parameters are let through, as Nova does; from 2.75 they
    are refused.

    :raises Invalid: a malformed value, a sort key qsched does not record, or
        (2.75+) a parameter the listing does not know.
    """
    refuse_unknown(req, _QUERY_KEYS)
    limit = _param(req, "limit")
    sort_key = _param(req, "sort_key") or "flavorid"
    sort_dir = _param(req, "sort_dir") or "asc"
    _check_sort(sort_key, sort_dir)
    return FlavorQuery(
        is_public=_is_public(_param(req, "is_public")) if admin else True,
        min_ram_mb=_minimum(req, "minRam"),
        min_disk_gb=_minimum(req, "minDisk"),
        sort_key=sort_key,
        sort_dir=sort_dir,
        limit=None if limit is None else query_int("limit", limit),
        marker=_param(req, "marker"),
    )


def _param(req: falcon.Request, name: str) -> str | None:
    # a repeated parameter counts by its last value, as Nova's multi_params reads it
    value = req.params.get(name)
    return value[-1] if isinstance(value, list) else value


def _check_sort(sort_key: str, sort_dir: str) -> None:
    if sort_key in UNRECORDED_SORT_KEYS:
        raise exception.Invalid(
            message=f"qsched does not record flavors' {sort_key}; sort by one of "
            f"{', '.join(sorted(SORT_KEYS))}."
        )
    for name, value, allowed in (
        ("sort_key", sort_key, sorted({*SORT_KEYS, *UNRECORDED_SORT_KEYS})),
        ("sort_dir", sort_dir, list(_SORT_DIRS)),
    ):
        if value not in allowed:
            raise exception.Invalid(
                message=f"Invalid input for query parameters {name}. Value: {value}. "
                f"{value!r} is not one of {allowed}"
            )


def _is_public(value: str | None) -> bool | None:
    """Nova's ``is_public`` filter: absent is True, ``none`` is every flavor."""
    if value is None:
        return True
    word = value.strip().lower()
    if word == "none":
        return None
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise exception.Invalid(message=f"Invalid is_public filter [{value}]")


def _minimum(req: falcon.Request, name: str) -> int | None:
    value = _param(req, name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise exception.Invalid(message=f"Invalid {name} filter [{value}]") from None


def _strings(specs: dict[str, Any]) -> dict[str, str]:
    # Nova stores extra spec values as strings whatever JSON type they came in.
    return {key: value if isinstance(value, str) else str(value) for key, value in specs.items()}


def access_view(flavor: Flavor) -> dict[str, Any]:
    """Nova's ``flavor_access`` list: one entry per project granted the flavor."""
    return {
        "flavor_access": [
            {"flavor_id": flavor.flavor_id, "tenant_id": project}
            for project in sorted(flavor.projects)
        ]
    }


def brief(flavor: Flavor, base: str, version: microversion.Version = (2, 1)) -> dict[str, Any]:
    """A flavor in a plain listing (``description`` from 2.55)."""
    view: dict[str, Any] = {
        "id": flavor.flavor_id,
        "name": flavor.name,
        "links": links(base, "flavors", flavor.flavor_id),
    }
    if version >= (2, 55):
        view["description"] = flavor.description
    return view


def detail(
    flavor: Flavor,
    base: str,
    version: microversion.Version = (2, 1),
    extra_specs: bool = False,
) -> dict[str, Any]:
    """A flavor as Nova shows it at ``version``; with its extra specs if ``extra_specs``
    (the caller decides: 2.61 and the index rule)."""
    view: dict[str, Any] = {
        "id": flavor.flavor_id,
        "name": flavor.name,
        "vcpus": flavor.vcpus,
        "ram": flavor.ram_mb,
        "disk": flavor.disk_gb,
        "swap": flavor.swap_mb or (0 if version >= (2, 75) else ""),
        "OS-FLV-EXT-DATA:ephemeral": flavor.ephemeral_gb,
        "OS-FLV-DISABLED:disabled": False,
        "os-flavor-access:is_public": flavor.is_public,
        "rxtx_factor": flavor.rxtx_factor,
        "links": links(base, "flavors", flavor.flavor_id),
    }
    if version >= (2, 55):
        view["description"] = flavor.description
    if extra_specs:
        view["extra_specs"] = dict(flavor.extra_specs)
    return view
