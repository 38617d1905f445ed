"""Pure checks on resource classes, traits, UUIDs and amounts (no I/O)."""

from __future__ import annotations

import re
import uuid as uuidlib

import os_resource_classes
import os_traits

from qsched import exception

_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]+$")
_STANDARD_CLASSES = frozenset(os_resource_classes.STANDARDS)
_STANDARD_TRAITS = frozenset(os_traits.get_traits())

VCPU = os_resource_classes.VCPU
MEMORY_MB = os_resource_classes.MEMORY_MB
DISK_GB = os_resource_classes.DISK_GB
#: A provider with this trait shares its inventory with every provider tree whose root
#: is in one of its aggregates (Placement's "sharing provider").
SHARES_VIA_AGGREGATE = os_traits.MISC_SHARES_VIA_AGGREGATE


def check_resource_class(name: object) -> str:
    """Return ``name`` if it is a standard or CUSTOM_ resource class, else raise."""
    if isinstance(name, str) and (name in _STANDARD_CLASSES or _CUSTOM.match(name)):
        return name
    raise exception.InvalidResourceClass(resource_class=name)


def check_trait(name: object) -> str:
    """Return ``name`` if it is a standard os-traits trait or CUSTOM_, else raise."""
    if isinstance(name, str) and (name in _STANDARD_TRAITS or _CUSTOM.match(name)):
        return name
    raise exception.InvalidTrait(trait=name)


def check_uuid(value: object, what: str = "UUID") -> str:
    """Return the canonical (lower-case, dashed) form of a UUID string, else raise."""
    if isinstance(value, str):
        try:
            canonical = str(uuidlib.UUID(value))
        except ValueError:
            pass
        else:
            if canonical == value.lower():
                return canonical
    raise exception.InvalidUUID(what=what, value=value)


def check_aggregate(value: object) -> str:
    """Aggregates are UUIDs, as in Placement."""
    return check_uuid(value, "Aggregate")
