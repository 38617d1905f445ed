"""RedisCellMap: the records of several cells behind one API (:mod:`qsched.cells`).

In the API keyspace: the instance mappings (``inst-map:<uuid>``, JSON ``[cell,
project]``) and the boots pending (``inst-map-pending``); the host mappings
(``host-map:<host>``: its cell), the node mappings (``node-map:<node>``: the cell of a
compute node, by its name), the last aggregate id (``agg-seq``) and the lock an
aggregate's writer holds (``agg-lock:<id>``); the server group mappings
(``group-map:<uuid>``, the same JSON), the groups pending (``group-map-pending``) and
each project's mapped groups (``project:<project>:groups``, what its ``server_groups``
limit counts there: ``group_map`` checks and writes them in one step). In a cell's keyspace:
``quota-home``, set when the cell joined, and ``quota-ends``, the releases of quota
its scripts indexed for the API keyspace (``release_quota`` in ``lib.lua``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from qsched import exception
from qsched.ledger import Stores, cluster
from qsched.ledger.errors import maps_errors
from qsched.ledger.groups import GroupLimits, RedisGroups
from qsched.ledger.quota import RedisQuota
from qsched.ledger.redis import RedisStore, glob_escape, read_many, text

#: the value of a cell's ``quota-home`` once the API keyspace holds its quota
API_HOME = "api"


def cell_map(stores: Stores) -> RedisCellMap:
    """The cell records of the keyspace ``stores`` work on.

    :raises Invalid: the stores are not on Redis.
    """
    quota = stores.quota
    if not isinstance(quota, RedisQuota):
        raise exception.Invalid(reason="several cells need the Redis ledger")
    groups = stores.groups.limits if isinstance(stores.groups, RedisGroups) else GroupLimits()
    return RedisCellMap(quota.store, groups.server_groups, quota.default_args())


@dataclasses.dataclass(frozen=True)
class GroupAdoption:
    """What :meth:`RedisCellMap.adopt_group` did: ``state`` ``adopted`` (mapped now, or
    would be), ``mapped`` (to that cell and project already) or ``elsewhere`` (mapped to
    ``cell`` and ``project``, not those asked); ``held``: the project's groups counted
    before it, ``limit`` its ``server_groups`` (-1: none)."""

    state: str
    held: int
    limit: int
    cell: str | None = None
    project: str | None = None


@maps_errors
class RedisCellMap:
    """``server_groups``: the ``[quota]`` option, the limit of a project's groups when
    neither the project nor the default class sets one (:meth:`map_group`)."""

    def __init__(
        self,
        store: RedisStore,
        server_groups: int = -1,
        instance_limits: tuple[int, int, int] = (-1, -1, -1),
    ) -> None:
        self.store = store
        self.keys = store.keys
        self.server_groups = server_groups
        #: the default limits of instances, cores and RAM (``[quota]``) a boot is held to
        self.instance_limits = instance_limits

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

    def hold(
        self,
        uuids: Sequence[str],
        cell: str,
        project: str,
        cores: int,
        ram_mb: int,
        min_count: int,
    ) -> list[str]:
        """Reserve the quota of each instance in order and map it to its cell and
        project, pending, in one step, until the limits refuse one (``boot_hold``):
        the uuids held, at least ``min_count``.

        :raises QuotaExceeded: fewer than ``min_count`` fit; nothing is held.
        """
        found = self.store.run("boot_hold", self.keys.quota_used(project), project, cell,
                               cores, ram_mb, min_count, time.time(), *self.instance_limits,
                               *uuids)  # fmt: skip
        return [text(u) for u in found["held"] or []]  # none held: an empty Lua table, {}

    def mapping(self, uuid: str) -> tuple[str, str] | None:
        """The instance's cell and project; None: not mapped."""
        return _pair(self.store.client.get(self.keys.instance_cell(uuid)))

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

    # -- server groups, in the API keyspace --

    def map_group(self, uuid: str, cell: str, project: str) -> None:
        """Map a new group to its cell and count it in its project's ``server_groups``
        limit, pending until :meth:`confirm_groups`: one atomic step.

        :raises ServerGroupLimitExceeded: the project holds its limit of groups in every
            cell together; nothing is written.
        :raises Conflict: the uuid is mapped already.
        """
        self.store.run("group_map", self.keys.group_cell(uuid), uuid, cell, project,
                       self.server_groups, time.time())  # fmt: skip

    def group_mapping(self, uuid: str) -> tuple[str, str] | None:
        """The group's cell and project; None: not mapped."""
        return _pair(self.store.client.get(self.keys.group_cell(uuid)))

    def unmap_group(self, uuid: str, project: str) -> bool:
        """Drop a group's mapping, its count and pending entry (deleted, or never created
        in its cell), in one step. Returns whether it was mapped (False for a repeat)."""
        pipe = self.store.client.pipeline(transaction=True)  # one slot: one MULTI
        pipe.delete(self.keys.group_cell(uuid))
        pipe.srem(self.keys.project_groups(project), uuid)
        pipe.zrem(self.keys.group_mapping_pending, uuid)
        dropped, _counted, _pending = pipe.execute()
        return bool(dropped)

    def confirm_groups(self, uuids: Sequence[str]) -> None:
        """Their cell holds these groups: no longer pending."""
        if uuids:
            self.store.client.zrem(self.keys.group_mapping_pending, *uuids)

    def groups_pending_before(self, until: float) -> list[str]:
        """Groups pending since before ``until`` (epoch seconds)."""
        found = self.store.client.zrangebyscore(self.keys.group_mapping_pending, 0, until)
        return [text(u) for u in found]

    def counted_groups(self, project: str) -> set[str]:
        """The groups the project's ``server_groups`` limit counts (every cell's)."""
        return {text(u) for u in self.store.client.smembers(self.keys.project_groups(project))}

    def group_pending(self, uuid: str) -> bool:
        """Whether the group waits for its cell's confirmation (one read)."""
        return self.store.client.zscore(self.keys.group_mapping_pending, uuid) is not None

    def groups_pending_count(self) -> int:
        return int(self.store.client.zcard(self.keys.group_mapping_pending))

    def group_mappings(self) -> dict[str, tuple[str, str]]:
        """Every group mapping: uuid -> (cell, project) (an admin scan of the keyspace)."""
        head = self.keys.group_cell("")
        keys = [text(k) for k in cluster.scan_cell(self.store.client, self.keys.prefix,
                                                   glob_escape(head) + "*", 1000)]  # fmt: skip
        found: dict[str, tuple[str, str]] = {}
        for key, raw in zip(keys, read_many(self.store.client, "get", keys), strict=True):
            if (pair := _pair(raw)) is not None:  # None: unmapped since the scan
                found[key[len(head) :]] = pair
        return found

    def group_mappings_of(self, uuids: Sequence[str]) -> dict[str, tuple[str, str] | None]:
        """The cell and project of each of these groups (None: not mapped), a thousand a
        round trip."""
        raws = read_many(self.store.client, "get", [self.keys.group_cell(u) for u in uuids])
        return {uuid: _pair(raw) for uuid, raw in zip(uuids, raws, strict=True)}

    def adopt_group(self, uuid: str, cell: str, project: str, write: bool = True) -> GroupAdoption:
        """Map a group its cell made before it was served with others to that cell and
        project, counted in the project's groups and not pending (its cell holds it), in
        one step; a group mapped already is left as it is. Never refused: the project
        may end above its ``server_groups`` limit (``held`` and ``limit`` tell). ``write``
        False: what it would do, nothing written."""
        found = self.store.run("group_adopt", self.keys.group_cell(uuid), uuid, cell, project,
                               self.server_groups, "1" if write else "0")  # fmt: skip
        return GroupAdoption(str(found["state"]), int(found["held"]), int(found["limit"]),
                             found.get("cell"), found.get("project"))  # fmt: skip

    # -- hosts, nodes and aggregates, in the API keyspace --

    def host_cell(self, host: str) -> str | None:
        """The cell a host was found in (Nova's host mapping); None: not mapped yet."""
        found = self.store.client.get(self.keys.host_cell(host))
        return None if found is None else text(found)

    def map_host(self, host: str, cell: str) -> None:
        """Record the cell a host was found in (a repeat or a move overwrites it)."""
        self.store.client.set(self.keys.host_cell(host), cell)

    def node_cell(self, node: str) -> str | None:
        """The cell a compute node (a root provider, by name) was found in; None: not
        mapped yet."""
        found = self.store.client.get(self.keys.node_cell(node))
        return None if found is None else text(found)

    def map_node(self, node: str, cell: str) -> None:
        """Record the cell a node was found in (a repeat or a move overwrites it)."""
        self.store.client.set(self.keys.node_cell(node), cell)

    def host_cells(self, hosts: Sequence[str]) -> dict[str, str | None]:
        """The host mapping of each of these hosts (None: not mapped), a thousand a round
        trip."""
        raws = read_many(self.store.client, "get", [self.keys.host_cell(h) for h in hosts])
        return {h: None if r is None else text(r) for h, r in zip(hosts, raws, strict=True)}

    def map_hosts(self, hosts: Sequence[str], cell: str) -> int:
        """Map to ``cell`` those of ``hosts`` that are not mapped (one the front door maps
        meanwhile keeps its mapping), a thousand a round trip; how many were mapped."""
        mapped = 0
        for start in range(0, len(hosts), 1000):
            pipe = self.store.client.pipeline(transaction=False)
            for host in hosts[start : start + 1000]:
                pipe.set(self.keys.host_cell(host), cell, nx=True)
            mapped += sum(1 for done in pipe.execute() if done)
        return mapped

    def aggregate_seq(self) -> int:
        """The last aggregate id given to every cell (0: none)."""
        return int(self.store.client.get(self.keys.aggregate_seq) or 0)

    def raise_aggregate_seq(self, floor: int) -> tuple[int, int]:
        """Make the last aggregate id given at least ``floor``, giving none, in one step:
        the sequence before and after (the same when it was there already)."""
        found = self.store.run("aggregate_seq", self.keys.aggregate_seq, int(floor), 0)
        return int(found["before"]), int(found["id"])

    def lock_aggregate(self, aggregate_id: int, token: str, ttl_s: float) -> bool:
        """Take aggregate ``aggregate_id``'s lock for ``token`` for ``ttl_s`` at most (its
        holder writes it to the cells: the front door, ``qsched-admin cells adopt``);
        False: another holds it."""
        key = self.keys.aggregate_lock(str(aggregate_id))
        return bool(self.store.client.set(key, token, nx=True, px=max(1, int(ttl_s * 1000))))

    def unlock_aggregate(self, aggregate_id: int, token: str) -> bool:
        """Give back the lock ``token`` holds (one step); False: it had expired, and may
        be another's now, which is left alone."""
        found = self.store.run("aggregate_unlock",
                               self.keys.aggregate_lock(str(aggregate_id)), token)  # fmt: skip
        return bool(found["released"])

    def next_aggregate_id(self, floor: int) -> int:
        """The next aggregate id of the deployment: above every id given here and above
        ``floor`` (the highest any cell gave itself), one atomic step."""
        return int(self.store.run("aggregate_seq", self.keys.aggregate_seq, int(floor))["id"])


def _pair(raw: Any) -> tuple[str, str] | None:
    """An instance's or a group's mapping as stored (JSON ``[cell, project]``); None for
    none."""
    if raw is None:
        return None
    cell, project = json.loads(text(raw))
    return str(cell), str(project)
