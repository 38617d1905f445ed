"""JSON schemas of the request bodies, in Nova's shapes, and their compiled validators.

Validators are compiled once at import; :func:`validate` gives Nova's message
("Invalid input for field/attribute ...") for the most relevant error. A
subschema may carry ``x-message``: a plainer explanation used instead of the
validator's own words. Two formats of our own check what a plain schema cannot
(Nova checks them in code after its schema): ``int32`` bounds a number written as
a string of digits, ``text255`` bounds a number by the length of its text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator

from qsched import exception

MAX_INT = 2**31 - 1  # Nova's db_const.MAX_INT: the largest size or count it stores
MAX_TEXT = 255
_DIGITS = re.compile(r"[0-9]{1,10}")

_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("int32")
def _int32(value: object) -> bool:
    """A string of digits (the pattern checks that) stands for a number <= MAX_INT."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value) <= MAX_INT
    return True


@_FORMATS.checks("text255")
def _text255(value: object) -> bool:
    """A number is kept as its text (Nova stores extra specs so): at most MAX_TEXT of it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return len(str(value)) <= MAX_TEXT
    return True


# -- parameter types (Nova's parameter_types, reduced to what qsched reads) --

_PRINTABLE = r"[^\x00-\x1f\x7f]"
_EDGE = r"[^\s\x00-\x1f\x7f]"

name = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "pattern": f"^{_EDGE}(?:{_PRINTABLE}*{_EDGE})?$",
    "x-message": "must be 1 to 255 printable characters without leading or trailing spaces",
}

uuid_like = {
    "type": "string",
    "pattern": "^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$",
    "x-message": "must be a UUID",
}

image_ref = {
    "anyOf": [uuid_like, {"type": "string", "maxLength": 0}],
    "x-message": "must be an image UUID (or empty when booting from a volume)",
}

flavor_ref = {
    "type": ["string", "integer"],
    "minLength": 1,
    "maxLength": 255,
    "minimum": 0,
    "x-message": "must be a flavor id (a string of 1 to 255 characters or an integer)",
}

metadata = {
    "type": "object",
    "maxProperties": 128,
    "propertyNames": {"pattern": "^[a-zA-Z0-9-_:. ]{1,255}$"},
    "additionalProperties": {"type": "string", "maxLength": 255},
}

#: Nova's multiple create: how many servers (an integer, or its digits as a string)
_server_count = {
    "type": ["integer", "string"],
    "pattern": "^[0-9]{1,10}$",
    "format": "int32",
    "minimum": 1,
    "minLength": 1,
    "x-message": "must be a whole number of servers, at least 1",
}
#: Nova's parameter_types.boolean
TRUE = (True, "True", "TRUE", "true", "1", "ON", "On", "on", "YES", "Yes", "yes")
FALSE = (False, "False", "FALSE", "false", "0", "OFF", "Off", "off", "NO", "No", "no")
boolean = {"enum": [*TRUE, *FALSE], "x-message": "must be a boolean (true or false)"}

_loose_string = {"type": "string", "maxLength": 255}

server_create = {
    "type": "object",
    "properties": {
        "server": {
            "type": "object",
            "properties": {
                "name": name,
                "flavorRef": flavor_ref,
                "imageRef": image_ref,
                "availability_zone": name,
                "metadata": metadata,
                "min_count": _server_count,
                "max_count": _server_count,
                # Accepted for client compatibility and ignored (no network, key or
                # config drive service behind qsched).
                "networks": {"type": ["string", "array"], "maxItems": 64},
                "key_name": _loose_string,
                "security_groups": {"type": "array", "maxItems": 64},
                "user_data": {"type": "string", "maxLength": 65535},
                "config_drive": {"type": ["boolean", "string"]},
                "OS-DCF:diskConfig": {"enum": ["AUTO", "MANUAL"]},
                "accessIPv4": _loose_string,
                "accessIPv6": _loose_string,
                "adminPass": _loose_string,
                "description": {"type": ["string", "null"], "maxLength": 255},
                "tags": {"type": "array", "maxItems": 50, "items": _loose_string},
                "return_reservation_id": boolean,
            },
            "required": ["name", "flavorRef", "imageRef"],
            "additionalProperties": False,
        },
        "os:scheduler_hints": {"type": "object", "maxProperties": 64},
        "OS-SCH-HNT:scheduler_hints": {"type": "object", "maxProperties": 64},
    },
    "required": ["server"],
    "additionalProperties": False,
}

_count = {
    "type": ["integer", "string"],
    "pattern": "^[0-9]{1,10}$",
    "format": "int32",
    "minimum": 0,
    "maximum": MAX_INT,
    "x-message": f"must be a whole number (at most {MAX_INT})",
}

flavor_id = {
    "type": ["string", "null"],
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

flavor_create = {
    "type": "object",
    "properties": {
        "flavor": {
            "type": "object",
            "properties": {
                "name": name,
                "id": flavor_id,
                "ram": _count,
                "vcpus": _count,
                "disk": _count,
                "OS-FLV-EXT-DATA:ephemeral": {
                    "enum": [0, "0"],
                    "x-message": "must be 0: ephemeral disks are not supported",
                },
                "swap": {"enum": [0, "0", ""], "x-message": "must be 0: swap is not supported"},
                "rxtx_factor": {"type": ["number", "string"]},
                "os-flavor-access:is_public": {"type": ["boolean", "string"]},
                "description": {"type": ["string", "null"], "maxLength": 65535},
                # qsched extension: extra specs at creation (Nova sets them afterwards).
                "extra_specs": extra_specs,
            },
            "required": ["name", "ram", "vcpus", "disk"],
            "additionalProperties": False,
        }
    },
    "required": ["flavor"],
    "additionalProperties": False,
}

extra_specs_set = {
    "type": "object",
    "properties": {"extra_specs": extra_specs},
    "required": ["extra_specs"],
    "additionalProperties": False,
}


# -- os-services (Nova's schemas/services.py) --


fqdn = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[a-zA-Z0-9-._]*$"}
_reason = {"type": "string", "minLength": 1, "maxLength": 255}

_service_fields: dict[str, Any] = {
    "host": fqdn,
    "binary": {"type": "string", "minLength": 1, "maxLength": 255},
    "disabled_reason": _reason,
}
service_update = {
    "type": "object",
    "properties": _service_fields,
    "required": ["host", "binary"],
    "additionalProperties": False,
}
#: 2.11 adds forced_down to the same body
service_update_v211 = {
    **service_update,
    "properties": {**_service_fields, "forced_down": boolean},
}
service_update_v253 = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["enabled", "disabled"]},
        "disabled_reason": _reason,
        "forced_down": boolean,
    },
    "additionalProperties": False,
}


def to_bool(value: bool | str) -> bool:
    """A value :data:`boolean` accepted, as a bool."""
    return value in TRUE


# -- os-aggregates (Nova's schemas/aggregates.py) --

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


# -- server groups: Nova's create bodies of 2.1, 2.15 (soft policies) and 2.64 --

_HARD_POLICIES = ["anti-affinity", "affinity"]
_ALL_POLICIES = [*_HARD_POLICIES, "soft-anti-affinity", "soft-affinity"]

_positive = {**_server_count, "x-message": f"must be a whole number from 1 to {MAX_INT}"}


def _group_create(policies: list[str] | None) -> dict[str, Any]:
    """``policies`` (a list of one) before 2.64; None: 2.64's ``policy`` and ``rules``."""
    if policies is not None:
        props: dict[str, Any] = {
            "policies": {
                "type": "array",
                "prefixItems": [{"type": "string", "enum": policies}],
                "minItems": 1,
                "maxItems": 1,
                "items": False,
                "x-message": f"must be a list of one policy of {policies}",
            }
        }
    else:
        props = {
            "policy": {"type": "string", "enum": _ALL_POLICIES,
                       "x-message": f"must be one of {_ALL_POLICIES}"},
            "rules": {
                "type": "object",
                "properties": {"max_server_per_host": _positive},
                "additionalProperties": False,
            },
        }  # fmt: skip
    return {
        "type": "object",
        "properties": {
            "server_group": {
                "type": "object",
                "properties": {"name": name, **props},
                "required": ["name", "policies" if policies is not None else "policy"],
                "additionalProperties": False,
            }
        },
        "required": ["server_group"],
        "additionalProperties": False,
    }


