"""Connection, Lua scripts and error mapping shared by the Redis-backed stores.

Features
    All state changes are Lua scripts run atomically where the state lives;
    every key of a cell shares the hash tag ``{cell}`` (Redis Cluster safe).

Connection string
    ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...``,
    ``unix:///path/to/socket?db=0``: a real Redis (standalone or behind Sentinel
    through a proxy).
    ``fakeredis://[name]``: an in-process fakeredis server with Lua, shared by
    every store of this process opened with the same name. Embedded default
    and tests only; nothing survives the process.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import fakeredis
import redis

from qsched import exception
from qsched.ledger.keys import Keyspace

_fake_servers: dict[str, fakeredis.FakeServer] = {}
_fake_lock = threading.Lock()


def connect(url: str) -> redis.Redis:
    """Return a client for ``url`` (see the module docstring)."""
    if url.startswith("fakeredis://"):
        name = urlsplit(url).netloc or "default"
        with _fake_lock:
            server = _fake_servers.setdefault(name, fakeredis.FakeServer())
        return fakeredis.FakeRedis(server=server)
    return redis.Redis.from_url(
        url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=30
    )


@functools.cache
def _source(name: str) -> str:
    lua = resources.files("qsched.ledger") / "lua"
    return (lua / "lib.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


def _error_map() -> dict[str, Callable[..., exception.QschedError]]:
    return {
        "provider_not_found": exception.ProviderNotFound,
        "provider_exists": exception.ProviderExists,
        "provider_in_use": exception.ProviderInUse,
        "provider_conflict": exception.ProviderGenerationConflict,
        "consumer_conflict": exception.ConsumerGenerationConflict,
        "capacity": exception.CapacityExceeded,
        "invalid_amount": exception.InvalidAmount,
        "inventory_in_use": exception.InventoryInUse,
        "quota": exception.QuotaExceeded,
        "instance_not_found": exception.InstanceNotFound,
        "instance_exists": exception.InstanceExists,
        "flavor_changed": exception.FlavorChanged,
        "not_waiting": exception.InstanceNotWaiting,
    }


_ERRORS = _error_map()


class RedisStore:
    """A cell's keyspace on one Redis, with the scripts loaded once."""

    def __init__(self, client: redis.Redis, cell: str = "cell1", max_events: int = 200) -> None:
        self.client = client
        self.keys = Keyspace(cell)
        self.max_events = max_events
        self._scripts: dict[str, Any] = {}

    def script(self, name: str) -> Any:
        """The registered script ``name`` (lib.lua prepended), loaded on first use."""
        found = self._scripts.get(name)
        if found is None:
            found = self._scripts[name] = self.client.register_script(_source(name))
        return found

    def run(self, name: str, key: str, *args: Any) -> dict[str, Any]:
        """Run script ``name`` on ``key``'s slot; raise its error as a qsched exception."""
        try:
            raw = self.script(name)(keys=[key], args=[self.keys.prefix, *args])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise exception.BackendUnavailable(backend="Redis", url="ledger", reason=exc) from exc
        result: dict[str, Any] = json.loads(raw)
        code = result.pop("error", None)
        if code is not None:
            raise _ERRORS[code](**result)
        return result

    @staticmethod
    def now() -> float:
        return time.time()


def read_many(client: Any, command: str, keys: Sequence[str], chunk: int = 1000) -> list[Any]:
    """One read ``command`` (``hgetall``, ``smembers``...) per key, pipelined
    ``chunk`` at a time: the replies in the order of ``keys``."""
    replies: list[Any] = []
    for start in range(0, len(keys), chunk):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + chunk]:
            getattr(pipe, command)(key)
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
