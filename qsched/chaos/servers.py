"""The servers a chaos run restarts: Redis servers it owns, RabbitMQ nodes it owns, and
the local RabbitMQ.

A chaos run never restarts or flushes a Redis it did not start: the ledger (and,
for the Redis transport, the bus) live on ``redis-server`` processes of its own
(:mod:`qsched.ledger.server`), on free ports, with AOF persistence in the run's
directory, so a restart keeps what was written. The ``amqp`` transport's RabbitMQ
is shared with whoever else uses the machine: its restart is ``rabbitmqctl
stop_app`` / ``start_app``, kept short, and ``start_app`` always runs, whatever
happens meanwhile. The ``oslo`` transport runs on a RabbitMQ node of its own
(:class:`RabbitNode`: its own node name, ports, Erlang cookie and data in the run's
directory), started in about five seconds and stopped at the end of the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from qsched.ledger.server import AofSampler, RedisServer, RedisServerError, wait_for
from qsched.net import LOOPBACK, free_port

__all__ = ["AofSampler", "ChaosError", "RabbitMQ", "RabbitNode", "RedisServer",
           "RedisServerError", "port_open", "wait_for"]  # fmt: skip

#: The broker policies a deployment applies (deploy/ of the source tree).
POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "rabbitmq-policies.sh"
#: The server's own scripts: the packaged wrappers run them as the rabbitmq user and
#: write the shared node's startup log.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


class ChaosError(Exception):
    """The harness itself could not do what it needed (not an invariant failure)."""


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


class RabbitMQ:
    """The local RabbitMQ node behind an ``amqp://`` URL, restarted with rabbitmqctl."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or LOOPBACK
        self.port = parts.port or 5672
        self.lock = threading.Lock()

    def check(self) -> None:
        """:raises ChaosError: nothing listens at the URL."""
        if not port_open(self.host, self.port, 2.0):
            raise ChaosError(
                f"RabbitMQ is not reachable at {self.host}:{self.port}; start "
                "it with: rabbitmq-server -detached"
            )

    def check_restartable(self) -> None:
        """:raises ChaosError: the broker is not this machine's, or rabbitmqctl is missing."""
        if self.host not in (LOOPBACK, "localhost", "::1"):
            raise ChaosError(
                f"will not restart RabbitMQ at {self.host}: only a local node "
                "can be restarted (use --broker-restarts 0)"
            )
        if shutil.which("rabbitmqctl") is None:
            raise ChaosError("rabbitmqctl is not on PATH (use --broker-restarts 0)")

    def restart(self, outage_s: float, abort: threading.Event) -> float:
        """``stop_app``, wait ``outage_s``, ``start_app`` (always), ``await_startup``.

        Returns when the node accepts AMQP connections again.
        """
        with self.lock:
            try:
                _ctl("stop_app", timeout_s=120)
                abort.wait(outage_s)
            finally:
                self.start_app()
        return time.time()

    def start_app(self) -> None:
        """Start the app and wait until the port takes connections; safe if it runs."""
        _ctl("start_app", timeout_s=120)
        _ctl("await_startup", timeout_s=150, args=["--timeout", "120"])
        if not wait_for(lambda: port_open(self.host, self.port), 60, 0.25):
            raise ChaosError(f"RabbitMQ did not open {self.host}:{self.port} after start_app")


def _ctl(command: str, timeout_s: float, args: list[str] | None = None) -> None:
    cmd = ["rabbitmqctl", "-q", command, *(args or [])]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ChaosError(f"{' '.join(cmd)} did not finish in {timeout_s:.0f}s") from exc
    if done.returncode != 0:
        output = (done.stderr or done.stdout).decode(errors="replace").strip()
        raise ChaosError(f"{' '.join(cmd)} failed ({done.returncode}): {output[-500:]}")


