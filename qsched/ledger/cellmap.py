"""RedisCellMap: the records of several cells behind one API (:mod:`qsched.cells`).

In the API keyspace: the instance mappings (``inst-map:<uuid>``, JSON ``[cell,
project]``) and the boots pending (``inst-map-pending``). In a cell's keyspace:
``quota-home``, set when the cell joined, and ``quota-ends``, the releases of quota
its scripts indexed for the API keyspace (``release_quota`` in ``lib.lua``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from qsched import exception
from qsched.ledger import Stores
from qsched.ledger.redis import RedisStore, maps_errors, text

#: the value of a cell's ``quota-home`` once the API keyspace holds its quota
API_HOME = "api"


def cell_map(stores: Stores) -> RedisCellMap:
    """The cell records of the keyspace ``stores`` work on.

    :raises Invalid: the stores are not on Redis.
    """
    store = getattr(stores.quota, "store", None)
    if not isinstance(store, RedisStore):
        raise exception.Invalid(reason="several cells need the Redis ledger")
    return RedisCellMap(store)


@maps_errors
class RedisCellMap:
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.keys = store.keys

    # -- a cell --

    def join(self) -> None:
        """Index this cell's releases of quota for the API keyspace from now on."""
        self.store.client.set(self.keys.quota_home, API_HOME)
        self.store.barrier()

    def ends(self, limit: int) -> list[tuple[str, str, str]]:
        """The oldest releases waiting for the API keyspace: (entry, project, holder)."""
        found = []
        for raw in self.store.client.zrange(self.keys.quota_ends, 0, limit - 1):
            entry = text(raw)
            project, holder = json.loads(entry)
            found.append((entry, str(project), str(holder)))
        return found

    def drop_ends(self, entries: Sequence[str]) -> None:
        """Forget releases the API keyspace has applied."""
        if entries:
            self.store.client.zrem(self.keys.quota_ends, *entries)

    def ends_waiting(self) -> int:
        return int(self.store.client.zcard(self.keys.quota_ends))

    # -- the API keyspace --

    def map(self, uuids: Sequence[str], cell: str, project: str) -> None:
        """Map instances to their cell and project and mark them pending, in one step."""
        mapped, now = json.dumps([cell, project]), time.time()
        pipe = self.store.client.pipeline(transaction=True)  # one slot: one MULTI
        for uuid in uuids:
            pipe.set(self.keys.instance_cell(uuid), mapped)
        pipe.zadd(self.keys.mapping_pending, dict.fromkeys(uuids, now))
        pipe.execute()
        self.store.barrier()

    def mapping(self, uuid: str) -> tuple[str, str] | None:
        """The instance's cell and project; None: not mapped."""
        found = self.store.client.get(self.keys.instance_cell(uuid))
        if found is None:
            return None
        cell, project = json.loads(text(found))
        return str(cell), str(project)

    def unmap(self, uuids: Sequence[str]) -> int:
        """Drop the mappings and pending entries of instances no cell holds (never
        created, or archived): one round trip, however many. Returns how many of them
        were mapped (0 for a repeat)."""
        if not uuids:
            return 0
        pipe = self.store.client.pipeline(transaction=True)  # one slot: one MULTI
        pipe.delete(*(self.keys.instance_cell(u) for u in uuids))
        pipe.zrem(self.keys.mapping_pending, *uuids)
        dropped, _pending = pipe.execute()
        return int(dropped)

    def confirm(self, uuids: Sequence[str]) -> None:
        """Their cell holds these instances: no longer pending."""
        if uuids:
            self.store.client.zrem(self.keys.mapping_pending, *uuids)

    def pending_before(self, until: float) -> list[str]:
        """Instances pending since before ``until`` (epoch seconds)."""
        found = self.store.client.zrangebyscore(self.keys.mapping_pending, 0, until)
        return [text(u) for u in found]

    def pending_count(self) -> int:
        return int(self.store.client.zcard(self.keys.mapping_pending))
