"""Nova's rules of the moves qsched serves (docs/moves.rst): resize, its confirm and
revert, cold and live migration, and evacuation."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_MEMBER_OR_ADMIN, rule

RESIZE = "os_compute_api:servers:resize"
CONFIRM_RESIZE = "os_compute_api:servers:confirm_resize"
REVERT_RESIZE = "os_compute_api:servers:revert_resize"
MIGRATE = "os_compute_api:os-migrate-server:migrate"
EVACUATE = "os_compute_api:os-evacuate"
MIGRATE_LIVE = "os_compute_api:os-migrate-server:migrate_live"

_ACTION = "/servers/{server_id}/action (%s)"

_RULES = [
    rule(RESIZE, PROJECT_MEMBER_OR_ADMIN, "Resize a server", "POST", _ACTION % "resize"),
    rule(CONFIRM_RESIZE, PROJECT_MEMBER_OR_ADMIN, "Confirm a server resize", "POST",
         _ACTION % "confirmResize"),
    rule(REVERT_RESIZE, PROJECT_MEMBER_OR_ADMIN, "Revert a server resize", "POST",
         _ACTION % "revertResize"),
    rule(MIGRATE, ADMIN, "Cold migrate a server to a host", "POST", _ACTION % "migrate"),
    rule(MIGRATE_LIVE, ADMIN, "Live migrate a server to a new host without a reboot", "POST",
         _ACTION % "os-migrateLive"),
    rule(EVACUATE, ADMIN, "Evacuate a server from a failed host to a new host", "POST",
         _ACTION % "evacuate"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
