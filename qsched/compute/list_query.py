"""The server list's query: Nova's filters, sort keys and their rules, as pure functions.

:func:`parse` reads a ``GET /servers`` (``/servers/detail``) query as Nova's
``_get_servers`` does, for one microversion and one caller; :class:`ServerQuery`
says which records match and in what order. No I/O here: :meth:`ComputeAPI.list
<qsched.compute.api.ComputeAPI.list>` reads the records (a project's, or an admin's
page of every project's) and applies it.

What Nova does and this does too:

* A caller the rule ``os_compute_api:servers:allow_all_filters`` refuses (a
  member) may filter by ``reservation_id``, ``name``, ``status``, ``image``,
  ``flavor``, ``ip``, ``changes-since`` and ``all_tenants`` (and ``ip6`` from
  2.5, the tag filters from 2.26, ``changes-before`` from 2.66, ``locked`` from
  2.73); any other filter of Nova's is dropped, as Nova drops it.
* Parameters Nova does not know are ignored before 2.75 (Nova's schema allows
  them for compatibility) and refused from 2.75.
* ``project_id`` (``tenant_id``) counts only with ``all_tenants``, which asks
  ``...:get_all_tenants`` (403 for a member).
* ``status``: Nova's status names, any case; none known is an empty list before
  2.38 and 400 from 2.38. ``DELETED`` alone is for admins (403 otherwise).
* ``changes-since`` / ``changes-before`` (ISO 8601) compare with ``updated`` and
  bring in DELETED servers (deleted since then), as Nova does.
* Sort keys of Nova's list; those Nova ignores (``vcpus``...) are dropped before
  2.75 and refused from 2.75; ``host`` and ``node`` are for admins (403).

qsched keeps no addresses, locks or kernels: ``ip``/``ip6`` match nothing,
``locked=true`` matches nothing, ``kernel_id`` and the like compare with ``""``.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.compute.server_actions import has_status, power_state, vm_state
from qsched.flavors import ref_id
from qsched.ledger.base import Instance, State
from qsched.scheduling.records import details

#: Nova's server status names (nova/api/openstack/common.py's state map)
STATUSES = frozenset({
    "ACTIVE", "REBOOT", "HARD_REBOOT", "PASSWORD", "REBUILD", "MIGRATING", "RESIZE", "BUILD",
    "SHUTOFF", "VERIFY_RESIZE", "REVERT_RESIZE", "PAUSED", "SUSPENDED", "RESCUE", "ERROR",
    "DELETED", "SOFT_DELETED", "SHELVED", "SHELVED_OFFLOADED",
})  # fmt: skip
VM_STATES = {
    State.BUILD: "building",
    State.ACTIVE: "active",
    State.ERROR: "error",
    State.DELETED: "deleted",
}
PAGING = ("limit", "marker", "sort_key", "sort_dir")
TAG_FILTERS = ("tags", "tags-any", "not-tags", "not-tags-any")
#: Nova's joined-table parameters: known, but a filter by them is refused (400)
JOINED = frozenset({"block_device_mapping", "services", "metadata", "system_metadata",
                    "info_cache", "security_groups", "pci_devices"})  # fmt: skip
#: sort keys Nova accepts and ignores (dropped before 2.75, refused from 2.75)
IGNORED_SORT_KEYS = frozenset({
    "architecture", "cell_name", "cleaned", "default_ephemeral_device", "default_swap_device",
    "deleted", "deleted_at", "disable_terminate", "ephemeral_gb", "ephemeral_key_uuid", "id",
    "key_data", "launched_on", "locked", "memory_mb", "os_type", "reservation_id", "root_gb",
    "shutdown_terminate", "user_data", "vcpus", "vm_mode",
})  # fmt: skip
_ADMIN_SORT_KEYS = ("host", "node")
_BOOLS = {
    **dict.fromkeys(("1", "t", "true", "on", "y", "yes"), True),
    **dict.fromkeys(("0", "f", "false", "off", "n", "no"), False),
}


_HOSTNAME_OTHER = re.compile(r"[^a-z0-9.-]+")


def hostname(name: str) -> str:
    """Nova's hostname of a display name: lower case, other characters as ``-``."""
    return _HOSTNAME_OTHER.sub("-", name.lower()).strip("-.")[:63] or "server"


