"""Poison messages for a chaos run: sent straight to the queues agents consume.

Each message but the empty one carries a token in its body, so that the checks
can find its dead letter: every poison message must be dead-lettered exactly once,
with a reason, and never stop the boots behind it.

Forged messages are well formed and name an instance of the run, but disagree with
its record (anyone who can publish on the bus can write one): a boot request for a
waiting or ACTIVE instance with the smallest flavor's class and flavor in it, and a
delete request for an ACTIVE server nobody asked to delete. Each is dead-lettered at
most once (an instance that no longer waits has its boot request dropped), and the
checks see that neither was obeyed: no claim of other amounts than the instance's
flavor asks, no server DELETED without the API having asked.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable
from typing import Any

import kombu
import msgpack

from qsched.bus.kombu.wire import KombuWire, kombu_options
from qsched.bus.oslo.wire import OsloWire, envelope
from qsched.chaos.stack import FLAVORS, Stack
from qsched.flavors import Flavor
from qsched.ledger.base import State
from qsched.scheduling.message import MAX_MESSAGE_BYTES, BootRequest, DeleteRequest


def _stray(token: str) -> bytes:
    """A well-formed boot request naming a class no front door published."""
    stray = BootRequest.create(str(uuid.uuid4()), "poison", "poison", _small(), request_id=token)
    return dataclasses.replace(stray, scheduling_class=f"poison-{token[-8:]}").encode()


#: kind -> the body of a poison message marked with a token
BODIES: dict[str, Callable[[str], bytes]] = {
    "empty": lambda token: b"",
    "garbage": lambda token: b"\x00\xffpoison " + token.encode(),
    "wrong shape": lambda t: msgpack.packb({"kind": "boot", "version": "1.0", "request_id": t}),
    "newer major": lambda t: msgpack.packb({"kind": "boot", "version": "9.0", "request_id": t}),
    "unknown class": _stray,
    "oversized": lambda token: token.encode() + b"x" * (MAX_MESSAGE_BYTES + 1),
}


def _small() -> Flavor:
    name, vcpus, ram_mb, _weight = FLAVORS[0]
    return Flavor(name, vcpus, ram_mb, 0)


def forged(stack: Stack, rng: random.Random) -> list[tuple[str, str, str, bytes]]:
    """The forged messages for instances of the run as its ledger holds them now: (kind,
    instance, the host queue's host or "" for the smallest flavor's boot queue, body).

    Reads every record of the run once (the harness's own scan, never a service's).
    """
    records = stack.stores.inspector.instance_records(fields=("state", "host", "node", "class"))
    small = _small()
    bigger = sorted(u for u, r in records.items() if r.get("class", small.name) != small.name
                    and r.get("state") in (State.BUILD.value, State.ACTIVE.value))  # fmt: skip
    active = sorted(u for u, r in records.items()
                    if r.get("state") == State.ACTIVE.value and r.get("host"))  # fmt: skip
    made: list[tuple[str, str, str, bytes]] = []
    if bigger:
        target = rng.choice(bigger)
        token = f"poison-{uuid.uuid4()}"
        boot = BootRequest.create(target, "forged", "forged", small, request_id=token)
        made.append(("forged boot", target, "", boot.encode()))
    if active:
        target = rng.choice(active)
        host, node = records[target]["host"], records[target].get("node", "")
        delete = DeleteRequest(f"poison-{uuid.uuid4()}", target, host, node)
        made.append(("forged delete", target, host, delete.encode()))
    return made


def inject_poison(stack: Stack, rng: random.Random) -> list[dict[str, Any]]:
    """Publish every poison body to a boot queue agents consume and some to a host queue.

    A text body (kombu hands it over as ``str``) goes as well; on the oslo.messaging
    bus, where every message is an oslo.messaging notification, a notification whose
    payload is not qsched's instead. Returns what was sent: kind, queue and token
    (None for the empty body).
    """
    if stack.bus_driver == "oslo.messaging":
        return _inject_oslo(stack, rng)
    wire = KombuWire(stack.transport_url, stack.prefix, kombu_options(stack.options.bus))
    sent: list[dict[str, Any]] = []
    try:
        boot = wire.boot_entity(FLAVORS[0][0])
        host = wire.host_entity(rng.choice(stack.hosts))
        for entity, kinds in ((boot, list(BODIES)), (host, ["empty", "garbage"])):
            for kind in kinds:
                token = f"poison-{uuid.uuid4()}"
                wire.publish(entity, BODIES[kind](token))
                sent.append(_note(kind, entity, None if kind == "empty" else token))
        token = f"poison-{uuid.uuid4()}"
        _publish_text(wire, boot, f"poison text {token}")
        sent.append(_note("text", boot, token))
        for kind, target, to_host, body in forged(stack, rng):
            entity = wire.host_entity(to_host) if to_host else boot
            wire.publish(entity, body)
            sent.append({**_note(kind, entity, _token(body)), "instance": target})
    finally:
        wire.close()
    return sent


def _token(body: bytes) -> str:
    """The token a forged message carries: its request id."""
    return str(msgpack.unpackb(body)["request_id"])


def _publish_text(wire: KombuWire, entity: kombu.Queue, text: str) -> None:
    """A body with a text encoding: py-amqp decodes it and kombu hands over a str."""
    with wire.channel() as channel:
        wire.declare(channel, entity)
        exchange, key = wire.route(entity)
        kombu.Producer(channel).publish(
            text, exchange=exchange, routing_key=key, content_type="text/plain",
            content_encoding="utf-8", serializer=None,
        )  # fmt: skip


def _note(kind: str, entity: kombu.Queue, token: str | None) -> dict[str, Any]:
    return {"kind": kind, "queue": str(entity.name), "token": token}


def _inject_oslo(stack: Stack, rng: random.Random) -> list[dict[str, Any]]:
    """:func:`inject_poison` through oslo.messaging's wire: the bodies in qsched's envelope."""
    wire = OsloWire(stack.transport_url, stack.prefix, kombu_options(stack.options.bus))
    sent: list[dict[str, Any]] = []
    try:
        boot = wire.boot_route(FLAVORS[0][0])
        host = wire.host_route(rng.choice(stack.hosts))
        for route, kinds in ((boot, list(BODIES)), (host, ["empty", "garbage"])):
            for kind in kinds:
                token = f"poison-{uuid.uuid4()}"
                wire.publish(route, BODIES[kind](token))
                sent.append({"kind": kind, "queue": route.queue,
                             "token": None if kind == "empty" else token})  # fmt: skip
        token = f"poison-{uuid.uuid4()}"
        foreign = {**envelope(b"", "qsched.boot"), "payload": {"not qsched": token}}
        wire.publish_notification(boot, foreign)
        sent.append({"kind": "foreign payload", "queue": boot.queue, "token": token})
        for kind, target, to_host, body in forged(stack, rng):
            route = wire.host_route(to_host) if to_host else boot
            wire.publish(route, body)
            sent.append({"kind": kind, "queue": route.queue, "token": _token(body),
                         "instance": target})  # fmt: skip
    finally:
        wire.close()
    return sent
