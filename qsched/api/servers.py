"""/v2.1/servers: boot, list, show, update and delete, and a server's metadata, in Nova's shapes
for each microversion."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid as uuidlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import falcon

from qsched import exception
from qsched.api import (
    PREFIX,
    FrontDoor,
    Handler,
    boot,
    context_of,
    iso8601,
    links,
    microversion,
    read_json,
    usage_time,
)
from qsched.api.query import refuse_unknown
from qsched.api.schemas import servers as schema
from qsched.api.schemas.parameter_types import TRUE
from qsched.api.schemas.validation import field_error, for_version, query_int, validate
from qsched.compute import list_query as server_list
from qsched.compute.host_rules import HostRequest
from qsched.compute.list_query import hostname
from qsched.compute.server_actions import power_state, status, vm_state
from qsched.context import RequestContext
from qsched.ledger.base import Instance, State
from qsched.policies import server_metadata as metadata_policy
from qsched.scheduling.records import BootDetails, ServerFields, details

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
        limit: int | None,
        path: str,
    ) -> None:
        """Nova's ``servers_links`` when the page is full, so clients fetch the next one."""
        size = self.compute.page_size(limit)
        if not found or len(found) < size:
            return
        query = {k: v for k, v in req.params.items() if k not in ("marker", "limit")}
        query.update(limit=str(size), marker=found[-1].uuid)
        href = f"{self.base(req)}{PREFIX}{path}?{urlencode(sorted(query.items()), doseq=True)}"
        resp.media["servers_links"] = [{"rel": "next", "href": href}]


class Servers(_Handler):
    """``/v2.1/servers``: list (id, name, links) and boot."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        params, limit = list_query(req)
        found = self.compute.list(
            context_of(req), params=params, version=microversion.current(req), limit=limit
        )
        base = self.base(req)
        resp.media = {"servers": [brief(i, base) for i in found]}
        self.next_link(req, resp, found, limit, "/servers")

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        validator = next(v for since, v in schema.SERVER_CREATE if version >= since)
        body = validate(validator, read_json(req, self.max_body))
        server, hints = body["server"], scheduler_hints(body)
        context = context_of(req)
        asked = boot.parse(server, version, self.compute.api.enable_instance_password,
                           lambda: self.compute.file_limits(context))  # fmt: skip
        min_count = int(server.get("min_count", 1))  # Nova's defaults: max is min
        found = self.compute.boot_many(
            context_of(req),
            name=server["name"],
            flavor_ref=server["flavorRef"],
            image_ref=asked.image_ref,
            availability_zone=server.get("availability_zone"),
            metadata=server.get("metadata"),
            group=hints.group,
            min_count=min_count,
            max_count=int(server.get("max_count", min_count)),
            server=asked.fields,
            hosts=HostRequest(hints.same_host, hints.different_host, asked.host, asked.node),
        )
        if server.get("return_reservation_id", False) in TRUE:
            resp.status = falcon.HTTP_202
            resp.media = {"reservation_id": found.reservation_id}
            return
        instance = found.instances[0]
        server_links = links(self.base(req), "servers", instance.uuid)
        resp.status = falcon.HTTP_202
        resp.location = server_links[0]["href"]
        created: dict[str, Any] = {
            "id": instance.uuid,
            "links": server_links,
            "OS-DCF:diskConfig": asked.fields.disk_config,
            "security_groups": [{"name": "default"}],
        }
        if asked.admin_pass is not None:  # returned once: no record keeps it
            created["adminPass"] = asked.admin_pass
        resp.media = {"server": created}


class ServersDetail(_Handler):
    """``/v2.1/servers/detail``: the project's servers in full."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        context, (params, limit) = context_of(req), list_query(req)
        version = microversion.current(req)
        found = self.compute.list(context, detail=True, params=params, version=version, limit=limit)
        base, hosts = self.base(req), self.compute.shows_host(context)
        shown = Shown.of(self.compute, context, version, listed=True)
        resp.media = {"servers": [detail(i, context, base, hosts, shown) for i in found]}
        self.next_link(req, resp, found, limit, "/servers/detail")


