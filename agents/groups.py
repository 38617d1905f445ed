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

:meth:`GroupStep.decide` takes what the placing step decided (:mod:`agents.placing`) and
returns the outcome for the delivery (:mod:`agents.outcome`): PARK, FORWARD, PASS_ON or
ENDED; the agent then settles it through :meth:`GroupStep.park`, :meth:`GroupStep.forward`
or :meth:`GroupStep.pass_on`.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from agents.outcome import ENDED, Code, Outcome
from agents.steps import AgentParts
from qsched import exception
from qsched.bus.base import Delivery, Names
from qsched.ledger.records import AFFINITY, HostRule
from qsched.scheduling.message import BootRequest
from qsched.scheduling.request import Refusal, RefusalKind

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

    def decide(self, msg: BootRequest, delivery: Delivery, outcome: Outcome) -> Outcome:
        """What becomes of a request the claim refused for a placement rule
        (RULE_REFUSED), or that no node here fits while it was sent to this host only
        (REFUSED from its own queue); any other outcome as it is."""
        if outcome.code is Code.RULE_REFUSED and outcome.rule is not None:
            return self.refused(msg, outcome.rule)
        if outcome.code is Code.REFUSED and self.routed_here(delivery):
            return self.no_room(msg, outcome.refusal)
        return outcome

    def refused(self, msg: BootRequest, refusal: exception.PlacementRuleRefused) -> Outcome:
        """The claim refused this host for the group's policy or the host rule: FORWARD
        the request to the host the refusal names (affinity, a host rule's ``only``, and
        soft-affinity while that host's agent lives), PASS_ON it (anti-affinity,
        soft-anti-affinity, ``different_host``), or PARK it (a hard rule, at every
        :data:`GROUP_TRIES` refusals)."""
        parts, host, reason = self.parts, self.parts.host, str(refusal)
        by_host_rule = isinstance(refusal, exception.HostRuleRefused)
        parts.counters["host_rule_refused" if by_host_rule else "group_refused"] += 1
        kind = RefusalKind.HOST_RULE if by_host_rule else RefusalKind.SERVER_GROUP
        parts.metrics.refused(kind.value)
        holder, soft = refusal.kwargs.get("holder"), bool(refusal.kwargs.get("soft"))
        refusals = int(refusal.kwargs.get("refusals") or 0)
        if not soft and refusals % GROUP_TRIES == 0:
            return Outcome.park(f"{reason}; refused {refusals} times so far")
        if holder and (not soft or parts.stores.agents.alive(holder)):
            parts.stores.instances.add_event(
                msg.instance_uuid, "forwarded", host=host, to=holder, reason=reason,
                kind=kind.value,
            )  # fmt: skip
            return Outcome.forward(holder)
        self._refused(msg, reason, kind)
        return Outcome.pass_on(give_way=True)

    def no_room(self, msg: BootRequest, why: Refusal | None) -> Outcome:
        """A request from this host's own queue that no node here fits: end it (ENDED:
        its affinity group is on this host, or the last host of its host rule), FORWARD
        it to the next host of its host rule, or PASS_ON it to its class queue."""
        parts, host = self.parts, self.parts.host
        what = str(why) if why is not None else "no node of this agent fits the request"
        parts.metrics.refused(why.kind.value if why else "none")  # as a class queue's refusal
        rule = msg.host_rule()
        if rule is not None and rule.only:
            return self._next_host(msg, rule, what)
        if (
            msg.group is not None
            and msg.group_policy == AFFINITY
            and parts.stores.groups.members_on(msg.group, host)
        ):
            self._refused(msg, f"affinity group {msg.group} is on {host}, which has no room: "
                          f"{what}")  # fmt: skip
            parts.no_valid_host(msg.instance_uuid, "affinity")
            return ENDED
        self._refused(msg, f"sent to {host}, which has no room: {what}")
        return Outcome.pass_on(give_way=False)

    def _next_host(self, msg: BootRequest, rule: HostRule, what: str) -> Outcome:
        """A request that may run on the hosts of ``rule.only`` and has no room here:
        FORWARD it to the next of them whose agent lives (:meth:`HostRule.next_host`), or
        ENDED in NoValidHost after the last. O(hosts of the rule)."""
        parts, host = self.parts, self.parts.host
        self._refused(msg, f"sent to {host}, which has no room: {what}", RefusalKind.HOST_RULE)
        after = host if host in rule.only else ""  # forwarded here for another rule
        while (following := rule.next_host(after)) is not None:
            if parts.stores.agents.alive(following):
                parts.stores.instances.add_event(
                    msg.instance_uuid, "forwarded", host=host, to=following,
                    reason="the next host of its host rule", kind=RefusalKind.HOST_RULE.value,
                )  # fmt: skip
                return Outcome.forward(following)
            after = following
        parts.no_valid_host(msg.instance_uuid, "host rule")
        return ENDED

    # -- settling the outcomes above (the agent's dispatch on the code) --

    def park(self, msg: BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        """PARK: leave the request to the janitor's outbox pass for a grace period (for
        ``outcome.reason``), then ack. A move has no outbox entry (its server runs): it
        is passed on with a pause instead, until a host takes it or its deadline."""
        if msg.moves:
            self.pass_on(msg, delivery, Outcome.pass_on(give_way=True))
            return
        self.parts.counters["parked"] += 1
        self.parts.stores.instances.park(msg.instance_uuid, self.parts.host, outcome.reason)
        delivery.ack()

    def forward(self, msg: BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        """FORWARD: publish the request to the queue of ``outcome.host`` (confirmed
        first), then ack."""
        self.parts.bus.publish_to_host(outcome.host, msg.requeued())
        delivery.ack()

    def pass_on(self, msg: BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        """PASS_ON: give the request to the other agents; with ``outcome.give_way``,
        pause this consumer a moment after."""
        self._pass_on(msg, delivery)
        if outcome.give_way:
            # Let the others take it first: a broker that hands a message to the consumer
            # that just gave it back, as kombu's memory transport does, would otherwise
            # keep it going round here (longer when it came back to a host that refused
            # it).
            self.parts.stopped.wait(REPICK_PAUSE_S if self._seen_again(msg) else PASS_PAUSE_S)

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
