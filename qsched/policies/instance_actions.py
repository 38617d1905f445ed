"""``os_compute_api:os-instance-actions:*``: Nova's rules for a server's action history."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_READER_OR_ADMIN, rule

BASE = "os_compute_api:os-instance-actions:%s"
LIST = BASE % "list"
SHOW = BASE % "show"
EVENTS = BASE % "events"

_ONE = "/servers/{server_id}/os-instance-actions/{request_id}"

_RULES = [
    rule(
        EVENTS,
        ADMIN,
        "Add events details in action details for a server. This check is performed only "
        "after the check os_compute_api:os-instance-actions:show passes. Beginning with "
        "Microversion 2.51, events details are always included; traceback information is "
        "provided per event if policy enforcement passes. Beginning with Microversion 2.62, "
        "each event includes a hashed host identifier and, if policy enforcement passes, the "
        "name of the host.",
        "GET",
        _ONE,
    ),
    rule(
        LIST,
        PROJECT_READER_OR_ADMIN,
        "List actions for a server.",
        "GET",
        "/servers/{server_id}/os-instance-actions",
    ),
    rule(SHOW, PROJECT_READER_OR_ADMIN, "Show action details for a server.", "GET", _ONE),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
