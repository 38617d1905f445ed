"""Authorisation: every action asks oslo.policy, with Nova's rules as the defaults.

The rules live in :mod:`qsched.policies` (policy in code); a ``policy.yaml``
(``[oslo_policy] policy_file``) overrides any of them by name. A refusal is
:class:`~qsched.exception.Forbidden`, Nova's 403 with the rule's name. A caller
may only be refused by a rule after it was allowed to see the resource: a
server of another project is not found (404) before any rule is asked, as in
Nova, whose database queries are scoped to the caller's project.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oslo_policy import policy

from qsched import exception
from qsched.conf.policy import policy_enforcer
from qsched.context import RequestContext
from qsched.policies import list_rules


class Policy:
    """oslo.policy's enforcer with qsched's rules registered (None: the defaults only)."""

    def __init__(self, enforcer: policy.Enforcer | None = None) -> None:
        self.enforcer = enforcer or policy_enforcer()
        self.enforcer.register_defaults(list_rules())

    def authorize(
        self, context: RequestContext, rule: str, target: Mapping[str, Any] | None = None
    ) -> None:
        """Allow ``context`` to do ``rule`` on ``target`` (default: its own project).

        :raises Forbidden: the rule refuses it, or the token's scope does not fit.
        """
        if not self.allows(context, rule, target):
            raise exception.Forbidden(action=rule)

    def allows(
        self, context: RequestContext, rule: str, target: Mapping[str, Any] | None = None
    ) -> bool:
        """Whether ``rule`` lets ``context`` act on ``target`` (default: its own project)."""
        target = target if target is not None else own(context)
        try:
            return bool(self.enforcer.authorize(rule, target, context))
        except policy.InvalidScope:
            return False

    def is_admin(self, context: RequestContext) -> bool:
        """What ``context_is_admin`` says of the caller (``role:admin`` by default)."""
        return self.allows(context, "context_is_admin", {})


def own(context: RequestContext) -> dict[str, Any]:
    """The target of an action on the caller's own project."""
    return {"project_id": context.project_id, "user_id": context.user_id}
