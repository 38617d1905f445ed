"""/v2.1/os-services: list compute services, disable and enable them, force them down.

Nova's shapes at microversions 2.1 to 2.79 (:mod:`qsched.api.microversion`; the last
change is 2.53): before 2.53 a service is named by host and binary in the body of ``PUT
/os-services/{enable,disable,disable-log-reason,force-down}`` (``force-down`` and
the ``forced_down`` field from 2.11), its id an integer; from 2.53 by its UUID,
``PUT /os-services/{service_id}`` with ``status``, ``disabled_reason`` and
``forced_down``. A host in an aggregate's zone shows that zone, as in Nova. The
domain is :class:`qsched.compute.services.ServiceAPI`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon

from qsched import exception
from qsched.api import FrontDoor, Handler, context_of, microversion, read_json, usage_time
from qsched.api.microversion import Version
from qsched.api.query import refuse_unknown
from qsched.api.schemas import services as schema
from qsched.api.schemas.parameter_types import to_bool
from qsched.api.schemas.validation import validate
from qsched.compute.services import Change, ServiceView

FORCED_DOWN: Version = (2, 11)  # force-down, and forced_down in every view
UUID_IDS: Version = (2, 53)  # services named by UUID
_QUERY = ("host", "binary")


class _Handler(Handler):
    def __init__(self, compute: FrontDoor, public_endpoint: str | None, max_body: int) -> None:
        super().__init__(compute, public_endpoint, max_body)
        self.services = compute.services

    def version(self, req: falcon.Request) -> Version:
        """The request's microversion, as the app read it."""
        return microversion.current(req)


class Services(_Handler):
    """``GET /v2.1/os-services``, filtered by ``host`` and ``binary``."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = self.version(req)
        refuse_unknown(req, _QUERY, since=microversion.MIN)
        found = self.services.list(context_of(req), req.get_param("host"), req.get_param("binary"))
        zones = self.compute.host_zones()
        resp.media = {"services": [detail(v, version, zones.get(v.service.host)) for v in found]}


class ServiceItem(_Handler):
    """``PUT /v2.1/os-services/{action}`` (before 2.53), ``/{service_id}`` (2.53)."""

    def on_put(self, req: falcon.Request, resp: falcon.Response, service_id: str) -> None:
        version = self.version(req)
        body = read_json(req, self.max_body)
        if version >= UUID_IDS:
            view = self._update_by_id(req, service_id, body)
            zone = self.compute.host_zones().get(view.service.host)
            resp.media = {"service": detail(view, version, zone)}
            return
        old = schema.SERVICE_UPDATE_V211 if version >= FORCED_DOWN else schema.SERVICE_UPDATE
        body = validate(old, body)
        self.services.authorize_update(context_of(req))  # before the action: 403, not 404
        action = _ACTIONS.get(service_id)
        if action is None or (service_id == "force-down" and version < FORCED_DOWN):
            raise falcon.HTTPNotFound(description="Unknown action")
        change, shown = action(body)
        self.services.update(context_of(req), body["host"], body["binary"], change)
        resp.media = {"service": {"host": body["host"], "binary": body["binary"], **shown}}

    def _update_by_id(self, req: falcon.Request, service_id: str, body: Any) -> ServiceView:
        body = validate(schema.SERVICE_UPDATE_V253, body)
        status = body.get("status")
        forced = body.get("forced_down")
        change = Change(
            disabled=None if status is None else status == "disabled",
            disabled_reason=body.get("disabled_reason"),
            forced_down=None if forced is None else to_bool(forced),
        )
        return self.services.update_by_id(context_of(req), service_id, change)


def _enable(body: dict[str, Any]) -> tuple[Change, dict[str, Any]]:
    return Change(disabled=False), {"status": "enabled"}


def _disable(body: dict[str, Any]) -> tuple[Change, dict[str, Any]]:
    return Change(disabled=True), {"status": "disabled"}


def _disable_log_reason(body: dict[str, Any]) -> tuple[Change, dict[str, Any]]:
    reason = body.get("disabled_reason")
    if reason is None:
        raise exception.Invalid(message="Missing disabled reason field")
    shown = {"status": "disabled", "disabled_reason": reason}
    return Change(disabled=True, disabled_reason=reason), shown


def _force_down(body: dict[str, Any]) -> tuple[Change, dict[str, Any]]:
    if "forced_down" not in body:
        raise exception.Invalid(message="Missing forced_down field")
    forced = to_bool(body["forced_down"])
    return Change(forced_down=forced), {"forced_down": forced}


_ACTIONS: dict[str, Callable[[dict[str, Any]], tuple[Change, dict[str, Any]]]] = {
    "enable": _enable,
    "disable": _disable,
    "disable-log-reason": _disable_log_reason,
    "force-down": _force_down,
}


def detail(view: ServiceView, version: Version, zone: str | None = None) -> dict[str, Any]:
    """One service as Nova shows it at ``version``: in ``zone``, its aggregate's, if it
    has one (Nova's rule: an aggregate's zone is its hosts'), else in its agent's."""
    service = view.service
    shown: dict[str, Any] = {
        "id": service.id if version >= UUID_IDS else service.seq,
        "binary": view.binary,
        "host": service.host,
        "zone": zone or service.zone,
        "status": "disabled" if service.disabled else "enabled",
        "state": "up" if view.up else "down",
        "updated_at": usage_time(view.reported_at),
        "disabled_reason": service.disabled_reason,
    }
    if version >= FORCED_DOWN:
        shown["forced_down"] = service.forced_down
    return shown
