"""``/healthcheck``: oslo.middleware's healthcheck, with the ledger and the bus checked first.

For load balancers and monitoring. The path is public (no token), so the answer
says what is down, never where. It is oslo.middleware's ``Healthcheck``, reading
its ``[healthcheck]`` options and loading the backends they name, with one
backend of qsched's always first, :class:`LedgerAndBus`: its reason is ``OK``,
or the parts down with a word each for why (``DOWN: bus (unreachable)``).

* 200 when every backend is available, else 503. ``HEAD``: the same status and
  no body (oslo.middleware answers a healthy ``HEAD`` with 204; qsched keeps 200).
* Text, the default: each backend's reason, one a line.
* ``Accept: application/json``: :func:`health_document`; with ``[healthcheck]
  detailed = true``, oslo.middleware's detailed document instead (each backend's
  details, and the process's threads, platform and Python: not for a public address).
* ``Accept: text/html``: oslo.middleware's page.

``[healthcheck] backends = disable_by_file`` and ``disable_by_file_path`` let an
operator drain a node: while the file exists the answer is 503 ``DISABLED BY
FILE``. A request that ``allowed_source_ranges`` or ``ignore_proxied_requests``
leaves out is answered 404, as a path nothing serves would be.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import EntryPoint
from typing import Any

import falcon
import webob
from oslo_middleware import healthcheck
from oslo_middleware.healthcheck import pluginbase
from stevedore.extension import Extension

#: What :class:`LedgerAndBus` asks: each part and why it is down (None: it answers).
HealthCheck = Callable[[], Mapping[str, str | None]]

# Set in the WSGI environment of a request oslo.middleware left out (see _left_out).
_LEFT_OUT = "qsched.healthcheck.left_out"


class Healthcheck:
    """The ``/healthcheck`` resource: ``GET`` and ``HEAD``, answered by :class:`OsloHealthcheck`.

    ``check``: :meth:`qsched.compute.api.ComputeAPI.check_health` (what each check
    costs and sees); ``conf``: the entry point's parsed configuration, which
    oslo.middleware reads ``[healthcheck]`` from.
    """

    def __init__(self, check: HealthCheck, conf: Any) -> None:
        self.middleware = OsloHealthcheck(check, conf)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        answer = webob.Request(req.env).get_response(self.middleware)
        if req.env.get(_LEFT_OUT):
            raise falcon.HTTPNotFound()
        resp.status = answer.status
        resp.content_type = answer.headers["Content-Type"]
        resp.cache_control = ["no-store"]
        resp.data = answer.body

    on_head = on_get


class OsloHealthcheck(healthcheck.Healthcheck):
    """oslo.middleware's healthcheck with :class:`LedgerAndBus` before the configured backends.

    qsched's backend is not loaded by name: it needs this API's stores and bus,
    which a stevedore entry point cannot be given, and a healthcheck that did not
    look at them because ``backends`` left it out would say nothing worth knowing.
    """

    HEAD_HEALTHY_TO_STATUS_CODES = healthcheck.Healthcheck.HEALTHY_TO_STATUS_CODES

    def __init__(self, check: HealthCheck, conf: Any) -> None:
        super().__init__(_left_out, conf)
        ours = LedgerAndBus(self.oslo_conf, check)
        entry_point = EntryPoint("qsched", f"{__name__}:LedgerAndBus", self.NAMESPACE)
        self._backends.extensions.insert(0, Extension("qsched", entry_point, LedgerAndBus, ours))

    def _make_json_response(
        self, results: list[pluginbase.HealthcheckResult], healthy: bool
    ) -> tuple[str, str]:
        if self._show_details:
            return super()._make_json_response(results, healthy)
        return json.dumps(health_document(results)), "application/json"


class LedgerAndBus(pluginbase.HealthcheckBaseExtension):
    """The backend that asks this API's ledger and bus (``check``); reads no option."""

    def __init__(self, oslo_conf: Any, check: HealthCheck) -> None:
        super().__init__(oslo_conf, {})
        self.check = check

    def healthcheck(self, server_port: int) -> PartsResult:
        return PartsResult(self.check())


class PartsResult(pluginbase.HealthcheckResult):
    """The ledger's and the bus's health: available when both answer.

    ``reason``: :func:`health_text`; ``details`` (the detailed view): each part,
    ``ledger: up; bus: unreachable``.
    """

    def __init__(self, health: Mapping[str, str | None]) -> None:
        self.parts = dict(health)
        details = "; ".join(f"{part}: {why or 'up'}" for part, why in health.items())
        super().__init__(not any(health.values()), health_text(health), details)


def health_text(health: Mapping[str, str | None]) -> str:
    """``OK``, or ``DOWN: ledger (timed out), bus (unreachable)``: the parts down and why."""
    down = [f"{part} ({why})" for part, why in health.items() if why]
    return f"DOWN: {', '.join(down)}" if down else "OK"


def health_document(results: Sequence[pluginbase.HealthcheckResult]) -> dict[str, Any]:
    """The JSON answer: the verdict, the reasons, then each part with its own::

    {"status": "DOWN", "reasons": ["bus: unreachable"],
     "parts": {"ledger": {"status": "UP"}, "bus": {"status": "DOWN", "reason": "unreachable"}}}

    Another backend that is not available adds its reason (``DISABLED BY FILE``).
    """
    parts: dict[str, dict[str, str]] = {}
    reasons: list[str] = []
    for result in results:
        if isinstance(result, PartsResult):
            for part, why in result.parts.items():
                parts[part] = {"status": "DOWN", "reason": why} if why else {"status": "UP"}
                reasons.extend([f"{part}: {why}"] if why else [])
        elif not result.available:
            reasons.append(result.reason)
    return {"status": "DOWN" if reasons else "OK", "reasons": reasons, "parts": parts}


def _left_out(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Where oslo.middleware sends a request it does not answer (allowed_source_ranges,
    ignore_proxied_requests): marked, for :class:`Healthcheck` to answer it 404."""
    environ[_LEFT_OUT] = True
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b""]
