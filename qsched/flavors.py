"""Flavors and what a boot request asks for, parsed from Nova-style extra specs.

Pure functions, no I/O. Extra specs follow Nova's syntax::

    resources:VCPU=2            override the flavor's VCPU amount (0 removes it)
    resources:CUSTOM_GPU=1      more resources in the unnumbered group
    resources1:VGPU=1           granular group 1: all of it from one provider
    trait:HW_CPU_X86_AVX2=required
    trait1:CUSTOM_FAST=forbidden
    group_policy=isolate|none   required with two or more granular groups: without it
                                a boot ends NoValidHost, as Placement refuses the query
    same_subtree=1,2            the providers of groups 1 and 2 sit under one of them
                                (Placement's same_subtree: a GPU on the NUMA node)

    aggregate_instance_extra_specs:ssd=true
                                land in an aggregate whose metadata has ssd=true
                                (qsched.aggregates; exact values only)

Other namespaces (hw:, hw_rng:, ...) are carried but not interpreted here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.resources import DISK_GB, MEMORY_MB, VCPU, check_resource_class, check_trait

_RESOURCES = re.compile(r"^resources(\d*):(.+)$")
_TRAIT = re.compile(r"^trait(\d*):(.+)$")
#: A flavor name that serves as its scheduling class (a queue name) as it is.
_QUEUE_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: Nova's flavor names: 1-255 printable characters, no whitespace at either end.
_NAME = re.compile(r"^[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]{0,253}[^\s\x00-\x1f\x7f])?$")
#: Nova's flavor ids, as the create schema has them
_ID = re.compile(r"^(?! )[a-zA-Z0-9. _-]{1,255}(?<! )$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_INT = 2**31 - 1  # Nova's db_const.MAX_INT: the largest size it stores
MAX_RXTX_FACTOR = 3.40282e38  # Nova's SQL_SP_FLOAT_MAX
MAX_DESCRIPTION = 65535
#: Granular groups whose providers must share a subtree (Placement's same_subtree).
SAME_SUBTREE = "same_subtree"
#: Flavor extra specs matched against host aggregate metadata (qsched.aggregates).
AGGREGATE_SPEC_PREFIX = "aggregate_instance_extra_specs:"
_SPEC_OPERATOR = re.compile(r"^(<\w+>|s?==|!=|>=|<=|s!=|s>=|s<=|s<|s>)(\s|$)")


@dataclasses.dataclass(frozen=True)
class RequestGroup:
    """Resources and traits that one provider (granular) or one tree (unnumbered) satisfies."""

    suffix: str = ""
    resources: Mapping[str, int] = dataclasses.field(default_factory=dict)
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Flavor:
    """A flavor as the catalog keeps it.

    ``swap_mb`` and ``ephemeral_gb`` count into the DISK_GB a boot asks for, as
    Nova's placement request counts them. ``rxtx_factor`` and ``description`` are
    shown, not acted on. ``projects`` are those granted a private flavor
    (os-flavor-access); the catalog keeps them, boot messages do not carry them.
    """

    name: str
    vcpus: int
    ram_mb: int
    disk_gb: int = 0
    id: str = ""
    extra_specs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    is_public: bool = True
    swap_mb: int = 0
    ephemeral_gb: int = 0
    rxtx_factor: float = 1.0
    description: str | None = None
    projects: frozenset[str] = frozenset()

    @property
    def flavor_id(self) -> str:
        return self.id or self.name

    @property
    def class_key(self) -> str:
        """The flavor's part of a scheduling class name: the name itself when a queue
        name may hold it, else a stable form that may: ``f<letters>.<sha256 of the
        name>``, longer than any name used as it is, so the two cannot meet."""
        if _QUEUE_SAFE.match(self.name):
            return self.name
        digest = hashlib.sha256(self.name.encode("utf-8", "surrogatepass")).hexdigest()
        return f"f{_UNSAFE.sub('_', self.name)[:60]}.{digest}"

    def visible_to(self, project_id: str | None) -> bool:
        """Whether a project that is no admin sees the flavor: public, or granted it."""
        return self.is_public or project_id in self.projects

    def to_dict(self) -> dict[str, Any]:
        """What a boot request and a scheduling class carry of the flavor."""
        data: dict[str, Any] = {
            "name": self.name,
            "id": self.flavor_id,
            "vcpus": self.vcpus,
            "ram_mb": self.ram_mb,
            "disk_gb": self.disk_gb,
            "extra_specs": dict(self.extra_specs),
        }
        # Only when set, so that the forms of flavors without them stay as they were.
        if self.swap_mb:
            data["swap_mb"] = self.swap_mb
        if self.ephemeral_gb:
            data["ephemeral_gb"] = self.ephemeral_gb
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Flavor:
        """Read :meth:`to_dict` back, checked.

        :raises Invalid: the flavor does not pass :func:`check_flavor`.
        """
        return check_flavor(
            cls(
                name=data["name"],
                id=data.get("id", ""),
                vcpus=data["vcpus"],
                ram_mb=data["ram_mb"],
                disk_gb=data.get("disk_gb", 0),
                extra_specs=dict(data.get("extra_specs") or {}),
                swap_mb=data.get("swap_mb", 0),
                ephemeral_gb=data.get("ephemeral_gb", 0),
            )
        )

    @property
    def disk_request_gb(self) -> int:
        """The DISK_GB a boot asks for: root, ephemeral and swap (rounded up to whole
        GiB), as Nova's placement request adds them up."""
        return self.disk_gb + self.ephemeral_gb + -(-self.swap_mb // 1024)


def check_flavor(flavor: Flavor) -> Flavor:
    """Validate names, sizes and extra specs; return the flavor or raise Invalid."""
    if not isinstance(flavor.name, str) or not _NAME.match(flavor.name):
        raise exception.Invalid(
            reason=f"flavor name {flavor.name!r} must be 1 to 255 printable characters "
            "without leading or trailing whitespace"
        )
    sizes = (("vcpus", 1), ("ram_mb", 1), ("disk_gb", 0), ("swap_mb", 0), ("ephemeral_gb", 0))
    for field, low in sizes:
        value = getattr(flavor, field)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_INT:
            raise exception.Invalid(
                reason=f"flavor {field} must be an integer from {low} to {MAX_INT}"
            )
    factor = flavor.rxtx_factor
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not (0 < factor <= MAX_RXTX_FACTOR)
    ):
        raise exception.Invalid(
            reason=f"'rxtx_factor' argument must be a float between 0 and {MAX_RXTX_FACTOR:g}"
        )
    description = flavor.description
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION
    ):
        raise exception.Invalid(
            reason=f"flavor description must be text of at most {MAX_DESCRIPTION} characters"
        )
    request_groups(flavor)
    return flavor


