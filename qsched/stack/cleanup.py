"""Remove what a stack left on shared servers: its ledger cell, its queues.

Nothing is flushed: only keys of the cell (``qsched:{<cell>}:*``) and queues,
exchanges and kombu keys named with the stack's own bus prefix are removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

from qsched.ledger import Stores

if TYPE_CHECKING:
    from qsched.bus.kombu_wire import KombuWire


def forget_cell(stores: Stores) -> int:
    """Delete every key of the stores' cell (and nothing else); return how many."""
    client = stores.store.client
    pattern = stores.store.keys.prefix.replace("[", "\\[") + "*"
    deleted, batch = 0, []
    for key in client.scan_iter(match=pattern, count=5000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += client.unlink(*batch)
            batch = []
    if batch:
        deleted += client.unlink(*batch)
    return deleted


def forget_bus(transport_url: str, prefix: str, classes: list[str], hosts: list[str]) -> list[str]:
    """Remove a stack's queues and exchanges (RabbitMQ) or keys (kombu's Redis transport).

    :returns: what RabbitMQ refused to delete, one line each.
    :raises: one of the wire's errors when the broker cannot be reached at all,
        a ``redis.RedisError`` when the Redis transport's server cannot.
    """
    from qsched.bus.kombu_wire import KombuWire  # kombu only once a stack ran

    wire = KombuWire(transport_url, prefix=prefix)
    if wire.amqp:
        return _delete_amqp(wire, classes, hosts)
    if wire.driver == "redis":
        _delete_redis_keys(transport_url, prefix)
    return []


def _delete_amqp(wire: KombuWire, classes: list[str], hosts: list[str]) -> list[str]:
    names = wire.names
    queues = [names.dead_queue, *map(names.boot_queue, classes), *map(names.host_queue, hosts)]
    exchanges = [names.exchange, names.dead_exchange]
    doomed = [*(("queue", q) for q in queues), *(("exchange", e) for e in exchanges)]
    failed = []
    connection = wire.connect()
    try:
        for kind, name in doomed:
            try:
                channel = connection.channel()  # a failed delete closes its channel
                delete = channel.queue_delete if kind == "queue" else channel.exchange_delete
                delete(name)
                channel.close()
            except wire.errors as exc:
                failed.append(f"{kind} {name}: {exc}")
    finally:
        connection.release()
    return failed


def _delete_redis_keys(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"*{prefix}*", count=1000):
            client.delete(key)
        for key in client.scan_iter(match="_kombu.binding.*", count=1000):
            mine = [m for m in client.smembers(key) if prefix.encode() in m]
            if mine:
                client.srem(key, *mine)
    finally:
        client.close()
