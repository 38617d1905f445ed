"""/v2.1/servers: boot, show, list and delete, in Nova's 2.1 shapes."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlencode

import falcon

from qsched.api import (
    PREFIX,
    Handler,
    context_of,
    iso8601,
    links,
    read_json,
    schemas,
    usage_time,
)
from qsched.context import RequestContext
from qsched.ledger.base import Instance, State
from qsched.scheduling.records import details
from qsched.server_actions import power_state, status, vm_state

_VM_STATES = {
    State.BUILD: "building",
    State.ACTIVE: "active",
    State.ERROR: "error",
    State.DELETED: "deleted",
}


class _Handler(Handler):
    def next_link(
        self,
        req: falcon.Request,
        resp: falcon.Response,
        found: list[Instance],
        filters: dict[str, Any],
        path: str,
    ) -> None:
        """Nova's ``servers_links`` when the page is full, so clients fetch the next one."""
        size = self.compute.page_size(filters.get("limit"))
        if not found or len(found) < size:
            return
        query = {k: v for k, v in req.params.items() if k != "marker"}
        query.update(limit=str(size), marker=found[-1].uuid)
        href = f"{self.base(req)}{PREFIX}{path}?{urlencode(sorted(query.items()), doseq=True)}"
        resp.media["servers_links"] = [{"rel": "next", "href": href}]


class Servers(_Handler):
    """``/v2.1/servers``: list (id, name, links) and boot."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        filters = list_filters(req)
        found = self.compute.list(context_of(req), **filters)
        base = self.base(req)
        resp.media = {"servers": [brief(i, base) for i in found]}
        self.next_link(req, resp, found, filters, "/servers")

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = schemas.validate(schemas.SERVER_CREATE, read_json(req, self.max_body))
        server = body["server"]
        min_count = int(server.get("min_count", 1))  # Nova's defaults: max is min
        found = self.compute.boot_many(
            context_of(req),
            name=server["name"],
            flavor_ref=server["flavorRef"],
            image_ref=server["imageRef"],
            availability_zone=server.get("availability_zone"),
            metadata=server.get("metadata"),
            group=group_hint(body),
            min_count=min_count,
            max_count=int(server.get("max_count", min_count)),
        )
        if server.get("return_reservation_id", False) in schemas.TRUE:
            resp.status = falcon.HTTP_202
            resp.media = {"reservation_id": found.reservation_id}
            return
        instance = found.instances[0]
        server_links = links(self.base(req), "servers", instance.uuid)
        resp.status = falcon.HTTP_202
        resp.location = server_links[0]["href"]
        resp.media = {
            "server": {
                "id": instance.uuid,
                "links": server_links,
                "OS-DCF:diskConfig": "MANUAL",
                "security_groups": [{"name": "default"}],
            }
        }


class ServersDetail(_Handler):
    """``/v2.1/servers/detail``: the project's servers in full."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        context = context_of(req)
        filters = list_filters(req)
        found = self.compute.list(context, detail=True, **filters)
        base, hosts = self.base(req), self.compute.shows_host(context)
        resp.media = {"servers": [detail(i, context, base, hosts) for i in found]}
        self.next_link(req, resp, found, filters, "/servers/detail")


