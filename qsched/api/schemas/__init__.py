"""JSON schemas of the request bodies, in Nova's shapes, and their compiled validators.

Validators are compiled once at import; :func:`validate` gives Nova's message
("Invalid input for field/attribute ...") for the most relevant error. A
subschema may carry ``x-message``: a plainer explanation used instead of the
validator's own words. Two formats of our own check what a plain schema cannot
(Nova checks them in code after its schema): ``int32`` bounds a number written as
a string of digits, ``text255`` bounds a number by the length of its text; and
``ipv4``, ``ipv6`` and ``base64`` are Nova's formats of the same names.

Bodies that change by microversion are tuples of ``(first microversion,
validator)``, latest first (:data:`SERVER_CREATE`, :data:`KEYPAIR_CREATE`,
:data:`SERVER_GROUP_CREATE`).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
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


@_FORMATS.checks("ipv4")
def _ipv4(value: object) -> bool:
    return not isinstance(value, str) or _is_address(value, ipaddress.IPv4Address)


@_FORMATS.checks("ipv6")
def _ipv6(value: object) -> bool:
    return not isinstance(value, str) or _is_address(value, ipaddress.IPv6Address)


def _is_address(value: str, kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


@_FORMATS.checks("base64")
def _base64(value: object) -> bool:
    """Base64 as Nova reads it (``base64.decodebytes``: characters outside the alphabet,
    such as spaces and line breaks, are skipped; the padding must be right)."""
    if not isinstance(value, str):
        return True
    try:
        base64.decodebytes(value.encode("utf-8"))
    except (binascii.Error, UnicodeError):
        return False
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

#: Nova's ``description`` (2.19): printable text (whitespace too), up to 255, or null
description = {
    "type": ["string", "null"],
    "maxLength": 255,
    "pattern": r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$",
    "x-message": "must be at most 255 printable characters, or null",
}
#: Nova's ``tag`` (instance tags, 2.52; device tags, 2.32 and 2.42)
tag = {
    "type": "string",
    "minLength": 1,
    "maxLength": 60,
    "pattern": "^[^,/]*$",
    "x-message": "must be 1 to 60 characters without '/' or ','",
}
_ip_address = {"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]}

#: the legacy block device mapping (Nova's ``_legacy_block_device_mapping``)
_legacy_bdm: dict[str, Any] = {
    "virtual_name": {"type": "string", "maxLength": 255},
    "volume_id": uuid_like,
    "snapshot_id": uuid_like,
    "volume_size": {"type": ["integer", "string"], "pattern": "^[0-9]+$", "minimum": 1,
                    "maximum": MAX_INT, "format": "int32"},
    "device_name": {"type": "string", "minLength": 1, "maxLength": 255,
                    "pattern": "^[a-zA-Z0-9._/-]*$"},
    "delete_on_termination": boolean,
    "no_device": {},
    "connection_info": {"type": "string", "maxLength": 16777215},
}  # fmt: skip
_bdm_v2: dict[str, Any] = {
    **_legacy_bdm,
    "source_type": {"type": "string", "enum": ["volume", "image", "snapshot", "blank"]},
    "uuid": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[a-zA-Z0-9._-]*$"},
    "image_id": uuid_like,
    "destination_type": {"type": "string", "enum": ["local", "volume"]},
    "guest_format": {"type": "string", "maxLength": 255},
    "device_type": {"type": "string", "maxLength": 255},
    "disk_bus": {"type": "string", "maxLength": 255},
    "boot_index": {"type": ["integer", "string", "null"], "pattern": "^-?[0-9]+$"},
}


def _items(properties: dict[str, Any]) -> dict[str, Any]:
    item = {"type": "object", "properties": properties, "additionalProperties": False}
    return {"type": "array", "items": item}


_network_items: dict[str, Any] = {
    "fixed_ip": _ip_address,
    "port": {"type": ["string", "null"], "pattern": uuid_like["pattern"]},
    "uuid": {"type": "string"},
}
_server_fields: dict[str, Any] = {
    "name": name,
    "flavorRef": flavor_ref,
    "imageRef": image_ref,
    "adminPass": {"type": "string"},
    "availability_zone": name,
    "metadata": metadata,
    "min_count": _server_count,
    "max_count": _server_count,
    "OS-DCF:diskConfig": {"type": "string", "enum": ["AUTO", "MANUAL"],
                          "x-message": "must be 'AUTO' or 'MANUAL'"},
    "accessIPv4": {"type": "string", "format": "ipv4", "x-message": "must be an IPv4 address"},
    "accessIPv6": {"type": "string", "format": "ipv6", "x-message": "must be an IPv6 address"},
    "personality": _items({"path": {"type": "string"},
                           "contents": {"type": "string", "format": "base64",
                                        "x-message": "must be base64 text"}}),
    "block_device_mapping": _items(_legacy_bdm),
    "config_drive": boolean,
    "key_name": name,
    "return_reservation_id": boolean,
    "security_groups": _items({"name": name}),
    "user_data": {"type": "string", "format": "base64", "maxLength": 65535,
                  "x-message": "must be base64 text of at most 65535 characters"},
}  # fmt: skip


def _server_create(version: tuple[int, int]) -> dict[str, Any]:
    """Nova's server create body at ``version`` (its schemas ``create`` to ``create_v274``)."""
    fields = dict(_server_fields)
    bdm, network = dict(_bdm_v2), dict(_network_items)
    required = ["name", "flavorRef"]
    if version >= (2, 19):
        fields["description"] = description
    if version == (2, 32) or version >= (2, 42):
        bdm["tag"] = tag
    if (2, 32) <= version < (2, 37) or version >= (2, 42):  # 2.37's networks had none
        network["tag"] = tag
    if version >= (2, 37):
        required.append("networks")
        network["uuid"] = uuid_like
        fields["networks"] = {
            "oneOf": [_items(network), {"type": "string", "enum": ["none", "auto"]}],
            "x-message": "must be 'none', 'auto' or a list of networks",
        }
    else:
        fields["networks"] = _items(network)
    if version >= (2, 52):
        fields["tags"] = {"type": "array", "items": tag, "maxItems": 50}
    if version >= (2, 57):
        del fields["personality"]
    if version >= (2, 63):
        fields["trusted_image_certificates"] = {
            "type": ["array", "null"], "minItems": 1, "maxItems": 50, "uniqueItems": True,
            "items": {"type": "string", "minLength": 1, "maxLength": 255},
        }  # fmt: skip
    if version >= (2, 67):
        bdm["volume_type"] = {"type": ["string", "null"], "minLength": 0, "maxLength": 255}
    if version >= (2, 74):
        fields["host"] = fqdn
        fields["hypervisor_hostname"] = fqdn
    fields["block_device_mapping_v2"] = _items(bdm)
    return {
        "type": "object",
        "properties": {
            "server": {
                "type": "object",
                "properties": fields,
                "required": required,
                "additionalProperties": False,
            },
            "os:scheduler_hints": {"type": "object", "maxProperties": 64},
            "OS-SCH-HNT:scheduler_hints": {"type": "object", "maxProperties": 64},
        },
        "required": ["server"],
        "additionalProperties": False,
    }