def _boot(name: str, default: Any = "") -> Callable[[Instance], Any]:
    """A boot detail of a record (``default`` for a record not made by a boot)."""

    def read(instance: Instance) -> Any:
        try:
            value = getattr(details(instance), name)
        except exception.Invalid:
            return default
        return default if value is None else value

    return read


def _asked(name: str, default: Any = "") -> Callable[[Instance], Any]:
    """What the create (or an update) asked of the server: its
    :class:`~qsched.scheduling.records.ServerFields`."""

    def read(instance: Instance) -> Any:
        try:
            value = getattr(details(instance).server, name)
        except exception.Invalid:
            return default
        return default if value is None else value

    return read


def _flavor_id(instance: Instance) -> str:
    return str(instance.flavor.get("id") or instance.flavor.get("name") or "")


def _zone(instance: Instance) -> str:
    try:
        return details(instance).availability_zone or ""
    except exception.Invalid:
        return ""


def _const(value: Any) -> Callable[[Instance], Any]:
    return lambda instance: value


#: what each field of Nova's (a filter or a sort key) reads of a record
FIELDS: dict[str, Callable[[Instance], Any]] = {
    "uuid": lambda i: i.uuid,
    "project_id": lambda i: i.project_id,
    "user_id": lambda i: i.user_id,
    "display_name": lambda i: i.name,
    "display_description": _asked("description"),
    "host": lambda i: i.host or "",
    "node": lambda i: i.node or "",
    "vm_state": lambda i: vm_state(i, VM_STATES[i.state]),
    "task_state": lambda i: i.task_state.value,
    "power_state": power_state,
    "created_at": lambda i: i.created_at,
    "updated_at": lambda i: i.updated_at,
    "launched_at": lambda i: i.launched_at or 0.0,
    "terminated_at": _const(0.0),
    "image_ref": _boot("image_ref"),
    "instance_type_id": _flavor_id,
    "availability_zone": _zone,
    "reservation_id": _boot("reservation_id"),
    "launch_index": _const(0),
    "hostname": lambda i: hostname(i.name),
    "key_name": _asked("key_name"),
    "access_ip_v4": _asked("access_ipv4"),
    "access_ip_v6": _asked("access_ipv6"),
    "auto_disk_config": _const(False),
    "config_drive": _const(""),
    "progress": _const(0),
    "kernel_id": _const(""),
    "ramdisk_id": _const(""),
    "root_device_name": _const(""),
    "locked_by": _const(""),
    "locked": _const(False),
}

#: the filters a member may use -> the microversion they start at
MEMBER_FILTERS = {
    "reservation_id": (2, 1), "name": (2, 1), "status": (2, 1), "image": (2, 1),
    "flavor": (2, 1), "ip": (2, 1), "changes-since": (2, 1), "all_tenants": (2, 1),
    "ip6": (2, 5), **dict.fromkeys(TAG_FILTERS, (2, 26)), "changes-before": (2, 66),
    "locked": (2, 73),
}  # fmt: skip
#: filters of Nova's beyond the members' (admins): parameter -> field, and how it matches
ADMIN_FILTERS: dict[str, tuple[str, str]] = {
    "user_id": ("user_id", "exact"), "uuid": ("uuid", "exact"), "host": ("host", "exact"),
    "node": ("node", "regex"), "vm_state": ("vm_state", "exact"),
    "task_state": ("task_state", "exact"), "power_state": ("power_state", "regex"),
    "launch_index": ("launch_index", "exact"), "image_ref": ("image_ref", "exact"),
    "kernel_id": ("kernel_id", "regex"), "ramdisk_id": ("ramdisk_id", "regex"),
    "hostname": ("hostname", "regex"), "key_name": ("key_name", "regex"),
    "availability_zone": ("availability_zone", "regex"),
    "display_name": ("display_name", "regex"), "description": ("display_description", "regex"),
    "display_description": ("display_description", "regex"),
    "locked_by": ("locked_by", "regex"), "root_device_name": ("root_device_name", "regex"),
    "config_drive": ("config_drive", "regex"), "access_ip_v4": ("access_ip_v4", "regex"),
    "access_ip_v6": ("access_ip_v6", "regex"), "auto_disk_config": ("auto_disk_config", "regex"),
    "progress": ("progress", "regex"), "launched_at": ("launched_at", "regex"),
    "terminated_at": ("terminated_at", "regex"), "created_at": ("created_at", "regex"),
}  # fmt: skip
#: parameters of Nova's that are no filter of one field
_OTHER = {"project_id", "tenant_id", "deleted", "soft_deleted", *JOINED, *PAGING}
#: every parameter Nova's list schema names (from 2.75 the API refuses any other, except
#: those starting with ``_``, which :func:`parse` refuses or drops itself)
PARAMETERS = frozenset({*MEMBER_FILTERS, *ADMIN_FILTERS, *_OTHER})


