"""RedisGroups: server groups, their members and the hosts their members hold claims on.

A group is one hash; its members a set written with each instance record; its
hosts a hash (host -> members claimed there) that the claim script reads and
writes in the step that takes the resources (``lib.lua``: ``group_refusal``,
``group_claim``, ``group_unclaim``), so a hard policy holds under any interleaving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from qsched import exception
from qsched.ledger.base import GroupStore, ServerGroup
from qsched.ledger.errors import maps_errors
from qsched.ledger.instances import ABANDON_MARK_S
from qsched.ledger.redis import RedisStore, canonical_json, read_many, text, text_map
from qsched.resources import check_uuid


@dataclasses.dataclass(frozen=True)
class GroupLimits:
    """``[quota] server_groups`` and ``server_group_members`` (-1: no limit)."""

    server_groups: int = 10
    server_group_members: int = 10


@maps_errors
class RedisGroups(GroupStore):
    def __init__(self, store: RedisStore, limits: GroupLimits | None = None) -> None:
        self.store = store
        self.keys = store.keys
        self.limits = limits or GroupLimits()

    def create(self, group: ServerGroup) -> ServerGroup:
        uuid = check_uuid(group.uuid, "Server group UUID")
        created = dataclasses.replace(group, uuid=uuid, created_at=self.store.now(), members=())
        self.store.run(
            "group_create", self.keys.group(uuid), uuid, group.project_id,
            canonical_json(_fields(created)), self.limits.server_groups,
        )  # fmt: skip
        return created

    def get(self, uuid: str, members: bool = True) -> ServerGroup:
        pipe = self.store.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.group(uuid))
        if members:
            pipe.smembers(self.keys.group_members(uuid))
        replies = pipe.execute()
        if not replies[0]:
            raise exception.GroupNotFound(group=uuid)
        return _group(uuid, text_map(replies[0]), replies[1] if members else ())

    def list_project(self, project_id: str) -> list[ServerGroup]:
        return self._many(self.store.client.smembers(self.keys.project_groups(project_id)))

    def list_all(self) -> list[ServerGroup]:
        return self._many(self.store.client.smembers(self.keys.groups))

    def _many(self, raw: object) -> list[ServerGroup]:
        uuids = sorted(text(u) for u in raw)  # type: ignore[attr-defined]
        records = read_many(self.store.client, "hgetall", [self.keys.group(u) for u in uuids])
        members = read_many(self.store.client, "smembers",
                            [self.keys.group_members(u) for u in uuids])  # fmt: skip
        found = [
            _group(uuid, text_map(fields), in_group)
            for uuid, fields, in_group in zip(uuids, records, members, strict=True)
            if fields  # deleted since the SMEMBERS
        ]
        return sorted(found, key=lambda g: (g.created_at, g.uuid))

    def delete(self, uuid: str) -> None:
        self.store.run("group_delete", self.keys.group(uuid), uuid)

    def abandon(self, uuid: str) -> bool:
        found = self.store.run("group_abandon", self.keys.group(uuid), uuid, ABANDON_MARK_S,
                               self.store.now())  # fmt: skip
        return found["state"] == "present"

    def hosts(self, uuid: str) -> dict[str, int]:
        raw = text_map(self.store.client.hgetall(self.keys.group_hosts(uuid)))
        return {host: int(n) for host, n in raw.items() if int(n) > 0}

    def members_on(self, uuid: str, host: str) -> int:
        return int(self.store.client.hget(self.keys.group_hosts(uuid), host) or 0)


def _fields(group: ServerGroup) -> dict[str, str]:
    fields = {
        "uuid": group.uuid,
        "name": group.name,
        "project_id": group.project_id,
        "user_id": group.user_id,
        "policy": group.policy,
        "created_at": repr(group.created_at),
    }
    if group.max_server_per_host is not None:
        fields["max_server_per_host"] = str(group.max_server_per_host)
    return fields


def _group(uuid: str, fields: Mapping[str, str], members: object) -> ServerGroup:
    most = fields.get("max_server_per_host")
    return ServerGroup(
        uuid=uuid,
        name=fields["name"],
        project_id=fields["project_id"],
        user_id=fields["user_id"],
        policy=fields["policy"],
        max_server_per_host=int(most) if most else None,
        created_at=float(fields.get("created_at", 0)),
        members=tuple(sorted(text(m) for m in members)),  # type: ignore[attr-defined]
    )
