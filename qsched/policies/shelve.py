"""Nova's rules of shelving (docs/moves.rst, "Shelve"): shelve, shelveOffload, unshelve,
and unshelve to a named host."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, PROJECT_MEMBER_OR_ADMIN, rule

SHELVE = "os_compute_api:os-shelve:shelve"
SHELVE_OFFLOAD = "os_compute_api:os-shelve:shelve_offload"
UNSHELVE = "os_compute_api:os-shelve:unshelve"
UNSHELVE_TO_HOST = "os_compute_api:os-shelve:unshelve_to_host"

_ACTION = "/servers/{server_id}/action (%s)"

_RULES = [
    rule(SHELVE, PROJECT_MEMBER_OR_ADMIN, "Shelve server", "POST", _ACTION % "shelve"),
    rule(UNSHELVE, PROJECT_MEMBER_OR_ADMIN, "Unshelve (restore) shelved server", "POST",
         _ACTION % "unshelve"),
    rule(UNSHELVE_TO_HOST, ADMIN,
         "Unshelve (restore) shelve offloaded server to a specific host", "POST",
         _ACTION % "unshelve"),
    rule(SHELVE_OFFLOAD, ADMIN, "Shelf-offload (remove) server", "POST",
         _ACTION % "shelveOffload"),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
