"""Host rules: where a create asks its servers to run, by host, turned into the rule the
claim holds (docs/server-groups.rst, "Host rules").

A create may name servers to share a host with (Nova's ``same_host`` scheduler hint)
or to keep away from (``different_host``), and an admin may name the host and node
(microversion 2.74's ``host`` and ``hypervisor_hostname``). Nova's SameHostFilter
and DifferentHostFilter read them while the scheduler weighs hosts, and two parallel
boots can both pass; qsched turns them into a
:class:`~qsched.ledger.records.HostRule` kept in each record, and the claim refuses a
host that breaks it in the same atomic step that takes the resources.

The servers named are read once, here, when the create is accepted (O(servers
named), never O(hosts)): a server the caller may not see, a deleted one and one not
placed yet count as on no host. That keeps a member from learning where another
project's servers run (Nova's filters would tell, by where a boot lands). A create
whose rule no host can satisfy ends in ERROR NoValidHost at once, as Nova's scheduler
would end it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from qsched import exception
from qsched.compute.visible import may_see
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import HostRule, State
from qsched.policies import servers as servers_policy
from qsched.policy import Policy

#: At most this many servers in ``same_host`` and ``different_host`` together: the claim
#: reads the hosts they were on, so a rule stays a few hundred bytes.
MAX_NAMED_SERVERS = 1000


class RequestedHostNotFound(exception.Invalid):
    """No compute service or node by the name a 2.74 create asks for (Nova's 400)."""

    msg_fmt = "Compute host {host} could not be found."


@dataclasses.dataclass(frozen=True)
class HostRequest:
    """What a create asks of its servers' hosts: servers to share one with and to keep
    away from (uuids), and a host and node (2.74, admin only)."""

    same_host: tuple[str, ...] = ()
    different_host: tuple[str, ...] = ()
    host: str | None = None
    node: str | None = None

    def __bool__(self) -> bool:
        return bool(self.same_host or self.different_host or self.host or self.node)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The rule a create's servers carry, and why no host can satisfy it (else None)."""

    rule: HostRule | None
    unplaceable: str | None = None


class HostRules:
    """Turns a :class:`HostRequest` into the rule the claim holds."""

    def __init__(self, stores: Stores, policy: Policy) -> None:
        self.stores = stores
        self.policy = policy

    def resolve(self, context: RequestContext, asked: HostRequest) -> Resolved:
        """The rule for ``asked``; checked before anything is held.

        :raises Forbidden: a host or node asked for by a caller that
            ``compute:servers:create:requested_destination`` refuses (403).
        :raises RequestedHostNotFound: no such host or node, or the node is not the
            host's (400).
        :raises Invalid: more than :data:`MAX_NAMED_SERVERS` servers named.
        """
        if not asked:
            return Resolved(None)
        named = len(asked.same_host) + len(asked.different_host)
        if named > MAX_NAMED_SERVERS:
            raise exception.Invalid(
                reason=f"same_host and different_host name {named} servers; at most "
                f"{MAX_NAMED_SERVERS} may be named."
            )
        only: set[str] | None = None
        if asked.host is not None or asked.node is not None:
            only = {self._destination(context, asked.host, asked.node)}
        if asked.same_host:
            hosts = self._hosts(context, asked.same_host)
            only = hosts if only is None else only & hosts
        never = self._hosts(context, asked.different_host)
        rule = HostRule(tuple(only or ()), tuple(never), asked.node)
        if only is not None and not only - never:
            return Resolved(rule, _why_unplaceable(asked, only))
        return Resolved(rule)

    def _destination(self, context: RequestContext, host: str | None, node: str | None) -> str:
        """The host of a 2.74 request: ``host`` if its service exists, else the host of
        ``node``, which must be that host's when both are given."""
        self.policy.authorize(
            context, servers_policy.REQUESTED_DESTINATION, {"project_id": context.project_id}
        )
        if host is not None:
            try:
                self.stores.agents.service(host)
            except exception.NotFound:
                raise RequestedHostNotFound(host=host) from None
        if node is None:
            assert host is not None
            return host
        provider = self.stores.ledger.find_provider(node)
        if provider is None or provider.parent_uuid is not None or not provider.host:
            raise RequestedHostNotFound(host=node)
        if host is not None and provider.host != host:
            raise RequestedHostNotFound(host=host)
        return provider.host

    def _hosts(self, context: RequestContext, uuids: Sequence[str]) -> set[str]:
        """The hosts the caller's servers among ``uuids`` are on (placed, not deleted)."""
        if not uuids:
            return set()
        found = self.stores.instances.get_many(sorted(set(uuids)))
        return {
            i.host
            for i in found.values()
            if i.host and i.state != State.DELETED and may_see(context, i)
        }


def _why_unplaceable(asked: HostRequest, only: set[str]) -> str:
    if not only:
        if asked.same_host and (asked.host or asked.node):
            return "no server of same_host is on the host asked for"
        return "no server of same_host is on a host"
    return "every host it may run on runs a server of different_host"
