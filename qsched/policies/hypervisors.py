"""``os_compute_api:os-hypervisors:*``: Nova's rules, every one admin-only and project-scoped."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, rule

ROOT = "os_compute_api:os-hypervisors:%s"
LIST = ROOT % "list"
LIST_DETAIL = ROOT % "list-detail"
STATISTICS = ROOT % "statistics"
SHOW = ROOT % "show"
SEARCH = ROOT % "search"
SERVERS = ROOT % "servers"
UPTIME = ROOT % "uptime"

_RULES = [
    rule(LIST, ADMIN, "List all hypervisors.", "GET", "/os-hypervisors"),
    rule(LIST_DETAIL, ADMIN, "List all hypervisors with details", "GET",
         "/os-hypervisors/details"),
    rule(STATISTICS, ADMIN, "Show summary statistics for all hypervisors over all compute "
         "nodes.", "GET", "/os-hypervisors/statistics"),
    rule(SHOW, ADMIN, "Show details for a hypervisor.", "GET", "/os-hypervisors/{hypervisor_id}"),
    rule(SEARCH, ADMIN, "Search hypervisor by hypervisor_hostname pattern.", "GET",
         "/os-hypervisors/{hypervisor_hostname_pattern}/search"),
    rule(SERVERS, ADMIN, "List all servers on hypervisors that can match the provided "
         "hypervisor_hostname pattern.", "GET",
         "/os-hypervisors/{hypervisor_hostname_pattern}/servers"),
    rule(UPTIME, ADMIN, "Show the uptime of a hypervisor.", "GET",
         "/os-hypervisors/{hypervisor_id}/uptime"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
