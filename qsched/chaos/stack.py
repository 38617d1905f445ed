"""One qsched stack as separate processes: the API under gunicorn and N agents.

Every process reads the same INI file (plus one per agent naming its host),
exactly as a deployment would; the bus prefix is unique per run so that queues
on a shared RabbitMQ never meet another run's. Agents can be signalled and
started again under the same host name, as an operator would restart a
compute service.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from qsched import conf as qconf
from qsched.chaos.load import http_call
from qsched.chaos.servers import LOOPBACK, ChaosError, free_port, wait_for
from qsched.ledger import Stores, open_stores

CONFIG = """\
[DEFAULT]
transport_url = {transport_url}

[bus]
prefix = {prefix}
connect_timeout_s = 2
confirm_timeout_s = 5
heartbeat_s = 10
reconnect_max_delay_s = 2

[ledger]
url = {ledger_url}
cpu_allocation_ratio = 1.0
ram_allocation_ratio = 1.0

[quota]
instances = -1
cores = -1
ram = -1

[scheduler]
build_timeout_s = {build_timeout_s}
max_attempts = 3
reap_interval_s = 1
janitor_interval_s = 2

[api]
{flavors}

[agent]
node_count = {nodes_per_agent}
node_vcpus = {node_vcpus}
node_ram_mb = {node_ram_mb}
node_disk_gb = 0
spawn_delay_s = {spawn_delay_s}
spawn_failure_rate = {failure_rate}
heartbeat_interval_s = 0.5
heartbeat_ttl_s = {heartbeat_ttl_s}
class_poll_interval_s = 0.5
reap_interval_s = 1
shutdown_timeout_s = {shutdown_timeout_s}
"""

#: name, vcpus, ram_mb, weight in the load's mix
FLAVORS = (("chaos.small", 1, 1024, 5), ("chaos.medium", 2, 2048, 3), ("chaos.large", 4, 4096, 1))


@dataclasses.dataclass(frozen=True)
class StackSpec:
    """What to start: how many agents and nodes, how the fake driver behaves."""

    agents: int = 3
    nodes_per_agent: int = 4
    node_vcpus: int = 8
    node_ram_mb: int = 16384
    spawn_delay_s: float = 1.0
    failure_rate: float = 0.05
    build_timeout_s: float = 30.0
    heartbeat_ttl_s: float = 3.0
    shutdown_timeout_s: float = 15.0
    api_workers: int = 2
    seed: int = 1
    extra_config: tuple[Path, ...] = ()

    @property
    def capacity_vcpus(self) -> int:
        return self.agents * self.nodes_per_agent * self.node_vcpus


class Stack:
    """The processes of one stack, its config, and the harness's own view of its ledger."""

    def __init__(self, spec: StackSpec, directory: Path, transport_url: str, ledger_url: str):
        self.spec = spec
        self.dir = directory
        self.logs = directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.transport_url = transport_url
        self.prefix = f"chaos{uuid.uuid4().hex[:8]}"
        self.hosts = [f"{self.prefix}-cn{i}" for i in range(spec.agents)]
        self.port = free_port()
        self.config = directory / "qsched.conf"
        self.config.write_text(self._config_text(transport_url, ledger_url))
        self.conf = qconf.load([], [str(self.config)])
        self.stores: Stores = open_stores(self.conf)
        self.api: subprocess.Popen[bytes] | None = None
        self.agents: dict[int, subprocess.Popen[bytes]] = {}
        self.agent_starts: dict[int, int] = {}

    def _config_text(self, transport_url: str, ledger_url: str) -> str:
        spec = self.spec
        flavors = "\n".join(f"flavor = {n}:{v}:{r}:0" for n, v, r, _ in FLAVORS)
        return CONFIG.format(
            transport_url=transport_url,
            prefix=self.prefix,
            ledger_url=ledger_url,
            build_timeout_s=spec.build_timeout_s,
            flavors=flavors,
            nodes_per_agent=spec.nodes_per_agent,
            node_vcpus=spec.node_vcpus,
            node_ram_mb=spec.node_ram_mb,
            spawn_delay_s=spec.spawn_delay_s,
            failure_rate=spec.failure_rate,
            heartbeat_ttl_s=spec.heartbeat_ttl_s,
            shutdown_timeout_s=spec.shutdown_timeout_s,
        )

    def config_files(self) -> list[str]:
        return [str(self.config), *(str(p) for p in self.spec.extra_config)]

    # -- processes ---------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the API and every agent; wait until the API answers and all agents beat."""
        self.start_api()
        for index in range(self.spec.agents):
            self.start_agent(index)
        ready = lambda: self.healthy() and all(self.alive(h) for h in self.hosts)  # noqa: E731
        if not wait_for(ready, timeout_s, 0.2):
            raise ChaosError(f"the stack was not ready after {timeout_s:.0f}s; logs in {self.logs}")

    def start_api(self) -> None:
        bindir = Path(sys.executable).parent
        env = dict(os.environ, QSCHED_CONFIG=os.pathsep.join(self.config_files()))
        cmd = [
            str(bindir / "gunicorn"),
            "-b",
            f"{LOOPBACK}:{self.port}",
            "-w",
            str(self.spec.api_workers),
            "-k",
            "gthread",
            "--threads",
            "8",
            "--timeout",
            "60",
            "--graceful-timeout",
            "10",
            "qsched.api.app:wsgi_app",
        ]
        self.api = self._spawn("api", cmd, env)

    def start_agent(self, index: int) -> None:
        """Start agent ``index`` (again): same host name, so it finds its nodes and claims."""
        host_conf = self.dir / f"agent{index}.conf"
        host_conf.write_text(
            f"[agent]\nhost = {self.hosts[index]}\nseed = {self.spec.seed * 100 + index}\n"
        )
        args = [a for f in [*self.config_files(), str(host_conf)] for a in ("--config-file", f)]
        cmd = [str(Path(sys.executable).parent / "qsched-agent"), *args]
        self.agents[index] = self._spawn(f"agent{index}", cmd, dict(os.environ))
        self.agent_starts[index] = self.agent_starts.get(index, 0) + 1

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        log.write(f"=== chaos: starting {name} at {time.time():.3f}\n".encode())
        log.flush()
        try:
            return subprocess.Popen(
                cmd, env=dict(env, PYTHONUNBUFFERED="1"), stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()

    def signal_agent(self, index: int, sig: int) -> None:
        proc = self.agents[index]
        if proc.poll() is None:
            proc.send_signal(sig)

    def wait_agent_exit(self, index: int, timeout_s: float) -> int | None:
        """The exit code, or None if it still runs after ``timeout_s``."""
        try:
            return self.agents[index].wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def agent_running(self, index: int) -> bool:
        return self.agents[index].poll() is None

    def stop(self) -> dict[str, Any]:
        """SIGTERM every process, SIGKILL what does not exit; return their exit codes."""
        procs = {f"agent{i}": p for i, p in self.agents.items()}
        if self.api is not None:
            procs["api"] = self.api
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, Any] = {}
        for name, proc in procs.items():
            try:
                codes[name] = proc.wait(self.spec.shutdown_timeout_s + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = f"killed after {self.spec.shutdown_timeout_s + 10:.0f}s"
        self.stores.store.client.close()
        return codes

    def forget_bus(self, classes: list[str]) -> list[str]:
        """Delete this run's queues and exchanges on RabbitMQ; return what failed.

        The Redis transport needs nothing: its server belongs to the run.
        """
        from qsched.bus.kombu import KombuBus  # kombu only when a stack ran

        bus = KombuBus(self.transport_url, prefix=self.prefix)
        if not bus.amqp:
            return []
        names = [
            *(bus.names.boot_queue(c) for c in classes),
            *(bus.names.host_queue(h) for h in self.hosts),
            bus.names.dead_queue,
        ]
        failed = []
        connection = bus.connect()
        try:
            for kind, name in [
                *(("queue", n) for n in names),
                ("exchange", bus.names.exchange),
                ("exchange", bus.names.dead_exchange),
            ]:
                try:
                    channel = connection.channel()  # a failed delete closes its channel
                    delete = channel.queue_delete if kind == "queue" else channel.exchange_delete
                    delete(name)
                    channel.close()
                except bus.errors as exc:
                    failed.append(f"{kind} {name}: {exc}")
        finally:
            connection.release()
            bus.close()
        return failed

    # -- views -------------------------------------------------------------------------

    def alive(self, host: str) -> bool:
        """The agent's heartbeat has not expired (read from the ledger)."""
        return self.stores.agents.alive(host)

    def healthy(self) -> bool:
        try:
            return self.request("GET", "/healthcheck", token=None)[0] == 200
        except OSError:
            return False

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        timeout_s: float = 30.0,
    ) -> tuple[int, dict[str, Any]]:
        """One HTTP call to the API on the loopback interface; (status, JSON body or {})."""
        return http_call(self.port, method, path, body, token, timeout_s)

    def tail_logs(self, chars: int = 2000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
            for p in sorted(self.logs.glob("*.log"))
        )
