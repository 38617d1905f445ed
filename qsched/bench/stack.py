"""The cloud a scenario runs on: real processes on real servers, or the embedded default.

:class:`ProcessCloud` starts ``qsched-api`` under gunicorn and agent processes
(:mod:`qsched.bench.agent`, each driving many fake nodes) on a real Redis ledger
and RabbitMQ or kombu's Redis transport, every process reading the same INI
file as a deployment would. Each cloud gets its own ledger cell and bus prefix,
and removes its keys and queues when it stops: nothing is flushed.

:class:`EmbeddedCloud` is the fallback when no server answers: everything in
this process on fakeredis and ``memory://`` (:mod:`qsched.bench.embedded`).
Its figures are not comparable with a real deployment's, and reports say so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from qsched.bench.packing import BenchFlavor
from qsched.bench.switch import flip
from qsched.bench.timing import peak_rss_kb
from qsched.bus.kombu import KombuBus
from qsched.compute.api import ComputeAPI
from qsched.conf import Options as ServiceOptions
from qsched.ledger import Stores, open_stores
from qsched.metrics import APIMetrics
from qsched.net import free_port
from qsched.scheduling.classes import SchedulingClass
from qsched.stack import (
    LOOPBACK,
    CellConfig,
    GunicornConfig,
    Options,
    ProcessStack,
    StackFailed,
    merged,
    new_prefix,
)
from qsched.stack.cleanup import forget_amqp
from qsched.stack.processes import children


@dataclasses.dataclass(frozen=True)
class CloudSpec:
    """What to start. Node sizes are per simulated host."""

    hosts: int
    agents: int  # processes
    flavors: tuple[BenchFlavor, ...]
    transport_url: str
    ledger_url: str
    http: bool = True
    node_vcpus: int = 64
    node_ram_mb: int = 262144
    node_disk_gb: int = 2000
    cpu_allocation_ratio: float = 4.0
    build_timeout_s: float = 300.0
    heartbeat_interval_s: float = 1.0  # [agent] defaults: 2.0 and 1.0; shorter to start
    class_poll_interval_s: float = 0.5  # measuring sooner, at a negligible cost
    reap_interval_s: float = 5.0
    api_workers: int = 2
    api_threads: int = 16
    #: ``[agent] node_provider`` lines: every node's child providers (a provider tree)
    node_providers: tuple[str, ...] = ()
    #: more ``[scheduler]`` options (the request filters of the rules scenario)
    scheduler: tuple[tuple[str, Any], ...] = ()
    #: Prometheus metrics: the API's (in gunicorn's multiprocess mode) and, on processes,
    #: each agent's on a port of its own (docs/metrics.rst)
    metrics: bool = True
    #: versioned notifications (docs/notifications.rst) sent through oslo.messaging to
    #: this RabbitMQ (``rabbit://...``), on a topic and an exchange of the cloud's own;
    #: None: off, as by default
    notification_url: str | None = None
    #: agent processes that turn notifications and metrics off and on when told
    #: (:meth:`Cloud.switch`, :mod:`qsched.bench.switch`)
    switchable: bool = False
    #: compute hosts (agents, each with its own consumer) per agent process
    #: (:mod:`qsched.bench.agent` ``--hosts``); the process's nodes are split between them
    hosts_per_agent: int = 1
    reconcile_interval_s: float = 10.0  # [agent] defaults
    reconcile_batch: int = 1000
    bus_poll_interval_s: float = 0.1  # [bus] poll_interval_s
    #: [bus] host_queue_type: quorum on a RabbitMQ cluster (docs/pipeline.rst)
    host_queue_type: str = "classic"
    #: the home of the RabbitMQ cluster the run started (``--rabbit-cluster``), whose
    #: nodes alone count as RabbitMQ's CPU; None: every RabbitMQ on the machine
    rabbit_home: str | None = None
    #: [ledger] durability of every process: async on a ledger URL given (a shared
    #: Redis may keep no AOF), or the run's ``--durability`` on a ledger server of its
    #: own set to match (:func:`qsched.ledger.server.start_for`)
    durability: str = "async"

    def slots(self, flavor: BenchFlavor) -> int:
        """How many instances of ``flavor`` the whole cloud holds."""
        node = {"VCPU": int(self.node_vcpus * self.cpu_allocation_ratio),
                "MEMORY_MB": self.node_ram_mb, "DISK_GB": self.node_disk_gb}  # fmt: skip
        per_node = min(node.get(rc, 0) // n for rc, n in flavor.demand.items())
        return self.hosts * per_node

    def node_counts(self) -> list[int]:
        """Hosts per agent, as even as can be, none empty."""
        parts = max(1, min(self.agents, self.hosts))
        return [self.hosts // parts + (1 if i < self.hosts % parts else 0) for i in range(parts)]

    def agent_hosts(self) -> list[int]:
        """Compute hosts of each agent process (:attr:`hosts_per_agent`, fewer when a
        process has fewer nodes)."""
        return [min(self.hosts_per_agent, nodes) for nodes in self.node_counts()]

    def options(self) -> Options:
        """The qsched options every process reads: no quota, no spawn delay."""
        return {
            "ledger": {"cpu_allocation_ratio": self.cpu_allocation_ratio,
                       "durability": self.durability},
            "quota": {"instances": -1, "cores": -1, "ram": -1, "server_groups": -1,
                      "server_group_members": -1},
            "scheduler": {"build_timeout_s": self.build_timeout_s,
                          "reap_interval_s": self.reap_interval_s, **dict(self.scheduler)},
            "api": {"flavor": [f.config_line for f in self.flavors], "metrics": self.metrics,
                    "flavor_extra_spec": [line for f in self.flavors for line in f.spec_lines]},
            "agent": {"node_vcpus": self.node_vcpus, "node_ram_mb": self.node_ram_mb,
                      "node_disk_gb": self.node_disk_gb, "spawn_delay_s": 0,
                      "node_provider": list(self.node_providers),
                      "heartbeat_interval_s": self.heartbeat_interval_s,
                      "heartbeat_ttl_s": max(10.0, 5 * self.heartbeat_interval_s),
                      "class_poll_interval_s": self.class_poll_interval_s,
                      "reap_interval_s": self.reap_interval_s,
                      "reconcile_interval_s": self.reconcile_interval_s,
                      "reconcile_batch": self.reconcile_batch},
            "bus": {"poll_interval_s": self.bus_poll_interval_s,
                    "host_queue_type": self.host_queue_type},
        }  # fmt: skip


class Cloud:
    """What scenarios use; see the two implementations below."""

    mode = ""
    spec: CloudSpec
    options: ServiceOptions
    stores: Stores
    bus: KombuBus
    compute: ComputeAPI
    api_url: str | None = None
    registration: dict[str, Any]
    accepted = 0  # boots accepted so far (run_phase counts them): room left for more

    @property
    def transport(self) -> str:
        return self.bus.wire.driver

    def hosts_of_agents(self) -> list[str]:
        """The host name of each agent (compute host), in order."""
        raise NotImplementedError

    def agent_classes(self) -> dict[str, frozenset[str]]:
        """The classes each live agent says (in its heartbeat) that it consumes."""
        return {
            a.host: frozenset(a.detail.get("classes") or ())
            for a in self.stores.agents.list()
            if a.alive
        }

    def prime_classes(
        self, names: list[str], timeout_s: float = 60.0, hosts: list[str] | None = None
    ) -> None:
        """Publish the classes and wait until every agent (or those of ``hosts``: a class
        only some can fit) consumes them all."""
        for name in names:
            definition = SchedulingClass(self.compute.get_flavor(name)).definition()
            self.stores.agents.add_class(name, definition)
        agents, wanted = len(hosts or self.hosts_of_agents()), frozenset(names)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = {h: c for h, c in self.agent_classes().items() if not hosts or h in hosts}
            if len(seen) >= agents and all(wanted <= c for c in seen.values()):
                return
            time.sleep(0.1)
        raise StackFailed(f"agents did not consume {sorted(wanted)} in {timeout_s}s: {seen}")

    def queue_depths(self, names: list[str]) -> dict[str, int]:
        """Messages ready in each class's boot queue."""
        return {name: self.bus.queue_stats(name).ready or 0 for name in names}

    def process_groups(self) -> dict[str, list[int]]:
        """The cloud's own processes by role (none when embedded: all in this one)."""
        return {}

    @property
    def redis_ports(self) -> frozenset[int]:
        """Ports of the Redis servers this cloud uses (ledger, and the bus on redis://)."""
        urls = [self.spec.ledger_url, self.spec.transport_url]
        return frozenset(
            urlsplit(u).port or 6379 for u in urls if u.startswith(("redis://", "rediss://"))
        )

    def profile_targets(self) -> dict[str, int]:
        """Processes worth sampling, by name: this one (the load generator) at least."""
        return {"bench": os.getpid()}

    def peak_rss(self) -> dict[str, Any]:
        raise NotImplementedError

    def switch(self, notifications: bool, metrics: bool) -> float:
        """Turn the agents' notifications and metrics off or on (a :attr:`CloudSpec.switchable`
        cloud); once every agent process applied it, the CPU seconds they have used so far,
        summed."""
        raise NotImplementedError(f"a {self.mode} cloud has no switch")

    def notifications_held(self) -> int:
        """Notifications waiting in this cloud's queues (a cloud that sends them)."""
        raise NotImplementedError(f"a {self.mode} cloud sends no notifications")

    def restart_agents(self) -> dict[str, Any] | None:
        """Stop the agents and start them again on their nodes; the new start's summary
        (as :attr:`registration`), or None where a cloud cannot (the embedded one)."""
        return None

    def stop(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _open(self, options: ServiceOptions, stores: Stores | None = None) -> None:
        self.options = options
        self.stores = stores or open_stores(options.ledger, options.quota)
        self.bus = KombuBus.from_options(options.bus)
        metrics = APIMetrics() if options.api.metrics else None  # the library path's
        self.compute = ComputeAPI(
            self.stores, self.bus, options.scheduler, options.api, metrics=metrics
        )
        self.compute.seed_flavors()


class ProcessCloud(Cloud):
    """gunicorn and agent processes on real servers, started by :meth:`start`."""

    mode = "processes"

    def __init__(self, spec: CloudSpec, workdir: Path, say: Any) -> None:
        self.spec = spec
        self.say = say
        prefix = new_prefix("bench")
        (workdir / prefix).mkdir(parents=True)
        self.notifications = NotificationQueues(prefix) if spec.notification_url else None
        options = spec.options()
        if self.notifications is not None and spec.notification_url is not None:
            options = merged(options, self.notifications.options(spec.notification_url))
        config = CellConfig(spec.transport_url, spec.ledger_url, prefix, cell=prefix,
                            options=options)  # fmt: skip
        metrics_dir = workdir / prefix / "metrics"
        metrics_dir.mkdir()
        api = GunicornConfig(
            spec.api_workers,
            spec.api_threads,
            timeout_s=30,
            graceful_timeout_s=10,
            keepalive_s=5,
            load_at_start=True,
            env=(("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir)),) if spec.metrics else (),
        )
        agent = [sys.executable, "-m", "qsched.bench.agent"]  # its start timed
        self.stack = ProcessStack(
            workdir / prefix, config, api, agent_command=agent, host_stem="a", stop_timeout_s=60
        )
        self.registration = {}
        self._switches = 0

    def start(self) -> Cloud:
        """Start everything, wait until agents consume and the API answers."""
        spawned_at = time.time()
        self._start_agents()
        if self.spec.http:
            self.stack.start_api()
            self.api_url = f"http://{LOOPBACK}:{self.stack.port}"
        self._open(self.stack.options, self.stack.stores)
        reports = self._go()
        self.registration = registration_summary(self.spec.hosts, reports, spawned_at)
        if self.spec.http:
            self.stack.wait(self.stack.healthy, 60, "the API did not answer", 0.1)
        return self

    def _start_agents(self) -> None:
        per_process = self.spec.agent_hosts()
        for i, count in enumerate(self.spec.node_counts()):
            args = ["--report", str(self._report(i)), "--go", str(self.stack.dir / "go"),
                    "--hosts", str(per_process[i])]  # fmt: skip
            if self.spec.switchable:
                args += ["--switch", str(self.stack.dir / "switch.json")]
            metrics = {"metrics_host": LOOPBACK, "metrics_port": free_port()}
            self.stack.start_agent(i, {"node_count": count, **(metrics if self.spec.metrics
                                                                 else {})}, args)  # fmt: skip
            self.stack.note_hosts(self._hosts(i, per_process[i]))

    def _go(self) -> list[dict[str, Any]]:
        """Once every agent loaded, let them start together; their start reports."""
        loaded = [self._report(i).with_suffix(".loaded") for i in self.stack.agents]
        self.stack.wait(lambda: all(p.exists() for p in loaded), 60, "agents did not load", 0.02)
        (self.stack.dir / "go").touch()  # every agent loaded: they register together
        return self._wait_agents()

    def switch(self, notifications: bool, metrics: bool) -> float:
        if not self.spec.switchable:
            raise StackFailed("this cloud's agents were not started with --switch")
        self._switches += 1
        agents = self.stack.agents.items()
        acks = {p.pid: self._report(i).with_suffix(".switched") for i, p in agents}
        found = flip(self.stack.dir / "switch.json", acks, self._switches,
                     notifications=notifications, metrics=metrics)  # fmt: skip
        return sum(float(ack["cpu_s"]) for ack in found.values())

    def notifications_held(self) -> int:
        if self.notifications is None:
            raise StackFailed("this cloud sends no notifications")
        import kombu

        held = 0
        with kombu.Connection(self.spec.transport_url) as connection:
            for name in self.notifications.queues():
                channel = connection.channel()  # a queue not declared yet closes it
                try:
                    held += channel.queue_declare(name, passive=True).message_count
                except connection.channel_errors:
                    continue  # no such queue: nothing was sent at its priority
                channel.close()
        return held

    def restart_agents(self) -> dict[str, Any]:
        """Stop every agent process (SIGTERM) and start them again on the same hosts and
        nodes, as an upgrade does; the new start's summary, as :attr:`registration`."""
        for i in list(self.stack.agents):
            self.stack.kill_agent(i, signal.SIGTERM, self.stack.stop_timeout_s)
            for path in (self._report(i), self._report(i).with_suffix(".loaded")):
                path.unlink(missing_ok=True)
        (self.stack.dir / "go").unlink(missing_ok=True)
        spawned_at = time.time()
        self._start_agents()
        return registration_summary(self.spec.hosts, self._go(), spawned_at)

    def _report(self, i: int) -> Path:
        return self.stack.dir / f"agent{i}.json"

    def hosts_of_agents(self) -> list[str]:
        per_process = self.spec.agent_hosts()
        return [h for i in self.stack.agents for h in self._hosts(i, per_process[i])]

    def _hosts(self, i: int, count: int) -> list[str]:
        """The compute hosts of agent process ``i`` (as :mod:`qsched.bench.agent` names
        them)."""
        host = self.stack.host(i)
        return [host] if count == 1 else [f"{host}-{j}" for j in range(count)]

    def _wait_agents(self) -> list[dict[str, Any]]:
        paths = [self._report(i) for i in self.stack.agents]

        def progress() -> None:
            done = self.stores.inspector.provider_count()
            ready = sum(p.exists() for p in paths)
            self.say(f"  registering: {done}/{self.spec.hosts} providers, "
                     f"{ready}/{len(paths)} agents ready")  # fmt: skip

        ready = lambda: all(p.exists() for p in paths)  # noqa: E731
        self.stack.wait(ready, 120 + self.spec.hosts / 200, "agents not ready", 0.1, progress)
        return [json.loads(p.read_text()) for p in paths]

    def process_groups(self) -> dict[str, list[int]]:
        groups = {"agents": [p.pid for p in self.stack.agents.values()]}
        if self.stack.api is not None:
            groups["api"] = [self.stack.api.pid]
        return groups

    def profile_targets(self) -> dict[str, int]:
        targets = {f"agent{i}": p.pid for i, p in self.stack.agents.items()}
        if self.stack.api is not None:
            for pid in children(self.stack.api.pid):
                targets[f"api-worker-{pid}"] = pid
        return {**targets, "bench": os.getpid()}

    def peak_rss(self) -> dict[str, Any]:
        agents = self.stack.agents
        per_agent = {self.stack.host(i): peak_rss_kb(p.pid) for i, p in agents.items()}
        known = [kb for kb in per_agent.values() if kb is not None]
        return {
            "scope": "each agent process (VmHWM)",
            "per_agent_kb": per_agent,
            "max_kb": max(known, default=None),
            "nodes_per_agent": max(self.spec.node_counts()),
        }

    def stop(self) -> list[dict[str, Any]]:
        """Stop every process, then remove this cloud's queues and ledger keys."""
        self.stack.stop()
        reports = []
        for i in self.stack.agents:
            path = self._report(i)
            reports.append(json.loads(path.read_text()) if path.exists() else {})
        if hasattr(self, "bus"):
            self.bus.close()
        self._forget()
        if self.notifications is not None:
            self._forget_notifications(self.notifications)
        self.stack.close()
        return reports

    def _forget_notifications(self, queues: NotificationQueues) -> None:
        try:
            failed = forget_amqp(self.spec.transport_url, queues.queues(), [queues.exchange])
        except Exception as exc:  # cleanup must not hide the run's own outcome
            failed = [f"{type(exc).__name__}: {exc}"]
        if failed:
            self.say(f"  WARNING: could not remove the notification queues of "
                     f"{self.stack.prefix}: {'; '.join(failed)}")  # fmt: skip

    def _forget(self) -> None:
        """Remove this cloud's queues and keys; a broker that is down is retried a little."""
        for attempt in range(5):
            try:
                failed = self.stack.forget()
            except Exception as exc:  # cleanup must not hide the run's own outcome
                failed = [f"{type(exc).__name__}: {exc}"]
            if not failed:
                return
            if attempt == 4:
                self.say(f"  WARNING: could not remove the queues or keys of "
                         f"{self.stack.prefix}: {'; '.join(failed)}")  # fmt: skip
            else:
                time.sleep(2)


@dataclasses.dataclass(frozen=True)
class NotificationQueues:
    """Where a bench cloud's notifications go: a topic and an exchange named after the
    cloud (a shared broker keeps ``versioned_notifications``), deleted with it."""

    prefix: str

    @property
    def exchange(self) -> str:
        return f"{self.prefix}-notifications"  # not the bus's: a topic exchange

    @property
    def topic(self) -> str:
        return f"{self.prefix}-versioned"

    def queues(self) -> list[str]:
        """The queues oslo.messaging's notifier declares: ``<topic>.<priority>``."""
        return [f"{self.topic}.info", f"{self.topic}.error"]

    def options(self, url: str) -> Options:
        return {
            "DEFAULT": {"control_exchange": self.exchange},
            "notifications": {"versioned_notifications_topics": [self.topic]},
            "oslo_messaging_notifications": {"driver": ["messagingv2"], "transport_url": url},
        }


def notification_url(amqp_url: str) -> str:
    """kombu's ``amqp://u:p@h:5672//`` in oslo.messaging's words, ``rabbit://u:p@h:5672/``
    (its ``amqp://`` is another driver, AMQP 1.0)."""
    parts = urlsplit(amqp_url)
    vhost = parts.path[1:]
    return f"rabbit://{parts.netloc}/{'' if vhost == '/' else quote(vhost, safe='')}"


def registration_summary(
    hosts: int, reports: list[dict[str, Any]], spawned_at: float
) -> dict[str, Any]:
    """The cloud's registration time from the agents' own timings (first start to last end)."""
    phases = [r["phases"]["registration"] for r in reports]
    began = min((p["began_at"] for p in phases if p["began_at"]), default=spawned_at)
    ended = max((p["ended_at"] for p in phases if p["ended_at"]), default=spawned_at)
    seconds = max(ended - began, 1e-9)
    return {
        "hosts": hosts,
        "agents": len(reports),
        "seconds": round(seconds, 3),
        "hosts_per_s": round(hosts / seconds, 1),
        "ready_s": round(max(r.get("ready_at", spawned_at) for r in reports) - spawned_at, 2),
        "timed": sorted({name for r in reports for name in r.get("timed", [])}),
        "per_agent": [
            {
                "host": r["host"],
                "hosts": len(r.get("hosts") or [r["host"]]),  # compute hosts of the process
                "nodes": r["nodes"],
                "registration_s": round(r["phases"]["registration"]["seconds"], 3),
                "reconcile_s": round(r["phases"].get("reconcile", {}).get("seconds", 0.0), 3),
                "start_s": round(r["start_s"], 3),
            }
            for r in reports
        ],
    }
