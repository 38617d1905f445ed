"""The messages on the bus: boot requests per scheduling class (a move's too); deletes,
server actions and the steps of moves per host.

Wire format: a msgpack map with a ``kind`` ("boot", "delete", "action" or "move") and a
``version``
("MAJOR.MINOR"). A reader accepts every minor of the majors it knows; fields it
does not know (added by a newer minor) are kept aside in ``extra`` and written
back on :meth:`encode`, so an older agent that requeues a newer message does not
strip it. Any other major is :class:`UnsupportedVersion`.

Validation is a table of cheap hand-written checks per field (this runs once per
delivery on every agent), not a schema engine. Whatever the bytes, :func:`decode`
returns a message or raises :class:`PoisonMessage` with a reason fit for a
dead-letter header; it raises nothing else.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar, cast

import msgpack

from qsched import exception
from qsched.flavors import Constraints, Flavor
from qsched.ledger.records import HostRule
from qsched.scheduling.classes import class_name

MAJOR_VERSION = 1
BOOT_VERSION = "1.4"  # 1.1: global_request_id; 1.2: aggregate groups, server group;
# 1.3: host rules (same_host, different_host, the 2.74 host and node); 1.4: moves
# (migration, source_host)
DELETE_VERSION = "1.0"
ACTION_VERSION = "1.1"  # 1.1: shelve, shelve_offload, unshelve, rebuild
MOVE_VERSION = "1.0"
MAX_MESSAGE_BYTES = 64 * 1024
MAX_NAME_CHARS = 255
MAX_LIST_ITEMS = 1024

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").fullmatch
_VERSION = re.compile(r"(\d{1,4})\.(\d{1,4})").fullmatch
_INT32_MAX = 2**31 - 1


class PoisonMessage(exception.Invalid):
    """A message that cannot be decoded; ``reason`` says why, for the dead-letter header."""

    msg_fmt = "Poison message: {reason}"


class UnsupportedVersion(PoisonMessage):
    """A message from a major version this service does not read (``version`` says which)."""


class _Bad(Exception):
    """A field check failed; ``args[0]`` says what the field must be."""


Msg = TypeVar("Msg", bound="_Message")


# -- field checks: return the value (normalised) or raise _Bad(what it must be) --


def _name(value: Any) -> str:
    if type(value) is str and 0 < len(value) <= MAX_NAME_CHARS:
        return value
    raise _Bad(f"a non-empty string of at most {MAX_NAME_CHARS} characters")


def _uuid(value: Any) -> str:
    if type(value) is str and _UUID(value):
        return value
    raise _Bad("a canonical lower-case UUID (8-4-4-4-12 hex)")


def _count(low: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if type(value) is int and low <= value <= _INT32_MAX:
            return value
        raise _Bad(f"an integer between {low} and {_INT32_MAX}")

    return check


def _epoch_s(value: Any) -> float:
    if (type(value) is float or type(value) is int) and 0 <= value < math.inf:
        return float(value)
    raise _Bad("a finite number of seconds since the epoch")


def _optional_name(value: Any) -> str | None:
    return None if value is None else _name(value)


def _optional_uuid(value: Any) -> str | None:
    return None if value is None else _uuid(value)


_GROUP_POLICIES = ("affinity", "anti-affinity", "soft-affinity", "soft-anti-affinity")


def _optional_policy(value: Any) -> str | None:
    if value is None or (type(value) is str and value in _GROUP_POLICIES):
        return value
    raise _Bad(f"null or one of {', '.join(_GROUP_POLICIES)}")


def _names(value: Any) -> tuple[str, ...]:
    if type(value) is list and len(value) <= MAX_LIST_ITEMS:
        for item in value:
            if type(item) is not str or not 0 < len(item) <= MAX_NAME_CHARS:
                raise _Bad("a list of non-empty strings")
        return tuple(value)
    raise _Bad(f"a list of at most {MAX_LIST_ITEMS} strings")


def _uuids(value: Any) -> tuple[str, ...]:
    if type(value) is list and len(value) <= MAX_LIST_ITEMS:
        for item in value:
            if type(item) is not str or not _UUID(item):
                raise _Bad("a list of canonical lower-case UUIDs")
        return tuple(value)
    raise _Bad(f"a list of at most {MAX_LIST_ITEMS} UUIDs")


def _uuid_groups(value: Any) -> tuple[tuple[str, ...], ...]:
    if type(value) is list and len(value) <= MAX_LIST_ITEMS:
        return tuple(_uuids(group) for group in value)
    raise _Bad(f"a list of at most {MAX_LIST_ITEMS} lists of UUIDs")


_FLAVOR_SIZES = (("vcpus", 1), ("ram_mb", 1), ("disk_gb", 0))


def _flavor(value: Any) -> dict[str, Any]:
    """Shape and types only; :meth:`BootRequest.to_flavor` runs the full flavor checks."""
    if type(value) is not dict:
        raise _Bad("a map with name, vcpus, ram_mb, disk_gb and extra_specs")
    name = value.get("name")
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_CHARS:
        raise _Bad("a flavor map with a non-empty string 'name'")
    for key, low in _FLAVOR_SIZES:
        size = value.get(key)
        if type(size) is not int or not low <= size <= _INT32_MAX:
            raise _Bad(f"a flavor map whose {key!r} is an integer between {low} and {_INT32_MAX}")
    specs = value.get("extra_specs", _NO_SPECS)
    if type(specs) is not dict or (specs and not _all_strings(specs)):
        raise _Bad("a flavor map whose 'extra_specs' maps strings to strings")
    return value


def _all_strings(mapping: dict[Any, Any]) -> bool:
    return all(type(key) is str and type(item) is str for key, item in mapping.items())


_NO_SPECS: dict[str, str] = {}


# -- the messages --


class _Message:
    """What every message does; each kind is a frozen dataclass deriving from this."""

    KIND: ClassVar[str] = ""
    # (name, check, required): the decode table, in wire order.
    FIELDS: ClassVar[tuple[tuple[str, Callable[[Any], Any], bool], ...]] = ()
    extra: Mapping[str, Any]  # a field of each kind: what a newer minor added

    def encode(self) -> bytes:
        """The msgpack bytes of this message (fields unknown to us written back as read)."""
        wire: dict[str, Any] = dict(self.extra) if self.extra else {}
        wire["kind"] = self.KIND
        for name, _check, _required in self.FIELDS:
            wire[name] = getattr(self, name)
        return msgpack.packb(wire, use_bin_type=True)

    @classmethod
    def decode(cls: type[Msg], data: Any) -> Msg:
        """Decode bytes that must hold this kind of message.

        :raises PoisonMessage: anything wrong (see :func:`decode`), or another kind.
        """
        message = decode(data)
        if not isinstance(message, cls):
            raise PoisonMessage(reason=f"expected a {cls.KIND} message, got {message.KIND}")
        return message


@dataclasses.dataclass(frozen=True)
class BootRequest(_Message):
    """Place one instance: published on ``boot.<scheduling_class>``, pulled by an agent.

    A move's request (``migration`` set, docs/moves.rst) places a server that runs on
    ``source_host``: its destination claims it with the migration's claim, never on the
    source (unless a resize may stay there) nor on a host in ``tried_hosts``. An agent
    that reads no 1.4 takes it for a boot, whose claim finds no instance waiting and
    drops it: agents are upgraded before the API serves moves.
    """

    KIND: ClassVar[str] = "boot"

    request_id: str
    instance_uuid: str
    project_id: str
    user_id: str
    flavor: Mapping[str, Any]  # Flavor.to_dict()
    scheduling_class: str
    deadline: float  # epoch seconds; past it the instance ends in ERROR
    published_at: float  # epoch seconds, set again on every requeue
    attempt: int = 1  # 1 for the first try
    max_attempts: int = 3
    required_traits: tuple[str, ...] = ()
    forbidden_traits: tuple[str, ...] = ()
    member_of: tuple[str, ...] = ()  # aggregate UUIDs: a node must be in all of them
    member_of_any: tuple[tuple[str, ...], ...] = ()  # and in one of each group
    forbidden_aggregates: tuple[str, ...] = ()  # and in none of these
    availability_zone: str | None = None
    tried_hosts: tuple[str, ...] = ()  # hosts that claimed it and gave it back, in order
    global_request_id: str | None = None  # the caller's X-OpenStack-Request-ID
    group: str | None = None  # the server group's uuid (the ``group`` scheduler hint)
    group_policy: str | None = None  # its policy, for the agents' routing and preferences
    only_hosts: tuple[str, ...] = ()  # its host rule (HostRule): the hosts it may run on,
    never_hosts: tuple[str, ...] = ()  # those it must not run on,
    requested_node: str | None = None  # and the node it must run on
    migration: str | None = None  # a move's migration uuid (None: a boot)
    source_host: str | None = None  # the host a move's server runs on
    version: str = BOOT_VERSION
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    FIELDS: ClassVar[tuple[tuple[str, Callable[[Any], Any], bool], ...]] = (
        ("version", _name, True),  # major checked before the table runs
        ("request_id", _name, True),
        ("instance_uuid", _uuid, True),
        ("project_id", _name, True),
        ("user_id", _name, True),
        ("flavor", _flavor, True),
        ("scheduling_class", _name, True),
        ("attempt", _count(1), True),
        ("max_attempts", _count(1), True),
        ("deadline", _epoch_s, True),
        ("published_at", _epoch_s, True),
        ("required_traits", _names, False),
        ("forbidden_traits", _names, False),
        ("member_of", _uuids, False),
        ("member_of_any", _uuid_groups, False),
        ("forbidden_aggregates", _uuids, False),
        ("availability_zone", _optional_name, False),
        ("tried_hosts", _names, False),
        ("global_request_id", _optional_name, False),
        ("group", _optional_uuid, False),
        ("group_policy", _optional_policy, False),
        ("only_hosts", _names, False),
        ("never_hosts", _names, False),
        ("requested_node", _optional_name, False),
        ("migration", _optional_uuid, False),
        ("source_host", _optional_name, False),
    )

    @property
    def moves(self) -> bool:
        """Whether it places a move of a running server, not a boot."""
        return self.migration is not None

    @classmethod
    def create(
        cls,
        instance_uuid: str,
        project_id: str,
        user_id: str,
        flavor: Flavor,
        constraints: Constraints | None = None,
        max_attempts: int = 3,
        timeout_s: float = 300.0,
        now: float | None = None,
        request_id: str | None = None,
        global_request_id: str | None = None,
        group: tuple[str, str] | None = None,
        hosts: HostRule | None = None,
    ) -> BootRequest:
        """A first attempt for ``flavor`` plus ``constraints``, due ``timeout_s`` from now;
        ``group``: the uuid and policy of its server group; ``hosts``: its host rule."""
        now = time.time() if now is None else now
        constraints = constraints or Constraints()
        return cls(
            request_id=request_id or f"req-{uuidlib.uuid4()}",
            instance_uuid=instance_uuid,
            project_id=project_id,
            user_id=user_id,
            flavor=flavor.to_dict(),
            scheduling_class=class_name(flavor.class_key, constraints),
            deadline=now + timeout_s,
            published_at=now,
            max_attempts=max_attempts,
            **constraint_fields(constraints),
            global_request_id=global_request_id,
            group=group[0] if group else None,
            group_policy=group[1] if group else None,
            **host_rule_fields(hosts),
        )

    def next_attempt(self, host: str | None, now: float | None = None) -> BootRequest:
        """The copy to requeue: attempt + 1, ``host`` added to tried_hosts, published now."""
        tried = self.tried_hosts
        if host is not None and host not in tried:
            tried = (*tried, host)
        return dataclasses.replace(
            self,
            attempt=self.attempt + 1,
            tried_hosts=tried,
            published_at=time.time() if now is None else now,
        )

    def requeued(self, now: float | None = None) -> BootRequest:
        """The copy to requeue when an agent did not claim it (no room, or it handed it
        back): the same attempt and tried hosts, published now.

        Neither is an attempt: only a claim given back (a failed spawn, a claim taken
        back) counts against max_attempts and adds its host to ``tried_hosts``, as
        Nova's retry hosts; the deadline ends requests that nobody has room for. A host
        that had no room says so in the instance history, not in the request.
        """
        return dataclasses.replace(self, published_at=time.time() if now is None else now)

    def expired(self, now: float | None = None) -> bool:
        """True once the deadline has passed."""
        return (time.time() if now is None else now) >= self.deadline

    @property
    def attempts_left(self) -> int:
        """Attempts after this one (0: this is the last)."""
        return max(0, self.max_attempts - self.attempt)

    def constraints(self) -> Constraints:
        """What the request adds to its flavor."""
        return Constraints(
            availability_zone=self.availability_zone,
            required_traits=frozenset(self.required_traits),
            forbidden_traits=frozenset(self.forbidden_traits),
            member_of=frozenset(self.member_of),
            member_of_any=tuple(frozenset(group) for group in self.member_of_any),
            forbidden_aggregates=frozenset(self.forbidden_aggregates),
        )

    def host_rule(self) -> HostRule | None:
        """Where it may run by host name (None: anywhere its class fits)."""
        rule = HostRule(self.only_hosts, self.never_hosts, self.requested_node)
        return rule if rule else None

    def to_flavor(self) -> Flavor:
        """The flavor, fully checked (extra specs parsed).

        :raises Invalid: the flavor is well-formed on the wire but not valid.
        """
        return Flavor.from_dict(self.flavor)


@dataclasses.dataclass(frozen=True)
class _HostMessage(_Message):
    """What a message for the agent of one host names: the request, the instance and
    where it runs; each kind adds its version (and fields) after these."""

    request_id: str
    instance_uuid: str
    host: str
    node: str

    FIELDS: ClassVar[tuple[tuple[str, Callable[[Any], Any], bool], ...]] = (
        ("version", _name, True),
        ("request_id", _name, True),
        ("instance_uuid", _uuid, True),
        ("host", _name, True),
        ("node", _name, True),
    )


@dataclasses.dataclass(frozen=True)
class DeleteRequest(_HostMessage):
    """Delete one instance: published on ``host.<host>`` for the agent that runs it."""

    KIND: ClassVar[str] = "delete"

    version: str = DELETE_VERSION
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)


#: the server actions an agent does (:mod:`agents.actions`)
ACTIONS = ("stop", "start", "reboot_soft", "reboot_hard", "shelve", "shelve_offload", "unshelve",
           "rebuild")  # fmt: skip


def _action(value: Any) -> str:
    if type(value) is str and value in ACTIONS:
        return value
    raise _Bad(f"one of {', '.join(ACTIONS)}")


@dataclasses.dataclass(frozen=True)
class ActionRequest(_HostMessage):
    """A server action (stop, start, soft or hard reboot, rebuild, shelve,
    shelve_offload, the unshelve of a server shelved on its host) for the agent of
    ``host``: published on ``host.<host>`` once the ledger holds its task_state. An agent
    that reads no 1.1 refuses a rebuild and the shelving actions as malformed, and they
    wait in their task_state until the host's agent, upgraded, runs them from the record
    (its sweep of actions under way: agents/actions.py)."""

    KIND: ClassVar[str] = "action"

    action: str  # one of ACTIONS
    version: str = ACTION_VERSION
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    FIELDS: ClassVar[tuple[tuple[str, Callable[[Any], Any], bool], ...]] = (
        *_HostMessage.FIELDS,
        ("action", _action, True),
    )


#: the steps of a move its hosts take from their queue (:mod:`agents.moves`)
MOVE_STEPS = ("confirm", "revert", "live")


def _move_step(value: Any) -> str:
    if type(value) is str and value in MOVE_STEPS:
        return value
    raise _Bad(f"one of {', '.join(MOVE_STEPS)}")


@dataclasses.dataclass(frozen=True)
class MoveStep(_HostMessage):
    """A step of a move for the agent of one of its hosts, published on ``host.<host>``
    once the ledger holds it: ``confirm`` to the source (its copy goes), ``revert`` to
    the destination (its copy goes, the server is back on its source), ``live`` to a
    live migration's source once its destination is ready (the source sends it)."""

    KIND: ClassVar[str] = "move"

    migration: str
    step: str  # one of MOVE_STEPS
    version: str = MOVE_VERSION
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    FIELDS: ClassVar[tuple[tuple[str, Callable[[Any], Any], bool], ...]] = (
        *_HostMessage.FIELDS,
        ("migration", _uuid, True),
        ("step", _move_step, True),
    )


