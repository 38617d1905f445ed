"""``POST /servers/{id}/action``: the actions qsched serves (qsched/api/server_actions.py),
one validator each in :data:`SERVER_ACTIONS`."""

from __future__ import annotations

from typing import Any

from qsched.api.schemas.parameter_types import boolean, fqdn, name, uuid_like
from qsched.api.schemas.servers import description, flavor_ref, metadata
from qsched.api.schemas.validation import compiled

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


#: ``{"resize": {"flavorRef": "2"}}`` (docs/moves.rst)
server_resize = {
    "type": "object",
    "properties": {
        "resize": {
            "type": "object",
            "properties": {
                "flavorRef": flavor_ref,
                "OS-DCF:diskConfig": {"type": "string", "enum": ["AUTO", "MANUAL"]},
            },
            "required": ["flavorRef"],
            "additionalProperties": False,
        }
    },
    "required": ["resize"],
    "additionalProperties": False,
}


def _null_action(name: str) -> dict[str, Any]:
    """``{"confirmResize": null}``: Nova's schema takes null only."""
    return {"type": "object", "properties": {name: {"type": "null"}}, "required": [name],
            "additionalProperties": False}  # fmt: skip


#: ``{"migrate": {"host": "cn1"}}`` from 2.56 (null, or no host: any host)
server_migrate_v256 = {
    "type": "object",
    "properties": {
        "migrate": {
            "type": ["object", "null"],
            "properties": {"host": {"anyOf": [fqdn, {"type": "null"}]}},
            "additionalProperties": False,
        }
    },
    "required": ["migrate"],
    "additionalProperties": False,
}


_ADMIN_PASS = {"type": "string", "maxLength": 255}


def _evacuate(**fields: Any) -> dict[str, Any]:
    """``{"evacuate": {"host": "cn2"}}``: Nova's host (optional) and adminPass, and what
    each range of microversions adds (``fields``; ``required`` says what must be there)."""
    required = fields.pop("required", [])
    inner = {"type": "object", "properties": {"host": fqdn, "adminPass": _ADMIN_PASS, **fields},
             "required": required, "additionalProperties": False}  # fmt: skip
    return {"type": "object", "properties": {"evacuate": inner}, "required": ["evacuate"],
            "additionalProperties": False}  # fmt: skip


_BOOLEAN = {
    "type": ["boolean", "string"],
    "enum": [True, False, "True", "False", "true", "false", "1", "0", "yes", "no"],
}
#: ``evacuate`` by microversion: onSharedStorage up to 2.13, force from 2.29 to 2.67
EVACUATE = {
    (2, 1): compiled(_evacuate(onSharedStorage=_BOOLEAN, required=["onSharedStorage"])),
    (2, 14): compiled(_evacuate()),
    (2, 29): compiled(_evacuate(force=_BOOLEAN)),
    (2, 68): compiled(_evacuate()),
}


