"""A Redis Sentinel set on loopback, for the tests and the chaos run: one master, its
replicas, and the sentinels that watch them.

Every process is a ``redis-server`` (Debian's ``redis-server`` package; ``redis-server
--sentinel`` runs a sentinel) on a free port, with its files in its own directory.
The data servers are :class:`~qsched.ledger.server.RedisServer` (AOF on); each
sentinel gets a ``sentinel.conf`` of its own, which it rewrites as it learns the
set. Sentinel's timers are short (``down-after-milliseconds`` 1000 by default) so a
killed master is replaced within a few seconds, and a sentinel that a busy machine
put in TILT mode (its timer two seconds late) leaves it after 2 s instead of 30.
:meth:`SentinelSet.stop` ends every process it started, sentinels first so that
none fails over during the stop.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import redis

from qsched.ledger.sentinel import SCHEME
from qsched.ledger.server import RedisServer, RedisServerError, wait_for
from qsched.net import LOOPBACK, free_port

__all__ = ["RedisServerError", "SentinelProcess", "SentinelSet"]

#: how long a sentinel stays in TILT mode (Redis 7's ``SENTINEL DEBUG``; 30 s by default)
TILT_PERIOD_MS = 2000


class SentinelProcess:
    """One ``redis-server --sentinel`` watching ``service`` on a port of its own."""

    def __init__(self, directory: Path, name: str) -> None:
        self.name = name
        self.dir = directory / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(
        self,
        service: str,
        master: RedisServer,
        quorum: int,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        """Write its ``sentinel.conf`` and start it; it answers PING when this returns.

        :raises RedisServerError: it did not answer within 15 s.
        """
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind {LOOPBACK}\ndir {self.dir}\nlogfile sentinel.log\n"
            f"sentinel monitor {service} {LOOPBACK} {master.port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 2\n"
        )
        self.proc = subprocess.Popen(
            ["redis-server", str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_for(lambda: bool(self.client().ping()), 15):
            raise RedisServerError(
                f"sentinel {self.name} on port {self.port} did not answer "
                f"within 15 s (see {self.dir / 'sentinel.log'})"
            )
        # A sentinel whose timer ran two seconds late (a busy machine) stops acting for
        # TILT-PERIOD, 30 s by default: far longer than a test waits for a failover.
        client = self.client()
        try:
            client.execute_command("SENTINEL", "DEBUG", "TILT-PERIOD", TILT_PERIOD_MS)
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis(
            LOOPBACK, self.port, socket_connect_timeout=1, socket_timeout=5, decode_responses=True
        )

    def master_port(self, service: str) -> int | None:
        """The port of the master this sentinel names now (None if it names none)."""
        client = self.client()
        try:
            found = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", service)
        finally:
            client.close()
        return int(found[1]) if found else None

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 10 s; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class SentinelSet:
    """A master, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority).

    :param fsync: the data servers' ``appendfsync``.
    :param down_after_ms: Sentinel's ``down-after-milliseconds``: how long a master may
        not answer before a sentinel counts it down.
    :param failover_timeout_ms: Sentinel's ``failover-timeout`` (a new failover of the
        same master waits twice as long after one began).
    """

    def __init__(
        self,
        directory: Path,
        service: str = "qsched",
        replicas: int = 2,
        sentinels: int = 3,
        fsync: str = "everysec",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        if shutil.which("redis-server") is None:
            raise RedisServerError(
                "redis-server is not on PATH: install Redis (apt-get install redis-server)"
            )
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        first = RedisServer(directory, "redis0", fsync=fsync)
        self.servers = [first] + [
            RedisServer(directory, f"redis{i}", fsync=fsync, replica_of=first)
            for i in range(1, replicas + 1)
        ]
        self.sentinels = [SentinelProcess(directory, f"sentinel{i}") for i in range(sentinels)]

    def url(self, db: int = 0) -> str:
        """The ledger's ``redis+sentinel://`` URL of the set."""
        hosts = ",".join(f"{LOOPBACK}:{s.port}" for s in self.sentinels)
        return f"{SCHEME}://{hosts}/{self.service}/{db}"

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the servers, link the replicas, start the sentinels; return once every
        sentinel sees the master, all its replicas and every other sentinel.

        :raises RedisServerError: a process did not start or the set did not form in time
            (what started is stopped).
        """
        try:
            for server in self.servers:
                server.start()
            for replica in self.servers[1:]:
                if not replica.wait_synced(timeout_s):
                    raise RedisServerError(f"{replica.name} did not link to its master")
            quorum = len(self.sentinels) // 2 + 1
            for sentinel in self.sentinels:
                sentinel.start(
                    self.service,
                    self.servers[0],
                    quorum,
                    self.down_after_ms,
                    self.failover_timeout_ms,
                )
            if not wait_for(self.formed, timeout_s, 0.2):
                raise RedisServerError(
                    f"the sentinels did not all see the set within "
                    f"{timeout_s:.0f} s (see {self.sentinels[0].dir})"
                )
        except BaseException:
            self.stop()
            raise

    def formed(self) -> bool:
        """Every sentinel names the same live master, with every live replica and every
        other sentinel, none of them down."""
        master = self.master()
        live = sum(1 for s in self.servers if s.proc is not None) - 1
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                state: dict[str, Any] = client.sentinel_master(self.service)  # type: ignore[assignment]
                replicas: list[dict[str, Any]] = client.sentinel_slaves(self.service)
            finally:
                client.close()
            up = [r for r in replicas if not (r["is_sdown"] or r["is_odown"])]
            if (
                state["port"] != master.port
                or not state["is_master"]
                or state["is_sdown"]
                or state["is_odown"]
                or len(up) < live
                or state["num-other-sentinels"] < len(self.sentinels) - 1
            ):
                return False
        info = _replication(master)
        return info["role"] == "master" and int(info["connected_slaves"]) >= live

    def master(self) -> RedisServer:
        """The server the first sentinel that answers names as master.

        :raises RedisServerError: no sentinel answers, or it names none of the set.
        """
        for sentinel in self.sentinels:
            try:
                port = sentinel.master_port(self.service)
            except redis.RedisError:
                continue
            found = next((s for s in self.servers if s.port == port), None)
            if found is not None:
                return found
        raise RedisServerError(f"no sentinel names a master of {self.service}")

    def replicas(self) -> list[RedisServer]:
        """The servers other than the master, running or not."""
        master = self.master()
        return [s for s in self.servers if s is not master]

    def failover(self, timeout_s: float = 30.0) -> RedisServer:
        """``SENTINEL FAILOVER``: a replica is promoted while the master still runs; return
        the new master once the set has formed again around it.

        :raises RedisServerError: the set did not form again within ``timeout_s``.
        """
        old = self.master()
        client = self.sentinels[0].client()
        try:
            client.execute_command("SENTINEL", "FAILOVER", self.service)
        finally:
            client.close()
        return self._promoted(old, timeout_s)

    def kill_master(self, timeout_s: float = 30.0) -> tuple[RedisServer, RedisServer]:
        """SIGKILL the master; return (the killed one, the replica the sentinels promoted)
        once they agree on it. The killed one stays down until :meth:`rejoin`.

        :raises RedisServerError: no promotion within ``timeout_s``.
        """
        old = self.master()
        old.stop(signal.SIGKILL)
        return old, self._promoted(old, timeout_s)

    def rejoin(self, server: RedisServer, timeout_s: float = 30.0) -> None:
        """Start ``server`` again as a replica of the current master, as an operator
        would bring back a failed machine; return once the set has formed again."""
        server.replica_of = self.master()
        server.start()
        if not wait_for(self.formed, timeout_s, 0.2):
            raise RedisServerError(f"{server.name} did not rejoin within {timeout_s:.0f} s")

    def _promoted(self, old: RedisServer, timeout_s: float) -> RedisServer:
        def moved() -> bool:
            ports = {s.master_port(self.service) for s in self.sentinels}
            return ports != {old.port} and len(ports) == 1 and self.formed()

        if not wait_for(moved, timeout_s, 0.1):
            raise RedisServerError(
                f"the sentinels did not agree on a new master within "
                f"{timeout_s:.0f} s (see {self.sentinels[0].dir})"
            )
        return self.master()

    def stop(self) -> None:
        """Stop every sentinel, then every server (each idempotent)."""
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()


def _replication(server: RedisServer) -> dict[str, Any]:
    """``INFO replication`` of ``server``."""
    client = server.client()
    try:
        return client.info("replication")
    finally:
        client.close()
