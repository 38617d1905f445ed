"""A boot request and the instance record made for it: both ways, every field.

The front door records the instance of a boot request (:func:`record_for`) in
the same step that reserves its quota; the janitor and a restarting agent rebuild
the request from the record (:func:`request_for`) when nothing on the bus holds
it any more. The rebuilt request must ask for exactly what the first one asked
for, or a requeue would silently drop a constraint.

Where each field of a :class:`~qsched.scheduling.message.BootRequest` lives in the record:

=====================  ================================================================
request field          record
=====================  ================================================================
instance_uuid          ``uuid``
project_id, user_id    ``project_id``, ``user_id``
flavor                 ``flavor`` (the copy the server was booted with)
attempt                ``attempts + 1`` (the ledger counts requeues)
tried_hosts            ``tried_hosts`` (the ledger adds each host a requeue took the
                       claim from)
deadline               ``deadline``
published_at           not kept: a rebuilt request is published now
group                  ``group`` (the claim script reads it there)
only_hosts,            ``hosts``, the :class:`~qsched.ledger.records.HostRule` as JSON
never_hosts,           (the claim script reads it there)
requested_node
everything else        ``extra``, as :class:`BootDetails` (request_id, global_request_id,
                       scheduling_class, max_attempts, the constraints, group_policy),
                       with what only the API shows (image_ref, metadata, the
                       reservation id, the zone asked for) and, as
                       :class:`ServerFields` under ``server``, what the create asked of
                       the server itself (key, access addresses, disk config,
                       description, tags, user data, config drive, networks)
=====================  ================================================================

Nothing else reads ``Instance.extra`` by key: :func:`details` is the one reader, and
:func:`server_change` and :func:`metadata_change` say what an update changes of it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from qsched import exception
from qsched.flavors import Constraints
from qsched.ledger.base import Instance, MapChange, Migration, State
from qsched.scheduling.message import BootRequest, constraint_fields, host_rule_fields


@dataclasses.dataclass(frozen=True)
class ServerFields:
    """What a create asked of the server beyond where it runs: shown by the API, kept for
    the agent (``key_data``: the public key of ``key_name``, to inject).

    ``networks``: as asked (``auto``, ``none``; ``""`` an empty list; None: not given);
    qsched has no networking, so nothing is attached either way. ``user_data``: the
    base64 text as given. The admin password is never kept.
    """

    key_name: str | None = None
    key_data: str | None = None
    access_ipv4: str = ""
    access_ipv6: str = ""
    disk_config: str = "MANUAL"
    description: str | None = None
    tags: tuple[str, ...] = ()
    user_data: str | None = None
    config_drive: bool = False
    networks: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; :meth:`from_dict` reads it back."""
        return {**dataclasses.asdict(self), "tags": list(self.tags)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ServerFields:
        """Read :meth:`to_dict` back; keys a record made before a field existed default."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in raw.items() if k in known}
        if "tags" in fields:
            fields["tags"] = tuple(fields["tags"] or ())
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class BootDetails:
    """What a record keeps of its boot request beyond the ledger's own fields."""

    request_id: str
    scheduling_class: str
    max_attempts: int
    constraints: Constraints = dataclasses.field(default_factory=Constraints)
    image_ref: str = ""
    metadata: Mapping[str, str] = dataclasses.field(default_factory=dict)
    global_request_id: str | None = None
    group_policy: str | None = None
    reservation_id: str = ""  # Nova's id of the create that made it (a multi-create's)
    #: The zone the boot asked for, when it routes by the zone's aggregates instead.
    requested_zone: str | None = None
    server: ServerFields = dataclasses.field(default_factory=ServerFields)

    @property
    def availability_zone(self) -> str | None:
        """The zone the boot asked for, however it is routed."""
        return self.requested_zone or self.constraints.availability_zone

    def to_extra(self) -> dict[str, Any]:
        """The ``extra`` map of the record (JSON-able)."""
        return {
            "request_id": self.request_id,
            "scheduling_class": self.scheduling_class,
            "max_attempts": self.max_attempts,
            **self.constraints.to_dict(),
            "image_ref": self.image_ref,
            "metadata": dict(self.metadata),
            "global_request_id": self.global_request_id,
            "requested_zone": self.requested_zone,
            "group_policy": self.group_policy,
            "reservation_id": self.reservation_id,
            "server": self.server.to_dict(),
        }

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> BootDetails:
        """Read :meth:`to_extra` back; keys a record made before a field existed default.

        :raises Invalid: no request id, class or attempt limit (not a boot's record), or
            malformed constraints.
        """
        try:
            request_id, cls_name = str(extra["request_id"]), str(extra["scheduling_class"])
            max_attempts = int(extra["max_attempts"])
        except (KeyError, TypeError, ValueError) as exc:
            raise exception.Invalid(reason=f"not the record of a boot request: {exc!r}") from None
        return cls(
            request_id, cls_name, max_attempts, Constraints.from_dict(extra),
            str(extra.get("image_ref") or ""), dict(extra.get("metadata") or {}),
            extra.get("global_request_id") or None, extra.get("group_policy") or None,
            str(extra.get("reservation_id") or ""), extra.get("requested_zone") or None,
            ServerFields.from_dict(extra.get("server") or {}),
        )  # fmt: skip


def details(instance: Instance) -> BootDetails:
    """The boot details a record keeps (see the module docstring).

    :raises Invalid: the record was not made by :func:`record_for`.
    """
    return BootDetails.from_extra(instance.extra)


def server_change(fields: Mapping[str, Any]) -> dict[str, MapChange]:
    """The change of a record's ``extra`` (see ``InstanceStore.update``) that sets
    ``fields`` of its :class:`ServerFields`, by their names there.

    :raises Invalid: a name that is no field of ServerFields.
    """
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(ServerFields)})
    if unknown:
        raise exception.Invalid(reason=f"{unknown} are no fields of a server")
    return {"server": MapChange(items=dict(fields))}


