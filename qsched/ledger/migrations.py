"""RedisMigrations: moves of placed servers (docs/moves.rst), one script a step."""

from __future__ import annotations

import builtins
import json
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from qsched import exception
from qsched.ledger.agents import class_json
from qsched.ledger.base import Allocations, ClaimGuard
from qsched.ledger.base.migrations import (
    KINDS,
    RESIZE,
    Migration,
    MigrationStore,
    MoveClaim,
    MoveRequest,
)
from qsched.ledger.errors import maps_errors
from qsched.ledger.placement import check_allocations
from qsched.ledger.redis import RedisStore, canonical_json, read_many, text, text_map
from qsched.resources import check_uuid

#: Nova's words for what refuses a move (InstanceInvalidState's ``attr``)
_REFUSED = {"vm_state": "vm_state", "task_state": "task_state"}


@maps_errors
class RedisMigrations(MigrationStore):
    def __init__(self, store: RedisStore, quota_defaults: tuple[int, int, int]) -> None:
        self.store = store
        self.keys = store.keys
        self.quota_defaults = quota_defaults

    def start(self, request: MoveRequest) -> Migration:
        uuid = check_uuid(request.instance_uuid, "Instance UUID")
        mig = check_uuid(request.uuid, "Migration UUID")
        if request.kind not in KINDS:
            raise exception.Invalid(reason=f"a move is one of {', '.join(KINDS)}")
        resize = request.kind == RESIZE
        if resize and request.new_flavor is None:
            raise exception.Invalid(reason="a resize names its new flavor")
        result = self.store.run(
            "move_start", self.keys.instance(uuid), uuid, mig, request.kind,
            canonical_json(dict(request.new_flavor)) if resize and request.new_flavor else "",
            request.new_class or "",
            class_json(request.class_definition) if request.class_definition else "",
            int(request.cores), int(request.ram_mb), *self.quota_defaults,
            request.host or "", "1" if request.same_host else "", request.request_id,
            request.user_id, request.project_id, self.store.now(), self.store.max_events,
            int(request.max_attempts), repr(float(request.deadline)),
            {None: "", True: "1", False: "0"}[request.block_migration],
        )  # fmt: skip
        refused = result.get("refused")
        if refused == "source_up":
            raise exception.ComputeServiceInUse(host=result["state"])
        if refused == "quota_home":
            raise exception.Conflict(
                reason="a resize that changes cores or RAM is not served behind the front "
                "door of several cells yet (the deployment's quota lives in the API "
                "keyspace): migrate the server, or resize to a flavor of the same cores and RAM"
            )
        if refused is not None:
            raise exception.InstanceInvalidState(
                action=request.kind, instance=uuid, attr=_REFUSED[refused],
                state=result["state"] or None,
            )  # fmt: skip
        return self.get(mig)

    def claim(
        self,
        migration_uuid: str,
        allocations: Allocations,
        host: str,
        node: str,
        provider_generations: Mapping[str, int] | None = None,
        guard: ClaimGuard | None = None,
        scheduling_class: str | None = None,
    ) -> MoveClaim:
        clean = check_allocations(allocations)
        if not clean:
            raise exception.Invalid(reason="a claim must allocate something")
        instance = self._instance_of(migration_uuid)
        result = self.store.run(
            "move_claim", self.keys.consumer(instance), migration_uuid, instance,
            canonical_json(clean),
            canonical_json(dict(provider_generations)) if provider_generations else "",
            host, node, self.store.now(), self.store.max_events,
            canonical_json(guard.to_json()) if guard else "", scheduling_class or "",
        )  # fmt: skip
        return MoveClaim(str(result["status"]), bool(result.get("already")))

    def finish(self, migration_uuid: str, host: str) -> str:
        result = self._step("move_finish", migration_uuid, host)
        return str(result["status"])

    def confirm(self, migration_uuid: str, phase: str, host: str = "") -> dict[str, Any]:
        return self._step("move_confirm", migration_uuid, _phase(phase), host)

    def revert(self, migration_uuid: str, phase: str, host: str = "") -> dict[str, Any]:
        return self._step("move_revert", migration_uuid, _phase(phase), host)

    def fail(
        self, migration_uuid: str, host: str, reason: str, retry: bool, take_over: bool = False
    ) -> bool:
        held = str(uuidlib.uuid4()) if take_over else ""
        result = self.store.run(
            "move_fail", self.keys.migration(migration_uuid), migration_uuid, host, reason,
            "1" if retry else "", self.store.now(), self.store.max_events,
            "1" if take_over else "", held,
        )  # fmt: skip
        return bool(result.get("retry"))

    def ask(
        self,
        migration_uuid: str,
        instance_uuid: str,
        asked: str,
        allowed: builtins.list[str],
        action: str,
        request_id: str,
        user_id: str,
        project_id: str,
    ) -> str:
        if asked not in ("force_complete", "abort"):
            raise exception.Invalid(reason=f"a live migration is asked force_complete or abort, "
                                    f"not {asked!r}")  # fmt: skip
        result = self._step("move_ask", migration_uuid, instance_uuid, asked, json.dumps(allowed),
                            action, request_id, user_id, project_id)  # fmt: skip
        refused = result.get("refused")
        if refused == "migration":
            raise exception.MigrationNotFound(migration=migration_uuid)
        if refused == "instance":  # Nova's words for the two
            raise exception.InstanceInvalidState(
                action="force_complete" if asked == "force_complete" else "abort live migration",
                instance=instance_uuid, attr="task_state",
                state=result["state"] or None,
            )  # fmt: skip
        if refused == "status":
            method = "force complete" if asked == "force_complete" else "abort live migration"
            raise exception.InvalidMigrationState(
                migration=migration_uuid, instance=instance_uuid, state=result["state"],
                method=method,
            )  # fmt: skip
        return str(result["status"])

    def _step(self, script: str, migration_uuid: str, *args: Any) -> dict[str, Any]:
        return self.store.run(
            script, self.keys.migration(migration_uuid), migration_uuid, *args,
            self.store.now(), self.store.max_events,
        )  # fmt: skip

    def expired(self, now: float, limit: int = 100) -> builtins.list[str]:
        found = self.store.client.zrangebyscore(self.keys.move_deadlines, "-inf", now, 0, limit)
        return [text(u) for u in found]

    def finished_before(self, before: float, limit: int = 100) -> builtins.list[str]:
        found = self.store.client.zrangebyscore(self.keys.moves_finished, "-inf", before, 0, limit)
        return [text(u) for u in found]

    def forget_deadline(self, migration_uuid: str) -> None:
        self.store.client.zrem(self.keys.move_deadlines, migration_uuid)

    def get(self, migration_uuid: str) -> Migration:
        fields = text_map(self.store.client.hgetall(self.keys.migration(migration_uuid)))
        if not fields:
            raise exception.MigrationNotFound(migration=migration_uuid)
        return _migration(fields)

    def _instance_of(self, migration_uuid: str) -> str:
        found = self.store.client.hget(self.keys.migration(migration_uuid), "instance_uuid")
        if found is None:
            raise exception.MigrationNotFound(migration=migration_uuid)
        return text(found)

    def of_instance(self, instance_uuid: str) -> builtins.list[Migration]:
        uuids = self.store.client.zrevrange(self.keys.instance_migrations(instance_uuid), 0, -1)
        return self._read([text(u) for u in uuids])

    def on_host(self, host: str) -> builtins.list[Migration]:
        uuids = sorted(text(u) for u in self.store.client.smembers(self.keys.host_migrations(host)))
        return self._read(uuids)

    def list(self, after: int = 0, limit: int | None = None) -> builtins.list[Migration]:
        client, key = self.store.client, self.keys.migrations
        if limit is None:
            uuids = client.zrangebyscore(key, f"({after}", "+inf")
        else:
            uuids = client.zrangebyscore(key, f"({after}", "+inf", 0, limit)
        return self._read([text(u) for u in uuids])

    def newest(self, below: int | None = None, limit: int = 100) -> builtins.list[Migration]:
        top = "+inf" if below is None else f"({below}"
        uuids = self.store.client.zrevrangebyscore(self.keys.migrations, top, "-inf", 0, limit)
        return self._read([text(u) for u in uuids])

    def _read(self, uuids: builtins.list[str]) -> builtins.list[Migration]:
        keys = [self.keys.migration(u) for u in uuids]
        return [_migration(text_map(f)) for f in read_many(self.store.client, "hgetall", keys) if f]