def constraint_fields(constraints: Constraints) -> dict[str, Any]:
    """The fields of a boot request that carry ``constraints`` (names sorted)."""
    wire = constraints.to_dict()
    fields = {
        key: tuple(value) if isinstance(value, list) else value for key, value in wire.items()
    }
    fields["member_of_any"] = tuple(tuple(group) for group in wire["member_of_any"])
    return fields


def host_rule_fields(rule: HostRule | None) -> dict[str, Any]:
    """The fields of a boot request that carry a host rule (none: no rule)."""
    if not rule:
        return {}
    return {"only_hosts": rule.only, "never_hosts": rule.never, "requested_node": rule.node}


_KINDS: dict[str, type[_Message]] = {
    BootRequest.KIND: BootRequest,
    DeleteRequest.KIND: DeleteRequest,
    ActionRequest.KIND: ActionRequest,
    MoveStep.KIND: MoveStep,
}

Message = BootRequest | DeleteRequest | ActionRequest | MoveStep
#: what goes to one host's agent besides deletes: a server action or a move's step
HostAction = ActionRequest | MoveStep


def decode(data: Any) -> Message:
    """Decode a message of any kind.

    :raises UnsupportedVersion: a major version this service does not read.
    :raises PoisonMessage: not bytes, too big, not msgpack, not a map, an unknown
        kind, or a missing or wrongly typed field.
    """
    wire = _unpack(data)
    kind = wire.get("kind")
    cls = _KINDS.get(kind) if type(kind) is str else None
    if cls is None:
        raise PoisonMessage(reason=f"unknown message kind {_short(kind)}")
    _check_version(wire.get("version"))
    return cast(Message, _build(cls, wire))


