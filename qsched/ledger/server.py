"""The Redis servers behind a ledger, for harnesses: started, probed, flushed.

``redis-server`` processes a harness or a test owns: own port, own directory, AOF on.

A harness never restarts or flushes a Redis it did not start; this is how it gets
one to break. Each server writes an AOF (``appendfsync`` as asked) in its own
directory, so a restart keeps what was written, and can follow another as its
replica. :meth:`RedisServer.crash` emulates a crash of the server's *machine*:
what the operating system had not written to disk is lost, so the AOF is cut back
to where it was ``lose_s`` seconds before (sampled by :class:`AofSampler`) before
the server starts again. With ``appendfsync always`` Redis fsyncs before it
answers, so such a crash loses nothing acknowledged and ``lose_s`` is 0.

And a Redis at a URL, for the benchmarks: whether it answers
(:func:`unreachable`), what it runs (:func:`redis_facts`), a scratch database
flushed before and after (:func:`flushed`).
"""

from __future__ import annotations

import bisect
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from redis.connection import parse_url

from qsched.net import LOOPBACK, free_port

#: The ``appendfsync`` a harness's server runs under each ``[ledger] durability``: disk
#: needs a server that fsyncs before it answers; async and replica run Redis's usual
#: ``everysec`` (a replica's copy is their promise, not the disk).
FSYNC = {"disk": "always", "async": "everysec", "replica": "everysec"}