def ref_id(ref: str | int) -> str:
    """The id a reference names: an id, or a link whose last part is one (``flavorRef``,
    ``imageRef``, a list's ``flavor`` and ``image`` filters)."""
    return str(ref).rstrip("/").rsplit("/", 1)[-1]


def check_flavor_id(flavor_id: str) -> str:
    """Return a flavor id of Nova's form (as a client may write it), or raise Invalid."""
    if not _ID.match(flavor_id):
        raise exception.Invalid(
            reason=f"flavor id {flavor_id!r} must be 1 to 255 of letters, digits, spaces, "
            "'.', '_', '-', without a space at either end"
        )
    return flavor_id


def request_groups(flavor: Flavor) -> tuple[RequestGroup, ...]:
    """What the flavor asks of providers: the unnumbered group first, then granular ones.

    :raises Invalid: a malformed resources or trait spec, or an unknown class or trait.
    """
    resources: dict[str, dict[str, int]] = {"": {VCPU: flavor.vcpus, MEMORY_MB: flavor.ram_mb}}
    if flavor.disk_request_gb:
        resources[""][DISK_GB] = flavor.disk_request_gb
    required: dict[str, set[str]] = {}
    forbidden: dict[str, set[str]] = {}
    for key, value in sorted(flavor.extra_specs.items()):
        if match := _RESOURCES.match(key):
            suffix, rc = match.groups()
            resources.setdefault(suffix, {})[check_resource_class(rc)] = _spec_amount(key, value)
        elif match := _TRAIT.match(key):
            suffix, trait = match.groups()
            target = {"required": required, "forbidden": forbidden}.get(str(value))
            if target is None:
                raise exception.Invalid(reason=f"{key}={value!r}: use required or forbidden")
            target.setdefault(suffix, set()).add(check_trait(trait))
        elif key == "group_policy" and value not in ("isolate", "none"):
            raise exception.Invalid(reason=f"group_policy={value!r}: use isolate or none")
        elif key == SAME_SUBTREE:
            _check_same_subtree(str(value))
        elif key.startswith(AGGREGATE_SPEC_PREFIX):
            _check_aggregate_spec(key, str(value))
    suffixes = sorted(set(resources) | set(required) | set(forbidden), key=lambda s: (s != "", s))
    groups = []
    for suffix in suffixes:
        amounts = {rc: n for rc, n in resources.get(suffix, {}).items() if n}
        if suffix and not amounts:
            raise exception.Invalid(reason=f"granular group {suffix} asks for no resources")
        groups.append(
            RequestGroup(
                suffix,
                amounts,
                frozenset(required.get(suffix, ())),
                frozenset(forbidden.get(suffix, ())),
            )
        )
    result = tuple(groups)
    granular = {g.suffix for g in result if g.suffix}
    for suffix in same_subtree(flavor):
        if suffix not in granular:
            raise exception.Invalid(
                reason=f"same_subtree names group {suffix}, which the flavor does not have "
                f"(its granular groups: {', '.join(sorted(granular)) or 'none'})"
            )
    return result