class RabbitNode:
    """A RabbitMQ node of a run's own: its node name, AMQP and distribution ports, Erlang
    cookie (``HOME``), data and logs under ``directory``; no plugins.

    Nothing of the machine's own node is touched: its ports (5672, 25672, and 35672-35682
    that its CLI tools take) are never chosen, since :func:`~qsched.net.free_port` hands
    out free ephemeral ports. ``started_s``: how long the last start took.
    """

    def __init__(self, directory: Path, name: str = "bus-rabbit") -> None:
        self.dir = directory / name
        self.node = f"qsched{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.dist_port = _dist_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.started_s: float | None = None
        self.bin = RABBITMQ_BIN if (RABBITMQ_BIN / "rabbitmq-server").exists() else None

    @property
    def url(self) -> str:
        return f"rabbit://guest:guest@{LOOPBACK}:{self.port}/"

    def env(self) -> dict[str, str]:
        d = self.dir
        return {
            **os.environ,
            "HOME": str(d),  # the Erlang cookie of this node and its CLI calls
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),  # not /etc's
        }

    def command(self, name: str) -> str:
        """The path of one of RabbitMQ's commands. :raises ChaosError: not installed."""
        found = str(self.bin / name) if self.bin is not None else shutil.which(name)
        if found is None:
            raise ChaosError(f"{name} is not installed (apt-get install rabbitmq-server)")
        return found

    def start(self, timeout_s: float = 90.0) -> float:
        """Start the node and wait until it takes AMQP connections; the seconds it took.

        :raises ChaosError: it did not come up (it is stopped again).
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(f"listeners.tcp.1 = {LOOPBACK}:{self.port}\n")
        (self.dir / "rabbitmq-env.conf").write_text("")
        began = time.monotonic()
        log = (self.dir / "server.log").open("ab")
        self.proc = subprocess.Popen([self.command("rabbitmq-server")], env=self.env(),
                                     stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        log.close()
        try:
            self.ctl("wait", "--timeout", str(int(timeout_s)), str(self.dir / "rabbit.pid"),
                     timeout_s=timeout_s + 10)  # fmt: skip
            if not wait_for(lambda: port_open(LOOPBACK, self.port), 30, 0.1):
                raise ChaosError(f"RabbitMQ node {self.node} did not open port {self.port}")
        except BaseException:
            self.stop()
            raise
        self.started_s = round(time.monotonic() - began, 2)
        return self.started_s

    def ctl(self, *args: str, timeout_s: float = 120.0) -> str:
        """``rabbitmqctl -n NODE ARGS``; its output. :raises ChaosError: it failed."""
        cmd = [self.command("rabbitmqctl"), "-q", "-n", self.node, *args]
        try:
            done = subprocess.run(cmd, env=self.env(), capture_output=True, timeout=timeout_s,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise ChaosError(f"{' '.join(cmd)} did not finish in {timeout_s:.0f}s") from exc
        if done.returncode != 0:
            output = (done.stderr or done.stdout).decode(errors="replace").strip()
            raise ChaosError(f"{' '.join(cmd)} failed ({done.returncode}): {output[-500:]}")
        return done.stdout.decode(errors="replace")

    def apply_policies(self, prefix: str, delivery_limit: int) -> None:
        """Run the deployment's ``deploy/rabbitmq-policies.sh`` on this node.

        :raises ChaosError: the script is missing (not a source tree) or failed.
        """
        if not POLICIES.exists():
            raise ChaosError(f"{POLICIES} is missing: run qsched-chaos from a source tree")
        env = {**self.env(), "PREFIX": prefix, "DELIVERY_LIMIT": str(delivery_limit),
               "RABBITMQCTL": f"{self.command('rabbitmqctl')} -n {self.node}"}  # fmt: skip
        done = subprocess.run(["sh", str(POLICIES)], env=env, capture_output=True, timeout=120,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            output = (done.stderr or done.stdout).decode(errors="replace").strip()
            raise ChaosError(f"{POLICIES.name} failed ({done.returncode}): {output[-500:]}")

    def restart(self, outage_s: float, abort: threading.Event) -> float:
        """``stop_app``, wait ``outage_s``, ``start_app`` (always); when it is up again."""
        with self.lock:
            try:
                self.ctl("stop_app")
                abort.wait(outage_s)
            finally:
                self.ctl("start_app")
                self.ctl("await_startup", "--timeout", "120", timeout_s=150)
        if not wait_for(lambda: port_open(LOOPBACK, self.port), 60, 0.25):
            raise ChaosError(f"RabbitMQ node {self.node} did not open {self.port} again")
        return time.time()

    def stop(self) -> None:
        """Stop the node (``rabbitmqctl stop``, else SIGKILL of its process group); idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ChaosError):  # the kill below ends it anyway
            self.ctl("stop", timeout_s=60)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)


def _dist_port() -> int:
    """A free port for Erlang distribution whose CLI range (+10000..+10010) exists."""
    for _ in range(50):
        port = free_port()
        if port + 10010 < 65536:
            return port
    raise ChaosError("no free port below 55526 for RabbitMQ's distribution")
