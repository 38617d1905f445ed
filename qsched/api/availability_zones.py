"""/v2.1/os-availability-zone: the zones a boot may name, and (admin) their hosts.

Nova's shapes, the same at every microversion from 2.1 to 2.79: ``availabilityZoneInfo``
with ``zoneName``, ``zoneState.available`` and ``hosts`` (null in the list; in the
detail, host -> ``nova-compute`` -> ``available``, ``active``, ``updated_at``
for an available zone). Query parameters are refused with a 400, where Nova
drops them. The domain is :class:`qsched.compute.zones.ZoneAPI`.
"""

from __future__ import annotations

from typing import Any

import falcon

from qsched.api import FrontDoor, Handler, context_of, microversion, usage_time
from qsched.api.query import refuse_unknown
from qsched.compute.services import ServiceView
from qsched.compute.zones import Zone


class _Handler(Handler):
    def __init__(self, compute: FrontDoor, public_endpoint: str | None, max_body: int) -> None:
        super().__init__(compute, public_endpoint, max_body)
        self.zones = compute.zones


class AvailabilityZones(_Handler):
    """``GET /v2.1/os-availability-zone``: anyone's, O(number of zones)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        zones = self.zones.list(context_of(req))
        refuse_unknown(req, (), since=microversion.MIN)
        resp.media = {"availabilityZoneInfo": [zone_of(zone) for zone in zones]}


class AvailabilityZonesDetail(_Handler):
    """``GET /v2.1/os-availability-zone/detail``: with the hosts (admin; it scans)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        zones = self.zones.detail(context_of(req))
        refuse_unknown(req, (), since=microversion.MIN)
        resp.media = {"availabilityZoneInfo": [zone_of(zone) for zone in zones]}


def zone_of(zone: Zone) -> dict[str, Any]:
    """One zone as Nova shows it."""
    hosts = None
    if zone.hosts is not None:
        hosts = {host: {view.binary: _service(view)} for host, view in sorted(zone.hosts.items())}
    return {"zoneName": zone.name, "zoneState": {"available": zone.available}, "hosts": hosts}


def _service(view: ServiceView) -> dict[str, Any]:
    return {
        "available": view.up,
        "active": not view.service.disabled,
        "updated_at": usage_time(view.reported_at),
    }