@dataclasses.dataclass(frozen=True)
class ServerQuery:
    """A server list's query, checked: which records, which match, in what order.

    ``project_id``: the project listed (None: every project, an admin's
    ``all_tenants``). ``deleted``: None lists servers not DELETED, and with
    ``changes_since``/``changes_before`` those deleted since too; True only DELETED
    ones. ``empty``: nothing can match (an unknown status before 2.38, an ``ip``).
    """

    project_id: str | None
    predicates: tuple[Callable[[Instance], bool], ...] = ()
    deleted: bool | None = None
    changes_since: float | None = None
    changes_before: float | None = None
    sort: tuple[tuple[str, bool], ...] = ()  # (field, descending)
    limit: int | None = None
    marker: str | None = None
    empty: bool = False

    @property
    def with_deleted(self) -> bool:
        """Whether DELETED records are listed too."""
        if self.deleted is not None:
            return self.deleted
        return self.changes_since is not None or self.changes_before is not None

    @property
    def newest_first(self) -> bool:
        """Whether the order is the index's (created_at, uuid, descending)."""
        return all(field in ("created_at", "uuid") and desc for field, desc in self.sort)

    def matches(self, instance: Instance) -> bool:
        """Whether ``instance`` is one the query lists (its project checked by the caller)."""
        if instance.state == State.DELETED:
            if not self.with_deleted:
                return False
        elif self.deleted:
            return False
        if self.changes_since is not None and instance.updated_at < self.changes_since:
            return False
        if self.changes_before is not None and instance.updated_at > self.changes_before:
            return False
        return all(check(instance) for check in self.predicates)

    def sort_key(self, instance: Instance) -> tuple[Any, ...]:
        """The instance's place in the query's order as one value (the order is total:
        it ends with ``uuid``), so that pages of several cells merge and a marker of
        one cell says where every other cell's page starts."""
        return tuple(
            _Descending(_sortable(FIELDS[field](instance))) if descending
            else _sortable(FIELDS[field](instance))
            for field, descending in self.sort
        )  # fmt: skip

    def ordered(self, found: Iterable[Instance]) -> list[Instance]:
        """``found`` in the query's order (stable sorts, last key first)."""
        result = list(found)
        for field, descending in reversed(self.sort):
            result.sort(key=_sort_key(FIELDS[field]), reverse=descending)
        return result


@dataclasses.dataclass(frozen=True)
class _Descending:
    """A sort value that orders the other way round."""

    value: tuple[int, Any]

    def __lt__(self, other: _Descending) -> bool:
        return other.value < self.value

    def __gt__(self, other: _Descending) -> bool:
        return other.value > self.value


def _sort_key(read: Callable[[Instance], Any]) -> Callable[[Instance], tuple[int, Any]]:
    return lambda instance: _sortable(read(instance))


def _sortable(value: Any) -> tuple[int, Any]:
    # numbers before text, so a key whose values mix them still sorts
    if isinstance(value, bool | int | float):
        return (0, float(value))
    return (1, str(value))


def parse(
    params: Mapping[str, Sequence[str]],
    version: tuple[int, int],
    project_id: str,
    all_filters: bool,
    is_admin: bool,
    limit: int | None = None,
) -> tuple[ServerQuery, bool]:
    """Read a list's query (each parameter's values in order) as Nova does; return it
    and whether it asks for every project (``all_tenants``: the caller checks the rule).

    ``project_id``: the caller's; ``all_filters``: ``...:allow_all_filters`` allows
    the caller every filter; ``is_admin``: may sort by host and node and list
    DELETED servers by status; ``limit``: the page size asked for, read already.

    :raises Invalid: a malformed value, an unknown status (2.38+), a sort key or
        direction Nova refuses, a joined-table or ``_`` filter. Other unknown
        parameters are ignored: from 2.75 the API refuses those outside
        :data:`PARAMETERS` before asking.
    :raises Forbidden: a member sorting by host or node, or listing DELETED ones.
    """
    given = {name: list(values) for name, values in params.items()}
    if not all_filters:
        allowed = {n for n, since in MEMBER_FILTERS.items() if version >= since}
        given = {n: v for n, v in given.items() if n in allowed or n in PAGING}
    for name in given:
        if name in JOINED or name.startswith("_"):
            raise exception.Invalid(message=f"Invalid filter field: {name}.")
    one = {name: values[-1] for name, values in given.items() if values}
    all_tenants = _all_tenants(one)
    project: str | None = project_id
    if all_tenants:
        project = one.get("project_id") or one.get("tenant_id") or None
    statuses, status_empty = _statuses(given.get("status"), version, is_admin)
    since, before = _changes(one)
    deleted = _deleted(one, statuses)
    predicates, empty = _predicates(one, version, all_filters)
    if statuses is not None:
        predicates.append(lambda i: any(has_status(i, wanted) for wanted in statuses))
    query = ServerQuery(
        project, tuple(predicates), deleted, since, before,
        _sort(given, version, is_admin), limit, one.get("marker") or None,
        empty or status_empty,
    )  # fmt: skip
    return query, all_tenants


