"""Flavors and what a boot request asks for, parsed from Nova-style extra specs.

Pure functions, no I/O. Extra specs follow Nova's syntax::

    resources:VCPU=2            override the flavor's VCPU amount (0 removes it)
    resources:CUSTOM_GPU=1      more resources in the unnumbered group
    resources1:VGPU=1           granular group 1: all of it from one provider
    trait:HW_CPU_X86_AVX2=required
    trait1:CUSTOM_FAST=forbidden
    group_policy=isolate|none

    aggregate_instance_extra_specs:ssd=true
                                land in an aggregate whose metadata has ssd=true
                                (qsched.aggregates; exact values only)

Other namespaces (hw:, hw_rng:, ...) are carried but not interpreted here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from qsched import exception
from qsched.resources import DISK_GB, MEMORY_MB, VCPU, check_resource_class, check_trait

_RESOURCES = re.compile(r"^resources(\d*):(.+)$")
_TRAIT = re.compile(r"^trait(\d*):(.+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
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
    name: str
    vcpus: int
    ram_mb: int
    disk_gb: int = 0
    id: str = ""
    extra_specs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    is_public: bool = True

    @property
    def flavor_id(self) -> str:
        return self.id or self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.flavor_id,
            "vcpus": self.vcpus,
            "ram_mb": self.ram_mb,
            "disk_gb": self.disk_gb,
            "extra_specs": dict(self.extra_specs),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Flavor:
        return check_flavor(
            cls(
                name=data["name"],
                id=data.get("id", ""),
                vcpus=data["vcpus"],
                ram_mb=data["ram_mb"],
                disk_gb=data.get("disk_gb", 0),
                extra_specs=dict(data.get("extra_specs") or {}),
            )
        )


def check_flavor(flavor: Flavor) -> Flavor:
    """Validate names, sizes and extra specs; return the flavor or raise Invalid."""
    if not isinstance(flavor.name, str) or not _NAME.match(flavor.name):
        raise exception.Invalid(
            reason=f"flavor name {flavor.name!r} must be 1-64 of letters, digits, '.', '_', '-'"
        )
    for field, low in (("vcpus", 1), ("ram_mb", 1), ("disk_gb", 0)):
        value = getattr(flavor, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise exception.Invalid(reason=f"flavor {field} must be an integer >= {low}")
    request_groups(flavor)
    return flavor


def request_groups(flavor: Flavor) -> tuple[RequestGroup, ...]:
    """What the flavor asks of providers: the unnumbered group first, then granular ones.

    :raises Invalid: a malformed resources or trait spec, or an unknown class or trait.
    """
    resources: dict[str, dict[str, int]] = {"": {VCPU: flavor.vcpus, MEMORY_MB: flavor.ram_mb}}
    if flavor.disk_gb:
        resources[""][DISK_GB] = flavor.disk_gb
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
    return tuple(groups)


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