#: the ``group`` hint: a server group's uuid, or a list of one (as Nova accepts)
group_hint = {
    "anyOf": [uuid_like, {"type": "array", "items": uuid_like, "minItems": 1, "maxItems": 1}],
    "x-message": "must be a server group UUID (qsched takes one group per server)",
}


# -- os-quota-sets (Nova's schemas/quota_sets.py) --

_quota = {
    "type": ["integer", "string"],
    "pattern": "^-?[0-9]+$",
    "minimum": -1,
    "maximum": MAX_INT,
    "x-message": f"must be a whole number from -1 (no limit) to {MAX_INT}",
}
_NETWORK_QUOTAS = ("fixed_ips", "floating_ips", "security_groups", "security_group_rules")
_FILE_QUOTAS = ("injected_files", "injected_file_content_bytes", "injected_file_path_bytes")
_QUOTAS = ("instances", "cores", "ram", "metadata_items", "key_pairs", "server_groups",
           "server_group_members", *_NETWORK_QUOTAS, *_FILE_QUOTAS)  # fmt: skip


def _quota_update(dropped: Sequence[str], key: str = "quota_set") -> dict[str, Any]:
    """A quota set update (with ``force``) or, for ``quota_class_set``, a class's."""
    fields: dict[str, Any] = {name: _quota for name in _QUOTAS if name not in dropped}
    if key == "quota_set":
        fields["force"] = boolean
    return {
        "type": "object",
        "properties": {
            key: {"type": "object", "properties": fields, "additionalProperties": False}
        },
        "required": [key],
        "additionalProperties": False,
    }


