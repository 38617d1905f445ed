"""``POST /os-server-groups``: Nova's create bodies of 2.1, 2.15 (soft policies) and 2.64
(``policy`` and ``rules``) (Nova's schemas/server_groups.py)."""

from __future__ import annotations

from typing import Any

from qsched.api.schemas.parameter_types import MAX_INT, name, server_count
from qsched.api.schemas.validation import compiled

_HARD_POLICIES = ["anti-affinity", "affinity"]
_ALL_POLICIES = [*_HARD_POLICIES, "soft-anti-affinity", "soft-affinity"]

_positive = {**server_count, "x-message": f"must be a whole number from 1 to {MAX_INT}"}


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


#: (first microversion, validator) of the server group create body, latest first
SERVER_GROUP_CREATE = (
    ((2, 64), compiled(_group_create(None))),
    ((2, 15), compiled(_group_create(_ALL_POLICIES))),
    ((2, 1), compiled(_group_create(_HARD_POLICIES))),
)