class Server(_Handler):
    """``/v2.1/servers/{server_id}``: show, update and delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        context = context_of(req)
        instance = self.compute.get(context, server_id)
        hosts = self.compute.shows_host(context)
        shown = Shown.of(self.compute, context, microversion.current(req))
        resp.media = {"server": detail(instance, context, self.base(req), hosts, shown)}

    def on_put(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        """Nova's update: the server as GET shows it from 2.75, Nova's fewer keys before."""
        version = microversion.current(req)
        validator = for_version(schema.SERVER_UPDATE, version)
        body = validate(validator, read_json(req, self.max_body))["server"]
        context = context_of(req)
        instance = self.compute.update(
            context, server_id, {_UPDATE_FIELDS[k]: v for k, v in body.items()}
        )
        resp.media = {"server": changed(self.compute, req, context, instance, self.base(req))}

    def on_delete(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        self.compute.delete(context_of(req), server_id)
        resp.status = falcon.HTTP_204


#: the scheduler hints qsched acts on; any other is refused, never ignored
HINTS = ("group", "same_host", "different_host")
_HINT_KEYS = ("os:scheduler_hints", "OS-SCH-HNT:scheduler_hints")


@dataclasses.dataclass(frozen=True)
class Hints:
    """The scheduler hints of a create: its server group, the servers to share a host
    with and to keep away from."""

    group: str | None = None
    same_host: tuple[str, ...] = ()
    different_host: tuple[str, ...] = ()


def scheduler_hints(body: dict[str, Any]) -> Hints:
    """The scheduler hints of a create body.

    :raises Invalid: hints given under both names, a hint qsched does not act on
        (Nova's scheduler filters that qsched has not: ``query``, ``target_cell``...),
        a group that is not one UUID, servers that are not UUIDs.
    """
    given = [key for key in _HINT_KEYS if key in body]
    if not given:
        return Hints()
    if len(given) > 1:
        raise field_error(
            [given[1]], body[given[1]], f"Give the scheduler hints once, as {given[0]}."
        )
    hints = body[given[0]]
    unknown = sorted(set(hints) - set(HINTS))
    if unknown:
        raise field_error(
            [given[0]], hints, f"qsched acts only on the scheduler hints {list(HINTS)}; "
            f"remove {unknown}.",
        )  # fmt: skip
    group = hints.get("group")
    if group is not None and not schema.GROUP_HINT.is_valid(group):
        raise field_error([given[0], "group"], group, f"It {schema.group_hint['x-message']}.")
    servers = {}
    for hint in ("same_host", "different_host"):
        value = hints.get(hint, [])
        if not schema.SERVERS_HINT.is_valid(value):
            raise field_error([given[0], hint], value, f"It {schema.servers_hint['x-message']}.")
        listed = [value] if isinstance(value, str) else value
        servers[hint] = tuple(str(uuidlib.UUID(u)) for u in listed)
    return Hints(
        str(group[0] if isinstance(group, list) else group) if group is not None else None,
        servers["same_host"], servers["different_host"],
    )  # fmt: skip


def list_query(req: falcon.Request) -> tuple[dict[str, list[str]], int | None]:
    """The list's query (:func:`list_params`) and its ``limit`` (:func:`list_limit`).

    :raises Invalid: a ``limit`` that is not a whole number; from 2.75 a parameter
        the list does not read (one starting with ``_`` goes on to the list, which
        refuses it or drops it).
    """
    limit = list_limit(req)
    internal = [name for name in req.params if name.startswith("_")]
    refuse_unknown(req, [*server_list.PARAMETERS, *internal])
    return list_params(req), limit


def list_params(req: falcon.Request) -> dict[str, list[str]]:
    """The list's query, each parameter's values in order
    (:func:`qsched.compute.list_query.parse` reads them)."""
    return {k: v if isinstance(v, list) else [v] for k, v in req.params.items()}


def list_limit(req: falcon.Request) -> int | None:
    """``limit`` (the last one given), a whole number as Nova's schema says.

    :raises Invalid: anything else.
    """
    values = list_params(req).get("limit")
    return None if not values else query_int("limit", values[-1])


def brief(instance: Instance, base: str) -> dict[str, Any]:
    return {
        "id": instance.uuid,
        "name": instance.name,
        "links": links(base, "servers", instance.uuid),
    }


def detail(
    instance: Instance,
    context: RequestContext,
    base: str,
    show_host: bool = False,
    shown: Shown | None = None,
) -> dict[str, Any]:
    """A server as Nova shows it at ``shown.version`` (None: 2.1); where it runs if
    ``show_host`` (the extended server attributes rule allows it), fault details for
    admins only."""
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
        "accessIPv4": "",  # these four as the create asked: _asked_fields
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
    version = shown.version if shown is not None else microversion.BASE
    view.update(_asked_fields(boot.server, version, show_host))
    if shown is not None:
        view.update(versioned(instance, boot, show_host, shown))
    return view


def _asked_fields(
    fields: ServerFields, version: microversion.Version, show_host: bool
) -> dict[str, Any]:
    """What the create asked of the server, each from the microversion that shows it."""
    shown: dict[str, Any] = {
        "accessIPv4": fields.access_ipv4,
        "accessIPv6": fields.access_ipv6,
        "key_name": fields.key_name,
        "OS-DCF:diskConfig": fields.disk_config,
        "config_drive": "True" if fields.config_drive else "",  # Nova's text
    }
    if version >= (2, 19):
        shown["description"] = fields.description
    if version >= (2, 26):
        shown["tags"] = list(fields.tags)
    if show_host and version >= (2, 3):
        shown["OS-EXT-SRV-ATTR:user_data"] = fields.user_data
    return shown


@dataclasses.dataclass(frozen=True)
class Shown:
    """What a server's view shows besides Nova 2.1's keys: the microversion, the host
    status when the caller may see it (a function of the server), the flavor's extra
    specs (2.47, ``os-flavor-extra-specs:index``), and whether it is a list's view
    (``server_groups`` is for show and update only)."""

    version: microversion.Version = (2, 1)
    host_status: Callable[[Instance], str | None] | None = None
    extra_specs: bool = False
    listed: bool = False

    @classmethod
    def of(
        cls,
        compute: FrontDoor,
        context: RequestContext,
        version: microversion.Version,
        listed: bool = False,
    ) -> Shown:
        """What ``context`` may see at ``version``; host statuses are read once per host
        and project of a page (two O(1) reads each)."""
        statuses: dict[tuple[str | None, str], str | None] = {}

        def host_status(instance: Instance) -> str | None:
            key = (instance.host, instance.project_id)
            if key not in statuses:
                statuses[key] = compute.host_status(context, instance)
            return statuses[key]

        specs = version >= (2, 47) and compute.shows_extra_specs(context)
        return cls(version, host_status if version >= (2, 16) else None, specs, listed)


def versioned(
    instance: Instance, boot: BootDetails, show_host: bool, shown: Shown
) -> dict[str, Any]:
    """The keys of a server's view that microversions after 2.1 add or change."""
    version, view = shown.version, {}
    if version >= (2, 3) and show_host:
        view.update({
            "OS-EXT-SRV-ATTR:reservation_id": boot.reservation_id,
            "OS-EXT-SRV-ATTR:launch_index": 0,  # not kept: every server is launch 0
            "OS-EXT-SRV-ATTR:hostname": hostname(instance.name),
            "OS-EXT-SRV-ATTR:kernel_id": "",
            "OS-EXT-SRV-ATTR:ramdisk_id": "",
            "OS-EXT-SRV-ATTR:root_device_name": None,
        })  # fmt: skip
    if version >= (2, 9):
        view["locked"] = False  # qsched has no lock action
    if version >= (2, 16) and shown.host_status is not None:
        status = shown.host_status(instance)
        if status is not None:
            view["host_status"] = status
    if version >= (2, 47):
        view["flavor"] = embedded_flavor(instance.flavor, shown.extra_specs)
    if version >= (2, 63):
        view["trusted_image_certificates"] = None  # qsched verifies no image signatures
    if version >= (2, 71) and not shown.listed:
        view["server_groups"] = [instance.group] if instance.group else []
    if version >= (2, 73):
        view["locked_reason"] = None
    return view


def embedded_flavor(flavor: Mapping[str, Any], extra_specs: bool) -> dict[str, Any]:
    """Nova's 2.47 flavor of a server: the copy it was booted with, no id or links."""
    shown: dict[str, Any] = {
        "original_name": str(flavor.get("name", "")),
        "vcpus": int(flavor.get("vcpus", 0)),
        "ram": int(flavor.get("ram_mb", 0)),
        "disk": int(flavor.get("disk_gb", 0)),
        "ephemeral": int(flavor.get("ephemeral_gb", 0)),
        "swap": int(flavor.get("swap_mb", 0)),
    }
    if extra_specs:
        shown["extra_specs"] = dict(flavor.get("extra_specs") or {})
    return shown


#: a PUT body's fields -> what :meth:`qsched.compute.api.ComputeAPI.update` changes
_UPDATE_FIELDS = {"name": "name", "description": "description", "accessIPv4": "access_ip_v4",
                  "accessIPv6": "access_ip_v6", "OS-DCF:diskConfig": "disk_config"}  # fmt: skip
#: the keys of Nova's update answer before 2.75 (as the show's after)
_UPDATE_KEYS = frozenset({
    "OS-DCF:diskConfig", "accessIPv4", "accessIPv6", "addresses", "created", "flavor", "hostId",
    "id", "image", "links", "metadata", "name", "progress", "status", "tenant_id", "updated",
    "user_id", "locked", "description", "tags", "trusted_image_certificates", "server_groups",
    "locked_reason", "fault",
})  # fmt: skip


def changed(
    compute: FrontDoor,
    req: falcon.Request,
    context: RequestContext,
    instance: Instance,
    base: str,
    more: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """A server as Nova's update (and rebuild: ``more`` keys) answers: as GET shows it
    from 2.75, Nova's fewer keys before."""
    version = microversion.current(req)
    full = version >= (2, 75)
    hosts = full and compute.shows_host(context)
    if full:
        shown = Shown.of(compute, context, version)
    else:  # the embedded flavor shows its extra specs to those who may read them
        specs = version >= (2, 47) and compute.shows_extra_specs(context)
        shown = Shown(version, extra_specs=specs)
    view = detail(instance, context, base, hosts, shown)
    if not full:
        view = {k: v for k, v in view.items() if k in _UPDATE_KEYS | more}
    return view


class Metadata(_Handler):
    """``/v2.1/servers/{server_id}/metadata``: list, replace (PUT) and update (POST)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        resp.media = {"metadata": self.compute.metadata(context_of(req), server_id)}

    def on_post(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        items = validate(schema.METADATA_SET, read_json(req, self.max_body))["metadata"]
        found = self.compute.set_metadata(context_of(req), server_id, items)
        resp.media = {"metadata": found}

    def on_put(self, req: falcon.Request, resp: falcon.Response, server_id: str) -> None:
        items = validate(schema.METADATA_SET, read_json(req, self.max_body))["metadata"]
        found = self.compute.set_metadata(
            context_of(req), server_id, items, replace=True, rule=metadata_policy.UPDATE_ALL
        )
        resp.media = {"metadata": found}


class MetadataItem(_Handler):
    """``/v2.1/servers/{server_id}/metadata/{key}``: show, set and delete one item."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, server_id: str, key: str) -> None:
        resp.media = {"meta": self.compute.metadata(context_of(req), server_id, key)}

    def on_put(self, req: falcon.Request, resp: falcon.Response, server_id: str, key: str) -> None:
        item = validate(schema.METADATA_ITEM, read_json(req, self.max_body))["meta"]
        if key not in item:
            raise exception.Invalid(message="Request body and URI mismatch")
        self.compute.set_metadata(context_of(req), server_id, item, rule=metadata_policy.UPDATE)
        resp.media = {"meta": item}

    def on_delete(
        self, req: falcon.Request, resp: falcon.Response, server_id: str, key: str
    ) -> None:
        self.compute.delete_metadata(context_of(req), server_id, key)
        resp.status = falcon.HTTP_204


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
