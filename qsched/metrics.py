"""The qsched-api process's Prometheus metrics: names, labels, and where each is counted.

Every name follows Prometheus's conventions (``qsched_<part>_<what>``, ``_total`` on
counters, ``_seconds`` on durations); ``docs/metrics.rst`` lists them with the agents'
(:mod:`agents.metrics`) and sample alerts. In this process:

* ``qsched_api_requests_total`` and ``qsched_api_request_duration_seconds``: every
  response, by route template, method (and status), in :mod:`qsched.api.metrics`;
* ``qsched_api_boots_accepted_total`` and ``qsched_api_boots_refused_total`` (by
  reason): every create, by :class:`qsched.compute.api.ComputeAPI`;
* ``qsched_api_publish_failures_total`` (by kind): publishes the broker did not
  confirm, by the front door's bus (:class:`CountedPublisher`);
* ``qsched_no_valid_host_total`` (by reason): ``deadline`` for the reaper's ends,
  ``filter`` for a boot no host could take (the agents count theirs under the same
  name); ``qsched_janitor_requeued_total``, ``qsched_janitor_requeue_failures_total``,
  ``qsched_outbox_published_total``, and with ``[cells]`` named
  ``qsched_cells_quota_moved_total``, ``qsched_cells_boots_settled_total`` and
  ``qsched_cells_passed_over_total``: the
  housekeeping runs (:func:`qsched.cells.housekeeping.start_periodic_tasks`).

Label values come from fixed sets, so the number of series stays bounded whatever the
traffic: ``route`` is the route's URI template (``/v2.1/servers/{server_id}``, or
``unmatched``), never the path; ``method`` one of HTTP's (else ``other``); ``reason``
one of the words of :func:`refusal_reason` or :data:`NO_VALID_HOST_REASONS`. No
instance, project or host name is ever a label here.

Under gunicorn every worker counts in its own files of ``PROMETHEUS_MULTIPROC_DIR``
(``deploy/gunicorn.conf.py`` sets it before any worker starts), and a scrape of
``/metrics`` on any worker sums them all (:meth:`APIMetrics.exposition`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)

from qsched import exception
from qsched.bus.base import Publisher

#: The environment variable prometheus_client reads for its multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The content type of a scrape's answer (the text format, 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: The route label of a request no route matched.
UNMATCHED = "unmatched"
#: The name both the API process and the agents count NoValidHost ends under.
NO_VALID_HOST = "qsched_no_valid_host"
#: Why an instance ended in NoValidHost, wherever it ended.
NO_VALID_HOST_REASONS = ("deadline", "max_attempts", "affinity", "host_rule", "filter")
#: The ``reason`` label of a refused create: the domain error's class, most specific first
#: (looked up along the MRO); an outage says which backend; anything else is ``error``.
BOOT_REFUSALS: dict[type[Exception], str] = {
    exception.QuotaExceeded: "quota",
    exception.Forbidden: "policy",
    exception.Invalid: "invalid",
    exception.NotFound: "not_found",
    exception.Conflict: "conflict",
}
_UNAVAILABLE = {
    "the ledger": "ledger_unavailable",
    "the message bus": "bus_unavailable",
    "the image service": "image_service_unavailable",
}
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
)


def refusal_reason(error: BaseException) -> str:
    """The ``reason`` label of a create refused with ``error`` (a fixed set of words)."""
    if isinstance(error, exception.BackendUnavailable):
        return _UNAVAILABLE.get(error.service, "unavailable")
    return next((BOOT_REFUSALS[c] for c in type(error).__mro__ if c in BOOT_REFUSALS), "error")


def method_label(method: str) -> str:
    """An HTTP method as a label: a client may send any word, the label takes ten."""
    return method if method in _METHODS else "other"


class APIMetrics:
    """The metrics of one qsched-api process, on a registry of their own.

    ``multiprocess_dir``: where gunicorn's workers keep their counts
    (``$PROMETHEUS_MULTIPROC_DIR``, read by the entry point); None for one process.
    """

    enabled = True

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry()
        on = self.registry
        self._requests = Counter(
            "qsched_api_requests", "API requests answered, by route template, method and "
            "status.", ["route", "method", "status"], registry=on,
        )  # fmt: skip
        self._seconds = Histogram(
            "qsched_api_request_duration_seconds", "Time from a request's arrival in the "
            "application to its response, by route template and method.",
            ["route", "method"], registry=on,
        )  # fmt: skip
        self._accepted = Counter(
            "qsched_api_boots_accepted", "Servers a create accepted (202): recorded BUILD "
            "and published; each server of a multi-create counts.", registry=on,
        )  # fmt: skip
        self._refused = Counter(
            "qsched_api_boots_refused", "Server creates refused, by reason.", ["reason"],
            registry=on,
        )  # fmt: skip
        self._publish_failures = Counter(
            "qsched_api_publish_failures", "Publishes the broker did not confirm (the client "
            "was told 503), by message kind.", ["kind"], registry=on,
        )  # fmt: skip
        self._no_valid_host = Counter(
            NO_VALID_HOST, "Instances this process ended in ERROR NoValidHost, by reason.",
            ["reason"], registry=on,
        )  # fmt: skip
        self._requeued = Counter(
            "qsched_janitor_requeued", "Claims of dead agents the janitor released, their "
            "requests published again.", registry=on,
        )  # fmt: skip
        self._requeue_failures = Counter(
            "qsched_janitor_requeue_failures", "Requests of dead agents the janitor could "
            "not publish again (their deadline ends them).", registry=on,
        )  # fmt: skip
        self._outbox = Counter(
            "qsched_outbox_published", "Boot requests stranded in the outbox (recorded, "
            "never confirmed) that the janitor published.", registry=on,
        )  # fmt: skip
        self._quota_moved = Counter(
            "qsched_cells_quota_moved", "Releases of quota in the cells that the janitor "
            "applied to the API keyspace.", registry=on,
        )  # fmt: skip
        self._boots_settled = Counter(
            "qsched_cells_boots_settled", "Boots left pending past [cells] pending_grace_s "
            "(their API process died) that the janitor settled.", registry=on,
        )  # fmt: skip
        self._passed_over = Counter(
            "qsched_cells_passed_over", "Runs of a janitor task (quota-mover, reaper, "
            "janitor, outbox) that passed over a cell whose ledger or bus did not answer.",
            ["task", "cell"], registry=on,
        )  # fmt: skip

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One response: ``route`` is its URI template (or :data:`UNMATCHED`)."""
        method = method_label(method)
        self._requests.labels(route, method, str(status)).inc()
        self._seconds.labels(route, method).observe(seconds)

    def boots_accepted(self, count: int) -> None:
        self._accepted.inc(count)

    def boot_refused(self, error: BaseException) -> None:
        """A create refused with ``error`` (counted under :func:`refusal_reason`)."""
        self._refused.labels(refusal_reason(error)).inc()

    def publish_failed(self, kind: str) -> None:
        """The broker did not confirm a ``boot``, ``delete`` or ``action`` message."""
        self._publish_failures.labels(kind).inc()

    def no_valid_host(self, reason: str, count: int = 1) -> None:
        """``count`` instances ended NoValidHost for ``reason`` (:data:`NO_VALID_HOST_REASONS`)."""
        if count:
            self._no_valid_host.labels(reason).inc(count)

    def janitor_ran(self, requeued: int, failed: int) -> None:
        """One janitor run: requests of dead agents published again, and those that failed."""
        self._requeued.inc(requeued)
        self._requeue_failures.inc(failed)

    def outbox_published(self, count: int) -> None:
        self._outbox.inc(count)

    def cells_mover_ran(self, moved: int, settled: int) -> None:
        """One pass of the cells' quota mover: releases moved, pending boots settled."""
        self._quota_moved.inc(moved)
        self._boots_settled.inc(settled)

    def cell_passed_over(self, task: str, cell: str) -> None:
        """A run of janitor task ``task`` passed over ``cell``: it did not answer."""
        self._passed_over.labels(task, cell).inc()

    def counted(self, bus: Publisher) -> Publisher:
        """``bus`` with its failed publishes counted (:class:`CountedPublisher`)."""
        return CountedPublisher(bus, self)

    def exposition(self) -> bytes:
        """A scrape's answer (:data:`CONTENT_TYPE`): this registry, or, in multiprocess
        mode, every worker's files summed (those of workers gone included, so counters
        never go back)."""
        registry = self.registry
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.multiprocess_dir)
        return generate_latest(registry)


