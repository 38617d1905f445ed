"""Remove what a benchmark cloud left on shared servers: its ledger cell, its queues.

Nothing is flushed: only keys of the cell (``qsched:{<cell>}:*``) and queues,
exchanges and kombu keys named with the cloud's own bus prefix are removed.
"""

from __future__ import annotations

import contextlib

import redis

from qsched.bus.kombu import KombuBus
from qsched.ledger import Stores


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


def forget_bus(transport_url: str, prefix: str, classes: list[str], hosts: list[str]) -> None:
    """Remove a run's queues and exchanges (RabbitMQ) or keys (kombu Redis transport)."""
    bus = KombuBus(transport_url, prefix=prefix)
    try:
        if bus.amqp:
            names = [
                bus.names.dead_queue,
                *(bus.names.boot_queue(c) for c in classes),
                *(bus.names.host_queue(h) for h in hosts),
            ]
            _delete_amqp(bus, names, [bus.names.exchange, bus.names.dead_exchange])
        elif bus.driver == "redis":
            _delete_redis_bus(transport_url, prefix)
    finally:
        bus.close()


def _delete_amqp(bus: KombuBus, queues: list[str], exchanges: list[str]) -> None:
    connection = bus.connect()
    try:
        for name in queues:
            channel = connection.channel()
            with contextlib.suppress(*bus.channel_errors):  # never declared: nothing to do
                channel.queue_delete(name)
        channel = connection.channel()
        for name in exchanges:
            channel.exchange_delete(name)
    finally:
        connection.release()


def _delete_redis_bus(url: str, prefix: str) -> None:
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
