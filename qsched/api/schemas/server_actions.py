"""``POST /servers/{id}/action``: the actions qsched serves (qsched/api/server_actions.py),
one validator each in :data:`SERVER_ACTIONS`."""

from __future__ import annotations

from typing import Any

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


def _bare_action(name: str) -> dict[str, Any]:
    """``{"os-stop": null}``: Nova takes any value there and reads none."""
    return {"type": "object", "properties": {name: {}}, "required": [name],
            "additionalProperties": False}  # fmt: skip


SERVER_ACTIONS = {
    "os-stop": compiled(_bare_action("os-stop")),
    "os-start": compiled(_bare_action("os-start")),
    "reboot": compiled(server_reboot),
}