def _unpack(data: Any) -> dict[str, Any]:
    if type(data) is not bytes and not isinstance(data, bytearray | memoryview):
        raise PoisonMessage(reason=f"the body is {type(data).__name__}, not bytes")
    if len(data) > MAX_MESSAGE_BYTES:
        raise PoisonMessage(reason=f"the body is {len(data)} bytes, over {MAX_MESSAGE_BYTES}")
    if not data:
        raise PoisonMessage(reason="not msgpack: the body is empty")
    try:
        wire = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for bad input; all mean one thing
        raise PoisonMessage(reason=f"not msgpack: {type(exc).__name__}: {_short(exc)}") from None
    if type(wire) is not dict:
        raise PoisonMessage(reason=f"the body must be a msgpack map, not {type(wire).__name__}")
    return wire


def _check_version(version: Any) -> None:
    if type(version) is str and version in _READABLE:
        return
    if type(version) is not str or not (match := _VERSION(version)):
        raise PoisonMessage(reason=f"field 'version' must be 'MAJOR.MINOR', got {_short(version)}")
    if int(match.group(1)) != MAJOR_VERSION:
        raise UnsupportedVersion(
            reason=f"version {version} is not supported: this service reads {MAJOR_VERSION}.x",
            version=version,
        )
    _READABLE.add(version)  # bounded: at most 10,000 minors match _VERSION


