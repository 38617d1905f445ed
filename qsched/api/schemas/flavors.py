"""``/flavors``: create (2.1; 2.55 adds the description), update, extra specs and
tenant access (Nova's schemas/flavor_manage.py, flavors_extraspecs.py and
flavor_access.py)."""

from __future__ import annotations

from typing import Any

from qsched.api.schemas.parameter_types import MAX_INT, MAX_TEXT, boolean, name
from qsched.api.schemas.validation import compiled

_count = {
    "type": ["integer", "string"],
    "pattern": "^[0-9]{1,10}$",
    "format": "int32",
    "minimum": 0,
    "maximum": MAX_INT,
    "x-message": f"must be a whole number (at most {MAX_INT})",
}

flavor_id = {
    "type": ["string", "number", "null"],
    "minLength": 1,
    "maxLength": 255,
    "pattern": r"^(?! )[a-zA-Z0-9. _-]+(?<! )$",
    "x-message": "must be 1 to 255 of letters, digits, spaces, '.', '_', '-' (or null)",
}

extra_specs = {
    "type": "object",
    "maxProperties": 128,
    "propertyNames": {"pattern": "^[a-zA-Z0-9-_:. ]{1,255}$"},
    "additionalProperties": {
        "type": ["string", "integer", "number", "boolean"],
        "maxLength": MAX_TEXT,
        "format": "text255",
        "x-message": f"must be text or a number of at most {MAX_TEXT} characters",
    },
}

#: Nova's flavor_param_positive
_flavor_positive = {
    **_count,
    "minimum": 1,
    "x-message": f"must be a whole number from 1 to {MAX_INT}",
}
#: Nova's flavor description (2.55): printable text, line breaks and tabs allowed
flavor_description = {
    "type": ["string", "null"],
    "maxLength": 65535,
    "pattern": r"^[^\x00-\x08\x0e-\x1f\x7f]*$",
    "x-message": "must be printable text of at most 65535 characters (or null)",
}

_flavor_fields: dict[str, Any] = {
    "name": name,
    "id": flavor_id,
    "ram": _flavor_positive,
    "vcpus": _flavor_positive,
    "disk": _count,
    "OS-FLV-EXT-DATA:ephemeral": _count,
    "swap": _count,
    "rxtx_factor": {
        "type": ["number", "string"],
        "pattern": r"^[0-9]+(\.[0-9]+)?$",
        "exclusiveMinimum": 0,
        "maximum": 3.40282e38,
        "x-message": "must be a number above 0 (at most 3.40282e+38)",
    },
    "os-flavor-access:is_public": boolean,
    # qsched extension: extra specs at creation (Nova sets them afterwards).
    "extra_specs": extra_specs,
}


def _flavor_create(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "flavor": {
                "type": "object",
                "properties": fields,
                "required": ["name", "ram", "vcpus", "disk"],
                "additionalProperties": False,
            }
        },
        "required": ["flavor"],
        "additionalProperties": False,
    }


flavor_update = {
    "type": "object",
    "properties": {
        "flavor": {
            "type": "object",
            "properties": {"description": flavor_description},
            "required": ["description"],
            "additionalProperties": False,
        }
    },
    "required": ["flavor"],
    "additionalProperties": False,
}

#: PUT .../os-extra_specs/{key}: exactly one spec
extra_spec_update = {**extra_specs, "minProperties": 1, "maxProperties": 1}


def _tenant_action(action: str) -> dict[str, Any]:
    tenant = {"type": "string", "minLength": 1, "maxLength": 255}
    return {
        "type": "object",
        "properties": {
            action: {
                "type": "object",
                "properties": {"tenant": tenant},
                "required": ["tenant"],
                "additionalProperties": False,
            }
        },
        "required": [action],
        "additionalProperties": False,
    }


extra_specs_set = {
    "type": "object",
    "properties": {"extra_specs": extra_specs},
    "required": ["extra_specs"],
    "additionalProperties": False,
}

#: (first microversion, validator) of the flavor create body, latest first
FLAVOR_CREATE = (
    ((2, 55), compiled(_flavor_create({**_flavor_fields, "description": flavor_description}))),
    ((2, 1), compiled(_flavor_create(_flavor_fields))),
)
FLAVOR_UPDATE = compiled(flavor_update)
EXTRA_SPEC_UPDATE = compiled(extra_spec_update)
FLAVOR_ACTIONS = {
    "addTenantAccess": compiled(_tenant_action("addTenantAccess")),
    "removeTenantAccess": compiled(_tenant_action("removeTenantAccess")),
}
EXTRA_SPECS_SET = compiled(extra_specs_set)
