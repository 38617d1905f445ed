"""``os_compute_api:os-flavor-manage:*`` and ``os-flavor-extra-specs:*``: Nova's rules.

Listing and showing flavors takes no rule in Nova (any authenticated caller).
"""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_READER_OR_ADMIN

MANAGE = "os_compute_api:os-flavor-manage:%s"
MANAGE_CREATE = MANAGE % "create"
MANAGE_DELETE = MANAGE % "delete"
SPECS = "os_compute_api:os-flavor-extra-specs:%s"
SPECS_INDEX = SPECS % "index"
SPECS_SHOW = SPECS % "show"
SPECS_CREATE = SPECS % "create"
SPECS_DELETE = SPECS % "delete"

_SPECS_PATH = "/flavors/{flavor_id}/os-extra_specs"


def _rule(name: str, check: str, description: str, method: str, path: str) -> policy.RuleDefault:
    return policy.DocumentedRuleDefault(
        name, check, description, [{"method": method, "path": path}], scope_types=["project"]
    )


_RULES = [
    _rule(MANAGE_CREATE, ADMIN, "Create a flavor", "POST", "/flavors"),
    _rule(MANAGE_DELETE, ADMIN, "Delete a flavor", "DELETE", "/flavors/{flavor_id}"),
    _rule(
        SPECS_INDEX, PROJECT_READER_OR_ADMIN, "List extra specs for a flavor", "GET", _SPECS_PATH
    ),
    _rule(
        SPECS_SHOW,
        PROJECT_READER_OR_ADMIN,
        "Show an extra spec for a flavor",
        "GET",
        _SPECS_PATH + "/{flavor_extra_spec_key}",
    ),
    _rule(SPECS_CREATE, ADMIN, "Create extra specs for a flavor", "POST", _SPECS_PATH),
    _rule(
        SPECS_DELETE,
        ADMIN,
        "Delete an extra spec for a flavor",
        "DELETE",
        _SPECS_PATH + "/{flavor_extra_spec_key}",
    ),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
