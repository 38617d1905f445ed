"""``/metrics`` and the per-request counts: the API's edge of :mod:`qsched.metrics`.

``/metrics`` is served on the API's own port, outside authentication as
``/healthcheck`` is (:data:`qsched.api.auth.PUBLIC_PATHS`): Prometheus scrapes
without a Keystone token, and under gunicorn any worker's answer sums every
worker's counts, so no second port (and no second server in each worker) is needed.
Its labels name no project, server or host (``docs/metrics.rst``); a load balancer
that publishes the API may still keep ``/metrics`` to the operators' network.
"""

from __future__ import annotations

import time
from typing import Any

import falcon

from qsched.metrics import CONTENT_TYPE, UNMATCHED, APIMetrics

PATH = "/metrics"


class MetricsMiddleware:
    """Counts and times every response by route template, method and status.

    First in the middleware list, so its clock spans the others (request ids,
    microversions, authentication) and the error handlers.
    """

    def __init__(self, metrics: APIMetrics) -> None:
        self.metrics = metrics

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.metrics_started = time.perf_counter()

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, req_succeeded: bool
    ) -> None:
        started = getattr(req.context, "metrics_started", None)
        if started is None:
            return
        status = falcon.http_status_to_code(resp.status)
        route = req.uri_template or UNMATCHED
        self.metrics.request(route, req.method, status, time.perf_counter() - started)


class Metrics:
    """``/metrics``: this API's metrics in Prometheus's text format; no token needed."""

    def __init__(self, metrics: APIMetrics) -> None:
        self.metrics = metrics

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE
        resp.cache_control = ["no-store"]
        resp.data = self.metrics.exposition()


def middleware(metrics: APIMetrics) -> list[Any]:
    """The middleware metrics add (none when they are off)."""
    return [MetricsMiddleware(metrics)] if metrics.enabled else []


def routes(metrics: APIMetrics) -> list[tuple[str, object]]:
    """The routes metrics add (none when they are off)."""
    return [(PATH, Metrics(metrics))] if metrics.enabled else []
