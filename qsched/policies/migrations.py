"""Nova's rules of the migration listings (docs/api.rst, "Migrations"): every cell's
migrations (``os-migrations``) and a server's live migrations in progress, which an
admin may force to complete or abort (docs/moves.rst).

Nova's defaults before its project manager persona: admin only. (Nova 2026.1 opens
``index`` to a project manager and adds ``index:all_projects`` and ``index:host``,
admin, for the rest; qsched has no manager persona, :mod:`qsched.policies.base`.)
"""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, rule

INDEX = "os_compute_api:os-migrations:index"
SERVER_INDEX = "os_compute_api:servers:migrations:index"
SERVER_SHOW = "os_compute_api:servers:migrations:show"
FORCE_COMPLETE = "os_compute_api:servers:migrations:force_complete"
ABORT = "os_compute_api:servers:migrations:delete"

_SERVER = "/servers/{server_id}/migrations"

_RULES = [
    rule(INDEX, ADMIN, "List migrations", "GET", "/os-migrations"),
    rule(SERVER_SHOW, ADMIN, "Show details for an in-progress live migration for a given server",
         "GET", _SERVER + "/{migration_id}"),
    rule(SERVER_INDEX, ADMIN, "Lists in-progress live migrations for a given server", "GET",
         _SERVER),
    rule(FORCE_COMPLETE, ADMIN, "Force an in-progress live migration for a given server to "
         "complete", "POST", _SERVER + "/{migration_id}/action (force_complete)"),
    rule(ABORT, ADMIN, "Delete(Abort) an in-progress live migration", "DELETE",
         _SERVER + "/{migration_id}"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
