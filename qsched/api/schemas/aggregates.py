"""``/os-aggregates``: create, update and the actions ``add_host``, ``remove_host`` and
``set_metadata`` (Nova's schemas/aggregates.py)."""

from __future__ import annotations

from typing import Any

from qsched.api.schemas.parameter_types import MAX_TEXT, fqdn, name
from qsched.api.schemas.validation import compiled

_aggregate_zone = {
    "anyOf": [name, {"type": "null"}],
    "x-message": "must be 1 to 255 printable characters without leading or trailing spaces, "
    "or null",
}

host_name = {**fqdn, "x-message": "must be a host name: 1 to 255 of letters, digits, '-', '.', '_'"}

aggregate_create = {
    "type": "object",
    "properties": {
        "aggregate": {
            "type": "object",
            "properties": {"name": name, "availability_zone": _aggregate_zone},
            "required": ["name"],
            "additionalProperties": False,
        }
    },
    "required": ["aggregate"],
    "additionalProperties": False,
}

aggregate_update = {
    "type": "object",
    "properties": {
        "aggregate": {
            "type": "object",
            "properties": {"name": name, "availability_zone": _aggregate_zone},
            "additionalProperties": False,
            "anyOf": [{"required": ["name"]}, {"required": ["availability_zone"]}],
            "x-message": "must give a name, an availability_zone or both",
        }
    },
    "required": ["aggregate"],
    "additionalProperties": False,
}


def _host_action(action: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            action: {
                "type": "object",
                "properties": {"host": host_name},
                "required": ["host"],
                "additionalProperties": False,
            }
        },
        "required": [action],
        "additionalProperties": False,
    }


aggregate_set_metadata = {
    "type": "object",
    "properties": {
        "set_metadata": {
            "type": "object",
            "properties": {
                "metadata": {
                    "type": "object",
                    "maxProperties": 128,
                    "propertyNames": {"pattern": "^[a-zA-Z0-9-_:. ]{1,255}$"},
                    "additionalProperties": {
                        "type": ["string", "null"],
                        "maxLength": MAX_TEXT,
                        "x-message": f"must be text of at most {MAX_TEXT} characters, or "
                        "null to remove the key",
                    },
                }
            },
            "required": ["metadata"],
            "additionalProperties": False,
        }
    },
    "required": ["set_metadata"],
    "additionalProperties": False,
}

AGGREGATE_CREATE = compiled(aggregate_create)
AGGREGATE_UPDATE = compiled(aggregate_update)
AGGREGATE_ACTIONS = {
    "add_host": compiled(_host_action("add_host")),
    "remove_host": compiled(_host_action("remove_host")),
    "set_metadata": compiled(aggregate_set_metadata),
}
