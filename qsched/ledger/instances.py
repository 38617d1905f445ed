"""RedisInstances: instance records, their history, and the deadline index."""

from __future__ import annotations

import dataclasses
import json
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.ledger.agents import class_json
from qsched.ledger.base import (
    Event,
    HostRule,
    Instance,
    InstanceStore,
    MapChange,
    Placement,
    State,
    TaskState,
    Usage,
)
from qsched.ledger.errors import maps_errors
from qsched.ledger.quota import RedisQuota
from qsched.ledger.redis import RedisStore, canonical_json, read_many, text, text_map
from qsched.resources import check_uuid

#: How long a mark left by abandon keeps a late create out. A create can only arrive
#: late by waiting in a stalled server's buffers, which a day outlasts by far.
ABANDON_MARK_S = 86400
_OUTBOX_BATCH = 1000  # outbox entries cleared per script
BATCH_KEPT_S = 86400  # a batch's record outlives its deadline by this much
#: Deleted servers a changes-since list of the whole cell reads, newest first: the cell's
#: index holds every DELETED instance not archived yet (archive-deleted empties it).
DELETED_LISTED = 100_000


@maps_errors
class RedisInstances(InstanceStore):
    def __init__(self, store: RedisStore, quota: RedisQuota, group_members: int = -1) -> None:
        self.store = store
        self.keys = store.keys
        self.quota = quota
        self.group_members = group_members  # [quota] server_group_members (-1: no limit)

    def create(
        self,
        instance: Instance,
        deadline: float,
        expect_flavor: tuple[str, str] | None = None,
        scheduling_class: tuple[str, Mapping[str, Any]] | None = None,
        members_limit: int | None = None,
    ) -> Instance:
        uuid = check_uuid(instance.uuid, "Instance UUID")
        flavor, extra = dict(instance.flavor), dict(instance.extra)
        record = _record(instance, scheduling_class)
        now, deadline = self.store.now(), float(deadline)
        quota = Usage(1, int(flavor["vcpus"]), int(flavor["ram_mb"]))
        result = self.store.run(
            "instance_create",
            self.keys.instance(uuid),
            uuid,
            instance.project_id,
            canonical_json(record),
            quota.cores,
            quota.ram_mb,
            *self.quota.default_args(),
            repr(deadline),
            now,
            self.store.max_events,
            *(expect_flavor or ("", "")),
            *_class_args(scheduling_class),
            instance.group or "",
            *self._members_args(members_limit),
        )
        # what the script wrote, as get() would read it back
        return Instance(
            uuid, instance.project_id, instance.user_id, instance.name, flavor, State.BUILD,
            TaskState.SCHEDULING, created_at=now, updated_at=now, deadline=deadline,
            quota=quota, tried_hosts=tuple(instance.tried_hosts), extra=extra,
            group=instance.group or None, outbox=result["outbox"],
        )  # fmt: skip

    def _members_args(self, members_limit: int | None) -> tuple[int, str]:
        """The member limit's script arguments: the default, and whether it is final."""
        if members_limit is None:
            return self.group_members, ""
        return int(members_limit), "1"

    def create_batch(
        self,
        instances: Sequence[Instance],
        min_count: int,
        reservation_id: str,
        deadline: float,
        expect_flavor: tuple[str, str] | None = None,
        scheduling_class: tuple[str, Mapping[str, Any]] | None = None,
        lone_name: str | None = None,
        members_limit: int | None = None,
    ) -> list[Instance]:
        first = instances[0]
        records = [_record(instance, scheduling_class) for instance in instances]
        now, deadline = self.store.now(), float(deadline)
        flavor = dict(first.flavor)
        quota = Usage(1, int(flavor["vcpus"]), int(flavor["ram_mb"]))
        limit, final = self._members_args(members_limit)
        result = self.store.run(
            "instance_create_batch", self.keys.batch(reservation_id), reservation_id,
            first.project_id, canonical_json(records), quota.cores, quota.ram_mb,
            *self.quota.default_args(), repr(deadline), now, self.store.max_events,
            *(expect_flavor or ("", "")), *_class_args(scheduling_class), first.group or "",
            limit, int(min_count), lone_name or first.name,
            int(max(1.0, deadline - now) + BATCH_KEPT_S), final,
        )  # fmt: skip
        count, outboxes = int(result["count"]), list(result["outboxes"])
        lone = count == 1
        return [
            dataclasses.replace(
                instance, name=(lone_name or instance.name) if lone else instance.name,
                state=State.BUILD, task_state=TaskState.SCHEDULING, created_at=now,
                updated_at=now, deadline=deadline, quota=quota,
                batch=None if lone else reservation_id, outbox=outbox,
            )
            for instance, outbox in zip(instances[:count], outboxes, strict=True)
        ]  # fmt: skip

    def batches(self, reservation_ids: Sequence[str]) -> dict[str, str]:
        keys = [self.keys.batch(r) for r in reservation_ids]
        states = read_many(self.store.client, "hget", keys, "state")
        return {r: text(s) for r, s in zip(reservation_ids, states, strict=True) if s}

    def get(self, uuid: str) -> Instance:
        fields = text_map(self.store.client.hgetall(self.keys.instance(uuid)))
        if not fields:
            raise exception.InstanceNotFound(instance=uuid)
        return _instance(fields)

    def get_many(self, uuids: Sequence[str]) -> dict[str, Instance]:
        keys = [self.keys.instance(u) for u in uuids]
        replies = read_many(self.store.client, "hgetall", keys)
        return {u: _instance(text_map(f)) for u, f in zip(uuids, replies, strict=True) if f}

    def placements(self, uuids: Sequence[str]) -> dict[str, Placement]:
        keys = [self.keys.instance(u) for u in uuids]
        fields = ("state", "host", "node", "task_state", "move_from", "move_from_node",
                  "move_host", "move_node")  # fmt: skip
        replies = read_many(self.store.client, "hmget", keys, *fields)
        return {uuid: _placement(*found) for uuid, found in zip(uuids, replies, strict=True)
                if found[0] is not None}  # fmt: skip

    def list_project(self, project_id: str) -> list[Instance]:
        uuids = sorted(text(u) for u in self.store.client.smembers(
            self.keys.project_instances(project_id)))  # fmt: skip
        return list(self.get_many(uuids).values())

    def newest(self, count: int, after: str | None = None) -> list[str] | None:
        key, start = self.keys.live_instances, 0
        if after is not None:
            rank = self.store.client.zrevrank(key, after)
            if rank is None:
                return None
            start = int(rank) + 1  # type: ignore[arg-type]
        if count <= 0:
            return []
        return [text(u) for u in self.store.client.zrevrange(key, start, start + count - 1)]

    def deleted_since(self, since: float, project_id: str | None = None) -> list[str]:
        key = self.keys.deleted_instances if project_id is None else self.keys.project_deleted(
            project_id)  # fmt: skip
        found = self.store.client.zrevrangebyscore(
            key, "+inf", float(since), start=0, num=DELETED_LISTED
        )
        return [text(u) for u in found]

    def update(
        self, uuid: str, name: str | None = None, extra: Mapping[str, MapChange] | None = None
    ) -> Instance:
        uuid = check_uuid(uuid, "Instance UUID")
        args: list[Any] = ["" if name is None else "1", name or ""]
        for key, change in (extra or {}).items():
            args += _map_args(key, change)
        self.store.run("instance_update", self.keys.instance(uuid), uuid, self.store.now(), *args)
        return self.get(uuid)

    def add_event(
        self,
        uuid: str,
        event: str,
        host: str | None = None,
        node: str | None = None,
        **detail: Any,
    ) -> None:
        entry: dict[str, Any] = {"t": self.store.now(), "event": event, "detail": detail}
        if host:
            entry["host"] = host
        if node:
            entry["node"] = node
        self.store.run("instance_event", self.keys.instance(uuid), uuid, json.dumps(entry),
                       self.store.max_events)  # fmt: skip

    def events(self, uuid: str) -> list[Event]:
        raw = self.store.client.lrange(self.keys.instance_events(uuid), 0, -1)
        return [_event(json.loads(item)) for item in raw]

    def set_active(self, uuid: str, host: str, node: str) -> bool:
        return not self._run("instance_active", uuid, host, node).get("already")

    def requeue(
        self,
        uuid: str,
        host: str | None,
        reason: str,
        claimed_only: bool = False,
        take_over: bool = False,
    ) -> Instance:
        result = self._run(
            "instance_requeue", uuid, host or "", reason, "1" if claimed_only else "",
            _held(take_over),
        )  # fmt: skip
        return dataclasses.replace(self.get(uuid), outbox=result.get("outbox"))

    def park(self, uuid: str, host: str, reason: str) -> bool:
        return bool(self._run("instance_park", uuid, host, reason)["parked"])

    def set_error(
        self, uuid: str, message: str, details: Mapping[str, Any], due_only: bool = False
    ) -> bool:
        fault = self._fault(message, details)
        result = self._end(uuid, "ERROR", fault, "due" if due_only else "")
        return bool(result["changed"])

    def set_lost(
        self, uuid: str, host: str, node: str, message: str, details: Mapping[str, Any]
    ) -> bool:
        where = canonical_json({"host": host, "node": node})
        return bool(self._end(uuid, "ERROR", self._fault(message, details), where)["changed"])

    def _fault(self, message: str, details: Mapping[str, Any]) -> str:
        return canonical_json({"code": 500, "message": message, "details": dict(details),
                               "created": self.store.now()})  # fmt: skip

    def delete(
        self, uuid: str, destroyed_on: str | None = None, take_over: bool = False
    ) -> Instance:
        self._end(uuid, "DELETED", "", "", destroyed_on or "", _held(take_over))
        return self.get(uuid)

    def mark_deleting(self, uuid: str) -> Instance:
        self._run("instance_deleting", uuid)
        return self.get(uuid)

    def start_action(
        self,
        uuid: str,
        action: str,
        request_id: str,
        user_id: str,
        project_id: str,
        extra: Mapping[str, Any] | None = None,
        name: str | None = None,
        scheduling_class: tuple[str, Mapping[str, Any]] | None = None,
    ) -> tuple[str, str]:
        items = [json.dumps(part) for item in (extra or {}).items() for part in item]
        class_name, definition = scheduling_class or ("", None)
        result = self._run(
            "instance_action", uuid, action, request_id, user_id, project_id, json.dumps(items),
            name or "", class_name, class_json(definition) if definition is not None else "",
        )  # fmt: skip
        refused = result.get("refused")
        if refused == "not_ready":
            raise exception.InstanceNotReady(instance=uuid)
        if refused is not None:
            name = "shelveOffload" if action == "shelve_offload" else action.partition("_")[0]
            raise exception.InstanceInvalidState(
                action=name, instance=uuid, attr=refused, state=result["state"] or None
            )
        return str(result["host"]), str(result["node"])

    def step_action(
        self,
        uuid: str,
        host: str,
        expect: TaskState,
        to: TaskState,
        power: str = "",
        event: str = "",
        shelved: bool | None = None,
        **detail: Any,
    ) -> bool:
        mark = "" if shelved is None else ("1" if shelved else "0")
        result = self._run("instance_action_step", uuid, host, expect.value, to.value, power,
                           event, json.dumps(detail), mark)  # fmt: skip
        return not result["moved"]

    def offload(self, uuid: str, host: str, event: str, **detail: Any) -> bool:
        result = self._run("instance_offload", uuid, host, event, json.dumps(detail))
        return not result["moved"]

    def shelved_on(self, host: str, before: float) -> list[str]:
        found = self.store.client.zrangebyscore(self.keys.host_shelved(host), "-inf", before)
        return [text(u) for u in found]

    def acting(self, host: str, started_before: float | None = None) -> list[str]:
        until = "+inf" if started_before is None else started_before
        found = self.store.client.zrangebyscore(self.keys.host_actions(host), "-inf", until)
        return [text(u) for u in found]

    def forget_action(self, host: str, uuid: str) -> bool:
        return bool(self._run("instance_action_forget", uuid, host)["forgotten"])

    def deleting(self, host: str, marked_before: float | None = None) -> list[str]:
        until = "+inf" if marked_before is None else marked_before
        found = self.store.client.zrangebyscore(self.keys.host_deleting(host), "-inf", until)
        return [text(u) for u in found]

    def building(self, host: str) -> set[str]:
        return {text(u) for u in self.store.client.smembers(self.keys.host_building(host))}

    def expired(self, now: float, limit: int = 100) -> list[str]:
        found = self.store.client.zrangebyscore(self.keys.deadlines, "-inf", now, 0, limit)
        return [text(u) for u in found]

    def forget_deadline(self, uuid: str) -> None:
        self.store.client.zrem(self.keys.deadlines, uuid)

    def abandon(self, uuid: str, reason: str) -> tuple[State | None, str | None]:
        uuid = check_uuid(uuid, "Instance UUID")
        result = self._run("instance_abandon", uuid, reason, ABANDON_MARK_S)
        state = result["state"]
        return (None if state == "absent" else State(state)), (result.get("host") or None)

    def outbox_take(self, grace_s: float, limit: int = 100) -> list[tuple[str, str]]:
        result = self.store.run("outbox_take", self.keys.outbox, repr(float(grace_s)), limit)
        taken = result["taken"] or []  # cjson writes an empty table as {}
        return [(str(entry[0]), str(entry[1])) for entry in taken]

    def outbox_done(self, entries: Sequence[tuple[str, str | None]]) -> int:
        pairs = [item for uuid, outbox in entries if outbox is not None for item in (uuid, outbox)]
        cleared = 0
        for start in range(0, len(pairs), 2 * _OUTBOX_BATCH):  # short scripts, after an outage too
            chunk = pairs[start : start + 2 * _OUTBOX_BATCH]
            cleared += int(self.store.run("outbox_done", self.keys.outbox, *chunk)["cleared"])
        return cleared

    def unpublished(self, limit: int = 100) -> list[tuple[str, float]]:
        oldest: list[Any] = self.store.client.zrange(
            self.keys.outbox, 0, limit - 1, withscores=True
        )
        now = self.store.server_time()
        return [(text(uuid), max(0.0, now - float(score))) for uuid, score in oldest]

    def _end(
        self, uuid: str, state: str, fault: str, condition: str = "", destroyed_on: str = "",
        held: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """Run ``instance_end.lua`` (its arguments are named there)."""
        return self._run("instance_end", uuid, state, fault, condition, destroyed_on, held)

    def _run(self, script: str, uuid: str, *args: Any) -> dict[str, Any]:
        return self.store.run(
            script, self.keys.instance(uuid), uuid, *args, self.store.now(), self.store.max_events
        )


def _held(take_over: bool) -> str:
    """The consumer a take-over holds the claim under (a new UUID), or "" (none)."""
    return str(uuidlib.uuid4()) if take_over else ""


def _record(
    instance: Instance, scheduling_class: tuple[str, Mapping[str, Any]] | None = None
) -> dict[str, str]:
    """The fields a create script writes for ``instance`` besides its state and times;
    ``class``, the name of its scheduling class, is what a claim must be placed for."""
    record = {
        "uuid": check_uuid(instance.uuid, "Instance UUID"),
        "project_id": instance.project_id,
        "user_id": instance.user_id,
        "name": instance.name,
        "flavor": canonical_json(dict(instance.flavor)),
        "extra": canonical_json(dict(instance.extra)),
    }
    if instance.tried_hosts:
        record["tried_hosts"] = canonical_json(list(instance.tried_hosts))
    if instance.group:
        record["group"] = check_uuid(instance.group, "Server group UUID")
    if instance.hosts:
        record["hosts"] = canonical_json(instance.hosts.to_dict())
    if scheduling_class is not None:
        record["class"] = scheduling_class[0]
    return record


def _map_args(key: str, change: MapChange) -> list[Any]:
    """The arguments of ``instance_update`` for one map: keys and values as JSON text,
    spelled as :func:`_record` spells the record's (canonical JSON)."""
    items = [canonical_json(part) for item in change.items.items() for part in item]
    return [
        canonical_json(key), "1" if change.replace else "", int(change.limit),
        len(change.items), len(change.removed), *items,
        *(canonical_json(removed) for removed in change.removed),
    ]  # fmt: skip


def _class_args(scheduling_class: tuple[str, Mapping[str, Any]] | None) -> tuple[str, str]:
    """A class name and its definition as the ``classes`` hash stores them ("" "": none)."""
    if scheduling_class is None:
        return "", ""
    name, definition = scheduling_class
    return name, class_json(definition)


def _instance(fields: dict[str, str]) -> Instance:
    quota = None
    if fields.get("quota"):
        cores, ram_mb = fields["quota"].split()
        quota = Usage(1, int(cores), int(ram_mb))
    return Instance(
        uuid=fields["uuid"],
        project_id=fields["project_id"],
        user_id=fields["user_id"],
        name=fields["name"],
        flavor=json.loads(fields["flavor"]),
        state=State(fields["state"]),
        task_state=TaskState(fields.get("task_state", "")),
        host=fields.get("host") or None,
        node=fields.get("node") or None,
        fault=json.loads(fields["fault"]) if fields.get("fault") else None,
        attempts=int(fields.get("attempts", 0)),
        tried_hosts=tuple(json.loads(fields.get("tried_hosts") or "[]")),
        handbacks=int(fields.get("handbacks", 0)),
        created_at=float(fields.get("created_at", 0)),
        updated_at=float(fields.get("updated_at", 0)),
        deadline=float(fields["deadline"]) if fields.get("deadline") else None,
        launched_at=float(fields["launched_at"]) if fields.get("launched_at") else None,
        quota=quota,
        extra=json.loads(fields.get("extra") or "{}"),
        group=fields.get("group") or None,
        hosts=HostRule.from_dict(json.loads(fields["hosts"])) if fields.get("hosts") else None,
        batch=fields.get("batch") or None,
        stopped=fields.get("power") == "off",
        migration=fields.get("migration") or None,
        resized=fields.get("resized") == "1",
        shelved=bool(fields.get("shelved")),
        offloaded=fields.get("shelved") == "offloaded",
    )


def _placement(state: Any, host: Any, node: Any, task_state: Any, *moving: Any) -> Placement:
    """A placement from its HMGET reply; ``moving``: the move's source host and node,
    then its destination's (absent: none)."""
    ends = tuple((text(moving[i]), text(moving[i + 1] or b""))
                 for i in range(0, len(moving), 2) if moving[i])  # fmt: skip
    task = TaskState(text(task_state or b""))
    return Placement(State(text(state)), text(host) if host else None,
                     text(node) if node else None, task, ends)  # fmt: skip


def _event(entry: dict[str, Any]) -> Event:
    detail = entry.get("detail") or {}
    return Event(
        time=float(entry["t"]),
        event=entry["event"],
        host=entry.get("host"),
        node=entry.get("node"),
        detail=detail if isinstance(detail, dict) else {},
    )
