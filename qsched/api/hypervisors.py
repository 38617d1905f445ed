"""/v2.1/os-hypervisors: the compute nodes, their sizes, usages and servers (admin).

Nova's shapes at microversions 2.1 to 2.79 (:mod:`qsched.api.microversion`):
``cpu_info`` a JSON string, an object from 2.28; ``limit`` and ``marker`` with
``hypervisors_links`` from 2.33; from 2.53 uuids for ids (the hypervisor's is its
root provider's), the ``hypervisor_hostname_pattern`` and ``with_servers`` query
parameters instead of ``/{pattern}/search`` and ``/{pattern}/servers`` (gone, 404),
and from 2.75 ``servers`` always present (maybe empty) when asked for. Query
parameters a version does not define are refused with a 400, where Nova before
2.53 drops them. The domain is :class:`qsched.compute.hypervisors.HypervisorAPI`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import falcon

from qsched import exception
from qsched.api import PREFIX, FrontDoor, Handler, context_of, microversion
from qsched.api.microversion import Version
from qsched.api.query import refuse_unknown
from qsched.api.schemas.parameter_types import FALSE, TRUE, to_bool
from qsched.api.schemas.validation import query_int
from qsched.compute.hypervisors import (
    HYPERVISOR_TYPE,
    HYPERVISOR_VERSION,
    HypervisorNotFound,
    HypervisorView,
    Statistics,
)
from qsched.policies import hypervisors as hypervisors_policy
from qsched.resources import DISK_GB, MEMORY_MB, VCPU, check_uuid

CPU_INFO_OBJECT: Version = (2, 28)
PAGING: Version = (2, 33)
UUID_IDS: Version = (2, 53)  # also: search and servers as query parameters
SERVERS_ALWAYS: Version = (2, 75)


class _Handler(Handler):
    def __init__(self, compute: FrontDoor, public_endpoint: str | None, max_body: int) -> None:
        super().__init__(compute, public_endpoint, max_body)
        self.hypervisors = compute.hypervisors

    def authorize(self, req: falcon.Request, rule: str) -> None:
        self.hypervisors.authorize(context_of(req), rule)


class _Listing(_Handler):
    """``GET /os-hypervisors`` and ``/detail``: a page by id, or a hostname pattern."""

    rule = hypervisors_policy.LIST
    detailed = False

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        self.authorize(req, self.rule)
        allowed: tuple[str, ...] = ("limit", "marker") if version >= PAGING else ()
        if version >= UUID_IDS:
            allowed += ("hypervisor_hostname_pattern", "with_servers")
        refuse_unknown(req, allowed, since=microversion.MIN)
        with_servers = query_bool(req, "with_servers")
        pattern = _single(req, "hypervisor_hostname_pattern")
        size = None  # a page's size: links only for a full page
        if pattern is not None:
            if "limit" in req.params or "marker" in req.params:
                raise exception.Invalid(
                    message="Paging over hypervisors with the hypervisor_hostname_pattern "
                    "query parameter is not supported."
                )
            check_pattern(pattern)
            found = self.hypervisors.search(pattern, with_servers)
        elif version >= PAGING:
            size = self.compute.page_size(query_limit(req))
            found = self.hypervisors.page(size, marker_of(req, version), with_servers)
        else:  # no paging before 2.33: every hypervisor, as Nova lists them
            found = self.hypervisors.page(None)
        shown = [view_of(v, version, self.detailed, with_servers) for v in found]
        resp.media = {"hypervisors": shown}
        if size is not None and found and len(found) == size:
            resp.media["hypervisors_links"] = [self.next_link(req, version, found[-1], size)]

    def next_link(
        self, req: falcon.Request, version: Version, last: HypervisorView, size: int
    ) -> dict[str, str]:
        """Nova's ``hypervisors_links``: the next page after ``last``."""
        query = {k: v for k, v in req.params.items() if k != "marker"}
        query.update(limit=str(size), marker=str(last.uuid if version >= UUID_IDS else last.id))
        path = req.path.removeprefix(PREFIX)
        href = f"{self.base(req)}{PREFIX}{path}?{urlencode(sorted(query.items()))}"
        return {"rel": "next", "href": href}


class Hypervisors(_Listing):
    """``GET /v2.1/os-hypervisors``."""


