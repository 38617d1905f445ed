"""Authorisation: every action asks oslo.policy, with Nova's rules as the defaults.

The rules live in :mod:`qsched.policies` (policy in code); a ``policy.yaml``
(``[oslo_policy] policy_file``) overrides any of them by name. A refusal is
:class:`~qsched.exception.Forbidden`, Nova's 403 with the rule's name. A caller
may only be refused by a rule after it was allowed to see the resource: a
server of another project is not found (404) before any rule is asked, as in
Nova, whose database queries are scoped to the caller's project.

Speed: oslo.policy stats the policy file and inspects every check's signature
on each call (about 130 us a decision here, 12 ``inspect.getfullargspec`` calls
for one rule), so decisions are remembered for at most :data:`RELOAD_S`: the
rules are reloaded (a changed ``policy.yaml`` applies) and the remembered
decisions dropped at most that often. A decision depends only on the rule, the
caller's policy values and the target, which are its key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from oslo_policy import policy

from qsched import exception
from qsched.conf.policy import policy_enforcer
from qsched.context import RequestContext
from qsched.policies import list_rules

#: How long a decision is remembered, and how often the policy file is looked at.
RELOAD_S = 1.0
_MAX_DECISIONS = 4096


class Policy:
    """oslo.policy's enforcer with qsched's rules registered (None: the defaults only)."""

    def __init__(self, enforcer: policy.Enforcer | None = None) -> None:
        self.enforcer = enforcer or policy_enforcer()
        self.enforcer.register_defaults(list_rules())
        self._decisions: dict[tuple[Any, ...], bool] = {}
        self._loaded_at = -RELOAD_S
        self._lock = threading.Lock()

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
        key = (rule, _frozen(context.to_policy_values()), _frozen(target))
        self._reload_if_due()
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(rule, target, context)
            if len(self._decisions) >= _MAX_DECISIONS:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _decide(self, rule: str, target: Mapping[str, Any], context: RequestContext) -> bool:
        try:
            return bool(self.enforcer.authorize(rule, target, context))
        except policy.InvalidScope:
            return False

    def _reload_if_due(self) -> None:
        now = time.monotonic()
        if now - self._loaded_at < RELOAD_S:
            return
        with self._lock:
            if now - self._loaded_at >= RELOAD_S:
                self.enforcer.load_rules()
                self._decisions = {}
                self._loaded_at = now

    def is_admin(self, context: RequestContext) -> bool:
        """What ``context_is_admin`` says of the caller (``role:admin`` by default)."""
        return self.allows(context, "context_is_admin", {})


def own(context: RequestContext) -> dict[str, Any]:
    """The target of an action on the caller's own project."""
    return {"project_id": context.project_id, "user_id": context.user_id}


def _frozen(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A mapping of names to strings, lists or None as a hashable key."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in values.items()))