def _migrate_live(block_migration: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``{"os-migrateLive": {"host": null, "block_migration": "auto"}}`` (host and
    block_migration required, as Nova's; ``fields``: what a microversion adds)."""
    required = ["host", "block_migration", *fields.pop("required", [])]
    inner = {"type": "object",
             "properties": {"host": {"anyOf": [fqdn, {"type": "null"}]},
                            "block_migration": block_migration, **fields},
             "required": required, "additionalProperties": False}  # fmt: skip
    return {"type": "object", "properties": {"os-migrateLive": inner},
            "required": ["os-migrateLive"], "additionalProperties": False}  # fmt: skip


_AUTO_OR_BOOLEAN = {"anyOf": [_BOOLEAN, {"type": "string", "enum": ["auto"]}]}
#: ``os-migrateLive`` by microversion: disk_over_commit up to 2.24, ``auto`` from 2.25,
#: force from 2.30 to 2.67
MIGRATE_LIVE = {
    (2, 1): compiled(_migrate_live(_BOOLEAN, disk_over_commit=_BOOLEAN,
                                   required=["disk_over_commit"])),
    (2, 25): compiled(_migrate_live(_AUTO_OR_BOOLEAN)),
    (2, 30): compiled(_migrate_live(_AUTO_OR_BOOLEAN, force=_BOOLEAN)),
    (2, 68): compiled(_migrate_live(_AUTO_OR_BOOLEAN)),
}  # fmt: skip


def _bare_action(name: str) -> dict[str, Any]:
    """``{"os-stop": null}``: Nova takes any value there and reads none."""
    return {"type": "object", "properties": {name: {}}, "required": [name],
            "additionalProperties": False}  # fmt: skip


def _unshelve(inner: dict[str, Any]) -> dict[str, Any]:
    """``{"unshelve": null}`` or ``{"unshelve": {...}}`` with ``inner``'s fields."""
    body = {"type": ["object", "null"], "additionalProperties": False, **inner}
    return {"type": "object", "properties": {"unshelve": body}, "required": ["unshelve"],
            "additionalProperties": False}  # fmt: skip


_ZONE = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^\S(.*\S)?$"}
#: ``unshelve`` by microversion: any value up to 2.76, a zone from 2.77 (then required
#: in an object), a host from 2.91 (and a null zone: unpinned)
UNSHELVE = {
    (2, 1): compiled(_bare_action("unshelve")),
    (2, 77): compiled(_unshelve({"properties": {"availability_zone": _ZONE},
                                 "required": ["availability_zone"]})),
    (2, 91): compiled(_unshelve({"properties": {
        "availability_zone": {"anyOf": [_ZONE, {"type": "null"}]}, "host": fqdn}})),
}  # fmt: skip

_REBUILD: dict[str, Any] = {
    "imageRef": {**uuid_like, "x-message": "must be an image UUID"},
    "name": name,
    "adminPass": {"type": "string"},
    "metadata": metadata,
    "preserve_ephemeral": boolean,
    "OS-DCF:diskConfig": {"type": "string", "enum": ["AUTO", "MANUAL"]},
    "accessIPv4": {"type": "string", "format": "ipv4", "x-message": "must be an IPv4 address"},
    "accessIPv6": {"type": "string", "format": "ipv6", "x-message": "must be an IPv6 address"},
    "personality": {"type": "array", "items": {"type": "object"}},
}
_USER_DATA = {
    "type": ["string", "null"],
    "format": "base64",
    "maxLength": 65535,
    "x-message": "must be base64 text of at most 65535 characters, or null",
}


def _rebuild(**changes: Any) -> dict[str, Any]:
    """``{"rebuild": {"imageRef": ...}}`` with ``changes`` to Nova's base fields (a
    None drops one)."""
    fields = {k: v for k, v in {**_REBUILD, **changes}.items() if v is not None}
    inner = {"type": "object", "properties": fields, "required": ["imageRef"],
             "additionalProperties": False}  # fmt: skip
    return {"type": "object", "properties": {"rebuild": inner}, "required": ["rebuild"],
            "additionalProperties": False}  # fmt: skip


_KEY_NAME = {"anyOf": [name, {"type": "null"}]}
#: ``rebuild`` by microversion: description from 2.19, key_name from 2.54, user_data in
#: place of personality from 2.57, trusted_image_certificates from 2.63
REBUILD = {
    (2, 1): compiled(_rebuild()),
    (2, 19): compiled(_rebuild(description=description)),
    (2, 54): compiled(_rebuild(description=description, key_name=_KEY_NAME)),
    (2, 57): compiled(_rebuild(description=description, key_name=_KEY_NAME,
                               user_data=_USER_DATA, personality=None)),
    (2, 63): compiled(_rebuild(description=description, key_name=_KEY_NAME,
                               user_data=_USER_DATA, personality=None,
                               trusted_image_certificates={"type": ["array", "null"]})),
}  # fmt: skip

SERVER_ACTIONS = {
    "os-stop": compiled(_bare_action("os-stop")),
    "os-start": compiled(_bare_action("os-start")),
    "reboot": compiled(server_reboot),
    "resize": compiled(server_resize),
    "confirmResize": compiled(_null_action("confirmResize")),
    "revertResize": compiled(_null_action("revertResize")),
    "migrate": compiled(_null_action("migrate")),
    "evacuate": EVACUATE[(2, 14)],
    "os-migrateLive": MIGRATE_LIVE[(2, 25)],
    "shelve": compiled(_bare_action("shelve")),
    "shelveOffload": compiled(_bare_action("shelveOffload")),
    "unshelve": UNSHELVE[(2, 1)],
    "rebuild": REBUILD[(2, 1)],
}
#: ``migrate`` from 2.56, which may name a host
MIGRATE_V256 = compiled(server_migrate_v256)
