"""One agent's Prometheus metrics, served on ``[agent] metrics_port`` (0: off).

Each agent has a registry of its own (several agents may share a process, as in the
embedded stack), served at ``/metrics`` by prometheus_client's small HTTP server in a
thread of the agent. ``docs/metrics.rst`` lists them. Where they come from:

* placements, hand-backs, claim conflicts, spawn failures, instances ACTIVE: the
  agent's own counters (kept anyway for its heartbeat), read at scrape time, so a
  placement costs nothing more for them (:data:`COUNTERS`);
* refusals and NoValidHost ends by reason, claim retries: counted here by the steps
  (:meth:`AgentMetrics.refused`, :meth:`~AgentMetrics.no_valid_host`,
  :meth:`~AgentMetrics.retried`);
* the claim and publish-to-claimed histograms: one observation each per claim,
  taken only when metrics are on (:meth:`AgentMetrics.claimed`);
* capacity, free capacity, the classes consumed, the builds in flight: read from
  the index, the consumer and the builds at scrape time.

Labels are bounded: refusal and NoValidHost reasons are fixed sets, resource classes
are those of the nodes, and scheduling classes are the deployment's flavors times the
distinct constraints its boots carry (zones, image traits, aggregates): a handful to
a few hundred, never one per request. Prometheus adds the agent's own address as
``instance``; the host name is not a label.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from qsched import exception
from qsched.metrics import NO_VALID_HOST
from qsched.scheduling.message import BootRequest

#: Plain counts read from the agent's counters: name (without ``_total``), help, key.
COUNTERS = (
    ("qsched_agent_placements", "Boot requests this agent claimed a node for.", "claimed"),
    ("qsched_agent_handbacks", "Requests this agent had tried, handed back to an alternate.",
     "handed_back"),
    ("qsched_agent_claim_conflicts", "Generation conflicts this agent's claims met, re-read "
     "and retried.", "conflicts"),
    ("qsched_agent_spawn_failures", "Spawns that failed; their claims given back.",
     "spawn_failed"),
    ("qsched_agent_active", "Instances this agent spawned and recorded ACTIVE.", "active"),
    ("qsched_agent_not_its_request", "Boot and delete requests dead-lettered because the "
     "ledger's record of their instance disagrees (a forged or stray message).",
     "not_its_request"),
    ("qsched_agent_lost_instances", "ACTIVE instances whose VM the driver no longer ran, set "
     "ERROR by the reconcile.", "reconcile_lost"),
    ("qsched_agent_republished", "Requests of claims the ledger no longer held (a crash "
     "rolled them back) whose instance waited again: left to the outbox to go out again.",
     ("republished", "reconcile_republished")),
)  # fmt: skip
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class MetricsUnavailable(exception.QschedError):
    msg_fmt = "cannot serve metrics on {address}:{port}: {reason}"


class AgentMetrics:
    """One agent's metrics: what it counts beyond its counters, and its registry.

    ``counters``: the agent's own; ``totals``: (used, capacity) per resource class;
    ``consumed``: the classes it consumes now; ``building``: its spawns in flight.
    ``enabled`` (``[agent] metrics_port`` set): without it the per-claim timings are
    not taken and nothing is served.
    """

    def __init__(
        self,
        counters: Counter[str],
        totals: Callable[[], dict[str, tuple[int, int]]],
        consumed: Callable[[], Iterable[str]],
        building: Callable[[], int],
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.refusals: Counter[str] = Counter()  # by reason
        self.ended: Counter[str] = Counter()  # NoValidHost, by reason
        self.retries = 0
        self.registry = CollectorRegistry()
        self._claim_seconds = Histogram(
            "qsched_agent_claim_duration_seconds", "Time one claim took: the node's lock, "
            "the ledger script and its conflict retries.", buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self._waited_seconds = Histogram(
            "qsched_agent_published_to_claimed_seconds", "From a request's last publish (the "
            "API's, for one claimed at its first delivery) to its claim.",
            buckets=WAIT_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.registry.register(_Collector(self, counters, totals, consumed, building))
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def refused(self, reason: str) -> None:
        """A request refused here: nothing fits (a RefusalKind), ``service`` or ``none``."""
        self.refusals[reason] += 1

    def no_valid_host(self, reason: str, count: int = 1) -> None:
        self.ended[reason] += count

    def retried(self) -> None:
        """The ledger refused a claim (the node was fuller than this agent saw): pick again."""
        self.retries += 1

    def claimed(self, msg: BootRequest, seconds: float) -> None:
        """A claim held after ``seconds``; the request waited since its last publish."""
        if self.enabled:
            self._claim_seconds.observe(seconds)
            self._waited_seconds.observe(max(0.0, time.time() - msg.published_at))

    def serve(self, address: str, port: int) -> int:
        """Serve ``/metrics`` on ``address:port`` in a thread; the port bound (``port`` 0:
        any free one).

        :raises MetricsUnavailable: the address cannot be bound (the port is taken).
        """
        try:
            self._server, self._thread = start_http_server(port, address, self.registry)
        except OSError as exc:
            raise MetricsUnavailable(address=address, port=port, reason=exc) from exc
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stop serving (nothing if it never served)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class _Collector(Collector):
    """What a scrape reads from the agent: its counters and its index, at that moment."""

    def __init__(
        self,
        metrics: AgentMetrics,
        counters: Counter[str],
        totals: Callable[[], dict[str, tuple[int, int]]],
        consumed: Callable[[], Iterable[str]],
        building: Callable[[], int],
    ) -> None:
        self.metrics = metrics
        self.counters = counters
        self.totals = totals
        self.consumed = consumed
        self.building = building

    def collect(self) -> Iterator[Metric]:
        counts = dict(self.counters)  # one copy: the agent's threads go on counting
        for name, help_text, keys in COUNTERS:
            summed = sum(counts.get(key, 0) for key in ((keys,) if isinstance(keys, str) else keys))
            yield CounterMetricFamily(name, help_text, value=summed)
        yield CounterMetricFamily(
            "qsched_agent_claim_retries", "Claims the ledger refused (the node fuller than "
            "this agent saw, its aggregates changed), followed by another pick.",
            value=self.metrics.retries,
        )  # fmt: skip
        yield _by_label(
            CounterMetricFamily("qsched_agent_refusals", "Requests refused by this agent, "
                                "by reason.", labels=["reason"]),
            self.metrics.refusals,
        )  # fmt: skip
        yield _by_label(
            CounterMetricFamily(NO_VALID_HOST, "Instances this agent ended in ERROR "
                                "NoValidHost, by reason.", labels=["reason"]),
            self.metrics.ended,
        )  # fmt: skip
        moves = CounterMetricFamily(
            "qsched_agent_moves", "Steps of moves this agent made, by kind (resize, "
            "migration, live-migration, evacuation, unshelve) and outcome: in (came up "
            "here), failed (given back), confirmed, reverted, sent (a live migration, from "
            "here), rolled_back, cancelled (an admin's abort).", labels=["kind", "outcome"],
        )  # fmt: skip
        for key, count in sorted(counts.items()):
            if key.startswith("move:"):
                moves.add_metric(key.split(":", 2)[1:], count)
        yield moves
        yield from self._gauges()

    def _gauges(self) -> Iterator[Metric]:
        totals = self.totals()
        capacity = GaugeMetricFamily(
            "qsched_agent_resource_capacity", "Capacity of this agent's nodes, by resource "
            "class (in its unit: MEMORY_MB in MiB, DISK_GB in GiB).", labels=["resource_class"],
        )  # fmt: skip
        free = GaugeMetricFamily(
            "qsched_agent_resource_free", "Capacity less usage of this agent's nodes, by "
            "resource class.", labels=["resource_class"],
        )  # fmt: skip
        for rc, (used, cap) in totals.items():
            capacity.add_metric([rc], cap)
            free.add_metric([rc], cap - used)
        consuming = GaugeMetricFamily(
            "qsched_agent_consuming_class", "1 for each scheduling class this agent "
            "consumes now (some node fits it, the class is not paused, the service is "
            "enabled).", labels=["scheduling_class"],
        )  # fmt: skip
        for name in sorted(self.consumed()):
            consuming.add_metric([name], 1)
        building = GaugeMetricFamily("qsched_agent_builds", "Spawns in flight on this agent.",
                                     value=self.building())  # fmt: skip
        yield from (capacity, free, consuming, building)


def _by_label(family: CounterMetricFamily, counts: Counter[str]) -> CounterMetricFamily:
    for value, count in sorted(dict(counts).items()):
        family.add_metric([value], count)
    return family