#: the microversions at which Nova's server create body changes
SERVER_CREATE_VERSIONS = ((2, 74), (2, 67), (2, 63), (2, 57), (2, 52), (2, 42), (2, 37),
                          (2, 33), (2, 32), (2, 19), (2, 1))  # fmt: skip

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
#: ``same_host`` and ``different_host``: one server UUID, or a list of them (Nova's)
servers_hint = {
    "anyOf": [uuid_like, {"type": "array", "items": uuid_like}],
    "x-message": "must be a server UUID or a list of server UUIDs",
}


# -- os-keypairs (Nova's schemas/keypairs.py): 2.1, 2.2 (type), 2.10 (user_id) --

keypair_name = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "pattern": r"^[_\-a-zA-Z0-9](?:[_\- a-zA-Z0-9]*[_\-a-zA-Z0-9])?$",
    "x-message": "must be 1 to 255 of letters, digits, spaces, '_' and '-', without leading "
    "or trailing spaces",
}


def _keypair_create(since: tuple[int, int]) -> dict[str, Any]:
    props: dict[str, Any] = {"name": keypair_name, "public_key": {"type": "string"}}
    if since >= (2, 2):
        props["type"] = {"type": "string", "enum": ["ssh", "x509"],
                         "x-message": "must be 'ssh' or 'x509'"}  # fmt: skip
    if since >= (2, 10):
        props["user_id"] = {"type": "string", "minLength": 1, "maxLength": 255}
    return {
        "type": "object",
        "properties": {
            "keypair": {
                "type": "object",
                "properties": props,
                "required": ["name"],
                "additionalProperties": False,
            }
        },
        "required": ["keypair"],
        "additionalProperties": False,
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


#: (first microversion, validator) of the server create body, latest first
SERVER_CREATE = tuple((since, _compile(_server_create(since))) for since in SERVER_CREATE_VERSIONS)
#: (first microversion, validator) of the flavor create body, latest first
FLAVOR_CREATE = (
    ((2, 55), _compile(_flavor_create({**_flavor_fields, "description": flavor_description}))),
    ((2, 1), _compile(_flavor_create(_flavor_fields))),
)
FLAVOR_UPDATE = _compile(flavor_update)
EXTRA_SPEC_UPDATE = _compile(extra_spec_update)
FLAVOR_ACTIONS = {
    "addTenantAccess": _compile(_tenant_action("addTenantAccess")),
    "removeTenantAccess": _compile(_tenant_action("removeTenantAccess")),
}
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
SERVERS_HINT = _compile(servers_hint)
UUID_LIKE = _compile(uuid_like)
#: (first microversion, validator) of the keypair create body, latest first
KEYPAIR_CREATE = tuple(
    (since, _compile(_keypair_create(since))) for since in ((2, 10), (2, 2), (2, 1))
)
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


_description = {
    "type": ["string", "null"],
    "maxLength": 255,
    "pattern": f"^{_PRINTABLE}*$",
    "x-message": "must be at most 255 printable characters, or null",
}
_server_update_fields: dict[str, Any] = {
    "name": name,
    "OS-DCF:diskConfig": {"enum": ["AUTO", "MANUAL"]},
    "accessIPv4": {"type": "string", "format": "ipv4", "x-message": "must be an IPv4 address"},
    "accessIPv6": {"type": "string", "format": "ipv6", "x-message": "must be an IPv6 address"},
}


def _server_update(fields: dict[str, Any]) -> dict[str, Any]:
    server = {"type": "object", "properties": fields, "additionalProperties": False}
    return {"type": "object", "properties": {"server": server}, "required": ["server"],
            "additionalProperties": False}  # fmt: skip


#: (first microversion, validator) of ``PUT /servers/{id}``, latest first
SERVER_UPDATE = (
    ((2, 19), _compile(_server_update({**_server_update_fields, "description": _description}))),
    ((2, 1), _compile(_server_update(_server_update_fields))),
)
METADATA_SET = _compile({"type": "object", "properties": {"metadata": metadata},
                         "required": ["metadata"], "additionalProperties": False})  # fmt: skip
METADATA_ITEM = _compile({
    "type": "object",
    "properties": {"meta": {**metadata, "minProperties": 1, "maxProperties": 1}},
    "required": ["meta"], "additionalProperties": False,
})  # fmt: skip


def for_version(choices: Sequence[tuple[tuple[int, int], Validator]], version: Any) -> Validator:
    """The validator of the newest first microversion at or below ``version``."""
    return next(v for since, v in choices if version >= since)


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
