"""RedisInspector: a cell's records read by scanning its keys (admin views only).

A scan walks the keys of one builder of :class:`~qsched.ledger.keys.Keyspace`
with ``SCAN MATCH`` (a thousand per step), then reads what it found pipelined
a thousand at a time (:func:`~qsched.ledger.redis.read_many`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from qsched.ledger import cluster
from qsched.ledger.base import Inspector
from qsched.ledger.errors import maps_errors
from qsched.ledger.records import Consumer, Usage
from qsched.ledger.redis import RedisStore, glob_escape, read_many, text, text_map

_PART = "\0"  # stands for the variable part of a key while its pattern is built


@maps_errors
class RedisInspector(Inspector):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.keys = store.keys

    def instance_records(
        self, uuids: Sequence[str] | None = None, fields: Sequence[str] = ()
    ) -> dict[str, dict[str, str]]:
        wanted = list(uuids) if uuids is not None else sorted(self._parts(self.keys.instance))
        keys = [self.keys.instance(u) for u in wanted]
        if fields:
            replies = read_many(self.store.client, "hmget", keys, *fields)
            found = [{f: text(v) for f, v in zip(fields, r, strict=True) if v is not None}
                     for r in replies]  # fmt: skip
        else:
            found = [text_map(r) for r in read_many(self.store.client, "hgetall", keys)]
        return {u: record for u, record in zip(wanted, found, strict=True) if record}

    def histories(self, uuids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        keys = [self.keys.instance_events(u) for u in uuids]
        replies = read_many(self.store.client, "lrange", keys, 0, -1)
        return {u: [json.loads(e) for e in raw] for u, raw in zip(uuids, replies, strict=True)}

    def events_trimmed(self, uuid: str) -> int:
        return int(self.store.client.hget(self.keys.instance(uuid), "events_trimmed") or 0)

    def deadline_index(self) -> list[str]:
        return [text(u) for u in self.store.client.zrange(self.keys.deadlines, 0, -1)]

    def waiting_count(self) -> int:
        return int(self.store.client.zcard(self.keys.deadlines))

    def consumers(self) -> dict[str, Consumer]:
        found = self._hashes(self.keys.consumer)
        return {u: _consumer(u, fields) for u, fields in found.items() if fields.get("allocs")}

    def project_usages(self) -> dict[str, dict[str, int]]:
        found = self._hashes(self.keys.project_usage)
        return {p: {rc: int(n) for rc, n in raw.items() if int(n)} for p, raw in found.items()}

    def quota_used(self) -> dict[str, dict[str, int]]:
        found = self._hashes(self.keys.quota_used)
        return {p: {k: int(v) for k, v in raw.items()} for p, raw in found.items()}

    def quota_held(self) -> dict[str, dict[str, Usage]]:
        found = self._hashes(self.keys.quota_held)
        return {p: {h: _held(v) for h, v in raw.items()} for p, raw in found.items()}

    def provider_uuid(self, name: str) -> str | None:
        raw = self.store.client.hget(self.keys.provider_names, name)
        return None if raw is None else text(raw)

    def provider_count(self) -> int:
        return int(self.store.client.scard(self.keys.providers))

    def _hashes(self, build: Callable[[str], str]) -> dict[str, dict[str, str]]:
        """Every hash ``build(part)`` of the cell, by part, read in bulk."""
        parts = sorted(self._parts(build))
        replies = read_many(self.store.client, "hgetall", [build(p) for p in parts])
        return {p: text_map(raw) for p, raw in zip(parts, replies, strict=True)}

    def _parts(self, build: Callable[[str], str]) -> set[str]:
        """The ``part`` of every key ``build(part)`` of the cell, parts with no ':' in them
        (so that ``instance`` does not find the instances' history keys)."""
        head, tail = build(_PART).split(_PART)
        pattern = f"{glob_escape(head)}*{glob_escape(tail)}"
        found = set()
        for key in cluster.scan_cell(self.store.client, self.keys.prefix, pattern, 1000):
            part = text(key)[len(head) : len(text(key)) - len(tail)]
            if part and ":" not in part:
                found.add(part)
        return found


def _consumer(uuid: str, fields: dict[str, str]) -> Consumer:
    generation = fields.get("generation")
    allocations = json.loads(fields["allocs"])
    return Consumer(uuid, int(generation) if generation else None, fields.get("project"),
                    fields.get("user"), allocations)  # fmt: skip


def _held(value: str) -> Usage:
    """``"cores ram_mb"``, what one holder reserved, as the Usage of one instance."""
    cores, ram_mb = value.split()
    return Usage(1, int(cores), int(ram_mb))