class Server(_Handler):
    """``/v2.1/servers/{server_id}``: show and delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        context = context_of(req)
        instance = self.compute.get(context, server_id)
        hosts = self.compute.shows_host(context)
        resp.media = {"server": detail(instance, context, self.base(req), hosts)}

    def on_delete(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        self.compute.delete(context_of(req), server_id)
        resp.status = falcon.HTTP_204


#: the scheduler hints qsched acts on; any other is refused, never ignored
HINTS = ("group",)
_HINT_KEYS = ("os:scheduler_hints", "OS-SCH-HNT:scheduler_hints")


def group_hint(body: dict[str, Any]) -> str | None:
    """The server group a boot joins: the ``group`` scheduler hint, if any.

    :raises Invalid: hints given under both names, a hint qsched does not act on
        (Nova's scheduler filters that qsched has not: ``same_host``, ``query``...),
        or a group that is not one UUID.
    """
    given = [key for key in _HINT_KEYS if key in body]
    if not given:
        return None
    if len(given) > 1:
        raise schemas.field_error(
            [given[1]], body[given[1]], f"Give the scheduler hints once, as {given[0]}."
        )
    hints = body[given[0]]
    unknown = sorted(set(hints) - set(HINTS))
    if unknown:
        raise schemas.field_error(
            [given[0]], hints, f"qsched acts only on the scheduler hints {list(HINTS)}; "
            f"remove {unknown}.",
        )  # fmt: skip
    if "group" not in hints:
        return None
    group = hints["group"]
    if schemas.GROUP_HINT.is_valid(group):
        return str(group[0] if isinstance(group, list) else group)
    raise schemas.field_error([given[0], "group"], group, f"It {schemas.group_hint['x-message']}.")


def list_filters(req: falcon.Request) -> dict[str, Any]:
    """``limit``, ``marker``, ``status`` and (admins) ``project_id`` from the query."""
    filters: dict[str, Any] = {
        "status": req.get_param("status"),
        "marker": req.get_param("marker"),
        "project_id": req.get_param("project_id") or req.get_param("tenant_id"),
        "reservation_id": req.get_param("reservation_id"),
    }
    limit = req.get_param("limit")
    if limit is not None:
        filters["limit"] = schemas.query_int("limit", limit)
    return filters


def brief(instance: Instance, base: str) -> dict[str, Any]:
    return {
        "id": instance.uuid,
        "name": instance.name,
        "links": links(base, "servers", instance.uuid),
    }


def detail(
    instance: Instance, context: RequestContext, base: str, show_host: bool = False
) -> dict[str, Any]:
    """A server as Nova 2.1 shows it; where it runs if ``show_host`` (the extended server
    attributes rule allows it), fault details for admins only."""
    boot = details(instance)
    flavor_id = str(instance.flavor.get("id") or instance.flavor.get("name"))
    image_ref = boot.image_ref
    view: dict[str, Any] = {
        "id": instance.uuid,
        "name": instance.name,
        "status": status(instance),
        "tenant_id": instance.project_id,
        "user_id": instance.user_id,
        "metadata": dict(boot.metadata),
        "hostId": _host_id(instance),
        "image": {"id": image_ref, "links": links(base, "images", image_ref)[1:]}
        if image_ref
        else "",
        "flavor": {"id": flavor_id, "links": links(base, "flavors", flavor_id)[1:]},
        "created": iso8601(instance.created_at),
        "updated": iso8601(instance.updated_at),
        "addresses": {},
        "accessIPv4": "",
        "accessIPv6": "",
        "links": links(base, "servers", instance.uuid),
        "OS-DCF:diskConfig": "MANUAL",
        "progress": 0,
        "OS-EXT-AZ:availability_zone": boot.availability_zone or "",
        "config_drive": "",
        "key_name": None,
        "OS-SRV-USG:launched_at": usage_time(instance.launched_at),
        "OS-SRV-USG:terminated_at": None,
        "OS-EXT-STS:task_state": instance.task_state.value or None,
        "OS-EXT-STS:vm_state": vm_state(instance, _VM_STATES[instance.state]),
        "OS-EXT-STS:power_state": power_state(instance),
        "os-extended-volumes:volumes_attached": [],
        "security_groups": [{"name": "default"}],
    }
    if show_host:
        view["OS-EXT-SRV-ATTR:host"] = instance.host
        view["OS-EXT-SRV-ATTR:hypervisor_hostname"] = instance.node
        view["OS-EXT-SRV-ATTR:instance_name"] = f"instance-{instance.uuid}"
    if instance.state == State.ERROR and instance.fault:
        view["fault"] = _fault(instance.fault, context.is_admin)
    return view


def _fault(fault: Any, is_admin: bool) -> dict[str, Any]:
    # Details (who refused, why) describe the cloud's topology: admins only, as in Nova.
    shown = {
        "code": fault.get("code", 500),
        "message": fault.get("message", ""),
        "created": iso8601(fault.get("created")),
    }
    if is_admin and fault.get("details"):
        shown["details"] = fault["details"]
    return shown


def _host_id(instance: Instance) -> str:
    """Nova's hostId: the same for a project's servers on one host, opaque otherwise."""
    if not instance.host:
        return ""
    return hashlib.sha224((instance.project_id + instance.host).encode()).hexdigest()
