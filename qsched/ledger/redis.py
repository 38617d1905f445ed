"""Connection and Lua scripts shared by the Redis-backed stores.

Features
    All state changes are Lua scripts run atomically where the state lives;
    every key of a cell shares the hash tag ``{cell}`` (Redis Cluster safe).

Connection string
    ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...``,
    ``unix:///path/to/socket?db=0``: one real Redis.
    ``redis+sentinel://[:password@]host:port[,host:port...]/service_name/db``:
    the master a Redis Sentinel set names, followed across its failovers
    (:mod:`qsched.ledger.sentinel`).
    ``redis+cluster://host:port[,host:port...]``: a Redis Cluster, through
    redis-py's cluster client (:mod:`qsched.ledger.cluster`).
    ``fakeredis://[name]``: the embedded ledger of :mod:`qsched.ledger.embedded`
    (the ``embedded`` extra); demo and tests only, nothing survives the process.

Durability (``[ledger] durability``, see :mod:`qsched.ledger.durability`)
    ``disk`` (the default): acknowledged once on the server's disk. Redis before
    7.2 has no ``WAITAOF``, so the server must run ``appendonly yes`` with
    ``appendfsync always`` and ``no-appendfsync-on-rewrite no`` (it then writes
    and fsyncs the AOF before it answers); the store checks that when it opens
    and refuses to run otherwise, saying what to set.
    ``replica``: every state change is followed by ``WAIT``, on the same
    connection and in the same round trip, and is acknowledged only once
    ``replicas`` replicas hold it; fewer within the timeout is
    :class:`~qsched.exception.BackendUnavailable` (the write did happen on
    the master: callers treat it as an outcome they do not know, as after a
    timeout).
    ``async`` (an opt-in): a write is acknowledged once Redis applied it; what
    a crash of the machine loses is what the server had not written to disk
    yet (``appendfsync everysec``: about the last second). The only setting the
    embedded ledger takes.

Errors
    Every call of a store class decorated with
    :func:`~qsched.ledger.errors.maps_errors` turns a lost or refusing Redis
    (connection refused or dropped, timeout, loading, read-only replica, out of
    memory) into :class:`~qsched.exception.BackendUnavailable`, so that no caller
    mistakes an outage for bad input; a script's refusal is raised as the
    exception its error code names (:mod:`qsched.ledger.errors`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis

from qsched import exception
from qsched.ledger import cluster, durability, embedded, sentinel
from qsched.ledger.base import Backend, LedgerUnavailable
from qsched.ledger.base.backend import ERROR, TIMED_OUT, UNREACHABLE
from qsched.ledger.durability import Durability
from qsched.ledger.errors import CLIENT_ERRORS, SCRIPT_ERRORS, mapped, unavailable
from qsched.ledger.keys import Keyspace, lua_prelude

#: Connections one client's pool may open. redis-py 8 caps a pool at 100 by default and
#: then raises instead of waiting; a process's concurrent ledger calls are bounded by
#: its threads (gunicorn's, an agent's consumer, spawn workers and periodic tasks, the
#: agents of an embedded stack), so the bound is set far above them, as redis-py's
#: earlier releases had none. A URL's ``?max_connections=`` still wins.
MAX_CONNECTIONS = 10_000


def connect(url: str, connect_timeout_s: float = 2.0, timeout_s: float = 10.0) -> redis.Redis:
    """Return a client for ``url`` (see the module docstring).

    ``timeout_s`` bounds every command: a stalled server makes a call fail with
    BackendUnavailable after it (and the API answer 503) rather than hang.

    :raises EmbeddedNotInstalled: a ``fakeredis://`` URL without the embedded extra.
    :raises Invalid: a malformed ``redis+sentinel://`` or ``redis+cluster://`` URL.
    :raises BackendUnavailable: no node of a cluster answered.
    :raises ValueError: another URL redis-py cannot read.
    """
    if embedded.is_embedded_url(url):
        client: redis.Redis = embedded.connect(url, MAX_CONNECTIONS)
        return client
    if sentinel.is_sentinel_url(url):
        return sentinel.connect(url, connect_timeout_s, timeout_s, health_check_interval=30,
                                max_connections=MAX_CONNECTIONS)  # fmt: skip
    if cluster.is_cluster_url(url):
        # RedisCluster answers every command the stores send (one slot's keys, scripts
        # called with a key of it, pipelines), though it is no subclass of Redis
        nodes: Any = cluster.connect(url, connect_timeout_s, timeout_s, MAX_CONNECTIONS)
        return nodes
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=timeout_s,
        health_check_interval=30,
        max_connections=MAX_CONNECTIONS,
    )


@functools.cache
def _source(name: str) -> str:
    """Script ``name`` as loaded: the key builders, lib.lua, then the script itself."""
    lua = resources.files("qsched.ledger") / "lua"
    parts = (lua_prelude(), (lua / "lib.lua").read_text(), (lua / f"{name}.lua").read_text())
    return "\n".join(parts)


class RedisStore:
    """A cell's keyspace on one Redis, with the scripts loaded once."""

    def __init__(
        self,
        client: redis.Redis,
        cell: str = "cell1",
        max_events: int = 200,
        durability: Durability | None = None,
    ) -> None:
        self.client = client
        self.keys = Keyspace(cell)
        self.max_events = max_events
        self.durability = durability or Durability()
        self._scripts: dict[str, Any] = {}
        self._loaded: set[str] = set()  # scripts queue_script has loaded (EVALSHA in pipelines)
        self._wait = self.durability.mode == "replica"

    def script(self, name: str) -> Any:
        """The registered script ``name`` (key builders and lib.lua prepended), loaded on
        first use."""
        found = self._scripts.get(name)
        if found is None:
            found = self._scripts[name] = self.client.register_script(_source(name))
        return found

    def queue_script(self, pipe: Any, name: str, keys: list[str], args: list[Any]) -> None:
        """Queue script ``name`` on ``pipe``, to run when :meth:`execute` sends it.

        As a plain ``EVALSHA``, the script loaded once beforehand (on a cluster, on the
        cell's master): redis-py's Script objects would make every such pipeline ask
        ``SCRIPT EXISTS`` first, a round trip more per heartbeat, and its cluster
        pipeline refuses them.
        """
        script = self.script(name)
        if name not in self._loaded:
            if cluster.is_cluster(self.client):
                cluster.load_script(self.client, self.keys.prefix, script.script)
            else:
                self.client.script_load(script.script)
            self._loaded.add(name)
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """Run ``script``; on a cluster a NOSCRIPT loads it on the cell's master only
        (redis-py's Script would load it on every master, failing while one is down)."""
        if not cluster.is_cluster(self.client):
            # on this store's client as it is now: a script first loaded while a test or
            # a failover had swapped the client must not stay bound to the old one
            return script(keys=keys, args=args, client=self.client)
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            cluster.load_script(self.client, self.keys.prefix, script.script)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)

    def execute(self, build: Callable[[Any], None]) -> list[Any]:
        """A pipeline (no transaction) filled by ``build``, sent; its replies.

        A server that lacks a queued script (a master that took over, or restarted)
        answers NOSCRIPT: the scripts are loaded again and the pipeline is built and
        sent once more, so ``build`` must queue only commands that may run twice.
        """
        for _attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            build(pipe)
            try:
                return list(pipe.execute())
            except redis.exceptions.NoScriptError:
                self._loaded.clear()
        raise redis.exceptions.NoScriptError("the scripts could not be loaded")

    @mapped
    def run(self, name: str, key: str, *args: Any) -> dict[str, Any]:
        """Run script ``name`` on ``key``'s slot; raise its error as a qsched exception.

        With ``replica`` durability the script and a ``WAIT`` go in one round trip.
        :raises BackendUnavailable: Redis is down, or (``replica``) too few
            replicas acknowledged in time: the write may have happened.
        """
        argv = [self.keys.prefix, *args]
        if self._wait:
            raw = self._run_and_wait(self.script(name), key, argv)
        else:
            raw = self._call(self.script(name), [key], argv)
        result: dict[str, Any] = json.loads(raw)
        code = result.pop("error", None)
        if code is not None:
            raise SCRIPT_ERRORS[code](**result)
        return result

    @mapped
    def read(self, name: str, key: str, *args: Any) -> Any:
        """Run read-only script ``name`` on ``key``'s slot: its raw reply (no ``WAIT``
        under ``replica`` durability: it writes nothing)."""
        return self._call(self.script(name), [key], [self.keys.prefix, *args])

    def _run_and_wait(self, script: Any, key: str, argv: list[Any]) -> Any:
        """EVALSHA then WAIT on one connection (WAIT counts that connection's writes)."""
        for _attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", script.sha, 1, key, *argv)
            pipe.execute_command("WAIT", self.durability.replicas, self.durability.timeout_ms)
            raw, acked = pipe.execute(raise_on_error=False)
            if isinstance(raw, redis.exceptions.NoScriptError):
                script.sha = self.client.script_load(script.script)  # a restarted server
                continue
            if isinstance(raw, Exception):
                raise raw
            self._check_acked(acked)
            return raw
        raise redis.exceptions.NoScriptError("the script could not be loaded")

    def _check_acked(self, acked: Any) -> None:
        if isinstance(acked, Exception):
            raise acked
        if int(acked) < self.durability.replicas:
            raise exception.BackendUnavailable(
                backend="Redis",
                url="ledger",
                reason=f"the write is on the master but {acked} of {self.durability.replicas} "
                f"replicas acknowledged it within {self.durability.timeout_ms} ms "
                "([ledger] durability = replica)",
            )

    @mapped
    def barrier(self) -> None:
        """Wait until every write made so far, on any connection, is as durable as set.

        For writes that are not scripts (the flavor catalog, quota limits): under
        ``replica`` a small write followed by ``WAIT`` on one connection; replicas
        apply the stream in order, so its acknowledgement covers what came before.
        """
        if not self._wait:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(self.keys.durability_barrier)
        pipe.execute_command("WAIT", self.durability.replicas, self.durability.timeout_ms)
        self._check_acked(pipe.execute()[1])

    @mapped
    def check_durability(self) -> None:
        """Check the server can keep the promise of the durability setting.

        :raises DurabilityRefused: ``disk`` on a server (any node of a cluster)
            without :data:`~qsched.ledger.durability.DISK_SETTINGS`, ``replica``
            on a cluster, or either on fakeredis; the message says what to set.
        :raises BackendUnavailable: the server (a node of a cluster) could not be asked.
        """
        mode = self.durability.mode
        if mode == "async":
            return
        if embedded.is_embedded(self.client):
            raise durability.refuse_embedded(mode)
        if cluster.is_cluster(self.client):
            cluster.check_durability(self.client, mode)
        elif mode == "disk":
            self._check_disk("the ledger's Redis ([ledger] url)")

    def _check_disk(self, server: str) -> None:
        try:
            found = self.client.config_get(*durability.DISK_SETTINGS)
        except redis.ResponseError as exc:
            if unavailable(exc) is not None:
                raise
            raise durability.refuse_unchecked(server, exc) from exc
        mismatches = durability.disk_mismatches({text(k): text(v) for k, v in found.items()})
        if mismatches:
            raise durability.refuse_disk(server, mismatches)

    @mapped
    def server_time(self) -> float:
        """The ledger server's clock (the outbox ages by it, whatever the callers' clocks)."""
        seconds, micros = self.client.time()
        return float(seconds) + float(micros) / 1e6

    @staticmethod
    def now() -> float:
        return time.time()


