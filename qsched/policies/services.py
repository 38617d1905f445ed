"""``os_compute_api:os-services:*``: Nova's rules for listing and updating compute services."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN

SERVICES = "os_compute_api:os-services:%s"
LIST = SERVICES % "list"
UPDATE = SERVICES % "update"

_RULES: list[policy.RuleDefault] = [
    policy.DocumentedRuleDefault(
        LIST,
        ADMIN,
        "List all running Compute services in a region.",
        [{"method": "GET", "path": "/os-services"}],
        scope_types=["project"],
    ),
    policy.DocumentedRuleDefault(
        UPDATE,
        ADMIN,
        "Update a Compute service.",
        [{"method": "PUT", "path": "/os-services/{service_id}"}],
        scope_types=["project"],
    ),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
