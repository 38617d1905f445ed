"""``os_compute_api:os-keypairs:*``: Nova's rules for keypairs (admin or the owner)."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, rule

POLICY_ROOT = "os_compute_api:os-keypairs:%s"
INDEX = POLICY_ROOT % "index"
CREATE = POLICY_ROOT % "create"
DELETE = POLICY_ROOT % "delete"
SHOW = POLICY_ROOT % "show"

#: Nova's default: an admin, or the user the keypair belongs to
ADMIN_OR_OWNER = f"({ADMIN}) or user_id:%(user_id)s"

_PATH = "/os-keypairs"
_ITEM = "/os-keypairs/{keypair_name}"

_RULES = [
    rule(INDEX, ADMIN_OR_OWNER, "List all keypairs", "GET", _PATH),
    rule(CREATE, ADMIN_OR_OWNER, "Create a keypair", "POST", _PATH),
    rule(DELETE, ADMIN_OR_OWNER, "Delete a keypair", "DELETE", _ITEM),
    rule(SHOW, ADMIN_OR_OWNER, "Show details of a keypair", "GET", _ITEM),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
