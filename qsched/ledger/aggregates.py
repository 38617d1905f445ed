"""Host aggregates in the ledger, mirrored into their hosts' root providers.

Each change is one script (``aggregate_*.lua``), checked before it writes. Adding
or removing a host is two steps: the membership (``aggregate_host``), then the
mirroring into the host's root providers (``provider_mirror``, in batches, each
changed provider's generation bumped). An agent registering meanwhile merges the
host's aggregates into its providers itself (``provider_register``), so the two
steps never lose a change.
"""

from __future__ import annotations

import builtins
import json
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from qsched import aggregates as agg
from qsched import exception
from qsched.aggregates import Aggregate, check_metadata
from qsched.ledger.base import AggregateStore
from qsched.ledger.errors import maps_errors
from qsched.ledger.redis import RedisStore, canonical_json, text, text_map

MIRROR_BATCH = 500  # providers per mirroring script, as registration batches them


@maps_errors
class RedisAggregates(AggregateStore):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.keys = store.keys

    def create(
        self,
        name: str,
        availability_zone: str | None = None,
        aggregate_id: int | None = None,
        uuid: str | None = None,
    ) -> Aggregate:
        made = self._run(
            "aggregate_create", uuid or str(uuidlib.uuid4()), name, availability_zone or "",
            self.store.now(), "" if aggregate_id is None else int(aggregate_id),
        )  # fmt: skip
        return self.get(int(made["id"]))

    def put(self, aggregate: Aggregate) -> bool:
        try:
            made = self._run(
                "aggregate_create", aggregate.uuid, aggregate.name, "", aggregate.created_at,
                int(aggregate.id), canonical_json(dict(aggregate.metadata)),
            )  # fmt: skip
        except exception.Conflict as taken:  # its id or name: by this very aggregate?
            try:
                there = self.get(aggregate.id)
            except agg.AggregateNotFound:
                raise taken from None  # its name is another aggregate's
            self._same(there, aggregate)
            return False
        if made.get("existed"):  # its id and uuid are here: the same name and metadata?
            self._same(self.get(aggregate.id), aggregate)
            return False
        return True

    @staticmethod
    def _same(there: Aggregate, wanted: Aggregate) -> None:
        if _shape(there) != _shape(wanted):
            raise exception.Conflict(
                reason=f"aggregate {wanted.id} is {_shape(there)} here, not {_shape(wanted)}"
            )

    def last_id(self) -> int:
        return int(self.store.client.hget(self.keys.aggregate_ids, "seq") or 0)

    def get(self, aggregate_id: int) -> Aggregate:
        uuid = self.store.client.hget(self.keys.aggregate_ids, str(aggregate_id))
        found = self._read([text(uuid)] if uuid is not None else [])
        if not found:
            raise agg.AggregateNotFound(aggregate_id=aggregate_id)
        return found[0]

    def list(self) -> builtins.list[Aggregate]:
        ids = text_map(self.store.client.hgetall(self.keys.aggregate_ids))
        uuids = [uuid for field, uuid in ids.items() if field != "seq"]
        return sorted(self._read(uuids), key=lambda a: a.id)

    def update(self, aggregate_id: int, changes: Mapping[str, str | None]) -> Aggregate:
        name = changes.get("name") or ""
        zone = {agg.ZONE_KEY: changes[agg.ZONE_KEY]} if agg.ZONE_KEY in changes else {}
        self._update(aggregate_id, name, zone, "update aggregate")
        return self.get(aggregate_id)

    def delete(self, aggregate_id: int) -> None:
        self._run("aggregate_delete", str(aggregate_id))

    def set_metadata(self, aggregate_id: int, changes: Mapping[str, str | None]) -> Aggregate:
        checked = check_metadata(changes)
        self._update(aggregate_id, "", checked, "update metadata of aggregate")
        return self.get(aggregate_id)

    def add_host(self, aggregate_id: int, host: str) -> Aggregate:
        return self._host(aggregate_id, host, "add")

    def remove_host(self, aggregate_id: int, host: str) -> Aggregate:
        return self._host(aggregate_id, host, "remove")

    def version(self) -> int:
        return int(self.store.client.get(self.keys.aggregates_version) or 0)

    def host_aggregates(self, host: str) -> set[str]:
        return {text(u) for u in self.store.client.smembers(self.keys.host_aggregates(host))}

    # -- steps --

    def _update(
        self, aggregate_id: int, name: str, changes: Mapping[str, str | None], action: str
    ) -> None:
        self._run(
            "aggregate_update", str(aggregate_id), name, json.dumps(changes, sort_keys=True),
            action, self.store.now(),
        )  # fmt: skip

    def _host(self, aggregate_id: int, host: str, op: str) -> Aggregate:
        done = self._run("aggregate_host", str(aggregate_id), host, op, self.store.now())
        self._mirror(str(done["uuid"]), host, op)
        return self.get(aggregate_id)

    def _mirror(self, aggregate_uuid: str, host: str, op: str) -> None:
        """Every root provider of ``host`` gains or loses the aggregate, a batch at a time."""
        batch: list[str] = []
        for rp in self.store.client.sscan_iter(self.keys.host_roots(host), count=MIRROR_BATCH):
            batch.append(text(rp))
            if len(batch) >= MIRROR_BATCH:
                self._mirror_batch(aggregate_uuid, op, batch)
                batch = []
        if batch:
            self._mirror_batch(aggregate_uuid, op, batch)

    def _mirror_batch(self, aggregate_uuid: str, op: str, providers: builtins.list[str]) -> None:
        self.store.run(
            "provider_mirror", self.keys.providers, aggregate_uuid, op,
            canonical_json(sorted(providers)),
        )  # fmt: skip

    def _run(self, script: str, *args: Any) -> dict[str, Any]:
        return self.store.run(script, self.keys.aggregate_ids, *args)

    def _read(self, uuids: builtins.list[str]) -> builtins.list[Aggregate]:
        pipe = self.store.client.pipeline(transaction=False)
        for uuid in uuids:
            pipe.hgetall(self.keys.aggregate(uuid))
            pipe.smembers(self.keys.aggregate_hosts(uuid))
        raw = pipe.execute()
        found = []
        for fields_raw, hosts in zip(raw[::2], raw[1::2], strict=True):
            fields = text_map(fields_raw)
            if not fields:
                continue  # deleted between the two reads
            found.append(
                Aggregate(
                    id=int(fields["id"]),
                    uuid=fields["uuid"],
                    name=fields["name"],
                    # an empty map may come back as [] (Lua has one empty table)
                    metadata=json.loads(fields.get("metadata") or "{}") or {},
                    hosts=frozenset(text(h) for h in hosts),
                    created_at=float(fields["created_at"]),
                    updated_at=float(fields["updated_at"]) if fields.get("updated_at") else None,
                )
            )
        return found


def _shape(aggregate: Aggregate) -> tuple[str, str, dict[str, str]]:
    """What a copy of an aggregate in another keyspace must have alike: uuid, name, metadata."""
    return aggregate.uuid, aggregate.name, dict(aggregate.metadata)
