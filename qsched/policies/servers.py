"""``os_compute_api:servers:*``: Nova's rules for the servers qsched serves."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_MEMBER_OR_ADMIN, PROJECT_READER_OR_ADMIN, rule

SERVERS = "os_compute_api:servers:%s"
INDEX = SERVERS % "index"
INDEX_ALL_TENANTS = SERVERS % "index:get_all_tenants"
DETAIL = SERVERS % "detail"
DETAIL_ALL_TENANTS = SERVERS % "detail:get_all_tenants"
SHOW = SERVERS % "show"
SHOW_HOST_STATUS = SERVERS % "show:host_status"
SHOW_HOST_STATUS_UNKNOWN = SERVERS % "show:host_status:unknown-only"
ALLOW_ALL_FILTERS = SERVERS % "allow_all_filters"
UPDATE = SERVERS % "update"
CREATE = SERVERS % "create"
#: 2.74's host and hypervisor_hostname in a create (Nova's rule name, not under SERVERS)
REQUESTED_DESTINATION = "compute:servers:create:requested_destination"
DELETE = SERVERS % "delete"
#: host and hypervisor_hostname in a server's view (Nova's extended server attributes)
EXTENDED_ATTRIBUTES = "os_compute_api:os-extended-server-attributes"


_RULES = [
    rule(INDEX, PROJECT_READER_OR_ADMIN, "List all servers", "GET", "/servers"),
    rule(
        DETAIL,
        PROJECT_READER_OR_ADMIN,
        "List all servers with detailed information",
        "GET",
        "/servers/detail",
    ),
    rule(INDEX_ALL_TENANTS, ADMIN, "List all servers for all projects", "GET", "/servers"),
    rule(
        DETAIL_ALL_TENANTS,
        ADMIN,
        "List all servers with detailed information for all projects",
        "GET",
        "/servers/detail",
    ),
    rule(SHOW, PROJECT_READER_OR_ADMIN, "Show a server", "GET", "/servers/{server_id}"),
    rule(
        SHOW_HOST_STATUS,
        ADMIN,
        "Show a server with additional host status information",
        "GET",
        "/servers/{server_id}",
    ),
    rule(
        SHOW_HOST_STATUS_UNKNOWN,
        ADMIN,
        "Show a server with additional host status information, only if host status is "
        "UNKNOWN (when show:host_status does not allow it)",
        "GET",
        "/servers/{server_id}",
    ),
    rule(
        ALLOW_ALL_FILTERS,
        ADMIN,
        "Allow all filters when listing servers",
        "GET",
        "/servers",
    ),
    rule(CREATE, PROJECT_MEMBER_OR_ADMIN, "Create a server", "POST", "/servers"),
    rule(
        REQUESTED_DESTINATION,
        ADMIN,
        "Create a server on the requested compute service host and/or hypervisor_hostname; "
        "the claim still checks that it fits there",
        "POST",
        "/servers",
    ),
    rule(UPDATE, PROJECT_MEMBER_OR_ADMIN, "Update a server", "PUT", "/servers/{server_id}"),
    rule(DELETE, PROJECT_MEMBER_OR_ADMIN, "Delete a server", "DELETE", "/servers/{server_id}"),
    rule(
        EXTENDED_ATTRIBUTES,
        ADMIN,
        "Return extended attributes for server (host and hypervisor_hostname)",
        "GET",
        "/servers/{id}",
    ),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
