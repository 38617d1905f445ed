"""``os_compute_api:os-server-groups:*``: Nova's rules for server groups."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_MEMBER_OR_ADMIN, PROJECT_READER_OR_ADMIN, rule

POLICY_ROOT = "os_compute_api:os-server-groups:%s"
CREATE = POLICY_ROOT % "create"
DELETE = POLICY_ROOT % "delete"
INDEX = POLICY_ROOT % "index"
INDEX_ALL_PROJECTS = POLICY_ROOT % "index:all_projects"
SHOW = POLICY_ROOT % "show"

_PATH = "/os-server-groups"
_ITEM = "/os-server-groups/{server_group_id}"


_RULES = [
    rule(CREATE, PROJECT_MEMBER_OR_ADMIN, "Create a new server group", "POST", _PATH),
    rule(DELETE, PROJECT_MEMBER_OR_ADMIN, "Delete a server group", "DELETE", _ITEM),
    rule(INDEX, PROJECT_READER_OR_ADMIN, "List all server groups", "GET", _PATH),
    rule(INDEX_ALL_PROJECTS, ADMIN, "List all server groups for all projects", "GET", _PATH),
    rule(SHOW, PROJECT_READER_OR_ADMIN, "Show details of a server group", "GET", _ITEM),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