def to_bool(name: str, value: str) -> bool:
    """oslo's strict ``bool_from_string``, in its words.

    :raises Invalid: a value it does not know.
    """
    found = _BOOLS.get(value.strip().lower())
    if found is None:
        accepted = ", ".join(repr(v) for v in sorted(_BOOLS))
        raise exception.Invalid(
            message=f"Unrecognized value '{value}', acceptable values are: {accepted}"
        )
    return found


def _all_tenants(one: Mapping[str, str]) -> bool:
    if "all_tenants" not in one:
        return False
    value = one["all_tenants"]
    return True if value == "" else to_bool("all_tenants", value)


def _statuses(
    values: Sequence[str] | None, version: tuple[int, int], is_admin: bool
) -> tuple[frozenset[str] | None, bool]:
    """The statuses asked for, and whether none is known (an empty list before 2.38)."""
    if values is None:
        return None, False
    known = frozenset(v.upper() for v in values if v.upper() in STATUSES)
    if not known:
        if version >= (2, 38):
            raise exception.Invalid(message="Invalid status value")
        return known, True
    if known == {"DELETED"} and not is_admin:
        raise exception.Forbidden(message="Only administrators may list deleted instances")
    return known, False


def _deleted(one: Mapping[str, str], statuses: frozenset[str] | None) -> bool | None:
    if statuses == {"DELETED"}:
        return True
    if "deleted" in one:  # Nova: a value it cannot read lists servers not deleted
        return _BOOLS.get(one["deleted"].strip().lower(), False)
    return None


def _changes(one: Mapping[str, str]) -> tuple[float | None, float | None]:
    since = query_time("changes-since", one.get("changes-since"))
    before = query_time("changes-before", one.get("changes-before"))
    if since is not None and before is not None and before < since:
        raise exception.Invalid(
            message="The value of changes-since must be less than or equal to changes-before."
        )
    return since, before


