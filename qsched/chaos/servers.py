"""The servers a chaos run restarts: Redis servers it owns, RabbitMQ nodes it owns, and
the local RabbitMQ.

A chaos run never restarts or flushes a Redis it did not start: the ledger (and,
for the Redis transport, the bus) live on ``redis-server`` processes of its own
(:mod:`qsched.ledger.server`), on free ports, with AOF persistence in the run's
directory, so a restart keeps what was written. The ``amqp`` transport's RabbitMQ
is shared with whoever else uses the machine: its restart is ``rabbitmqctl
stop_app`` / ``start_app``, kept short, and ``start_app`` always runs, whatever
happens meanwhile. The ``oslo`` transport runs on a RabbitMQ node of its own
(:class:`~qsched.stack.rabbitmq.RabbitNode`: its own node name, ports, Erlang cookie
and data in the run's directory), started in about five seconds and stopped at the
end of the run. Given ``--rabbit-cluster N``, the ``amqp`` and ``oslo`` transports
run on a cluster of N such nodes instead (:class:`~qsched.stack.rabbitmq.RabbitCluster`),
whose nodes the ``rabbit_node_loss`` fault stops and starts again.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from urllib.parse import urlsplit

from qsched.ledger.server import AofSampler, RedisServer, RedisServerError, wait_for
from qsched.net import LOOPBACK, port_open
from qsched.stack.rabbitmq import RabbitCluster, RabbitFailed, RabbitNode

__all__ = ["AofSampler", "ChaosError", "RabbitCluster", "RabbitFailed", "RabbitMQ",
           "RabbitNode", "RedisServer", "RedisServerError", "port_open", "wait_for"]  # fmt: skip


class ChaosError(Exception):
    """The harness itself could not do what it needed (not an invariant failure)."""


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
