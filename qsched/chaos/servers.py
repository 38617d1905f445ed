"""The servers a chaos run restarts: Redis servers it owns, and the local RabbitMQ.

A chaos run never restarts or flushes a Redis it did not start: the ledger (and,
for the Redis transport, the bus) live on ``redis-server`` processes of its own,
on free ports, with AOF persistence (``appendfsync everysec``) in the run's
directory, so a restart keeps what was written. RabbitMQ is shared with whoever
else uses the machine: its restart is ``rabbitmqctl stop_app`` / ``start_app``,
kept short, and ``start_app`` always runs, whatever happens meanwhile.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import redis

from qsched.stack import LOOPBACK, free_port


class ChaosError(Exception):
    """The harness itself could not do what it needed (not an invariant failure)."""


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` has passed; a raising call is false."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return True
        except Exception:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


class RedisServer:
    """A ``redis-server`` process of this run: own port, own directory, AOF everysec."""

    def __init__(self, directory: Path, name: str, restart_signal: int = signal.SIGTERM) -> None:
        if shutil.which("redis-server") is None:
            raise ChaosError(
                "redis-server is not on PATH: install Redis (apt-get install "
                "redis-server) to run the chaos harness"
            )
        self.name = name
        self.dir = directory / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.restart_signal = restart_signal  # SIGKILL: a crash, up to ~1 s of writes lost

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            LOOPBACK,
            "--dir",
            str(self.dir),
            "--logfile",
            "redis.log",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--daemonize",
            "no",
        ]

    def start(self, timeout_s: float = 15.0) -> None:
        """Start it (loading its AOF if any) and wait until it answers PING."""
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if not wait_for(self.ping, timeout_s):
            raise ChaosError(
                f"{self.name} redis-server on port {self.port} did not answer "
                f"within {timeout_s:.0f}s (see {self.dir / 'redis.log'})"
            )

    def ping(self) -> bool:
        client = redis.Redis(
            host=LOOPBACK, port=self.port, socket_connect_timeout=1, socket_timeout=1
        )
        try:
            # While it loads its AOF a server answers LOADING: not up yet.
            return bool(client.ping())
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        """Stop it; SIGTERM makes Redis fsync its AOF before it exits. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, outage_s: float, abort: threading.Event) -> float:
        """Stop, stay down ``outage_s`` (less if ``abort`` is set), start; return when up."""
        self.stop(self.restart_signal)
        abort.wait(outage_s)
        self.start()
        self.restarts += 1
        return time.time()


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