def metadata_change(
    items: Mapping[str, str] | None = None,
    removed: tuple[str, ...] = (),
    replace: bool = False,
    limit: int = -1,
) -> dict[str, MapChange]:
    """The change of a record's ``extra`` that sets ``items`` of its metadata (``replace``:
    they become the whole of it) and removes the keys ``removed``; ``limit``: the most
    items it may hold after (-1: no limit)."""
    return {"metadata": MapChange(dict(items or {}), removed, replace, limit)}


def record_for(
    request: BootRequest,
    name: str,
    image_ref: str = "",
    metadata: Mapping[str, str] | None = None,
    reservation_id: str = "",
    requested_zone: str | None = None,
    server: ServerFields | None = None,
) -> Instance:
    """The BUILD record of a boot request, as the front door creates it.

    ``reservation_id``: its create's (Nova's ``r-...``); ``requested_zone``: the zone
    the boot asked for, when its constraints route it by the zone's aggregates instead;
    ``server``: what the create asked of the server itself.
    """
    boot = BootDetails(
        request.request_id, request.scheduling_class, request.max_attempts,
        request.constraints(), image_ref, dict(metadata or {}), request.global_request_id,
        request.group_policy, reservation_id, requested_zone, server or ServerFields(),
    )  # fmt: skip
    return Instance(
        request.instance_uuid, request.project_id, request.user_id, name, request.flavor,
        State.BUILD, attempts=request.attempt - 1, deadline=request.deadline,
        tried_hosts=request.tried_hosts, extra=boot.to_extra(), group=request.group,
        hosts=request.host_rule(),
    )  # fmt: skip


def request_for(instance: Instance, now: float | None = None) -> BootRequest:
    """The boot request of a waiting instance, rebuilt from its record; published ``now``.

    A record without a deadline (none is made so) gets ``now``: the request then
    ends in NoValidHost at its first delivery instead of waiting forever.

    :raises Invalid: the record was not made by :func:`record_for`.
    """
    boot = details(instance)
    now = time.time() if now is None else now
    return BootRequest(
        request_id=boot.request_id,
        instance_uuid=instance.uuid,
        project_id=instance.project_id,
        user_id=instance.user_id,
        flavor=dict(instance.flavor),
        scheduling_class=boot.scheduling_class,
        deadline=now if instance.deadline is None else instance.deadline,
        published_at=now,
        attempt=instance.attempts + 1,
        max_attempts=boot.max_attempts,
        **constraint_fields(boot.constraints),
        tried_hosts=tuple(instance.tried_hosts),
        global_request_id=boot.global_request_id,
        group=instance.group,
        group_policy=boot.group_policy,
        **host_rule_fields(instance.hosts),
    )


def move_request_for(
    instance: Instance, migration: Migration, now: float | None = None
) -> BootRequest:
    """The request of a move of ``instance`` (docs/moves.rst), published ``now``: the
    boot's constraints, group and host rule from its record, the flavor and class the
    migration moves it with, the migration's attempts, tried hosts and deadline.

    :raises Invalid: the record was not made by :func:`record_for`.
    """
    now = time.time() if now is None else now
    return dataclasses.replace(
        request_for(instance, now),
        request_id=migration.request_id or details(instance).request_id,
        flavor=dict(migration.new_flavor),
        scheduling_class=migration.new_class,
        deadline=migration.deadline if migration.deadline is not None else now,
        attempt=migration.attempts + 1,
        max_attempts=migration.max_attempts,
        tried_hosts=tuple(migration.tried),
        migration=migration.uuid,
        source_host=migration.source_compute or None,  # an unshelve has none
    )