def _phase(phase: str) -> str:
    if phase not in ("ask", "done", "take_over"):
        raise exception.Invalid(reason=f"phase {phase!r} is ask, done or take_over")
    return phase


def _migration(fields: dict[str, str]) -> Migration:
    return Migration(
        id=int(fields["id"]),
        uuid=fields["uuid"],
        instance_uuid=fields["instance_uuid"],
        kind=fields["kind"],
        status=fields["status"],
        source_compute=fields["source_compute"],
        source_node=fields.get("source_node", ""),
        dest_compute=fields.get("dest_compute") or None,
        dest_node=fields.get("dest_node") or None,
        project_id=fields["project_id"],
        user_id=fields.get("user_id", ""),
        old_flavor=json.loads(fields.get("old_flavor") or "{}"),
        new_flavor=json.loads(fields.get("new_flavor") or "{}"),
        created_at=float(fields["created_at"]),
        updated_at=float(fields["updated_at"]),
        request_id=fields.get("request_id", ""),
        new_class=fields.get("new_class", ""),
        same_host=fields.get("same_host") == "1",
        attempts=int(fields.get("attempts", 0)),
        max_attempts=int(fields.get("max_attempts", 1)),
        tried=tuple(json.loads(fields.get("tried") or "[]")),
        fault=fields.get("fault") or None,
        deadline=float(fields["deadline"]) if fields.get("deadline") else None,
        caller_project_id=fields.get("caller_project_id", ""),
        block_migration={"1": True, "0": False}.get(fields.get("block_migration", "")),
        asked=fields.get("asked", ""),
    )
