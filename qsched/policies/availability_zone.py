"""``os_compute_api:os-availability-zone:*``: Nova's rules (the list is anyone's)."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, ANYONE, rule

ROOT = "os_compute_api:os-availability-zone:%s"
LIST = ROOT % "list"
DETAIL = ROOT % "detail"

_RULES = [
    rule(LIST, ANYONE, "List availability zone information without host information",
         "GET", "/os-availability-zone"),
    rule(DETAIL, ADMIN, "List detailed availability zone information with host information",
         "GET", "/os-availability-zone/detail"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
