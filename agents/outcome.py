"""The outcome of an agent's step for one request: what becomes of its delivery.

After kube-scheduler's framework ``Status`` (``pkg/scheduler/framework/interface.go``):
every step of the consumer thread returns one :class:`Outcome`, a :class:`Code` and the
data that code needs (the pick, the refusal, the reason, the host). The thread settles
the delivery with one dispatch on the code (:class:`agents.service.ComputeAgent`);
exceptions are left for what is exceptional (the ledger or the bus down: the delivery
goes back to the broker unacked).

Who returns which code:

==========================  ===============================================================
:meth:`Placer.admit`        ADMITTED, DROP, LATER, ENDED, DEAD_LETTER
:meth:`Placer.place`        PLACED, DROP, REFUSED, RULE_REFUSED, HAND_BACK, CLOSED,
                            DEAD_LETTER
:meth:`GroupStep.decide`    for RULE_REFUSED, and REFUSED from the host's own queue: PARK,
                            FORWARD, PASS_ON, ENDED; any other outcome as it is
:meth:`DeleteStep.delete`   ENDED, DROP, DEAD_LETTER
==========================  ===============================================================

(:mod:`agents.placing`, :mod:`agents.groups`, :mod:`agents.deletes`.) ADMITTED and
RULE_REFUSED are between steps: the service never settles a delivery on them.

Imports: the bus's and the scheduling contract's values, and the node index's pick.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

from agents.nodes import Pick
from qsched import exception
from qsched.bus.base import Delivery
from qsched.scheduling.message import BootRequest, Message
from qsched.scheduling.request import Refusal


class Code(enum.Enum):
    """What the consumer thread does with a delivery (or, between steps, goes on to do)."""

    ADMITTED = "admitted"  # between steps: go on, pick and claim
    PLACED = "placed"  # claimed: spawn it (or hold it for its batch), ack
    DROP = "drop"  # nothing to do (deleted, placed, our build of it runs): ack, counted
    ENDED = "ended"  # the step ended the instance (NoValidHost, or destroyed it): ack
    LATER = "later"  # our spawn of it runs but the ledger took the claim back: requeue it
    DEAD_LETTER = "dead_letter"  # not this agent's to act on: reject with the reason
    REFUSED = "refused"  # nothing here fits: say why, requeue it at the tail
    RULE_REFUSED = "rule_refused"  # between steps: the claim refused it for a group or a rule
    HAND_BACK = "hand_back"  # tried here, an alternate can take it: pause the class, requeue
    CLOSED = "closed"  # this host's service takes no new boots: stop consuming, requeue
    FORWARD = "forward"  # to the queue of the host named: publish it there, ack
    PASS_ON = "pass_on"  # to the other agents: the tail of its class queue
    PARK = "park"  # to the outbox for a grace period: ack


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A step's outcome: its code and what settling it needs.

    ``reason``: why (a dead letter's, a closed service's, a park's); ``counter``: the
    agent counter a dead letter is counted under; ``pick``: PLACED's node and
    allocations; ``refusal``: REFUSED's, why nothing here fits; ``rule``:
    RULE_REFUSED's, the claim's refusal; ``host``: where FORWARD sends it, or the
    alternate of a HAND_BACK; ``handbacks``: a HAND_BACK's count, this one included;
    ``give_way``: PASS_ON pauses the consumer after, so that the others take it first.
    """

    code: Code
    reason: str = ""
    counter: str = ""
    pick: Pick | None = None
    refusal: Refusal | None = None
    rule: exception.PlacementRuleRefused | None = None
    host: str = ""
    handbacks: int = 0
    give_way: bool = False

    @classmethod
    def placed(cls, pick: Pick) -> Outcome:
        return cls(Code.PLACED, pick=pick)

    @classmethod
    def dead_letter(cls, counter: str, reason: str) -> Outcome:
        return cls(Code.DEAD_LETTER, reason, counter=counter)

    @classmethod
    def refused(cls, refusal: Refusal) -> Outcome:
        return cls(Code.REFUSED, refusal=refusal)

    @classmethod
    def rule_refused(cls, rule: exception.PlacementRuleRefused) -> Outcome:
        return cls(Code.RULE_REFUSED, str(rule), rule=rule)

    @classmethod
    def hand_back(cls, alternate: str, handbacks: int) -> Outcome:
        return cls(Code.HAND_BACK, host=alternate, handbacks=handbacks)

    @classmethod
    def closed(cls, why: str) -> Outcome:
        return cls(Code.CLOSED, why)

    @classmethod
    def forward(cls, host: str) -> Outcome:
        return cls(Code.FORWARD, host=host)

    @classmethod
    def pass_on(cls, give_way: bool) -> Outcome:
        return cls(Code.PASS_ON, give_way=give_way)

    @classmethod
    def park(cls, reason: str) -> Outcome:
        return cls(Code.PARK, reason)


ADMITTED = Outcome(Code.ADMITTED)
DROP = Outcome(Code.DROP)
ENDED = Outcome(Code.ENDED)
LATER = Outcome(Code.LATER)

#: How the service settles a boot request's delivery for one code.
Settle = Callable[[BootRequest, Delivery, Outcome], None]
#: How it settles a delivery of any message, for the codes any step may return.
SettleAny = Callable[[Message, Delivery, Outcome], None]
