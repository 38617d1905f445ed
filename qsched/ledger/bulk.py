"""Harness chores on a big cell: instances written in bulk, and the memory records take.

For benchmarks only. :func:`preload` writes instances as the real flow does, through
the same scripts with the same arguments (``instance_create``, the claim of
``allocate``, ``instance_active``, and ``instance_end`` for past ones), but pipelined
a chunk at a time instead of one round trip per call: a million instances in
minutes, with the records, indexes, allocations and quota of the real thing. It
leaves out what the API and agents write besides the scripts (their ``published``
and similar events), so a preloaded record can be a little smaller than a booted
one; :func:`record_memory` measures either.

:func:`used_memory` and :func:`record_memory` read the server's ``INFO memory`` and
``MEMORY USAGE``; both are None on the embedded ledger, which does not measure.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from qsched import exception
from qsched.ledger import Stores
from qsched.ledger import embedded as qembedded
from qsched.ledger.errors import SCRIPT_ERRORS
from qsched.ledger.instances import RedisInstances
from qsched.ledger.placement import RedisLedger
from qsched.ledger.records import Instance, State
from qsched.ledger.redis import RedisBackend, RedisStore, connect, text


@dataclasses.dataclass(frozen=True)
class Node:
    """Where preloaded instances go: a node of a host, and its root provider."""

    host: str
    node: str
    provider: str


@dataclasses.dataclass(frozen=True)
class Preloaded:
    """What :func:`preload` wrote: the uuids of live (ACTIVE) and past (DELETED) ones."""

    live: list[str]
    past: list[str]
    seconds: float


class _Any(dict[str, Any]):
    """The reply of a script only queued: every field empty."""

    def __missing__(self, key: str) -> str:
        return ""


class _Queued(RedisStore):
    """A store whose scripts go into one pipeline instead of running one by one."""

    def __init__(self, store: RedisStore) -> None:
        super().__init__(store.client.pipeline(transaction=False), store.keys.cell,
                         store.max_events)  # fmt: skip

    def run(self, name: str, key: str, *args: Any) -> dict[str, Any]:
        self.script(name)(keys=[key], args=[self.keys.prefix, *args], client=self.client)
        return _Any()

    def send(self) -> None:
        """Run what was queued; raise the first failure a script answered."""
        for raw in self.client.execute():  # type: ignore[attr-defined]  # a pipeline
            reply = json.loads(raw)
            code = reply.pop("error", None)
            if code is not None:
                raise SCRIPT_ERRORS[code](**reply)


def _store(stores: Stores) -> RedisStore:
    backend = stores.backend
    if not isinstance(backend, RedisBackend):
        raise exception.Invalid(reason="a bulk load needs the Redis ledger")
    return backend.store


def preload(
    stores: Stores,
    nodes: Sequence[Node],
    flavor: dict[str, Any],
    live: int,
    past: int,
    project_id: str = "bench-preload",
    user_id: str = "bench",
    chunk: int = 500,
    progress: Callable[[int, int], None] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Preloaded:
    """Write ``live`` ACTIVE instances of ``flavor`` (name, vcpus, ram_mb, disk_gb),
    spread round robin over ``nodes`` with their allocations, then ``past`` ones placed
    and DELETED (their allocations and quota returned, their history kept), in project
    ``project_id``, whose quota it lifts. ``extra``: the boot details each record keeps
    (a booted server's, for records of its size), with the flavor's scheduling class.

    :raises Invalid: no nodes, or not the Redis ledger.
    :raises CapacityExceeded: the nodes are full; what was written before stays.
    """
    if not nodes:
        raise exception.Invalid(reason="a preload needs nodes to place instances on")
    store, began = _store(stores), time.perf_counter()
    stores.quota.set_limits(project_id, instances=-1, cores=-1, ram_mb=-1)  # its own project
    todo = [True] * live + [False] * past
    quota = stores.instances.quota  # type: ignore[attr-defined]
    template = {"scheduling_class": flavor["name"], **dict(extra or {})}

    def load(start: int) -> list[tuple[bool, str]]:
        queued = _Queued(store)
        instances, ledger = RedisInstances(queued, quota), RedisLedger(queued)
        made = [(alive, _one(instances, ledger, nodes[n % len(nodes)], flavor, template,
                             project_id, user_id, alive))
                for n, alive in enumerate(todo[start : start + chunk], start)]  # fmt: skip
        queued.send()
        return made

    written: dict[bool, list[str]] = {True: [], False: []}
    # two pipelines in flight: one is built while the server runs the other
    with ThreadPoolExecutor(2, thread_name_prefix="preload") as pool:
        for done, made in enumerate(pool.map(load, range(0, len(todo), chunk)), 1):
            for alive, uuid_ in made:
                written[alive].append(uuid_)
            if progress is not None:
                progress(min(done * chunk, len(todo)), len(todo))
    return Preloaded(written[True], written[False], round(time.perf_counter() - began, 2))


def _one(
    instances: RedisInstances,
    ledger: RedisLedger,
    node: Node,
    flavor: dict[str, Any],
    extra: dict[str, Any],
    project_id: str,
    user_id: str,
    alive: bool,
) -> str:
    """Queue the scripts of one instance's life: created, claimed, ACTIVE (and DELETED)."""
    uuid_ = str(uuid.uuid4())
    record = Instance(uuid_, project_id, user_id, f"preload-{uuid_[:8]}", flavor, State.BUILD,
                      extra=extra)  # fmt: skip
    instances.create(record, deadline=time.time() + 3600)
    demand = {"VCPU": flavor["vcpus"], "MEMORY_MB": flavor["ram_mb"], "DISK_GB": flavor["disk_gb"]}
    ledger.claim(uuid_, {node.provider: {k: v for k, v in demand.items() if v}}, node.host,
                 node.node)  # fmt: skip
    instances.set_active(uuid_, node.host, node.node)
    if not alive:
        instances._end(uuid_, "DELETED", "")
    return uuid_


def used_memory(stores: Stores) -> int | None:
    """The server's ``used_memory`` (bytes, all databases); None on the embedded ledger."""
    store = _store(stores)
    if qembedded.is_embedded(store.client):
        return None
    return int(store.client.info("memory")["used_memory"])


def used_memory_at(url: str) -> int | None:
    """:func:`used_memory` of the Redis at ``url`` (None for an embedded one)."""
    if qembedded.is_embedded_url(url):
        return None
    client = connect(url)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


def record_memory(
    stores: Stores, instances: Sequence[str], providers: Sequence[str]
) -> dict[str, Any] | None:
    """``MEMORY USAGE`` (exact: ``SAMPLES 0``) of the keys of these instances and
    providers, per kind and per item (bytes), and of the cell's indexes in all;
    None on the embedded ledger. One command per key, pipelined: sample, not the cell."""
    store = _store(stores)
    if qembedded.is_embedded(store.client):
        return None
    keys = store.keys
    kinds: dict[str, tuple[Callable[[str], str], Sequence[str]]] = {
        "instance record": (keys.instance, instances),
        "instance history": (keys.instance_events, instances),
        "allocations (consumer)": (keys.consumer, instances),
        "provider": (keys.provider, providers),
        "provider consumers": (keys.provider_consumers, providers),
        "provider traits": (keys.provider_traits, providers),
    }
    found: dict[str, Any] = {}
    for kind, (key_of, items) in kinds.items():
        sizes = _usage(store, [key_of(i) for i in items])
        present = [s for s in sizes if s is not None]
        found[kind] = {
            "items": len(items),
            "keys": len(present),
            "bytes_per_item": round(sum(present) / len(items), 1) if items else None,
        }
    indexes = {"live-instances": keys.live_instances, "deleted-instances": keys.deleted_instances,
               "providers (rps)": keys.providers, "provider names": keys.provider_names,
               "hypervisors": keys.hypervisors}  # fmt: skip
    found["indexes_bytes"] = {
        name: size for name, size in zip(indexes, _usage(store, list(indexes.values())),
                                         strict=True)
    }  # fmt: skip
    return found


def _usage(store: RedisStore, keys: Sequence[str], chunk: int = 1000) -> list[int | None]:
    sizes: list[int | None] = []
    for start in range(0, len(keys), chunk):
        pipe = store.client.pipeline(transaction=False)
        for key in keys[start : start + chunk]:
            pipe.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")
        sizes += [None if s is None else int(text(s)) for s in pipe.execute()]
    return sizes
