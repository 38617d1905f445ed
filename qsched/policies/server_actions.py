"""``os_compute_api:servers:stop``, ``:start``, ``:reboot`` and ``:rebuild``: Nova's server
action rules."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import PROJECT_MEMBER_OR_ADMIN, rule

STOP = "os_compute_api:servers:stop"
START = "os_compute_api:servers:start"
REBOOT = "os_compute_api:servers:reboot"
REBUILD = "os_compute_api:servers:rebuild"

_ACTION = "/servers/{server_id}/action (%s)"

_RULES = [
    rule(STOP, PROJECT_MEMBER_OR_ADMIN, "Stop a server", "POST", _ACTION % "os-stop"),
    rule(START, PROJECT_MEMBER_OR_ADMIN, "Start a server", "POST", _ACTION % "os-start"),
    rule(REBOOT, PROJECT_MEMBER_OR_ADMIN, "Reboot a server", "POST", _ACTION % "reboot"),
    rule(REBUILD, PROJECT_MEMBER_OR_ADMIN, "Rebuild a server", "POST", _ACTION % "rebuild"),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