#: Placement's 400 for a query with two or more granular groups and no group_policy.
GROUP_POLICY_REQUIRED = (
    'The "group_policy" parameter is required when specifying more than one '
    '"resources{N}" parameter.'
)
#: What Nova's scheduler logs before sending such a query (nova/scheduler/utils.py).
GROUP_POLICY_WARNING = (
    "There is more than one numbered request group in the allocation candidate query but "
    "the flavor did not specify any group policy. This query would fail in placement due "
    "to the missing group policy. If you specified more than one numbered request group "
    "in the flavor extra_spec then you need to specify the group policy in the flavor "
    "extra_spec. If it is OK to let these groups be satisfied by overlapping resource "
    "providers then use 'group_policy': 'none'. If you want each group to be satisfied "
    "from a separate resource provider then use 'group_policy': 'isolate'."
)


def missing_group_policy(flavor: Flavor) -> str | None:
    """Placement's refusal if the flavor has two or more granular groups and no
    ``group_policy``, else None. Nova accepts such a flavor and its boots, and the
    boots end NoValidHost when Placement answers 400: so does qsched.

    :raises Invalid: as :func:`request_groups`.
    """
    if "group_policy" in flavor.extra_specs:
        return None
    granular = [group for group in request_groups(flavor) if group.suffix]
    return GROUP_POLICY_REQUIRED if len(granular) >= 2 else None


def same_subtree(flavor: Flavor) -> frozenset[str]:
    """The granular group suffixes of ``same_subtree=1,2``: the providers that satisfy
    them must all sit under one of them (Placement's ``same_subtree``); empty without."""
    value = flavor.extra_specs.get(SAME_SUBTREE)
    if not value:
        return frozenset()
    return frozenset(part.strip() for part in str(value).split(","))


def _check_same_subtree(value: str) -> None:
    parts = [part.strip() for part in value.split(",")]
    if len(parts) < 2 or not all(part.isdigit() for part in parts):
        raise exception.Invalid(
            reason=f"same_subtree={value!r}: name two or more granular group numbers, "
            "e.g. same_subtree=1,2"
        )


def _check_aggregate_spec(key: str, value: str) -> None:
    """An ``aggregate_instance_extra_specs:<key>=<value>`` qsched can match: an exact value.

    :raises Invalid: nothing after the prefix, or a value with one of the operators
        Nova's filter knows (``<in>``, ``<or>``, ``s==``, ``>=``, ...), which qsched
        does not evaluate.
    """
    if not key[len(AGGREGATE_SPEC_PREFIX) :]:
        raise exception.Invalid(reason=f"{key!r} names no aggregate metadata key")
    if _SPEC_OPERATOR.match(value.strip()):
        raise exception.Invalid(
            reason=f"{key}={value!r}: qsched matches aggregate metadata by exact value only; "
            "drop the operator"
        )


def _spec_amount(key: str, value: object) -> int:
    try:
        amount = int(str(value))
    except ValueError:
        amount = -1
    if amount < 0:
        raise exception.Invalid(reason=f"{key}={value!r}: the amount must be an integer >= 0")
    return amount


