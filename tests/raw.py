"""The Redis store behind a :class:`~qsched.ledger.Stores`, for tests only.

Tests that corrupt records behind the scripts' back, count keys or swap the
client for a dead one reach the Redis backend through here; nothing outside
``qsched/ledger/`` may (``tests/test_layering.py``).
"""

from __future__ import annotations

from typing import Any

import redis

from qsched.ledger import Stores
from qsched.ledger.redis import RedisBackend, RedisStore


def redis_store(stores: Stores) -> RedisStore:
    """The one RedisStore every store of ``stores`` shares (its client, its keys)."""
    backend = stores.backend
    assert isinstance(backend, RedisBackend), f"not a Redis ledger: {backend!r}"
    return backend.store


class DeadClient:
    """A Redis client whose every command finds the server gone: put it in a store's
    ``client`` for an outage of that keyspace, put the live one back to end it."""

    def __getattr__(self, name: str) -> Any:
        raise redis.ConnectionError("Connection refused")
