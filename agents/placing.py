"""Placing one boot request on this agent: admit, pick, claim, or refuse.

The steps of a pull scheduler, in the order a request meets them (kube-scheduler's
framework names its plug-in points PreFilter, Filter, Reserve, Permit, Bind,
Unreserve; an agent that pulls its work is asked other questions):

=========  ==========================================================================
admit      Is the request this agent's to place now? Not a redelivery of a build in
           flight, not past its deadline (then it ends here in NoValidHost, if the
           record's deadline has passed too), of a class the ledger lists (else a
           dead letter), asking what that class holds (else a dead letter, unless
           its record asks the same).
pick       Which node has room: the index answers in O(1).
claim      Take the resources in the ledger, atomic with the check that the
           instance still waits and that its record names the class placed for;
           generation conflicts are re-read and retried the Placement way. The
           request is acked only once this holds.
refuse     Nothing here fits: say why in the instance history and requeue the
           request for another agent (a refusal is not an attempt).
hand back  The claim said this host already tried the request (its spawn failed
           here, or its claim was taken back) and another agent that has not can
           take it: requeue the request as it is, and pause its class here for
           ``[agent] handback_pause_s`` so that the broker gives it to another.
           The claim said this host's service is disabled or forced down: stop
           consuming boot requests and requeue it (a refusal).
=========  ==========================================================================

After the claim the spawn runs in a worker (:mod:`agents.spawning`: spawn, settle,
give back). A new rule that must hold at claim time (a hard server-group policy)
belongs in :meth:`Placer.claim`, one that narrows the nodes in :meth:`Placer.pick`.

The record the front door wrote is the truth, not the message (anyone who can publish
on the bus can write one): what a claim takes comes from the class the ledger defines,
the claim script refuses a class other than the one the record names, and the admit
step refuses a message whose flavor or constraints are not its class's. Either refusal
(:class:`~qsched.exception.NotItsRequest`) is the step's outcome DEAD_LETTER: the message
is dead-lettered with the reason; the instance waits for its own request.

Each step returns an :class:`~agents.outcome.Outcome`: its code says what the consumer
thread does with the delivery, and :class:`~agents.service.ComputeAgent` settles it
through the methods of this module that take one (refuse, refuse closed, hand back).

Alternates (Nova's alternate hosts and RetryFilter) are such a rule: the ledger's
claim refuses a host in the record's ``tried_hosts`` while a live agent not in them
has room for the class, up to ``[agent] max_handbacks`` hand-backs of the request
(docs/pipeline.rst, "Alternates").

A move's request (``BootRequest.moves``, docs/moves.rst) meets the same steps; its
claim is the migration's (:meth:`~qsched.ledger.base.MigrationStore.claim`), which
refuses the server's own host (unless a resize may stay there) and every destination
that could not take it before: both hand the request back, for another agent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from typing import Any

from agents.nodes import Pick
from agents.outcome import ADMITTED, DROP, ENDED, LATER, Outcome
from agents.steps import AgentParts, Build
from qsched import exception
from qsched.bus.base import Delivery
from qsched.flavors import Constraints
from qsched.ledger import retry
from qsched.ledger.base import ClaimGuard, State
from qsched.notifications import payloads
from qsched.recovery.reaper import MOVE_NO_VALID_HOST
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import BootRequest
from qsched.scheduling.records import request_for
from qsched.scheduling.request import Refusal, RefusalKind

LOG = logging.getLogger(__name__)

#: How many nodes one request may try after the ledger refused the first pick.
MAX_PICKS = 3


@dataclasses.dataclass(frozen=True)
class Alternates:
    """How a host that already tried a request gives way (``[agent]`` options)."""

    max_handbacks: int  # hand-backs of one request before a tried host may claim it
    pause_s: float  # how long a hand-back stops this agent consuming the class
    #: how long a move may find no other agent of its class before it ends: the
    #: agents that fit a new class register as its consumers within a few heartbeats
    move_grace_s: float = 2.0


class UnknownClass(exception.Invalid):
    msg_fmt = (
        "scheduling class {name} is not published in the ledger: no front door made it, so "
        "no agent consumes it"
    )


@dataclasses.dataclass(frozen=True)
class _Defined:
    """What a class holds, as the ledger defines it: a message of the class must ask the
    same (its flavor as the wire carries it, its constraints)."""

    flavor: dict[str, Any]
    constraints: Constraints

    def asked_by(self, msg: BootRequest) -> bool:
        return msg.flavor == self.flavor and msg.constraints() == self.constraints


class Placer:
    """The consumer thread's steps for one boot request (see the module docstring).

    ``claim_retries``: re-reads after generation conflicts before a claim gives up.
    """

    def __init__(self, parts: AgentParts, claim_retries: int, alternates: Alternates) -> None:
        self.parts = parts
        self.claim_retries = claim_retries
        self.alternates = alternates
        self.sample_node: str | None = None  # the node on which refusals are explained
        self._defined: dict[str, _Defined] = {}  # by class name, as learned

    # -- admit --

    def admit(self, msg: BootRequest) -> Outcome:
        """Whether this agent places ``msg`` now (ADMITTED); DROP a redelivery of a build
        in flight, or LATER if the ledger took its claim back; ENDED in NoValidHost if
        it is past due; DEAD_LETTER a class the ledger does not list, or a message that
        disagrees with its instance's record (a deadline the record has not reached,
        another flavor or constraints: ``not_its_request``).

        The usual path reads nothing from the ledger: the claim script is the check
        that the instance still waits, and the class's definition, in memory, the
        check of what the message asks.
        """
        try:
            return self._admit(msg)
        except exception.NotItsRequest as exc:  # the record says otherwise: nothing done
            return Outcome.dead_letter("not_its_request", str(exc))

    def _admit(self, msg: BootRequest) -> Outcome:
        if msg.instance_uuid in self.parts.builds:
            # A redelivery while our spawn runs: drop it. But if the ledger took our
            # claim back (a janitor thought us dead), the request is due again: once
            # that spawn has given up, we or another agent must take it.
            return LATER if self.still_waiting(msg) else DROP
        if msg.expired():
            if msg.moves:
                return self._move_expired(msg)
            self.parts.no_valid_host(msg.instance_uuid, "deadline", due_only=True)
            return ENDED
        if not self.knows_class(msg.scheduling_class):
            reason = str(UnknownClass(name=msg.scheduling_class))
            return Outcome.dead_letter("unknown_class", reason)
        self.check_asks(msg)
        return ADMITTED

    def check_asks(self, msg: BootRequest) -> None:
        """That ``msg`` asks what its class holds: compared in memory with the class's
        definition; on a difference, with the ledger's definition read again (a flavor
        changed since this agent learned it), then with the instance's record.

        A request whose record asks what it asks, while its class was defined anew
        since (its flavor was changed while it waited), is placed as the class is
        defined now, as before; the claim still checks that the record names the class.

        :raises NotItsRequest: neither the class nor the record asks the same.
        """
        name = msg.scheduling_class
        defined = self._defined.get(name)
        if defined is not None and defined.asked_by(msg):
            return
        self.parts.counters["class_rereads"] += 1
        found = self.parts.stores.agents.classes().get(name)
        if found is not None:
            self._learn_class(name, found)
            defined = self._defined.get(name)
            if defined is not None and defined.asked_by(msg):
                return
        why = self._disagreement(msg)
        if why is not None:
            raise exception.NotItsRequest(instance=msg.instance_uuid, reason=why)
        LOG.warning("agent %s: %s asks what its record asks, but class %s is defined anew "
                    "since (its flavor changed while it waited): placed as the class is now",
                    self.parts.host, msg.instance_uuid, name)  # fmt: skip

    def _disagreement(self, msg: BootRequest) -> str | None:
        """How ``msg`` differs from the request its record rebuilds, or None (also when
        there is no waiting record: the claim then finds nothing to place)."""
        try:
            inst = self.parts.stores.instances.get(msg.instance_uuid)
        except exception.InstanceNotFound:
            return None
        if inst.state != State.BUILD or inst.host is not None:
            return None
        try:
            recorded = request_for(inst)
        except exception.Invalid:
            return None  # no front door's record: nothing to compare with
        for field in ("scheduling_class", "flavor"):
            if getattr(msg, field) != getattr(recorded, field):
                return f"its {field} is not the one its record was made with"
        if msg.constraints() != recorded.constraints():
            return "its constraints are not the ones its record was made with"
        return None

    def _move_expired(self, msg: BootRequest) -> Outcome:
        """A move past its deadline: it ends (the server stays on its source) unless a
        destination holds it already; ENDED either way."""
        return self._end_move(msg, MOVE_NO_VALID_HOST, "deadline")

    def _move_elsewhere(self, msg: BootRequest, refusal: dict[str, Any]) -> Outcome:
        """A move this host may not take: HAND_BACK for the refusal's ``alternate``, a
        live agent that may. With none once the move is older than
        ``Alternates.move_grace_s`` (the agents that fit a class new to them register
        as its consumers within a few heartbeats), it ends (ENDED): no host can take
        it now, as Nova's scheduler answers NoValidHost at once."""
        alternate = str(refusal.get("alternate") or "")
        if alternate:
            return Outcome.hand_back(alternate, 0)
        if float(refusal.get("age") or 0.0) < self.alternates.move_grace_s:
            return Outcome.hand_back("an agent still learning its class", 0)
        reason = "No valid host was found: no other host can take the move now."
        return self._end_move(msg, reason, "no_alternate")

    def _end_move(self, msg: BootRequest, reason: str, why: str) -> Outcome:
        """End a move that waits for a destination, counted under ``why``: ENDED (also
        when it waits no more)."""
        assert msg.migration is not None
        with contextlib.suppress(exception.MoveNotUnderWay, exception.MigrationNotFound):
            self.parts.stores.migrations.fail(msg.migration, "", reason, retry=False)
            self.parts.metrics.no_valid_host(why)
        return ENDED

    def still_waiting(self, msg: BootRequest) -> bool:
        """Whether the instance (a move: its migration) still waits for a host: worth
        requeueing its request."""
        if msg.migration is not None:
            try:
                return self.parts.stores.migrations.get(msg.migration).waiting
            except exception.MigrationNotFound:
                return False
        try:
            inst = self.parts.stores.instances.get(msg.instance_uuid)
        except exception.InstanceNotFound:
            return False
        return inst.state == State.BUILD and inst.host is None

    def knows_class(self, name: str) -> bool:
        """Know the class, from the ledger only: agents consume what it lists."""
        if name not in self.parts.index.classes():
            self.sync_classes()
        return name in self.parts.index.classes()

    def sync_classes(self) -> None:
        """Learn the live classes from the ledger: O(number of classes)."""
        known = self.parts.index.classes()
        for name, definition in self.parts.stores.agents.classes().items():
            if name not in known:
                self._learn_class(name, definition)

    def _learn_class(self, name: str, definition: dict[str, Any]) -> None:
        """Know the class as ``definition`` says (replacing what was known of it)."""
        try:
            scheduling_class = SchedulingClass.from_definition(definition)
            request = scheduling_class.request()
        except exception.Invalid as exc:
            LOG.error("agent %s: ignoring class %s with a bad definition: %s", self.parts.host,
                      name, exc)  # fmt: skip
            return
        self.parts.index.add_request(name, request)
        flavor = scheduling_class.flavor.to_dict()
        self._defined[name] = _Defined(flavor, scheduling_class.constraints)

    # -- pick and claim --

    def place(self, msg: BootRequest) -> Outcome:
        """Pick and claim a node: PLACED with the pick; REFUSED with why nothing here
        fits; HAND_BACK (this host tried it, an alternate can take it) or CLOSED (this
        host's service takes no new boots); RULE_REFUSED (a group's policy, a host rule:
        :mod:`agents.groups` decides); DEAD_LETTER a request whose record names another
        class; DROP if nothing is to place (deleted, placed, or no refusal to tell).

        A node the ledger finds fuller than the index thought is read again and the
        next pick tried, up to :data:`MAX_PICKS`. When every pick failed in the ledger
        while the index says the request fits (a shared provider many agents claim on),
        the refusal says so (``conflict``, transient): the request is requeued, never
        dropped.
        """
        failed: Exception | None = None
        for _ in range(MAX_PICKS):
            pick = self.pick(msg)
            if pick is None:
                return self._refused(msg, self.why_not(msg))
            try:
                if not self.claim(msg, pick):
                    return DROP
            except (
                exception.CapacityExceeded,
                exception.ClaimRuleBroken,
                exception.ProviderGenerationConflict,
            ) as exc:
                # fuller than the index thought, or its aggregates changed, or another
                # agent kept changing a provider it shares (max_conflict_retries used
                # up, a contended shared provider): read it again, never dead-letter it
                self._note_conflict(msg, pick, exc)
                self.parts.metrics.retried()
                self.parts.reconciler.refresh_nodes([pick.node])
                self._refresh_sharing(pick)
                failed = exc
                continue
            except exception.TriedHost as exc:
                alternate, handbacks = exc.kwargs["alternate"], exc.kwargs["handbacks"]
                return Outcome.hand_back(str(alternate), int(handbacks))
            except exception.MoveTriedHost as exc:  # never back to a host that failed it
                return self._move_elsewhere(msg, exc.kwargs)
            except exception.HostRuleRefused as exc:
                if exc.kwargs.get("rule") == "own":  # a move leaves its host
                    return self._move_elsewhere(msg, exc.kwargs)
                return Outcome.rule_refused(exc)
            except exception.ServiceDisabled as exc:
                return Outcome.closed(str(exc))
            except exception.PlacementRuleRefused as exc:  # a group's policy, a host rule
                return Outcome.rule_refused(exc)
            except exception.NotItsRequest as exc:  # the record says otherwise: nothing done
                return Outcome.dead_letter("not_its_request", str(exc))
            return Outcome.placed(pick)
        return self._refused(msg, self.why_not(msg) or _contended(pick, failed))

    def _refused(self, msg: BootRequest, why: Refusal | None) -> Outcome:
        """REFUSED if there is a refusal to tell and the instance still waits for a host
        (worth requeueing its request); else DROP: nothing to place any more."""
        if why is not None and self.still_waiting(msg):
            return Outcome.refused(why)
        return DROP

    def pick(self, msg: BootRequest) -> Pick | None:
        """The node the index chooses for the request's class (O(1)), or None.

        With sharing providers, None may only mean that the agent's view of one is full:
        it is read again (O(sharing providers)) and the pick tried once more.
        """
        if msg.requested_node is not None:
            return self._pick_node(msg, msg.requested_node)
        pick = self.parts.index.pick(msg.scheduling_class)
        if pick is None and self.parts.index.sharing():
            self.parts.reconciler.refresh_sharing()
            pick = self.parts.index.pick(msg.scheduling_class)
        return pick

    def _pick_node(self, msg: BootRequest, node: str) -> Pick | None:
        """The node a request asks for (2.74's ``hypervisor_hostname``), if it is this
        agent's and fits the request's class now; O(1)."""
        if node not in self.parts.index:
            return None
        fitted = self.parts.index.fit(node, msg.scheduling_class)
        return None if isinstance(fitted, Refusal) else Pick(node, fitted)

    # -- sharing providers (docs/shared-providers.rst) --

    def _refresh_sharing(self, pick: Pick) -> None:
        """After a refused claim that allocated on a sharing provider: read them again."""
        if self.parts.index.shared_generations(pick.allocations):
            self.parts.reconciler.refresh_sharing()

    def _short_of_sharing(self, why: Refusal | None) -> bool:
        """Whether the refusal is a sharing provider's lack of room."""
        sharing = {p.uuid for p in self.parts.index.sharing()}
        return why is not None and why.transient and why.provider in sharing

    def claim(self, msg: BootRequest, pick: Pick) -> bool:
        """Claim ``pick`` in the ledger and hold the build; False if the instance no
        longer waits (deleted, ended, placed elsewhere).

        :raises CapacityExceeded: the node is fuller than the index thought.
        :raises ClaimRuleBroken: the node's aggregates no longer suit the request.
        :raises ProviderGenerationConflict: still conflicting after ``claim_retries``.
        :raises TriedHost: this host tried the request and another can take it.
        :raises ServiceDisabled: this host's service is disabled or forced down.
        :raises PlacementRuleRefused: a group's policy or a host rule refuses this host.
        :raises NotItsRequest: the record names another class than the request's.
        :raises MoveTriedHost: a move this host could not take before.
        """
        if msg.migration is not None:
            return self._claim_move(msg, msg.migration, pick)
        parts = self.parts
        began = time.perf_counter()
        term = parts.lease.current()  # before the claim: a lapse after it is seen later
        try:
            with parts.index.writing(pick.node):
                result = retry.claim(
                    parts.stores.ledger, msg.instance_uuid, pick.allocations, parts.host,
                    pick.node, max_retries=self.claim_retries,
                    provider_generations=parts.index.generations(pick.node, pick.allocations),
                    on_conflict=functools.partial(self._note_conflict, msg, pick),
                    on_reread=functools.partial(parts.index.reread, pick.node),
                    guard=self._guard(msg, pick),
                    max_handbacks=self.alternates.max_handbacks,
                    scheduling_class=msg.scheduling_class,
                )  # fmt: skip
                build = Build(msg, pick, result.batch, result.permitted, term=term)
                parts.builds.add(build)
                # ``already``: a redelivery after a restart; the index read it from the ledger
                if not result.already:
                    parts.index.claim(pick.node, pick.allocations)
        except (exception.InstanceNotWaiting, exception.InstanceNotFound):
            return False
        parts.counters["claimed"] += 1
        parts.metrics.claimed(msg, time.perf_counter() - began)
        if not result.already and parts.notifier.enabled:
            self._notify_claimed(build)
        return True

    def _claim_move(self, msg: BootRequest, migration: str, pick: Pick) -> bool:
        """Claim ``pick`` as the destination of a move and hold the build; False if the
        move waits for no destination any more. Raises as :meth:`claim`.

        On its own host (a resize that may stay), the ledger holds the larger of the two
        flavors on the node: the node is read again rather than counted here.
        """
        parts = self.parts
        began = time.perf_counter()
        term = parts.lease.current()
        try:
            with parts.index.writing(pick.node):
                claimed = retry.claim_move(
                    parts.stores.migrations, parts.stores.ledger, migration, pick.allocations,
                    parts.host, pick.node,
                    provider_generations=parts.index.generations(pick.node, pick.allocations),
                    max_retries=self.claim_retries,
                    on_conflict=functools.partial(self._note_conflict, msg, pick),
                    guard=self._guard(msg, pick),
                    on_reread=functools.partial(parts.index.reread, pick.node),
                    scheduling_class=msg.scheduling_class,
                )  # fmt: skip
                parts.builds.add(Build(msg, pick, term=term))
                in_place = msg.source_host == parts.host
                if not claimed.already and not in_place:
                    parts.index.claim(pick.node, pick.allocations)
        except (
            exception.InstanceNotWaiting,
            exception.InstanceNotFound,
            exception.MigrationNotFound,
        ):
            return False
        if in_place:
            parts.reconciler.refresh_nodes([pick.node])
        parts.counters["move_claimed"] += 1
        parts.metrics.claimed(msg, time.perf_counter() - began)
        return True

    def _notify_claimed(self, build: Build) -> None:
        """``scheduler.claim`` (qsched's decision) then ``instance.create.start``: built
        from the request, no ledger read; the latter kept in the build for ``.end``. A
        redelivery's claim (``already``) sends none."""
        parts, msg, pick = self.parts, build.request, build.pick
        context = payloads.context(msg)
        claimed = payloads.claim(msg, parts.host, pick.node, pick.allocations)
        parts.notifier.notify("scheduler.claim", claimed, context=context)
        started = payloads.create_from_request(
            msg, parts.host, pick.node, "building", "spawning", "pending"
        )
        parts.notifier.notify("instance.create.start", started, context=context)
        build.told["instance.create.start"] = started

    def _guard(self, msg: BootRequest, pick: Pick) -> ClaimGuard | None:
        """The request's aggregate rules, for the claim to check on the node's root, and
        the sharing providers the pick takes from, which must still serve that root."""
        sharing = frozenset(self.parts.index.shared_generations(pick.allocations))
        if not (msg.member_of or msg.member_of_any or msg.forbidden_aggregates or sharing):
            return None
        constraints = msg.constraints()
        return ClaimGuard(
            self.parts.index.node(pick.node).providers[0].uuid, constraints.member_of,
            constraints.member_of_any, constraints.forbidden_aggregates, sharing,
        )  # fmt: skip

    def _note_conflict(self, msg: BootRequest, pick: Pick, exc: Exception) -> None:
        self.parts.counters["conflicts"] += 1
        self.parts.stores.instances.add_event(
            msg.instance_uuid, "conflict", host=self.parts.host, node=pick.node,
            reason=str(exc), retried=True,
        )  # fmt: skip

    # -- refuse --

    def why_not(self, msg: BootRequest) -> Refusal | None:
        """Why no node fits, told on one node: exact for one node, a sample for many."""
        node = self.sample_node if msg.requested_node is None else msg.requested_node
        if node is None or node not in self.parts.index:
            return None
        result = self.parts.index.fit(node, msg.scheduling_class)
        return result if isinstance(result, Refusal) else None

    def refuse(self, msg: BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        """REFUSED: say why nothing here fits and requeue the request with this host
        tried."""
        parts, why = self.parts, outcome.refusal
        reason = str(why) if why is not None else "no node of this agent fits the request"
        parts.counters["refused"] += 1
        parts.metrics.refused(why.kind.value if why else "none")
        parts.stores.instances.add_event(
            msg.instance_uuid, "refused", host=parts.host, node=why.node if why else None,
            reason=reason, kind=why.kind.value if why else "none", nodes=len(parts.index),
        )  # fmt: skip
        if self._short_of_sharing(why):
            # every node here waits on that provider: let the others' releases show first
            parts.gate.pause(msg.scheduling_class, self.alternates.pause_s)
        delivery.requeue(msg.requeued().encode())

    def refuse_closed(self, msg: BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        """CLOSED: this host's service takes no new boots (``outcome.reason``): stop
        consuming them, requeue this one.

        The heartbeat would say so within its interval; the claim said it first.
        """
        parts = self.parts
        parts.counters["refused"] += 1
        parts.metrics.refused("service")
        parts.gate.enable(False)
        parts.stores.instances.add_event(
            msg.instance_uuid, "refused", host=parts.host, reason=outcome.reason, kind="service",
            nodes=len(parts.index),
        )  # fmt: skip
        delivery.requeue(msg.requeued().encode())

    # -- hand back --

    def hand_back(self, msg: BootRequest, delivery: Delivery, outcome: Outcome) -> None:
        """HAND_BACK: give a request this host already tried back to the queue, for
        ``outcome.host`` (the alternate).

        The claim recorded the hand-back in the history. The class pauses here first,
        so that the broker gives the copy to another consumer, not back to this one.
        """
        parts = self.parts
        parts.counters["handed_back"] += 1
        LOG.info("agent %s: handing %s back: tried here before, %s can take it (hand-back "
                 "%d of %d)", parts.host, msg.instance_uuid, outcome.host, outcome.handbacks,
                 self.alternates.max_handbacks)  # fmt: skip
        parts.gate.pause(msg.scheduling_class, self.alternates.pause_s)
        delivery.requeue(msg.requeued().encode())


def _contended(pick: Pick | None, failed: Exception | None) -> Refusal | None:
    """The refusal of a request whose :data:`MAX_PICKS` claims all failed in the ledger
    although the index says it fits here (None if none failed)."""
    if pick is None or failed is None:
        return None
    provider = failed.kwargs.get("provider") if isinstance(failed, exception.QschedError) else None
    reason = f"{MAX_PICKS} claims here failed in the ledger, the last: {failed}"
    return Refusal(RefusalKind.CONFLICT, reason, pick.node, provider=provider)