#: what a failed PING says, for the health page: the first class the error is an instance of
_PING_FAILURES = (
    (redis.TimeoutError, TIMED_OUT),
    (redis.ConnectionError, UNREACHABLE),
    (redis.RedisError, ERROR),
    (cluster.RedisClusterException, UNREACHABLE),  # no node of the cluster answers
)
_UNLINK_BATCH = 1000  # keys per UNLINK when a cell is forgotten


class RedisBackend(Backend):
    """The Redis connection of a cell's stores (see :class:`~qsched.ledger.base.Backend`)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def ping(self) -> None:
        try:
            cluster.ping_cell(self.store.client, self.store.keys.prefix)
        except CLIENT_ERRORS as exc:
            category = next(word for kind, word in _PING_FAILURES if isinstance(exc, kind))
            raise LedgerUnavailable(
                backend="Redis", url="ledger", category=category, reason=exc
            ) from exc

    def close(self) -> None:
        if cluster.is_cluster(self.store.client):
            cluster.close(self.store.client)
        else:
            sentinel.close(self.store.client)

    @mapped
    def is_empty(self) -> bool:
        return not cluster.key_count(self.store.client)

    def command_stats(self) -> dict[str, tuple[int, int]]:
        try:
            raw = cluster.cell_info(self.store.client, self.store.keys.prefix, "commandstats")
        except Exception:  # fakeredis or a Redis that refuses INFO: no figures, no failure
            return {}
        return {
            name.removeprefix("cmdstat_"): (int(v.get("calls", 0)), int(v.get("usec", 0)))
            for name, v in raw.items()
            if isinstance(v, dict)
        }

    def server_cpu_ms(self) -> float:
        try:
            info = cluster.cell_info(self.store.client, self.store.keys.prefix, "cpu")
        except Exception:  # fakeredis or a Redis that refuses INFO: no figure, no failure
            return 0.0
        return 1000 * sum(float(info.get(f, 0)) for f in ("used_cpu_user", "used_cpu_sys"))

    @mapped
    def forget_cell(self) -> int:
        client, prefix = self.store.client, self.store.keys.prefix
        deleted, batch = 0, []
        for key in cluster.scan_cell(client, prefix, glob_escape(prefix) + "*", 5000):
            batch.append(key)
            if len(batch) >= _UNLINK_BATCH:
                deleted += client.unlink(*batch)
                batch = []
        if batch:
            deleted += client.unlink(*batch)
        return deleted


def glob_escape(literal: str) -> str:
    """A Redis glob (SCAN MATCH) that matches ``literal`` and nothing else."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in literal)


def read_many(
    client: Any, command: str, keys: Sequence[str], *args: Any, chunk: int = 1000
) -> list[Any]:
    """One read ``command`` (``hgetall``, ``smembers``, ``hmget`` with ``args``...) per
    key, pipelined ``chunk`` at a time: the replies in the order of ``keys``."""
    replies: list[Any] = []
    for start in range(0, len(keys), chunk):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + chunk]:
            getattr(pipe, command)(key, *args)
        replies += pipe.execute()
    return replies


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def text(value: Any) -> str:
    """A Redis reply (bytes or str) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def text_map(raw: dict[Any, Any]) -> dict[str, str]:
    """An HGETALL reply as a dict of str."""
    return {text(k): text(v) for k, v in raw.items()}