@dataclasses.dataclass(frozen=True)
class Constraints:
    """What a request adds to its flavor: zone, image traits, aggregate membership.

    Aggregates as Placement's ``member_of`` has them: ``member_of`` lists aggregates a
    node must be in, every one (repeated ``member_of=<uuid>``); each group of
    ``member_of_any`` needs one of its aggregates (``member_of=in:<a>,<b>``; an empty
    group matches nothing); a node in any of ``forbidden_aggregates`` is refused
    (``member_of=!in:<a>,<b>``).
    """

    availability_zone: str | None = None
    required_traits: frozenset[str] = frozenset()
    forbidden_traits: frozenset[str] = frozenset()
    member_of: frozenset[str] = frozenset()
    member_of_any: tuple[frozenset[str], ...] = ()
    forbidden_aggregates: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # One order for the groups, so that equal constraints compare and hash equal.
        groups = tuple(sorted({frozenset(g) for g in self.member_of_any}, key=sorted))
        object.__setattr__(self, "member_of_any", groups)

    def __bool__(self) -> bool:
        return bool(self.availability_zone) or any(
            (self.required_traits, self.forbidden_traits, self.member_of, self.member_of_any,
             self.forbidden_aggregates)
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (names sorted, so equal constraints give equal maps)."""
        return {
            "availability_zone": self.availability_zone,
            "required_traits": sorted(self.required_traits),
            "forbidden_traits": sorted(self.forbidden_traits),
            "member_of": sorted(self.member_of),
            "member_of_any": [sorted(group) for group in self.member_of_any],
            "forbidden_aggregates": sorted(self.forbidden_aggregates),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Constraints:
        """Read :meth:`to_dict` back (other keys are ignored, a missing one is no constraint).

        :raises Invalid: a zone that is not a string, or names that are not a list of strings.
        """
        groups = raw.get("member_of_any") or ()
        if isinstance(groups, str | bytes):
            raise exception.Invalid(reason=f"member_of_any {groups!r} is not a list of lists")
        return cls(
            availability_zone=_zone(raw.get("availability_zone")),
            required_traits=_names("required_traits", raw.get("required_traits")),
            forbidden_traits=_names("forbidden_traits", raw.get("forbidden_traits")),
            member_of=_names("member_of", raw.get("member_of")),
            member_of_any=tuple(_names("member_of_any", group) for group in groups),
            forbidden_aggregates=_names("forbidden_aggregates", raw.get("forbidden_aggregates")),
        )

    def digest(self) -> str:
        """A short hash, stable across processes and releases."""
        parts = [
            self.availability_zone or "",
            ",".join(sorted(self.required_traits)),
            ",".join(sorted(self.forbidden_traits)),
            ",".join(sorted(self.member_of)),
        ]
        # Added later: only present when used, so that older classes keep their names.
        if self.member_of_any or self.forbidden_aggregates:
            parts.append(";".join(",".join(sorted(g)) for g in self.member_of_any))
            parts.append(",".join(sorted(self.forbidden_aggregates)))
        canonical = "|".join(parts)
        return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _zone(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise exception.Invalid(reason=f"availability_zone {value!r} is not a string")


def _names(field: str, value: Any) -> frozenset[str]:
    items = value or ()
    if isinstance(items, str | bytes) or not all(isinstance(i, str) for i in items):
        raise exception.Invalid(reason=f"{field} {value!r} is not a list of names")
    return frozenset(items)


#: Nova's flavor list sort keys and how qsched reads each; ``vcpu_weight`` is None for
#: every qsched flavor (it keeps none), ``disabled`` False (flavors are never disabled).
SORT_KEYS: Mapping[str, Any] = {
    "flavorid": lambda f: f.flavor_id,
    "name": lambda f: f.name,
    "memory_mb": lambda f: f.ram_mb,
    "vcpus": lambda f: f.vcpus,
    "root_gb": lambda f: f.disk_gb,
    "ephemeral_gb": lambda f: f.ephemeral_gb,
    "swap": lambda f: f.swap_mb,
    "rxtx_factor": lambda f: f.rxtx_factor,
    "is_public": lambda f: f.is_public,
    "description": lambda f: (f.description is not None, f.description or ""),
    "disabled": lambda f: False,
    "vcpu_weight": lambda f: 0,
}
#: Nova's sort keys for what qsched does not record: refused rather than ignored.
UNRECORDED_SORT_KEYS = frozenset({"created_at", "updated_at", "id"})


@dataclasses.dataclass(frozen=True)
class FlavorQuery:
    """A flavor listing as Nova's ``GET /flavors`` asks for it.

    ``is_public``: True for public flavors and the private ones the caller's project
    is granted, False for private ones only, None for all (the last two for admins);
    ``min_ram_mb``/``min_disk_gb``: at least that much; sorted by ``sort_key`` (one of
    :data:`SORT_KEYS`; the flavor id breaks ties) in ``sort_dir``; at most ``limit``
    flavors after the one whose id is ``marker``.
    """

    is_public: bool | None = True
    min_ram_mb: int | None = None
    min_disk_gb: int | None = None
    sort_key: str = "flavorid"
    sort_dir: str = "asc"
    limit: int | None = None
    marker: str | None = None


def select(
    catalog: Sequence[Flavor], query: FlavorQuery, project_id: str | None, admin: bool
) -> list[Flavor]:
    """The page of ``catalog`` that ``query`` asks for, as the caller may see it
    (O(flavors): the catalog is small and not per host).

    A caller that is no admin lists public flavors and the private ones granted to
    its project, whatever ``query.is_public`` says (as Nova).

    :raises Invalid: an unknown sort key or direction.
    :raises MarkerNotFound: ``marker`` is no flavor the caller may see.
    """
    order = SORT_KEYS.get(query.sort_key)
    if order is None or query.sort_dir not in ("asc", "desc"):
        raise exception.Invalid(reason=f"cannot sort flavors by {query.sort_key} {query.sort_dir}")
    public = query.is_public if admin else True
    chosen = [f for f in catalog if _listed(f, public, project_id) and _big_enough(f, query)]
    found = sorted(chosen, key=lambda f: (order(f), f.flavor_id), reverse=query.sort_dir == "desc")
    if query.marker is not None:
        seen = {f.flavor_id: f for f in catalog if admin or f.visible_to(project_id)}
        marker = seen.get(query.marker)
        if marker is None:
            raise exception.MarkerNotFound(marker=query.marker)
        here = (order(marker), marker.flavor_id)
        after = (lambda k: k < here) if query.sort_dir == "desc" else (lambda k: k > here)
        found = [f for f in found if after((order(f), f.flavor_id))]
    return found if query.limit is None else found[: query.limit]


def _listed(flavor: Flavor, public: bool | None, project_id: str | None) -> bool:
    if public is None:
        return True
    if public:
        return flavor.visible_to(project_id)
    return not flavor.is_public


def _big_enough(flavor: Flavor, query: FlavorQuery) -> bool:
    return (query.min_ram_mb is None or flavor.ram_mb >= query.min_ram_mb) and (
        query.min_disk_gb is None or flavor.disk_gb >= query.min_disk_gb
    )


class FlavorAccessExists(exception.Conflict):
    msg_fmt = "Flavor access already exists for flavor {flavor} and project {project} combination."


class FlavorAccessNotFound(exception.NotFound):
    msg_fmt = "Flavor access not found for {flavor} / {project} combination."


class PublicFlavorAccess(exception.Conflict):
    """Granting a public flavor (409 from 2.7; before, Nova adds the grant, which changes
    nothing while the flavor stays public)."""

    msg_fmt = "Can not add access to a public flavor."


class NoAccessListForPublic(exception.NotFound):
    msg_fmt = "Access list not available for public flavors."


def grant(flavor: Flavor, project_id: str, refuse_public: bool) -> Flavor:
    """``flavor`` with ``project_id`` granted.

    :raises PublicFlavorAccess: the flavor is public and ``refuse_public``.
    :raises FlavorAccessExists: the project holds it already.
    """
    if refuse_public and flavor.is_public:
        raise PublicFlavorAccess()
    if project_id in flavor.projects:
        raise FlavorAccessExists(flavor=flavor.flavor_id, project=project_id)
    return dataclasses.replace(flavor, projects=flavor.projects | {project_id})


def revoke(flavor: Flavor, project_id: str) -> Flavor:
    """``flavor`` without the grant of ``project_id``.

    :raises FlavorAccessNotFound: the project holds none.
    """
    if project_id not in flavor.projects:
        raise FlavorAccessNotFound(flavor=flavor.flavor_id, project=project_id)
    return dataclasses.replace(flavor, projects=flavor.projects - {project_id})
