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
import subprocess
import sys
import time
import uuid
from http import client
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from oslo_config import cfg

from qsched import conf as qconf
from qsched.bench.cleanup import forget_bus, forget_cell
from qsched.bench.packing import BenchFlavor
from qsched.bench.timing import peak_rss_kb
from qsched.bus.kombu import KombuBus
from qsched.compute import ComputeAPI, class_definition
from qsched.flavors import Constraints
from qsched.ledger import Stores, open_stores

LOOPBACK = "127.0.0.1"


class CloudFailed(Exception):
    """A process of the cloud did not start or died; the message carries its log."""


@dataclasses.dataclass(frozen=True)
class CloudSpec:
    """What to start. Node sizes are per simulated host."""

    hosts: int
    agents: int
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


CONFIG = """\
[DEFAULT]
transport_url = {transport_url}
[bus]
prefix = {prefix}
[ledger]
url = {ledger_url}
cell = {cell}
cpu_allocation_ratio = {cpu_ratio}
[quota]
instances = -1
cores = -1
ram = -1
[scheduler]
build_timeout_s = {build_timeout_s}
reap_interval_s = {reap_s}
[api]
{flavor_lines}
[agent]
node_vcpus = {node_vcpus}
node_ram_mb = {node_ram_mb}
node_disk_gb = {node_disk_gb}
spawn_delay_s = 0
heartbeat_interval_s = {heartbeat_s}
heartbeat_ttl_s = {heartbeat_ttl_s}
class_poll_interval_s = {class_poll_s}
reap_interval_s = {reap_s}
"""

GUNICORN = """\
bind = "{bind}"
workers = {workers}
worker_class = "gthread"
threads = {threads}
timeout = 30
graceful_timeout = 10
keepalive = 5
accesslog = None


def post_worker_init(worker):
    from qsched.api.app import wsgi_app

    wsgi_app.ensure_loaded()
"""