_READABLE: set[Any] = set()


def _build(cls: type[Msg], wire: dict[str, Any]) -> Msg:
    checks = _CHECKS[cls]
    try:
        values = {name: check(wire[name]) for name, check in checks if name in wire}
    except _Bad:
        raise _poison_field(checks, wire) from None
    extra = _extra(cls, wire) if len(wire) > len(values) + 1 else {}
    if len(values) < len(checks):
        _fill_defaults(cls, values)
    values["extra"] = extra
    # Fill the instance dict in one step: a frozen dataclass __init__ (one
    # object.__setattr__ per field) would cost as much as all the checks.
    message = object.__new__(cls)
    vars(message).update(values)
    return message


def _poison_field(
    checks: tuple[tuple[str, Callable[[Any], Any]], ...], wire: dict[str, Any]
) -> PoisonMessage:
    """The error for the first bad field (the slow path: only for poison)."""
    for name, check in checks:
        try:
            if name in wire:
                check(wire[name])
        except _Bad as bad:
            return PoisonMessage(
                reason=f"field {name!r} must be {bad.args[0]}, got {_short(wire[name])}"
            )
    return PoisonMessage(reason="a field check failed")


def _fill_defaults(cls: type[_Message], values: dict[str, Any]) -> None:
    for name, default in _DEFAULTS[cls].items():
        if name not in values:
            if default is _MISSING:
                raise PoisonMessage(reason=f"field {name!r} is missing")
            values[name] = default


def _extra(cls: type[_Message], wire: dict[str, Any]) -> dict[str, Any]:
    known = _KNOWN[cls]
    return {key: value for key, value in wire.items() if key not in known}


def _defaults(cls: type[_Message]) -> dict[str, Any]:
    # A dataclass keeps a plain default as a class attribute.
    return {name: _MISSING if required else getattr(cls, name) for name, _c, required in cls.FIELDS}


_MISSING: Any = object()
_CHECKS = {cls: tuple((name, check) for name, check, _r in cls.FIELDS) for cls in _KINDS.values()}
_DEFAULTS = {cls: _defaults(cls) for cls in _KINDS.values()}
_KNOWN = {cls: frozenset(name for name, _c, _r in cls.FIELDS) | {"kind"} for cls in _KINDS.values()}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
