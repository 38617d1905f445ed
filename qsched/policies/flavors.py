"""``os_compute_api:os-flavor-manage:*``, ``os-flavor-extra-specs:*`` and
``os-flavor-access``: Nova's rules.

Listing and showing flavors takes no rule in Nova (any authenticated caller).
"""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_READER_OR_ADMIN, rule

MANAGE = "os_compute_api:os-flavor-manage:%s"
MANAGE_CREATE = MANAGE % "create"
MANAGE_DELETE = MANAGE % "delete"
MANAGE_UPDATE = MANAGE % "update"
SPECS = "os_compute_api:os-flavor-extra-specs:%s"
SPECS_INDEX = SPECS % "index"
SPECS_SHOW = SPECS % "show"
SPECS_CREATE = SPECS % "create"
SPECS_UPDATE = SPECS % "update"
SPECS_DELETE = SPECS % "delete"
ACCESS = "os_compute_api:os-flavor-access"
ACCESS_ADD = ACCESS + ":add_tenant_access"
ACCESS_REMOVE = ACCESS + ":remove_tenant_access"

_SPECS_PATH = "/flavors/{flavor_id}/os-extra_specs"


_RULES = [
    rule(MANAGE_CREATE, ADMIN, "Create a flavor", "POST", "/flavors"),
    rule(MANAGE_UPDATE, ADMIN, "Update a flavor", "PUT", "/flavors/{flavor_id}"),
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
        SPECS_UPDATE,
        ADMIN,
        "Update an extra spec for a flavor",
        "PUT",
        _SPECS_PATH + "/{flavor_extra_spec_key}",
    ),
    rule(
        SPECS_DELETE,
        ADMIN,
        "Delete an extra spec for a flavor",
        "DELETE",
        _SPECS_PATH + "/{flavor_extra_spec_key}",
    ),
    rule(
        ACCESS_ADD,
        ADMIN,
        "Add flavor access to a tenant",
        "POST",
        "/flavors/{flavor_id}/action (addTenantAccess)",
    ),
    rule(
        ACCESS_REMOVE,
        ADMIN,
        "Remove flavor access from a tenant",
        "POST",
        "/flavors/{flavor_id}/action (removeTenantAccess)",
    ),
    rule(
        ACCESS,
        ADMIN,
        "List flavor access information\n\nAllows access to the full list of tenants that "
        "have access to a flavor via an os-flavor-access API.",
        "GET",
        "/flavors/{flavor_id}/os-flavor-access",
    ),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
