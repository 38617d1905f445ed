"""``os_compute_api:os-flavor-manage:*`` and ``os-flavor-extra-specs:*``: Nova's rules.

Listing and showing flavors takes no rule in Nova (any authenticated caller).
"""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_READER_OR_ADMIN, rule

MANAGE = "os_compute_api:os-flavor-manage:%s"
MANAGE_CREATE = MANAGE % "create"
MANAGE_DELETE = MANAGE % "delete"
SPECS = "os_compute_api:os-flavor-extra-specs:%s"
SPECS_INDEX = SPECS % "index"
SPECS_SHOW = SPECS % "show"
SPECS_CREATE = SPECS % "create"
SPECS_DELETE = SPECS % "delete"

_SPECS_PATH = "/flavors/{flavor_id}/os-extra_specs"


_RULES = [
    rule(MANAGE_CREATE, ADMIN, "Create a flavor", "POST", "/flavors"),
    rule(MANAGE_DELETE, ADMIN, "Delete a flavor", "DELETE", "/flavors/{flavor_id}"),
    rule(SPECS_INDEX, PROJECT_READER_OR_ADMIN, "List extra specs for a flavor", "GET", _SPECS_PATH),
    rule(
        SPECS_SHOW,
        PROJECT_READER_OR_ADMIN,
        "Show an extra spec for a flavor",
        "GET",
        _SPECS_PATH + "/{flavor_extra_spec_key}",
    ),
    rule(SPECS_CREATE, ADMIN, "Create extra specs for a flavor", "POST", _SPECS_PATH),
    rule(
        SPECS_DELETE,
        ADMIN,
        "Delete an extra spec for a flavor",
        "DELETE",
        _SPECS_PATH + "/{flavor_extra_spec_key}",
    ),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
