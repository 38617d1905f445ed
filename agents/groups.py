"""Placement rules at an agent (server groups, host rules): forward, pass on, park, or
end NoValidHost.

The claim script keeps a hard policy and a host rule atomically (``lib.lua``,
``allocate.lua``: a claim that would break one is refused in the step that would take
the resources, whatever the interleaving of agents). This step decides what becomes of
the requests it refuses, and of those sent to this host's own queue; each decision
costs O(1) ledger reads, whatever the number of hosts (O(hosts the rule names) for a
host rule).

==================  ========================================================================
refused by the      *affinity*: forwarded to the queue of the host the group is on (the
claim               refusal names it), so its members go only there. *anti-affinity*:
                    passed on to the other agents, at the tail of the class queue. At every
                    :data:`GROUP_TRIES` refusals (counted on its record by the claim) a
                    member is *parked*: it waits in the outbox for ``[scheduler]
                    outbox_grace_s`` before the janitor publishes it again, so a group no
                    host can take costs a few refusals per grace period until its deadline,
                    never a spin.
sent here, no room  a member sent to this host's queue that no node here fits: while its
                    affinity group is still on this host it ends NoValidHost (as in Nova, an
                    affinity group never leaves its host); otherwise (a soft-affinity
                    group, or the group moved) it goes to the class queue.
host rules          a request that may run on some hosts only (``same_host``, the 2.74
                    host) goes to the queue of the first of them whose agent lives; one
                    refused by the claim elsewhere is forwarded there. One that has no
                    room on a host of its rule goes to the next of them in name order
                    whose agent lives, and ends NoValidHost after the last: each is
                    tried once. One refused for ``different_host`` is passed on and
                    parked as an anti-affinity member is.
soft policies       the claim passes a member on while it has passes left (counted on its
                    record, ``GROUP_SOFT_TRIES`` in ``lib.lua``): soft-anti-affinity to the
                    other agents when this host holds members of its group, soft-affinity
                    to the queue of the host holding most of them (if its agent is alive).
                    Then any host that fits takes it: soft policies prefer, never refuse.
==================  ========================================================================
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from agents.steps import AgentParts
from qsched import exception
from qsched.bus.base import Delivery, Names
from qsched.ledger.records import AFFINITY, HostRule
from qsched.scheduling.fit import Refusal, RefusalKind
from qsched.scheduling.message import BootRequest

LOG = logging.getLogger(__name__)

#: A member of a hard-policy group is parked at every this many refusals by the claim.
GROUP_TRIES = 16
#: How long an agent stops taking requests after passing on a member it refused, and
#: after passing on one it had refused before.
PASS_PAUSE_S = 0.02
REPICK_PAUSE_S = 0.05
_REMEMBERED = 1024


class GroupStep:
    """What an agent does for members of server groups (see the module docstring)."""

    def __init__(self, parts: AgentParts) -> None:
        self.parts = parts
        self._own_key = Names.host_routing_key(parts.host)
        # members this host refused lately (tried_hosts keeps only failed claims)
        self._refused_here: collections.OrderedDict[str, None] = collections.OrderedDict()

    def _seen_again(self, msg: BootRequest) -> bool:
        """Whether this host refused the member before (remembering the last 1,024)."""
        uuid = msg.instance_uuid
        again = uuid in self._refused_here
        self._refused_here[uuid] = None
        self._refused_here.move_to_end(uuid)
        while len(self._refused_here) > _REMEMBERED:
            self._refused_here.popitem(last=False)
        return again

    def routed_here(self, delivery: Delivery) -> bool:
        """Whether the delivery came from this host's own queue (sent to this host only)."""
        return delivery.routing_key == self._own_key

    def refused(
        self, msg: BootRequest, delivery: Delivery, refusal: exception.PlacementRuleRefused
    ) -> None:
        """The claim refused this host for the group's policy or the host rule: forward
        the request to the host the refusal names (affinity, a host rule's ``only``, and
        soft-affinity while that host's agent lives), pass it on (anti-affinity,
        soft-anti-affinity, ``different_host``), or park it (a hard rule, at every
        :data:`GROUP_TRIES` refusals)."""
        parts, host, reason = self.parts, self.parts.host, str(refusal)
        by_host_rule = isinstance(refusal, exception.HostRuleRefused)
        parts.counters["host_rule_refused" if by_host_rule else "group_refused"] += 1
        kind = RefusalKind.HOST_RULE if by_host_rule else RefusalKind.SERVER_GROUP
        parts.metrics.refused(kind.value)
        holder, soft = refusal.kwargs.get("holder"), bool(refusal.kwargs.get("soft"))
        refusals = int(refusal.kwargs.get("refusals") or 0)
        if not soft and refusals % GROUP_TRIES == 0:
            self.park(msg, delivery, f"{reason}; refused {refusals} times so far")
            return
        if holder and (not soft or parts.stores.agents.alive(holder)):
            parts.stores.instances.add_event(
                msg.instance_uuid, "forwarded", host=host, to=holder, reason=reason,
                kind=kind.value,
            )  # fmt: skip
            parts.bus.publish_to_host(holder, msg.requeued())
            delivery.ack()
            return
        self._refused(msg, reason, kind)
        self._pass_on(msg, delivery)
        # Let the others take it first: a broker that hands a message to the consumer
        # that just gave it back, as kombu's memory transport does, would otherwise
        # keep it going round here (longer when it came back to a host that refused it).
        parts.stopped.wait(REPICK_PAUSE_S if self._seen_again(msg) else PASS_PAUSE_S)

    def park(self, msg: BootRequest, delivery: Delivery, reason: str) -> None:
        """Leave the request to the janitor's outbox pass for a grace period, then ack."""
        self.parts.counters["parked"] += 1
        self.parts.stores.instances.park(msg.instance_uuid, self.parts.host, reason)
        delivery.ack()

    def no_room(self, msg: BootRequest, delivery: Delivery, why: Refusal | None) -> bool:
        """A request from this host's own queue that no node here fits: end it (its
        affinity group is on this host) or send it to its class queue. False for a
        delivery from a class queue (the usual refusal applies)."""
        if not self.routed_here(delivery):
            return False
        parts, host = self.parts, self.parts.host
        what = str(why) if why is not None else "no node of this agent fits the request"
        parts.metrics.refused(why.kind.value if why else "none")  # as a class queue's refusal
        rule = msg.host_rule()
        if rule is not None and rule.only:
            self._next_host(msg, delivery, rule, what)
            return True
        if (
            msg.group is not None
            and msg.group_policy == AFFINITY
            and parts.stores.groups.members_on(msg.group, host)
        ):
            self._refused(msg, f"affinity group {msg.group} is on {host}, which has no room: "
                          f"{what}")  # fmt: skip
            parts.no_valid_host(msg.instance_uuid, "affinity")
            delivery.ack()
            return True
        self._refused(msg, f"sent to {host}, which has no room: {what}")
        self._pass_on(msg, delivery)
        return True

    def _next_host(self, msg: BootRequest, delivery: Delivery, rule: HostRule, what: str) -> None:
        """A request that may run on the hosts of ``rule.only`` and has no room here: on
        to the next of them whose agent lives (:meth:`HostRule.next_host`), or NoValidHost
        after the last. O(hosts of the rule)."""
        parts, host = self.parts, self.parts.host
        self._refused(msg, f"sent to {host}, which has no room: {what}", RefusalKind.HOST_RULE)
        after = host if host in rule.only else ""  # forwarded here for another rule
        while (following := rule.next_host(after)) is not None:
            if parts.stores.agents.alive(following):
                parts.stores.instances.add_event(
                    msg.instance_uuid, "forwarded", host=host, to=following,
                    reason="the next host of its host rule", kind=RefusalKind.HOST_RULE.value,
                )  # fmt: skip
                parts.bus.publish_to_host(following, msg.requeued())  # confirmed first
                delivery.ack()
                return
            after = following
        parts.no_valid_host(msg.instance_uuid, "host rule")
        delivery.ack()

    def _refused(
        self, msg: BootRequest, reason: str, kind: RefusalKind = RefusalKind.SERVER_GROUP
    ) -> None:
        detail: dict[str, Any] = {"kind": kind.value}
        if kind is RefusalKind.SERVER_GROUP:
            detail.update(group=msg.group, policy=msg.group_policy)
        self.parts.stores.instances.add_event(
            msg.instance_uuid, "refused", host=self.parts.host, reason=reason, **detail
        )

    def _pass_on(self, msg: BootRequest, delivery: Delivery) -> None:
        """Give the request to the other agents: the tail of its class queue."""
        copy = msg.requeued()
        if self.routed_here(delivery):
            self.parts.bus.publish_boot(copy)  # confirmed before the ack: never lost
            delivery.ack()
        else:
            delivery.requeue(copy.encode())
