"""``PUT /os-services``: the update bodies of 2.1, 2.11 (``forced_down``) and 2.53
(by id) (Nova's schemas/services.py)."""

from __future__ import annotations

from typing import Any

from qsched.api.schemas.parameter_types import boolean, fqdn
from qsched.api.schemas.validation import compiled

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

SERVICE_UPDATE = compiled(service_update)
SERVICE_UPDATE_V211 = compiled(service_update_v211)
SERVICE_UPDATE_V253 = compiled(service_update_v253)
