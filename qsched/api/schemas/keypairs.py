"""``POST /os-keypairs``: the create bodies of 2.1, 2.2 (``type``) and 2.10 (``user_id``)
(Nova's schemas/keypairs.py)."""

from __future__ import annotations

from typing import Any

from qsched.api.schemas.validation import compiled

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


#: (first microversion, validator) of the keypair create body, latest first
KEYPAIR_CREATE = tuple(
    (since, compiled(_keypair_create(since))) for since in ((2, 10), (2, 2), (2, 1))
)
