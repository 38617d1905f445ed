"""A real Redis Cluster of three masters on free loopback ports, for the tests.

Each master is a ``redis-server --cluster-enabled yes`` process (Debian's
``redis-server`` package) in its own folder under the caller's directory, with
no persistence by default: a test's cluster is thrown away with it. Given an
``fsync`` (``always``, ``everysec``), every master writes an AOF with that
``appendfsync`` instead, as ``[ledger] durability = disk`` needs with ``always``.
The cluster is formed
the way ``redis-cli --cluster create`` forms one, without its one-second
pauses: each master takes an even share of the 16384 hash slots
(``CLUSTER ADDSLOTSRANGE``), the first meets the others (``CLUSTER MEET``),
and :meth:`RedisClusterServers.start` returns once every master reports
``cluster_state:ok`` and knows every other. :meth:`RedisClusterServers.stop` ends them all.

:attr:`RedisClusterServers.url` is the ``redis+cluster://`` URL that ``[ledger] url``
takes (:mod:`qsched.ledger.cluster`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from qsched.net import LOOPBACK, free_port

SLOTS = 16384


class RedisClusterFailed(Exception):
    """redis-server is not installed, a master exited, or the cluster was not ok in time."""


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """Even, contiguous shares of the hash slots, first and last slot of each (inclusive),
    as ``redis-cli --cluster create`` splits them: three masters get 0-5460, 5461-10922
    and 10923-16383."""
    share = SLOTS / masters
    bounds = [round(share * i) for i in range(masters)] + [SLOTS]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


class RedisClusterServers:
    """``masters`` cluster-enabled redis-server processes on ``127.0.0.1``, no replicas.

    :param fsync: None, no persistence; else every master's ``appendfsync``, its AOF on.
    """

    def __init__(self, directory: Path, masters: int = 3, fsync: str | None = None) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        self.fsync = fsync
        self.dir = directory
        self.ports = [free_port() for _ in range(masters)]
        # the cluster bus would be on port + 10000, which may be taken or past 65535
        self.bus_ports = [free_port() for _ in range(masters)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<port>,...``: every master as a startup node."""
        return "redis+cluster://" + ",".join(f"{LOOPBACK}:{p}" for p in self.ports)

    def start(self, timeout_s: float = 10.0) -> float:
        """Start the masters, give them their slots, join them; wait until the cluster is ok.

        :returns: the seconds it took.
        :raises RedisClusterFailed: no ``redis-server`` on PATH, a master exited, or
            the cluster was not ok within ``timeout_s`` (the masters are stopped then).
        """
        started = time.monotonic()
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisClusterFailed(
                "no redis-server on PATH (Debian: apt-get install redis-server)"
            )
        try:
            for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
                self.procs.append(self._spawn(binary, port, bus_port))
            self._wait(lambda c: bool(c.ping()), started + timeout_s, "answer PING")
            self._form()
            self._wait(self._joined, started + timeout_s, "report cluster_state:ok")
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - started

    def _spawn(self, binary: str, port: int, bus_port: int) -> subprocess.Popen[bytes]:
        folder = self.dir / f"master-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [binary, "--port", str(port), "--bind", LOOPBACK, "--dir", str(folder),
               "--cluster-enabled", "yes", "--cluster-port", str(bus_port),
               "--cluster-config-file", "nodes.conf",
               "--cluster-node-timeout", "5000", "--save", "",
               "--logfile", "redis.log", "--daemonize", "no"]  # fmt: skip
        if self.fsync is None:
            cmd += ["--appendonly", "no"]
        else:
            cmd += ["--appendonly", "yes", "--appendfsync", self.fsync]
        return subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def _form(self) -> None:
        """Each master its slots, then the first meets the others (gossip does the rest)."""
        for port, (first, last) in zip(self.ports, slot_ranges(len(self.ports)), strict=True):
            with self.client(port) as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        with self.client(self.ports[0]) as client:
            for port, bus_port in zip(self.ports[1:], self.bus_ports[1:], strict=True):
                client.execute_command("CLUSTER", "MEET", LOOPBACK, port, bus_port)

    def _joined(self, client: redis.Redis) -> bool:
        info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return (fields.get("cluster_state"), fields.get("cluster_known_nodes")) == (
            "ok",
            str(len(self.ports)),
        )

    def _wait(self, ready: Callable[[redis.Redis], bool], deadline: float, what: str) -> None:
        """Poll every master until ``ready(client)`` holds for all of them."""
        pending = list(self.ports)
        while pending:
            self._check_running()
            port = pending[0]
            try:
                with self.client(port) as client:
                    done = ready(client)
            except redis.RedisError:
                done = False
            if done:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise RedisClusterFailed(
                    f"the master on port {port} did not {what} in time "
                    f"(its log: {self.dir / f'master-{port}' / 'redis.log'})"
                )
            time.sleep(0.05)

    def _check_running(self) -> None:
        for port, proc in zip(self.ports, self.procs, strict=False):
            if proc.poll() is not None:
                raise RedisClusterFailed(
                    f"the master on port {port} exited with {proc.returncode} "
                    f"(its log: {self.dir / f'master-{port}' / 'redis.log'})"
                )

    def client(self, port: int) -> redis.Redis:
        """A plain client of the master on ``port`` (no cluster redirections followed)."""
        return redis.Redis(host=LOOPBACK, port=port, socket_connect_timeout=1, socket_timeout=5)

    def kill(self, port: int) -> None:
        """SIGKILL the master on ``port`` (an outage of its shard); the others keep running."""
        proc = self.procs[self.ports.index(port)]
        proc.kill()
        proc.wait()

    def flush(self) -> None:
        """Empty every master (FLUSHALL on each: the cluster is this run's own)."""
        for port in self.ports:
            with self.client(port) as client:
                client.flushall()

    def stop(self, timeout_s: float = 10.0) -> None:
        """End every master (SIGTERM, then SIGKILL after ``timeout_s``). Idempotent."""
        procs, self.procs = self.procs, []
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
