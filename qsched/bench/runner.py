"""What every scenario shares: its settings, and the :class:`Runner` that starts clouds."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qsched.bench.embedded import EmbeddedCloud
from qsched.bench.load import Submit
from qsched.bench.packing import BenchFlavor
from qsched.bench.phase import Say, run_phase
from qsched.bench.profile import Profiler, find_py_spy
from qsched.bench.stack import Cloud, CloudSpec, ProcessCloud

#: The request shape of the issue's Placement figures: VCPU:2, MEMORY_MB:4096, DISK_GB:20.
SCALE_FLAVOR = BenchFlavor("bench.medium", 2, 4096, 20)


@dataclasses.dataclass
class Settings:
    """Everything a run needs; the CLI builds it (``--quick`` picks the small one)."""

    sizes: list[int]
    agents: int
    rate_per_s: float
    duration_s: float
    saturation_hosts: int
    saturation_rates: list[float]
    saturation_step_s: float
    fill_hosts: int
    fill_rate_per_s: float
    ledger_url: str
    transports: dict[str, str]  # name -> URL; the first is the sweep's and fill's bus
    embedded: bool
    workdir: Path
    warmup: int = 20
    samples: bool = False  # keep every request's latencies in the report
    profile_dir: Path | None = None  # py-spy every timed phase into this directory
    http_workers: int = 16
    library_workers: int = 8
    saturation_workers: int = 16
    settle_timeout_s: float = 120.0
    burst_s: float = 0.0  # scale sweep: seconds of burst per N (0: none)
    burst_rate_per_s: float = 1000.0
    fill_timeout_s: float = 5.0
    #: rules: members of the anti-affinity group, and the compute hosts of the rules
    #: cloud (at most one per node)
    group_members: int = 250
    #: Prometheus metrics on or off; the scale sweep runs each N once per value (both:
    #: their cost per placement), the other scenarios with the last one
    metrics: tuple[bool, ...] = (True,)
    #: versioned notifications on or off, likewise: the sweep adds a run of each N with
    #: them on (and metrics as last) when both; they go to this RabbitMQ (rabbit://)
    notifications: tuple[bool, ...] = (False,)
    notification_url: str | None = None
    #: a RabbitMQ cluster of the run's own (``--rabbit-cluster``): its nodes' home (their
    #: CPU alone counts as RabbitMQ's) and quorum host queues; None: the one broker
    rabbit_home: str | None = None
    #: plumbing: the hosts of its cloud, its blocks of four slices per comparison, and
    #: the seconds of one slice (:mod:`qsched.bench.plumbing`)
    plumbing_hosts: int = 1_000
    plumbing_blocks: int = 3
    plumbing_slice_s: float = 10.0
    #: instances: the hosts of its clouds, the instances preloaded into the second one,
    #: and the share of them live (ACTIVE; the others past: DELETED)
    instances_hosts: int = 100_000
    preload_instances: int = 1_000_000
    preload_live_share: float = 0.5
    #: [ledger] durability of the clouds (:attr:`CloudSpec.durability`)
    durability: str = "async"
    #: moves: the host counts of its clouds, and the servers of the host it drains and
    #: of the one it evacuates (:mod:`qsched.bench.moves`)
    moves_sizes: list[int] = dataclasses.field(default_factory=lambda: [100, 100_000])
    host_servers: int = 100

    @property
    def transport_url(self) -> str:
        return next(iter(self.transports.values()))

    def variants(self) -> list[tuple[bool, bool]]:
        return sweep_variants(self.metrics, self.notifications)


def sweep_variants(
    metrics: tuple[bool, ...], notifications: tuple[bool, ...]
) -> list[tuple[bool, bool]]:
    """(metrics, notifications) of the sweep's runs per N, each next to the one before
    it but for one feature: their costs are the differences."""
    found = [(m, notifications[0]) for m in metrics]
    return found + [(metrics[-1], n) for n in notifications[1:]]


class Runner:
    """Starts clouds for the scenarios and says what happens on stderr."""

    def __init__(self, settings: Settings, say: Say) -> None:
        self.settings = settings
        self.say = say
        self.profiler: Profiler | None = None
        #: results a scenario has so far, by scenario name (kept when it fails)
        self.partial: dict[str, Any] = {}
        if settings.profile_dir is not None:
            py_spy = find_py_spy()
            if py_spy is None:
                say("py-spy not found (pip install py-spy): no profiles")
            else:
                self.profiler = Profiler(settings.profile_dir, py_spy)

    def spec(self, hosts: int, flavors: tuple[BenchFlavor, ...], **extra: Any) -> CloudSpec:
        extra.setdefault("transport_url", self.settings.transport_url)
        extra.setdefault("metrics", self.settings.metrics[-1])
        extra.setdefault("durability", self.settings.durability)
        if self.settings.rabbit_home is not None:
            extra.setdefault("rabbit_home", self.settings.rabbit_home)
            extra.setdefault("host_queue_type", "quorum")
        if extra.pop("notifications", self.settings.notifications[-1]):
            extra["notification_url"] = self.settings.notification_url
        return CloudSpec(
            hosts, self.settings.agents, flavors, ledger_url=self.settings.ledger_url, **extra
        )

    @contextlib.contextmanager
    def cloud(self, spec: CloudSpec, after: dict[str, Any]) -> Iterator[Cloud]:
        """A started cloud; on the way out its peak RSS and agent counters go in ``after``."""
        agents = len(spec.node_counts())
        self.say(
            f"  starting {spec.hosts} hosts on {agents} agents "
            f"({'embedded' if self.settings.embedded else spec.transport_url.split(':')[0]})"
        )
        cloud: Cloud
        if self.settings.embedded:
            cloud = EmbeddedCloud(spec)
        else:
            process_cloud = ProcessCloud(spec, self.settings.workdir, self.say)
            try:
                cloud = process_cloud.start()
            except BaseException:
                process_cloud.stop()
                raise
        reg = cloud.registration
        self.say(
            f"  registered {spec.hosts} hosts in {reg['seconds']:.2f}s "
            f"({reg['hosts_per_s']:,.0f} hosts/s)"
        )
        try:
            yield cloud
        finally:
            after["peak_rss"] = cloud.peak_rss()
            after["agent_counters"] = [r.get("counters", {}) for r in cloud.stop()]

    def warm_up(self, cloud: Cloud, flavor: str, submitters: list[tuple[Submit, int]]) -> None:
        """A few boots through each submitter first: connections, pools, lazy loads."""
        for submit, workers in submitters:
            count = max(self.settings.warmup, 2 * workers)
            run_phase(cloud, "warm-up", submit, [flavor] * count, 50.0, workers,
                      self.settings.settle_timeout_s, lambda _msg: None)  # fmt: skip


def brief(stats: dict[str, Any]) -> str:
    claimed, active = stats["submit_to_claimed_ms"], stats["submit_to_active_ms"]
    return (
        f"claimed p50 {claimed['p50']} p99 {claimed['p99']} ms, ACTIVE p50 {active['p50']} "
        f"p99 {active['p99']} ms, {stats['placements_per_s']}/s, {stats['refused']} refused"
    )
