"""``os_compute_api:os-aggregates:*``: Nova's rules, every one admin-only and project-scoped."""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies.base import ADMIN, rule

ROOT = "os_compute_api:os-aggregates:%s"
INDEX = ROOT % "index"
CREATE = ROOT % "create"
SHOW = ROOT % "show"
UPDATE = ROOT % "update"
DELETE = ROOT % "delete"
ADD_HOST = ROOT % "add_host"
REMOVE_HOST = ROOT % "remove_host"
SET_METADATA = ROOT % "set_metadata"

_ITEM = "/os-aggregates/{aggregate_id}"
_ACTION = _ITEM + "/action"


def _rule(name: str, description: str, method: str, path: str) -> policy.RuleDefault:
    return rule(name, ADMIN, description, method, path)


_RULES = [
    _rule(SET_METADATA, "Create or replace metadata for an aggregate", "POST",
          _ACTION + " (set_metadata)"),
    _rule(ADD_HOST, "Add a host to an aggregate", "POST", _ACTION + " (add_host)"),
    _rule(CREATE, "Create an aggregate", "POST", "/os-aggregates"),
    _rule(REMOVE_HOST, "Remove a host from an aggregate", "POST", _ACTION + " (remove_host)"),
    _rule(UPDATE, "Update name and/or availability zone for an aggregate", "PUT", _ITEM),
    _rule(INDEX, "List all aggregates", "GET", "/os-aggregates"),
    _rule(DELETE, "Delete an aggregate", "DELETE", _ITEM),
    _rule(SHOW, "Show details for an aggregate", "GET", _ITEM),
]  # fmt: skip


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
