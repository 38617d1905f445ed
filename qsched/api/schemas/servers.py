"""``/servers``: the create body (by microversion, with its block devices, networks and
scheduler hints), the update body and server metadata (Nova's schemas/servers.py and
schemas/server_metadata.py)."""

from __future__ import annotations

from typing import Any

from qsched.api.schemas.parameter_types import (
    MAX_INT,
    PRINTABLE,
    boolean,
    fqdn,
    name,
    server_count,
    uuid_like,
)
from qsched.api.schemas.validation import compiled

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
    "min_count": server_count,
    "max_count": server_count,
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
#: (first microversion, validator) of the server create body, latest first
SERVER_CREATE = tuple((since, compiled(_server_create(since))) for since in SERVER_CREATE_VERSIONS)


# -- scheduler hints, checked one by one after the body (qsched/api/servers.py) --

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
GROUP_HINT = compiled(group_hint)
SERVERS_HINT = compiled(servers_hint)
#: an image id of a block device (qsched/api/boot.py)
UUID_LIKE = compiled(uuid_like)


# -- PUT /servers/{id} --

_description = {
    "type": ["string", "null"],
    "maxLength": 255,
    "pattern": f"^{PRINTABLE}*$",
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
    ((2, 19), compiled(_server_update({**_server_update_fields, "description": _description}))),
    ((2, 1), compiled(_server_update(_server_update_fields))),
)


# -- /servers/{id}/metadata --

METADATA_SET = compiled({"type": "object", "properties": {"metadata": metadata},
                         "required": ["metadata"], "additionalProperties": False})  # fmt: skip
METADATA_ITEM = compiled({
    "type": "object",
    "properties": {"meta": {**metadata, "minProperties": 1, "maxProperties": 1}},
    "required": ["meta"], "additionalProperties": False,
})  # fmt: skip