def query_time(name: str, value: str | None) -> float | None:
    """The ISO 8601 time of query parameter ``name`` as epoch seconds (UTC when it names
    no zone): ``changes-since`` and ``changes-before`` of every list that takes them.

    :raises Invalid: not a time, in Nova's words.
    """
    if value is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        raise exception.Invalid(
            message=f"Invalid input for query parameters {name}. Value: {value[:100]}. "
            f"'{value[:100]}' is not a 'date-time'"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _regex(name: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise exception.Invalid(
            message=f"Invalid input for query parameters {name}. Value: {pattern[:100]}. "
            f"It is no regular expression: {exc}"
        ) from None


def _matcher(name: str, field: str, how: str, value: str) -> Callable[[Instance], bool]:
    read = FIELDS[field]
    if how == "exact":
        return lambda i: str(read(i)) == value
    pattern = _regex(name, value)
    return lambda i: pattern.search(str(read(i))) is not None


def _predicates(
    one: Mapping[str, str], version: tuple[int, int], all_filters: bool
) -> tuple[list[Callable[[Instance], bool]], bool]:
    """A check per filter given, and whether one can match nothing."""
    checks: list[Callable[[Instance], bool]] = []
    empty = False
    if "name" in one:
        checks.append(_matcher("name", "display_name", "regex", one["name"]))
    if "reservation_id" in one:
        checks.append(_matcher("reservation_id", "reservation_id", "exact", one["reservation_id"]))
    if "flavor" in one:
        flavor = ref_id(one["flavor"])
        checks.append(lambda i: _flavor_id(i) == flavor)
    if "image" in one:
        image = ref_id(one["image"])
        checks.append(lambda i: FIELDS["image_ref"](i) == image)
    for name in ("ip", "ip6"):  # no server has an address
        if name in one:
            _regex(name, one[name])
            empty = True
    if "locked" in one and version >= (2, 73) and to_bool("locked", one["locked"]):
        empty = True  # qsched has no lock action: no server is locked
    if version >= (2, 26):
        checks += _tag_checks(one)
    if all_filters:
        for name, (field, how) in ADMIN_FILTERS.items():
            if name in one:
                checks.append(_matcher(name, field, how, one[name]))
    return checks, empty


def _tags(instance: Instance) -> frozenset[str]:
    return frozenset(_asked("tags", ())(instance))


def _tag_checks(one: Mapping[str, str]) -> list[Callable[[Instance], bool]]:
    """Nova's tag filters: every, any, not every, none of a comma-separated list."""
    checks: list[Callable[[Instance], bool]] = []
    for name in TAG_FILTERS:
        if name not in one:
            continue
        wanted = frozenset(t for t in one[name].split(",") if t)
        checks.append(_tag_check(name, wanted))
    return checks


def _tag_check(name: str, wanted: frozenset[str]) -> Callable[[Instance], bool]:
    def check(instance: Instance) -> bool:
        have = _tags(instance)
        if name == "tags":
            return wanted <= have
        if name == "tags-any":
            return bool(wanted & have)
        if name == "not-tags":
            return not wanted <= have
        return not wanted & have

    return check


#: Nova's sort keys (VALID_SORT_KEYS) besides those it ignores
SORT_KEYS = frozenset({
    "access_ip_v4", "access_ip_v6", "auto_disk_config", "availability_zone", "config_drive",
    "created_at", "display_description", "display_name", "host", "hostname", "image_ref",
    "instance_type_id", "kernel_id", "key_name", "launch_index", "launched_at", "locked_by",
    "node", "power_state", "progress", "project_id", "ramdisk_id", "root_device_name",
    "task_state", "terminated_at", "updated_at", "user_id", "uuid", "vm_state",
})  # fmt: skip


def _sort_keys(version: tuple[int, int]) -> tuple[frozenset[str], frozenset[str]]:
    """The sort keys Nova's schema takes at ``version``, and those of them it ignores."""
    if version >= (2, 75):
        return SORT_KEYS | {"locked"}, frozenset()
    if version >= (2, 73):
        return SORT_KEYS | IGNORED_SORT_KEYS, IGNORED_SORT_KEYS - {"locked"}
    return SORT_KEYS | IGNORED_SORT_KEYS, IGNORED_SORT_KEYS


def _sort(
    given: Mapping[str, Sequence[str]], version: tuple[int, int], is_admin: bool
) -> tuple[tuple[str, bool], ...]:
    """Nova's sort keys and directions, with created_at and uuid after them."""
    keys = [k.strip() for k in given.get("sort_key", [])]
    dirs = [d.strip() for d in given.get("sort_dir", [])]
    valid, ignored = _sort_keys(version)
    for key in keys:
        if key not in valid:
            raise exception.Invalid(
                message=f"Invalid input for query parameters sort_key. Value: {key[:100]}. "
                f"'{key[:100]}' is not one of {sorted(valid)}"
            )
    kept: list[tuple[str, str | None]] = []
    for n, key in enumerate(keys):
        if key in ignored:
            continue
        if key in _ADMIN_SORT_KEYS and not is_admin:
            raise exception.Forbidden(message=f"Only administrators can sort servers by {key}")
        kept.append((key, dirs[n] if n < len(dirs) else None))
    if len(dirs) > max(len(keys), 1):
        raise exception.Invalid(message="Sort direction size exceeds sort key size")
    default = dirs[0] if dirs else "desc"
    for direction in dirs:
        if direction not in ("asc", "desc"):
            raise exception.Invalid(message="Unknown sort direction, must be 'desc' or 'asc'")
    order = [(k, (d or default) == "desc") for k, d in kept]
    if not keys and not order:
        order = [("created_at", default == "desc")]
    fields = {k for k, _ in order}
    for tiebreak in ("created_at", "uuid"):
        if tiebreak not in fields:
            order.append((tiebreak, default == "desc"))
    return tuple(order)