class Cloud:
    """What scenarios use; see the two implementations below."""

    mode = ""
    spec: CloudSpec
    conf: cfg.ConfigOpts
    stores: Stores
    bus: KombuBus
    compute: ComputeAPI
    api_url: str | None = None
    registration: dict[str, Any]
    accepted = 0  # boots accepted so far (run_phase counts them): room left for more

    @property
    def transport(self) -> str:
        return self.bus.driver

    def agent_classes(self) -> dict[str, frozenset[str]]:
        """The classes each live agent says (in its heartbeat) that it consumes."""
        return {
            a.host: frozenset(a.detail.get("classes") or ())
            for a in self.stores.agents.list()
            if a.alive
        }

    def prime_classes(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Publish the classes and wait until every agent consumes them all."""
        for name in names:
            definition = class_definition(self.compute.get_flavor(name), Constraints())
            self.stores.agents.add_class(name, definition)
        agents, wanted = len(self.spec.node_counts()), frozenset(names)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = self.agent_classes()
            if len(seen) >= agents and all(wanted <= c for c in seen.values()):
                return
            time.sleep(0.1)
        raise CloudFailed(f"agents did not consume {sorted(wanted)} in {timeout_s}s: {seen}")

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

    def stop(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _open(self, conf: cfg.ConfigOpts, stores: Stores | None = None) -> None:
        self.conf = conf
        self.stores = stores or open_stores(conf)
        self.bus = KombuBus.from_conf(conf)
        self.compute = ComputeAPI(conf, self.stores, self.bus)
        self.compute.seed_flavors()


class ProcessCloud(Cloud):
    """gunicorn and agent processes on real servers, started by :meth:`start`."""

    mode = "processes"

    def __init__(self, spec: CloudSpec, workdir: Path, say: Any) -> None:
        self.spec = spec
        self.say = say
        self.prefix = f"bench{uuid.uuid4().hex[:8]}"
        self.workdir = workdir / self.prefix
        self.workdir.mkdir(parents=True)
        self.config = self.workdir / "qsched.conf"
        self.config.write_text(self._config_text())
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.api: subprocess.Popen[bytes] | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.registration = {}

    def _config_text(self) -> str:
        spec = self.spec
        return CONFIG.format(
            transport_url=spec.transport_url,
            prefix=self.prefix,
            ledger_url=spec.ledger_url,
            cell=self.prefix,
            cpu_ratio=spec.cpu_allocation_ratio,
            build_timeout_s=spec.build_timeout_s,
            flavor_lines="\n".join(f"flavor = {f.config_line}" for f in spec.flavors),
            node_vcpus=spec.node_vcpus,
            node_ram_mb=spec.node_ram_mb,
            node_disk_gb=spec.node_disk_gb,
            heartbeat_s=spec.heartbeat_interval_s,
            heartbeat_ttl_s=max(10.0, 5 * spec.heartbeat_interval_s),
            class_poll_s=spec.class_poll_interval_s,
            reap_s=spec.reap_interval_s,
        )

    def host(self, i: int) -> str:
        return f"{self.prefix}-a{i}"

    def start(self) -> Cloud:
        """Start everything, wait until agents consume and the API answers."""
        spawned_at = time.time()
        for i, count in enumerate(self.spec.node_counts()):
            self._start_agent(i, count)
        if self.spec.http:
            self._start_api()
        self._open(qconf.load([], [str(self.config)]))
        self._wait_files([self._report(i).with_suffix(".loaded") for i in range(len(self.agents))])
        (self.workdir / "go").touch()  # every agent loaded: they register together
        reports = self._wait_agents()
        self.registration = registration_summary(self.spec.hosts, reports, spawned_at)
        if self.spec.http:
            self._wait_api()
        return self

    def _start_agent(self, i: int, count: int) -> None:
        host_conf = self.workdir / f"agent{i}.conf"
        host_conf.write_text(f"[agent]\nhost = {self.host(i)}\nnode_count = {count}\n")
        files = ["--config-file", str(self.config), "--config-file", str(host_conf)]
        cmd = [sys.executable, "-m", "qsched.bench.agent", *files,
               "--report", str(self._report(i)), "--go", str(self.workdir / "go")]  # fmt: skip
        self.agents[self.host(i)] = self._spawn(f"agent{i}", cmd)

    def _report(self, i: int) -> Path:
        return self.workdir / f"agent{i}.json"

    def _start_api(self) -> None:
        port = free_port()
        settings = self.workdir / "gunicorn.conf.py"
        settings.write_text(
            GUNICORN.format(
                bind=f"{LOOPBACK}:{port}",
                workers=self.spec.api_workers,
                threads=self.spec.api_threads,
            )
        )
        cmd = [sys.executable, "-m", "gunicorn", "-c", str(settings), "qsched.api.app:wsgi_app"]
        self.api = self._spawn("api", cmd)
        self.api_url = f"http://{LOOPBACK}:{port}"

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        env = dict(os.environ, QSCHED_CONFIG=str(self.config))
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        self.procs.append(proc)
        return proc

    def _wait_agents(self) -> list[dict[str, Any]]:
        timeout_s = 120 + self.spec.hosts / 200
        deadline, last_say = time.monotonic() + timeout_s, time.monotonic()
        paths = [self._report(i) for i in range(len(self.agents))]
        while not all(p.exists() for p in paths):
            self._check_alive()
            if time.monotonic() > deadline:
                raise CloudFailed(f"agents not ready after {timeout_s:.0f}s\n{self.tail_logs()}")
            if time.monotonic() - last_say > 5:
                last_say = time.monotonic()
                done = self.stores.store.client.scard(self.stores.store.keys.providers)
                ready = sum(p.exists() for p in paths)
                self.say(
                    f"  registering: {done}/{self.spec.hosts} providers, "
                    f"{ready}/{len(paths)} agents ready"
                )
            time.sleep(0.1)
        return [json.loads(p.read_text()) for p in paths]

    def _wait_files(self, paths: list[Path], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(p.exists() for p in paths):
            self._check_alive()
            if time.monotonic() > deadline:
                raise CloudFailed(f"agents did not load in {timeout_s:.0f}s\n{self.tail_logs()}")
            time.sleep(0.02)

    def _wait_api(self) -> None:
        deadline = time.monotonic() + 60
        while not self._healthy():
            self._check_alive()
            if time.monotonic() > deadline:
                raise CloudFailed(f"the API did not answer in 60s\n{self.tail_logs()}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        assert self.api_url is not None
        conn = client.HTTPConnection(LOOPBACK, int(self.api_url.rsplit(":", 1)[1]), timeout=5)
        try:
            conn.request("GET", "/healthcheck")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _check_alive(self) -> None:
        dead = [p for p in self.procs if p.poll() is not None]
        if dead:
            raise CloudFailed(f"a process exited ({dead[0].args!r}):\n{self.tail_logs()}")

    def tail_logs(self, chars: int = 2000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )

    def process_groups(self) -> dict[str, list[int]]:
        groups = {"agents": [p.pid for p in self.agents.values()]}
        if self.api is not None:
            groups["api"] = [self.api.pid]
        return groups

    def profile_targets(self) -> dict[str, int]:
        targets = {f"agent{i}": p.pid for i, p in enumerate(self.agents.values())}
        if self.api is not None:
            for pid in _children(self.api.pid):
                targets[f"api-worker-{pid}"] = pid
        return {**targets, "bench": os.getpid()}

    def peak_rss(self) -> dict[str, Any]:
        per_agent = {host: peak_rss_kb(p.pid) for host, p in self.agents.items()}
        known = [kb for kb in per_agent.values() if kb is not None]
        return {
            "scope": "each agent process (VmHWM)",
            "per_agent_kb": per_agent,
            "max_kb": max(known, default=None),
            "nodes_per_agent": max(self.spec.node_counts()),
        }

    def stop(self) -> list[dict[str, Any]]:
        """Stop every process, then remove this cloud's queues and ledger keys."""
        live = [p for p in self.procs if p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        for proc in live:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reports = []
        for i in range(len(self.agents)):
            path = self._report(i)
            reports.append(json.loads(path.read_text()) if path.exists() else {})
        if hasattr(self, "stores"):
            self.bus.close()
            self._forget()
        return reports

    def _forget(self) -> None:
        """Remove this cloud's queues and keys; a broker that is down is retried a little."""
        classes = [f.name for f in self.spec.flavors]
        for attempt in range(5):
            try:
                forget_bus(self.spec.transport_url, self.prefix, classes, list(self.agents))
                forget_cell(self.stores)
                return
            except Exception as exc:  # cleanup must not hide the run's own outcome
                if attempt == 4:
                    self.say(f"  WARNING: could not remove the queues or keys of {self.prefix}: "
                             f"{type(exc).__name__}: {exc}")  # fmt: skip
                else:
                    time.sleep(2)


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
                "nodes": r["nodes"],
                "registration_s": round(r["phases"]["registration"]["seconds"], 3),
                "reconcile_s": round(r["phases"].get("reconcile", {}).get("seconds", 0.0), 3),
                "start_s": round(r["start_s"], 3),
            }
            for r in reports
        ],
    }


def _children(pid: int) -> list[int]:
    """Direct children of a process (gunicorn's workers), from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])