def _compile(schema: dict[str, Any]) -> Validator:
    cls = validators.validator_for(schema, default=Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, format_checker=_FORMATS)


SERVER_CREATE = _compile(server_create)
FLAVOR_CREATE = _compile(flavor_create)
EXTRA_SPECS_SET = _compile(extra_specs_set)
AGGREGATE_CREATE = _compile(aggregate_create)
AGGREGATE_UPDATE = _compile(aggregate_update)
AGGREGATE_ACTIONS = {
    "add_host": _compile(_host_action("add_host")),
    "remove_host": _compile(_host_action("remove_host")),
    "set_metadata": _compile(aggregate_set_metadata),
}
SERVICE_UPDATE = _compile(service_update)
SERVICE_UPDATE_V211 = _compile(service_update_v211)
SERVICE_UPDATE_V253 = _compile(service_update_v253)
#: (first microversion, validator) of the server group create body, latest first
SERVER_GROUP_CREATE = (
    ((2, 64), _compile(_group_create(None))),
    ((2, 15), _compile(_group_create(_ALL_POLICIES))),
    ((2, 1), _compile(_group_create(_HARD_POLICIES))),
)
GROUP_HINT = _compile(group_hint)
#: (first microversion, validator) of the quota set update body, latest first
QUOTA_SET_UPDATE = (
    ((2, 57), _compile(_quota_update((*_NETWORK_QUOTAS, *_FILE_QUOTAS)))),
    ((2, 36), _compile(_quota_update(_NETWORK_QUOTAS))),
    ((2, 1), _compile(_quota_update(()))),
)
#: ... and of a quota class's (Nova's schemas/quota_classes.py: networks go at 2.50)
QUOTA_CLASS_UPDATE = (
    ((2, 57), _compile(_quota_update((*_NETWORK_QUOTAS, *_FILE_QUOTAS), "quota_class_set"))),
    ((2, 50), _compile(_quota_update(_NETWORK_QUOTAS, "quota_class_set"))),
    ((2, 1), _compile(_quota_update((), "quota_class_set"))),
)


def validate(validator: Validator, body: Any) -> Any:
    """Return ``body`` if it matches, else raise Invalid with Nova's wording."""
    error = best_match(validator.iter_errors(body))
    if error is None:
        return body
    raise field_error(error.absolute_path, error.instance, _explanation(error))


def field_error(path: Sequence[Any], value: Any, explanation: str) -> exception.Invalid:
    """Nova's 400 for one field: "Invalid input for field/attribute <path>. Value: <value>.
    <explanation>" (``body`` for the whole body; a surrogate in a key shown escaped)."""
    where = "/".join(str(p) for p in path) or "body"
    where = where.encode("utf-8", "backslashreplace").decode("utf-8")
    return exception.Invalid(
        message=f"Invalid input for field/attribute {where}. Value: {_short(value)}. {explanation}"
    )


def query_int(name: str, value: str, maximum: int = MAX_INT) -> int:
    """A query parameter that must be a whole number from 0 to ``maximum`` (Nova's
    non_negative_integer, bounded): ASCII digits only, so neither '-1' nor '²' passes.

    :raises Invalid: anything else, in Nova's words for query parameters.
    """
    if _DIGITS.fullmatch(value) and int(value) <= maximum:
        return int(value)
    raise exception.Invalid(
        message=f"Invalid input for query parameters {name}. Value: {_short(value)}. "
        f"It must be a whole number (at most {maximum})."
    )


def _explanation(error: ValidationError) -> str:
    if error.validator in ("required", "additionalProperties", "maxProperties"):
        return str(error.message)
    # A missing or wrongly shaped field explains itself better in plain words.
    for schema in (error.schema, *_parents(error)):
        if isinstance(schema, dict) and "x-message" in schema:
            return f"It {schema['x-message']}."
    return str(error.message)


def _parents(error: ValidationError) -> list[Any]:
    parents = []
    while error.parent is not None:
        error = error.parent
        parents.append(error.schema)
    return parents


def _short(value: Any, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- server actions (qsched/api/server_actions.py) --

#: ``{"reboot": {"type": "SOFT"}}``, Nova's spellings of the type
server_reboot = {
    "type": "object",
    "properties": {
        "reboot": {
            "type": "object",
            "properties": {"type": {"type": "string", "enum": [
                "HARD", "Hard", "hard", "SOFT", "Soft", "soft"]}},
            "required": ["type"],
            "additionalProperties": False,
        }
    },
    "required": ["reboot"],
    "additionalProperties": False,
}  # fmt: skip


def _bare_action(name: str) -> dict[str, Any]:
    """``{"os-stop": null}``: Nova takes any value there and reads none."""
    return {"type": "object", "properties": {name: {}}, "required": [name],
            "additionalProperties": False}  # fmt: skip


SERVER_ACTIONS = {
    "os-stop": _compile(_bare_action("os-stop")),
    "os-start": _compile(_bare_action("os-start")),
    "reboot": _compile(server_reboot),
}
