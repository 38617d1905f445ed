"""``PUT /os-quota-sets`` and ``PUT /os-quota-class-sets``: the update bodies, whose
network quotas go at 2.36 (2.50 for a class) and file quotas at 2.57 (Nova's
schemas/quota_sets.py and quota_classes.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qsched.api.schemas.parameter_types import MAX_INT, boolean
from qsched.api.schemas.validation import compiled

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


#: (first microversion, validator) of the quota set update body, latest first
QUOTA_SET_UPDATE = (
    ((2, 57), compiled(_quota_update((*_NETWORK_QUOTAS, *_FILE_QUOTAS)))),
    ((2, 36), compiled(_quota_update(_NETWORK_QUOTAS))),
    ((2, 1), compiled(_quota_update(()))),
)
#: ... and of a quota class's (Nova's schemas/quota_classes.py: networks go at 2.50)
QUOTA_CLASS_UPDATE = (
    ((2, 57), compiled(_quota_update((*_NETWORK_QUOTAS, *_FILE_QUOTAS), "quota_class_set"))),
    ((2, 50), compiled(_quota_update(_NETWORK_QUOTAS, "quota_class_set"))),
    ((2, 1), compiled(_quota_update((), "quota_class_set"))),
)
