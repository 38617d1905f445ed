"""The personas of Nova's secure RBAC defaults, as rules the others build on.

An admin (the ``admin`` role) may do anything in any project; a project member
(``member``) acts on its own project's resources; a project reader (``reader``)
only reads them. Every rule is project-scoped, as Nova's are.
"""

from __future__ import annotations

from oslo_policy import policy

ADMIN = "rule:context_is_admin"
PROJECT_MEMBER = "role:member and project_id:%(project_id)s"
PROJECT_READER = "role:reader and project_id:%(project_id)s"
PROJECT_MEMBER_OR_ADMIN = "rule:project_member_or_admin"
PROJECT_READER_OR_ADMIN = "rule:project_reader_or_admin"
ANYONE = "@"


def rule(name: str, check: str, description: str, method: str, path: str) -> policy.RuleDefault:
    """A rule of one API call, project-scoped as Nova's compute rules are."""
    return policy.DocumentedRuleDefault(
        name, check, description, [{"method": method, "path": path}], scope_types=["project"]
    )


_RULES = [
    policy.RuleDefault("context_is_admin", "role:admin", "Decides what is an admin."),
    policy.RuleDefault(
        "project_member_api", PROJECT_MEMBER, "Default rule for Project level non admin APIs."
    ),
    policy.RuleDefault(
        "project_reader_api", PROJECT_READER, "Default rule for Project level read only APIs."
    ),
    policy.RuleDefault(
        "project_member_or_admin",
        "rule:project_member_api or rule:context_is_admin",
        "Default rule for Project Member or admin APIs.",
    ),
    policy.RuleDefault(
        "project_reader_or_admin",
        "rule:project_reader_api or rule:context_is_admin",
        "Default rule for Project reader or admin APIs.",
    ),
]


def list_rules() -> list[policy.RuleDefault]:
    return _RULES
