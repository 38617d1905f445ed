"""Remove what a stack left on a shared broker: its queues, exchanges and kombu keys.

Nothing is flushed: only what is named with the stack's own bus prefix goes.
Its ledger cell is the ledger's to forget
(:meth:`~qsched.ledger.base.Backend.forget_cell`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qsched.bus.base import Names
    from qsched.bus.kombu.wire import KombuWire


def forget_bus(
    transport_url: str, prefix: str, classes: list[str], hosts: list[str],
    names: Names | None = None,
) -> list[str]:  # fmt: skip
    """Remove a stack's queues and exchanges (RabbitMQ) or keys (kombu's Redis transport).

    ``names``: the bus's, when its queues are not the kombu bus's (the oslo.messaging
    bus's :class:`~qsched.bus.oslo.wire.OsloNames`).

    :returns: what RabbitMQ refused to delete, one line each.
    :raises: one of the wire's errors when the broker cannot be reached at all.
    """
    from qsched.bus.kombu.wire import KombuWire  # kombu only once a stack ran

    wire = KombuWire(transport_url, prefix=prefix)
    try:
        if wire.amqp:
            return _delete_amqp(wire, classes, hosts, names or wire.names)
        if wire.driver == "redis":
            _delete_redis_keys(wire, prefix)
        return []
    finally:
        wire.close()


def _delete_amqp(wire: KombuWire, classes: list[str], hosts: list[str], names: Names) -> list[str]:
    queues = [names.dead_queue, *map(names.boot_queue, classes), *map(names.host_queue, hosts)]
    return _delete_names(wire, queues, [names.exchange, names.dead_exchange])


def forget_amqp(amqp_url: str, queues: list[str], exchanges: list[str]) -> list[str]:
    """Delete these RabbitMQ queues, then exchanges (those a stack's other clients
    declared: its notifications). :returns: what RabbitMQ refused, one line each."""
    from qsched.bus.kombu.wire import KombuWire

    wire = KombuWire(amqp_url)
    try:
        return _delete_names(wire, queues, exchanges)
    finally:
        wire.close()


def _delete_names(wire: KombuWire, queues: list[str], exchanges: list[str]) -> list[str]:
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


def _delete_redis_keys(wire: KombuWire, prefix: str) -> None:
    """kombu's Redis transport keeps queues and bindings as keys: those of ``prefix`` go,
    through the transport's own client."""
    connection = wire.connect()
    try:
        channel: Any = connection.default_channel  # kombu.transport.redis.Channel
        with channel.conn_or_acquire() as client:
            for key in client.scan_iter(match=f"*{prefix}*", count=1000):
                client.delete(key)
            for key in client.scan_iter(match="_kombu.binding.*", count=1000):
                mine = [m for m in client.smembers(key) if prefix.encode() in m]
                if mine:
                    client.srem(key, *mine)
    finally:
        connection.release()
