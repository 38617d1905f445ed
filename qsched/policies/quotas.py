"""``os_compute_api:limits``, ``os-quota-sets:*`` and ``os-quota-class-sets:*``: Nova's rules."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, ANYONE, PROJECT_READER_OR_ADMIN, rule

LIMITS = "os_compute_api:limits"
LIMITS_OTHER_PROJECT = "os_compute_api:limits:other_project"
QUOTA_ROOT = "os_compute_api:os-quota-sets:%s"
QUOTA_UPDATE = QUOTA_ROOT % "update"
QUOTA_DEFAULTS = QUOTA_ROOT % "defaults"
QUOTA_SHOW = QUOTA_ROOT % "show"
QUOTA_DELETE = QUOTA_ROOT % "delete"
QUOTA_DETAIL = QUOTA_ROOT % "detail"
CLASS_ROOT = "os_compute_api:os-quota-class-sets:%s"
CLASS_SHOW = CLASS_ROOT % "show"
CLASS_UPDATE = CLASS_ROOT % "update"

_ITEM = "/os-quota-sets/{tenant_id}"
_CLASS = "/os-quota-class-sets/{quota_class}"

_RULES = [
    rule(LIMITS, ANYONE, "Show rate and absolute limits for the current user project",
         "GET", "/limits"),
    rule(LIMITS_OTHER_PROJECT, ADMIN, "Show rate and absolute limits of other project.\n\n"
         "This policy only checks if the user has access to the requested project limits. "
         "And this check is performed only after the check os_compute_api:limits passes",
         "GET", "/limits"),
    rule(QUOTA_UPDATE, ADMIN, "Update the quotas", "PUT", _ITEM),
    rule(QUOTA_DEFAULTS, ANYONE, "List default quotas", "GET", f"{_ITEM}/defaults"),
    rule(QUOTA_SHOW, PROJECT_READER_OR_ADMIN, "Show a quota", "GET", _ITEM),
    rule(QUOTA_DELETE, ADMIN, "Revert quotas to defaults", "DELETE", _ITEM),
    rule(QUOTA_DETAIL, PROJECT_READER_OR_ADMIN, "Show the detail of quota", "GET",
         f"{_ITEM}/detail"),
    rule(CLASS_SHOW, ADMIN, "List quotas for specific quota classes", "GET", _CLASS),
    rule(CLASS_UPDATE, ADMIN, "Update quotas for specific quota class", "PUT", _CLASS),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