class RedisServerError(Exception):
    """A server could not be started or crashed as asked (a harness problem)."""


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
    """A ``redis-server`` process of one run.

    :param fsync: the server's ``appendfsync``: ``everysec`` or ``always``.
    :param replica_of: another server this one replicates.
    :param restart_signal: how :meth:`restart` stops it (SIGTERM: a clean shutdown).
    """

    def __init__(
        self,
        directory: Path,
        name: str,
        restart_signal: int = signal.SIGTERM,
        fsync: str = "everysec",
        replica_of: RedisServer | None = None,
    ) -> None:
        if shutil.which("redis-server") is None:
            raise RedisServerError(
                "redis-server is not on PATH: install Redis (apt-get install redis-server)"
            )
        self.name = name
        self.dir = directory / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.fsync = fsync
        self.replica_of = replica_of
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.restart_signal = restart_signal

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def command(self) -> list[str]:
        cmd = ["redis-server", "--port", str(self.port), "--bind", LOOPBACK,
               "--dir", str(self.dir), "--logfile", "redis.log", "--save", "",
               "--appendonly", "yes", "--appendfsync", self.fsync,
               "--auto-aof-rewrite-percentage", "0",  # one AOF file to cut back in a crash
               "--repl-diskless-sync-delay", "0",  # a replica syncs at once
               "--shutdown-timeout", "0",  # SIGTERM does not wait for replicas
               "--daemonize", "no"]  # fmt: skip
        if self.replica_of is not None:
            cmd += ["--replicaof", LOOPBACK, str(self.replica_of.port)]
        return cmd

    def start(self, timeout_s: float = 15.0) -> None:
        """Start it (loading its AOF if any) and wait until it answers PING."""
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if not wait_for(self.ping, timeout_s):
            raise RedisServerError(
                f"{self.name} redis-server on port {self.port} did not answer "
                f"within {timeout_s:.0f}s (see {self.dir / 'redis.log'})"
            )

    def client(self) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=self.port, socket_connect_timeout=1,
                           socket_timeout=5)  # fmt: skip

    def ping(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())  # while it loads its AOF it answers LOADING
        finally:
            client.close()

    def wait_synced(self, timeout_s: float = 15.0) -> bool:
        """A replica: wait until its master counts it online (so WAIT counts it too)."""
        master = self.replica_of
        assert master is not None, f"{self.name} is no replica"

        def online() -> bool:
            info = master.client().info("replication")
            return any(
                isinstance(v, dict) and v.get("port") == self.port and v.get("state") == "online"
                for k, v in info.items()
                if k.startswith("slave")
            )

        return wait_for(online, timeout_s)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        """Stop it; SIGTERM makes Redis fsync its AOF before it exits. Idempotent.

        Redis refuses a SIGTERM while it writes its first AOF (a replica just after
        its sync: "Writing initial AOF, can't exit"): the signal is sent again every
        half second until it exits, killed after ``timeout_s``.
        """
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            proc.send_signal(sig)
            try:
                proc.wait(max(0.0, min(0.5, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    break
        proc.kill()
        proc.wait()

    def restart(self, outage_s: float, abort: threading.Event) -> float:
        """Stop, stay down ``outage_s`` (less if ``abort`` is set), start; return when up."""
        self.stop(self.restart_signal)
        abort.wait(outage_s)
        self.start()
        self.restarts += 1
        return time.time()

    def crash(self, sampler: AofSampler, lose_s: float, outage_s: float,
              abort: threading.Event) -> dict[str, float]:  # fmt: skip
        """A crash of the machine: SIGKILL, the AOF cut back by ``lose_s``, start again.

        :returns: the bytes the AOF had and kept, and the time the cut went back to.
        """
        self.stop(signal.SIGKILL)
        path = self.aof_path()
        size = path.stat().st_size
        kept = sampler.size_before(time.time() - lose_s) if lose_s > 0 else size
        kept = min(kept, size)
        os.truncate(path, kept)
        abort.wait(outage_s)
        self.start()
        self.restarts += 1
        return {"aof_bytes": size, "aof_kept_bytes": kept, "lost_bytes": size - kept}

    def aof_path(self) -> Path:
        """The AOF file new writes go to (Redis 7: the incr file of the manifest)."""
        folder = self.dir / "appendonlydir"
        manifest = next(folder.glob("*.manifest"), None)
        if manifest is None:
            raise RedisServerError(f"{self.name}: no AOF manifest in {folder}")
        incr = [line.split()[1] for line in manifest.read_text().splitlines()
                if line.split()[-1:] == ["i"]]  # fmt: skip
        if not incr:
            raise RedisServerError(f"{self.name}: no incremental AOF file in {manifest}")
        return folder / incr[-1]


def start_for(directory: Path, durability: str, name: str = "ledger") -> list[RedisServer]:
    """The servers a harness's ledger runs on under ``[ledger] durability``, started:
    the master first (``appendfsync`` as :data:`FSYNC` says) and, for ``replica``, one
    replica of it, linked (so that ``WAIT`` counts it). Stop them last to first.

    :raises RedisServerError: one did not start or link; those started are stopped.
    """
    master = RedisServer(directory, f"{name}-master", fsync=FSYNC[durability])
    servers = [master]
    try:
        master.start()
        if durability == "replica":
            servers.append(RedisServer(directory, f"{name}-replica", replica_of=master))
            servers[-1].start()
            if not servers[-1].wait_synced():
                raise RedisServerError(f"{name}-replica did not link to its master")
    except BaseException:
        for running in reversed(servers):
            running.stop()
        raise
    return servers


class AofSampler(threading.Thread):
    """Samples the size of a server's AOF every ``interval_s``, to cut it back in a crash."""

    def __init__(self, server: RedisServer, interval_s: float = 0.05) -> None:
        super().__init__(name=f"aof-{server.name}", daemon=True)
        self.server = server
        self.interval_s = interval_s
        self._times: list[float] = []
        self._sizes: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                size = self.server.aof_path().stat().st_size
            except (OSError, RedisServerError):
                continue
            with self._lock:
                if self._sizes and size < self._sizes[-1]:  # cut back or rewritten
                    self._times, self._sizes = [], []
                self._times.append(time.time())
                self._sizes.append(size)

    def size_before(self, moment: float) -> int:
        """The AOF's size at the last sample taken at or before ``moment`` (0 if none)."""
        with self._lock:
            index = bisect.bisect_right(self._times, moment) - 1
            if index < 0:  # nothing that old since the last cut: keep what it had then
                return self._sizes[0] if self._sizes else 0
            return self._sizes[index]

    def stop(self) -> None:
        self._stop.set()


def unreachable(url: str, timeout_s: float = 2.0) -> redis.RedisError | None:
    """The client's error when the Redis at ``url`` does not answer a PING, else None."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        return exc
    finally:
        client.close()
    return None


def redis_facts(url: str) -> dict[str, Any]:
    """Version and persistence settings of the Redis at ``url``."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2, decode_responses=True)
    try:
        info = client.info("server")
        facts: dict[str, Any] = {"version": info.get("redis_version")}
        try:
            config = client.config_get("appendonly", "appendfsync")
            facts.update({name: config.get(name) for name in ("appendonly", "appendfsync")})
        except redis.RedisError:
            facts["appendonly"] = "unknown (CONFIG refused)"
        return facts
    finally:
        client.close()


def db_number(url: str) -> int:
    """The database a ``redis://`` URL names (0 when it names none).

    :raises ValueError: not a Redis URL.
    """
    return int(parse_url(url).get("db", 0))


@contextmanager
def flushed(url: str) -> Iterator[None]:
    """The database at ``url``, flushed before and after: a benchmark's scratch space."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    client.flushdb()
    try:
        yield
    finally:
        client.flushdb()
        client.close()