class HypervisorsDetail(_Listing):
    """``GET /v2.1/os-hypervisors/detail``."""

    rule = hypervisors_policy.LIST_DETAIL
    detailed = True


class HypervisorItem(_Handler):
    """``GET /v2.1/os-hypervisors/{hypervisor_id}``: by integer id, from 2.53 by uuid."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, hypervisor_id: str) -> None:
        version = microversion.current(req)
        self.authorize(req, hypervisors_policy.SHOW)
        allowed = ("with_servers",) if version >= UUID_IDS else ()
        refuse_unknown(req, allowed, since=microversion.MIN)
        with_servers = query_bool(req, "with_servers")
        view = self.hypervisors.get(reference(hypervisor_id, version), with_servers)
        resp.media = {"hypervisor": view_of(view, version, True, with_servers)}


class HypervisorUptime(_Handler):
    """``GET /v2.1/os-hypervisors/{hypervisor_id}/uptime``: Nova's 501 for a virt driver
    that keeps no uptime (qsched's agents report none), once the hypervisor is found;
    clients such as ``openstack hypervisor show`` expect that answer."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, hypervisor_id: str) -> None:
        version = microversion.current(req)
        self.authorize(req, hypervisors_policy.UPTIME)
        refuse_unknown(req, (), since=microversion.MIN)
        self.hypervisors.get(reference(hypervisor_id, version))
        raise falcon.HTTPNotImplemented(
            description="Virt driver does not implement uptime function."
        )


def reference(hypervisor_id: str, version: microversion.Version) -> int | str:
    """A hypervisor's id in a path: an integer, from 2.53 a uuid.

    :raises Invalid: not a uuid from 2.53. :raises HypervisorNotFound: not an integer before.
    """
    if version >= UUID_IDS:
        try:
            return check_uuid(hypervisor_id)
        except exception.InvalidUUID:
            raise exception.Invalid(message=f"Invalid uuid {hypervisor_id}") from None
    if hypervisor_id.isascii() and hypervisor_id.isdigit():
        return int(hypervisor_id)
    raise HypervisorNotFound(id=hypervisor_id)


class HypervisorStatistics(_Handler):
    """``GET /v2.1/os-hypervisors/statistics``: sums over every enabled hypervisor."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.authorize(req, hypervisors_policy.STATISTICS)
        refuse_unknown(req, (), since=microversion.MIN)
        resp.media = {"hypervisor_statistics": statistics_of(self.hypervisors.statistics())}


class _PatternRoute(_Handler):
    """``/{pattern}/search`` and ``/{pattern}/servers``, before 2.53 only."""

    rule = hypervisors_policy.SEARCH
    with_servers = False

    def on_get(self, req: falcon.Request, resp: falcon.Response, hypervisor_id: str) -> None:
        pattern = hypervisor_id  # the route shares its first segment with the show
        version = microversion.current(req)
        if version >= UUID_IDS:
            raise falcon.HTTPNotFound()  # Nova's 404 for a route a version removed
        self.authorize(req, self.rule)
        refuse_unknown(req, (), since=microversion.MIN)
        found = self.hypervisors.search(pattern, self.with_servers)
        resp.media = {"hypervisors": [view_of(v, version, False, False) for v in found]}
        if self.with_servers:
            for shown, view in zip(resp.media["hypervisors"], found, strict=True):
                if view.servers:
                    shown["servers"] = servers_of(view)


class HypervisorSearch(_PatternRoute):
    """``GET /v2.1/os-hypervisors/{pattern}/search``."""


class HypervisorServers(_PatternRoute):
    """``GET /v2.1/os-hypervisors/{pattern}/servers``."""

    rule = hypervisors_policy.SERVERS
    with_servers = True


# -- query parameters --


def _single(req: falcon.Request, name: str) -> str | None:
    value = req.get_param(name)
    values = req.get_param_as_list(name) or []
    if len(values) > 1:
        raise exception.Invalid(
            message=f"Invalid input for query parameters {name}. Value: {values!r}. "
            "It must be given once."
        )
    return value


def query_bool(req: falcon.Request, name: str) -> bool:
    """A boolean query parameter (absent: False), as Nova's strict parsing reads it."""
    value = _single(req, name)
    if value is None:
        return False
    if value not in (*TRUE, *FALSE):
        raise exception.Invalid(
            message=f"Invalid input for query parameters {name}. Value: {value}. "
            "It must be a boolean (true or false)."
        )
    return to_bool(value)


def query_limit(req: falcon.Request) -> int | None:
    """``limit``: 0 or none is ``[api] max_limit``, as in Nova."""
    value = _single(req, "limit")
    if value is None:
        return None
    return query_int("limit", value) or None


def marker_of(req: falcon.Request, version: Version) -> int | str | None:
    """``marker``: a hypervisor's integer id, or from 2.53 its uuid.

    :raises Invalid: not one (Nova's "marker [...] not found").
    """
    marker = _single(req, "marker")
    if marker is None or version >= UUID_IDS:
        return marker
    if marker.isascii() and marker.isdigit() and len(marker) <= 10:
        return int(marker)
    raise exception.Invalid(message=f"marker [{marker}] not found")


def check_pattern(pattern: str) -> None:
    """:raises Invalid: not a host name pattern (Nova's fqdn: letters, digits, '-._')."""
    allowed = all(c.isascii() and (c.isalnum() or c in "-._") for c in pattern)
    if not (allowed and 0 < len(pattern) <= 255):
        raise exception.Invalid(
            message="Invalid input for query parameters hypervisor_hostname_pattern. "
            f"Value: {pattern[:100]}. It must be 1 to 255 of letters, digits, '-', '.', '_'."
        )


# -- views --


def view_of(
    view: HypervisorView, version: Version, detailed: bool, with_servers: bool
) -> dict[str, Any]:
    """One hypervisor as Nova shows it at ``version``."""
    uuids = version >= UUID_IDS
    shown: dict[str, Any] = {
        "id": view.uuid if uuids else view.id,
        "hypervisor_hostname": view.hostname,
        "state": "up" if view.up else "down",
        "status": "disabled" if view.service.disabled else "enabled",
    }
    if detailed:
        shown.update(_details(view, version))
    if with_servers and (view.servers or version >= SERVERS_ALWAYS):
        shown["servers"] = servers_of(view)
    return shown


def _details(view: HypervisorView, version: Version) -> dict[str, Any]:
    service = view.service
    cpu_info: dict[str, Any] = {"features": view.cpu_features} if view.cpu_features else {}
    memory_mb, memory_used = view.total(MEMORY_MB), view.used(MEMORY_MB)
    local_gb, local_used = view.total(DISK_GB), view.used(DISK_GB)
    return {
        "hypervisor_type": HYPERVISOR_TYPE,
        "hypervisor_version": HYPERVISOR_VERSION,
        "host_ip": None,  # agents do not report an address
        "service": {
            "id": service.id if version >= UUID_IDS else service.seq,
            "host": service.host,
            "disabled_reason": service.disabled_reason,
        },
        "vcpus": view.total(VCPU),
        "vcpus_used": view.used(VCPU),
        "memory_mb": memory_mb,
        "memory_mb_used": memory_used,
        "local_gb": local_gb,
        "local_gb_used": local_used,
        "free_ram_mb": memory_mb - memory_used,
        "free_disk_gb": local_gb - local_used,
        "disk_available_least": local_gb - local_used,
        "current_workload": view.building,
        "running_vms": len(view.consumers),
        "cpu_info": cpu_info if version >= CPU_INFO_OBJECT else json.dumps(cpu_info),
    }


def servers_of(view: HypervisorView) -> list[dict[str, str]]:
    return [{"name": s.name, "uuid": s.uuid} for s in view.servers or ()]


def statistics_of(stats: Statistics) -> dict[str, int]:
    """Nova's ``hypervisor_statistics``."""
    free_disk = stats.local_gb - stats.local_gb_used
    return {
        "count": stats.count,
        "vcpus": stats.vcpus,
        "vcpus_used": stats.vcpus_used,
        "memory_mb": stats.memory_mb,
        "memory_mb_used": stats.memory_mb_used,
        "free_ram_mb": stats.memory_mb - stats.memory_mb_used,
        "local_gb": stats.local_gb,
        "local_gb_used": stats.local_gb_used,
        "free_disk_gb": free_disk,
        "disk_available_least": free_disk,
        "running_vms": stats.running_vms,
        "current_workload": stats.current_workload,
    }