class NoMetrics(APIMetrics):
    """Counts nothing and serves nothing: ``[api] metrics = false``, and the front door a
    test or a benchmark builds without asking for metrics."""

    enabled = False

    def __init__(self) -> None:
        self.multiprocess_dir = None

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        pass

    def boots_accepted(self, count: int) -> None:
        pass

    def boot_refused(self, error: BaseException) -> None:
        pass

    def publish_failed(self, kind: str) -> None:
        pass

    def no_valid_host(self, reason: str, count: int = 1) -> None:
        pass

    def janitor_ran(self, requeued: int, failed: int) -> None:
        pass

    def outbox_published(self, count: int) -> None:
        pass

    def cells_mover_ran(self, moved: int, settled: int) -> None:
        pass

    def cell_passed_over(self, task: str, cell: str) -> None:
        pass

    def counted(self, bus: Publisher) -> Publisher:
        return bus

    def exposition(self) -> bytes:
        return b""


class CountedPublisher:
    """The front door's bus, counting the publishes the broker did not confirm.

    Everything else is the bus's own: each publish raises what it raised.
    """

    def __init__(self, bus: Publisher, metrics: APIMetrics) -> None:
        self.bus = bus
        self.metrics = metrics

    def publish_boot(self, msg: Any) -> None:
        self._counted("boot", self.bus.publish_boot, msg)

    def publish_to_host(self, host: str, msg: Any) -> None:
        self._counted("boot", self.bus.publish_to_host, host, msg)

    def publish_delete(self, host: str, msg: Any) -> None:
        self._counted("delete", self.bus.publish_delete, host, msg)

    def publish_action(self, host: str, msg: Any) -> None:
        self._counted("action", self.bus.publish_action, host, msg)

    def check_health(self) -> None:
        self.bus.check_health()

    def _counted(self, kind: str, publish: Callable[..., None], *args: Any) -> None:
        try:
            publish(*args)
        except exception.BackendUnavailable:
            self.metrics.publish_failed(kind)
            raise
