"""``os_compute_api:os-services:*``: Nova's rules for listing and updating compute services."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, rule

SERVICES = "os_compute_api:os-services:%s"
LIST = SERVICES % "list"
UPDATE = SERVICES % "update"

_RULES: list[policy.RuleDefault] = [
    rule(LIST, ADMIN, "List all running Compute services in a region.", "GET", "/os-services"),
    rule(UPDATE, ADMIN, "Update a Compute service.", "PUT", "/os-services/{service_id}"),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
