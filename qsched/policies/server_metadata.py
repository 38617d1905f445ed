"""``os_compute_api:server-metadata:*``: Nova's rules for a server's metadata."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import PROJECT_MEMBER_OR_ADMIN, PROJECT_READER_OR_ADMIN, rule

ROOT = "os_compute_api:server-metadata:%s"
INDEX = ROOT % "index"
SHOW = ROOT % "show"
CREATE = ROOT % "create"
UPDATE_ALL = ROOT % "update_all"
UPDATE = ROOT % "update"
DELETE = ROOT % "delete"

_ITEMS = "/servers/{server_id}/metadata"
_ITEM = "/servers/{server_id}/metadata/{key}"
_RULES = [
    rule(INDEX, PROJECT_READER_OR_ADMIN, "List all metadata of a server", "GET", _ITEMS),
    rule(SHOW, PROJECT_READER_OR_ADMIN, "Show metadata for a server", "GET", _ITEM),
    rule(CREATE, PROJECT_MEMBER_OR_ADMIN, "Create metadata for a server", "POST", _ITEMS),
    rule(UPDATE_ALL, PROJECT_MEMBER_OR_ADMIN, "Replace metadata for a server", "PUT", _ITEMS),
    rule(UPDATE, PROJECT_MEMBER_OR_ADMIN, "Update metadata from a server", "PUT", _ITEM),
    rule(DELETE, PROJECT_MEMBER_OR_ADMIN, "Delete metadata from a server", "DELETE", _ITEM),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
