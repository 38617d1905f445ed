"""Why a request was placed where it was, or not at all: its history in plain words.

Pure functions over an instance record, its history (every refusal is recorded
by the agent that refused, with the reason) and a :class:`Live` view of what the
cell could do for it now. :func:`diagnose` answers; :func:`render` prints.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.admin import views
from qsched.admin.capacity import FitReport
from qsched.ledger.base import Event, Instance, State, TaskState
from qsched.scheduling.records import details

MAX_HOSTS_NAMED = 3


@dataclasses.dataclass
class Live:
    """What the cell can do for a request now: live agents, who consumes its class, fit."""

    scheduling_class: str
    agents: list[str]  # hosts whose heartbeat is alive
    consumers: list[str]  # of those, the ones consuming the class now
    report: FitReport | None  # None when the request could not be compiled

    def explain(self) -> str:
        """Why nobody takes the request now, or who will."""
        cls = self.scheduling_class
        if not self.agents:
            return "no agent is alive to take it: start qsched-agent, or see why agents stopped"
        fitting = self.report.fitting if self.report else []
        if self.consumers:
            text = f"{_count(self.consumers, 'live agent')} consume class {cls} now"
            text += f" ({_names(self.consumers)})"
            if self.report is not None and not fitting:
                return f"{text}, but no node fits it now ({self.report.explain()})"
            return f"{text}: it should be placed shortly"
        head = f"no live agent consumes class {cls}"
        if fitting:
            return (
                f"{head} yet, although {_count(fitting, 'node')} fit it now (e.g. {fitting[0]}): "
                "agents learn new classes within [agent] class_poll_interval_s"
            )
        return f"{head}: {self.report.explain()}" if self.report else head

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheduling_class": self.scheduling_class,
            "live_agents": len(self.agents),
            "consumers": list(self.consumers),
            "fit": self.report.to_dict() if self.report else None,
            "explanation": self.explain(),
        }


@dataclasses.dataclass
class GroupView:
    """The server group of an instance as the ledger has it now (its hosts: host ->
    members holding a claim there)."""

    uuid: str
    policy: str
    max_server_per_host: int | None
    hosts: dict[str, int]

    def explain(self) -> str:
        """Where the group's servers are, and what that leaves its next member."""
        head = f"{self.policy} group {self.uuid}"
        if not self.hosts:
            return f"{head}: none of its servers holds a host yet"
        placed = sum(self.hosts.values())
        where = _names([f"{h} ({n})" for h, n in sorted(self.hosts.items())])
        if self.policy == "affinity":
            return f"{head}: its servers are on {where}; its next members go there only"
        if self.policy == "anti-affinity":
            most = self.max_server_per_host or 1
            return (
                f"{head}: {placed} server(s) on {_count(list(self.hosts), 'host')} ({where}), "
                f"at most {most} per host; a host holding {most} refuses the next"
            )
        return f"{head}: {placed} server(s) on {where} (a preference, never a refusal)"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "explanation": self.explain()}


@dataclasses.dataclass
class Diagnosis:
    """The answer to "why": a one-line verdict, the history, and the facts behind them."""

    instance: Instance
    outcome: str  # placed, spawning, waiting, error, deleting, deleted
    verdict: str
    history: list[dict[str, Any]]
    refusals: list[dict[str, Any]]
    conflicts: list[dict[str, Any]]
    spawn_failures: list[dict[str, Any]]
    hand_backs: list[dict[str, Any]]
    max_attempts: int
    events_trimmed: int = 0
    live: Live | None = None
    group: GroupView | None = None  # its server group, if it is in one

    def to_dict(self) -> dict[str, Any]:
        inst = self.instance
        return {
            "uuid": inst.uuid,
            "name": inst.name,
            "project_id": inst.project_id,
            "state": inst.state.value,
            "task_state": inst.task_state.value or None,
            "host": inst.host,
            "node": inst.node,
            "flavor": dict(inst.flavor),
            "scheduling_class": scheduling_class(inst),
            "attempts": inst.attempts,
            "max_attempts": self.max_attempts,
            "created_at": inst.created_at,
            "deadline": inst.deadline,
            "outcome": self.outcome,
            "verdict": self.verdict,
            "history": self.history,
            "events_trimmed": self.events_trimmed,
            "refusals": self.refusals,
            "conflicts": self.conflicts,
            "spawn_failures": self.spawn_failures,
            "tried_hosts": list(inst.tried_hosts),
            "handbacks": inst.handbacks,
            "hand_backs": self.hand_backs,
            "fault": dict(inst.fault) if inst.fault else None,
            "now": self.live.to_dict() if self.live else None,
            "server_group": self.group.to_dict() if self.group else None,
        }


def scheduling_class(instance: Instance) -> str:
    """The class the request was published on ("?" for a record no front door made)."""
    try:
        return details(instance).scheduling_class
    except exception.Invalid:
        return "?"


def diagnose(
    instance: Instance,
    events: Sequence[Event],
    now: float,
    max_attempts: int,
    live: Live | None = None,
    events_trimmed: int = 0,
    group: GroupView | None = None,
) -> Diagnosis:
    """Explain one request from its record, its history and, if given, the live view
    and its server group."""
    cls = scheduling_class(instance)
    diagnosis = Diagnosis(
        instance=instance,
        outcome="",
        verdict="",
        history=_history(events, cls),
        refusals=[_fact(e, "reason", "kind") for e in events if e.event == "refused"],
        conflicts=[_fact(e, "reason") for e in events if e.event == "conflict"],
        spawn_failures=[_fact(e, "reason", "attempts") for e in events if e.event == "requeued"],
        hand_backs=[_fact(e, "alternate", "handbacks") for e in events if e.event == "handed_back"],
        max_attempts=max_attempts,
        events_trimmed=events_trimmed,
        live=live,
        group=group,
    )
    diagnosis.outcome, diagnosis.verdict = _verdict(diagnosis, events, now)
    return diagnosis


def _fact(event: Event, *keys: str) -> dict[str, Any]:
    fact = {"time": event.time, "host": event.host, "node": event.node}
    fact.update({key: event.detail.get(key) for key in keys})
    return fact


def _history(events: Sequence[Event], cls: str) -> list[dict[str, Any]]:
    """Every event in words; a claim by a host that had failed the request says so."""
    tried: set[str] = set()
    steps = []
    for event in events:
        text = describe(event, cls)
        if event.event == "claimed" and event.host in tried:
            text += " (again: it had failed it, and no other host had room or the hand-backs "
            text += "were used up)"
        elif event.event == "requeued" and event.host:
            tried.add(event.host)
        steps.append(_step(event, text))
    return steps


def _step(event: Event, text: str) -> dict[str, Any]:
    return {
        "time": event.time,
        "event": event.event,
        "host": event.host,
        "node": event.node,
        "text": text,
        "detail": dict(event.detail),
    }


# -- the history, one event at a time -----------------------------------------------------


def describe(event: Event, cls: str) -> str:
    """One event of an instance's history in plain words."""
    say = _SAY.get(event.event)
    if say is not None:
        return say(event, cls)
    where = " ".join(x for x in (event.host, event.node) if x)
    extra = views.text(dict(event.detail)) if event.detail else ""
    return " ".join(x for x in (event.event, where, extra) if x and x != views.NONE)


def _accepted(e: Event, cls: str) -> str:
    return f"accepted by the API: quota reserved, boot request published on class {cls}"


def _refused(e: Event, cls: str) -> str:
    nodes = e.detail.get("nodes")
    text = f"{e.host} refused it: {e.detail.get('reason', 'no reason recorded')}"
    if nodes is not None:
        text += f" ({_count(range(int(nodes)), 'node')} on that agent)"
    return text + "; requeued for the others"


def _claimed(e: Event, cls: str) -> str:
    return f"{e.host} claimed {e.node}: {allocation_text(e.detail)}"


def _handed_back(e: Event, cls: str) -> str:
    return (
        f"{e.host} handed it back: it had failed it before and {e.detail.get('alternate')} has "
        f"room for class {cls} (hand-back {e.detail.get('handbacks')} of "
        f"{e.detail.get('max_handbacks')})"
    )


def _requeued(e: Event, cls: str) -> str:
    used = e.detail.get("attempts")
    where = f" on {e.host}" if e.host else ""
    return f"spawn failed{where}: {e.detail.get('reason')}; rescheduled ({used} attempt(s) used)"


_SAY: dict[str, Callable[[Event, str], str]] = {
    "accepted": _accepted,
    "publish_failed": lambda e, c: f"not published: {e.detail.get('reason')}; withdrawn",
    "refused": _refused,
    "conflict": lambda e, c: (
        f"{e.host} could not claim {e.node}: {str(e.detail.get('reason')).rstrip('.')}; "
        "it re-read the ledger and went on"
    ),
    "claimed": _claimed,
    "released": lambda e, c: f"claim of {e.host} released: {e.detail.get('reason') or '-'}",
    "requeued": _requeued,
    "handed_back": _handed_back,
    "active": lambda e, c: f"ACTIVE on {e.host} ({e.node})",
    "error": lambda e, c: "ended in ERROR, quota returned",
    "deleting": lambda e, c: f"delete asked; {e.host} destroys it",
    "deleted": lambda e, c: (
        "DELETED, quota returned" + (f" ({e.detail['reason']})" if e.detail.get("reason") else "")
    ),
    "local_delete": lambda e, c: f"deleted locally: {e.detail.get('reason')}",
    "forwarded": lambda e, c: (
        f"{e.host} could not take it: {e.detail.get('reason')}; sent to the queue of "
        f"{e.detail.get('to')}"
    ),
    "parked": lambda e, c: (
        f"parked by {e.host}: {e.detail.get('reason')}; the janitor publishes it again "
        "after [scheduler] outbox_grace_s"
    ),
}


def allocation_text(allocations: Mapping[str, Any]) -> str:
    """``{provider: {class: n}}`` summed per class: "1 VCPU, 512 MEMORY_MB"."""
    total: Counter[str] = Counter()
    for amounts in allocations.values():
        if isinstance(amounts, Mapping):
            total.update({rc: int(n) for rc, n in amounts.items()})
    return ", ".join(f"{n} {rc}" for rc, n in sorted(total.items())) or "nothing"


# -- the verdict --------------------------------------------------------------------------


def _verdict(d: Diagnosis, events: Sequence[Event], now: float) -> tuple[str, str]:
    inst = d.instance
    if inst.task_state == TaskState.DELETING:
        return "deleting", f"being deleted: {inst.host} was asked to destroy it"
    if inst.state == State.ACTIVE:
        return "placed", _placed(d)
    if inst.state == State.BUILD and inst.host:
        since = _last_time(events, "claimed") or inst.updated_at
        if inst.batch:
            return "spawning", (
                f"claimed by {inst.host} on {inst.node} {views.age(now - since)} ago; a member "
                f"of multi-create {inst.batch}, it spawns once every member holds its claim"
            )
        return "spawning", f"claimed by {inst.host} on {inst.node}; spawning for " + views.age(
            now - since
        )
    if inst.state == State.BUILD:
        return "waiting", _waiting(d, now)
    if inst.state == State.ERROR:
        return "error", _error(d)
    failed = next((e for e in events if e.event == "publish_failed"), None)
    if failed is not None:
        return "deleted", f"never published: {failed.detail.get('reason')}; ended DELETED"
    active = next((e for e in reversed(events) if e.event == "active"), None)
    where = f"after it ran on {active.host} ({active.node})" if active else "before it was placed"
    return "deleted", f"deleted {where}"


def _placed(d: Diagnosis) -> str:
    inst = d.instance
    took = ""
    if inst.launched_at and inst.created_at:
        took = f" {views.age(inst.launched_at - inst.created_at)} after it was accepted"
    tail = _tail(d)
    return f"placed on {inst.host} ({inst.node}){took}" + (f", after {tail}" if tail else "")


def _waiting(d: Diagnosis, now: float) -> str:
    inst = d.instance
    parts = [f"waiting for a host for {views.age(now - inst.created_at)}"]
    if d.refusals:
        parts.append(f"refused by {_refusers(d.refusals)}")
    if d.live is not None:
        parts.append(d.live.explain())
    if d.group is not None:
        parts.append(d.group.explain())
    if inst.deadline is not None:
        left = inst.deadline - now
        parts.append(
            f"deadline in {views.age(left)}"
            if left >= 0
            else f"deadline passed {views.age(-left)} ago: the reaper ends it in ERROR shortly"
        )
    return "; ".join(parts)


def _error(d: Diagnosis) -> str:
    fault = d.instance.fault or {}
    details = fault.get("details") or {}
    message = str(fault.get("message") or "ended in ERROR")
    reason = details.get("reason")
    if reason == "deadline":
        cause = (
            f"refused by {_refusers(d.refusals)}"
            if d.refusals
            else "no agent ever took it from its queue"
        )
        text = f"{message} Nobody placed it before its deadline: {cause}"
        if d.live is not None and d.live.report is not None and not d.live.report.fitting:
            text += f"; now: {d.live.report.explain()}"
        return text
    if reason == "batch":
        return (
            f"{message} It was created to be placed all or none with the other members of "
            f"multi-create {details.get('batch')}, and member {details.get('member')} could "
            "not be placed: none was, every claim released"
        )
    if reason == "affinity":
        refused = d.refusals[-1] if d.refusals else {}
        return f"{message} {refused.get('reason') or 'its affinity group host has no room'}"
    if reason == "max_attempts":
        hosts = _names(sorted({f["host"] for f in d.spawn_failures if f["host"]}))
        return (
            f"{message} Every attempt failed: {_count(d.spawn_failures, 'spawn')} failed"
            + (f" (on {hosts})" if hosts else "")
            + f", {d.instance.attempts} of {d.max_attempts} attempts used"
        )
    return f"{message} {reason}" if reason else message


def _tail(d: Diagnosis) -> str:
    counted = [
        (d.refusals, "refusal"),
        (d.conflicts, "conflict"),
        (d.spawn_failures, "failed spawn"),
        (d.hand_backs, "hand-back"),
    ]
    return ", ".join(_count(items, word) for items, word in counted if items)


def _refusers(refusals: Sequence[Mapping[str, Any]]) -> str:
    """``cn0 (not enough VCPU ...) and cn1 (...)``: the last reason each host gave."""
    last: dict[str, str] = {}
    for r in refusals:
        last.pop(str(r["host"]), None)  # keep the order of the last refusals
        last[str(r["host"])] = str(r.get("reason") or "no reason recorded")
    named = [f"{host} ({reason})" for host, reason in list(last.items())[:MAX_HOSTS_NAMED]]
    more = len(last) - len(named)
    if more:
        named.append(f"{more} more host(s)")
    return " and ".join([", ".join(named[:-1]), named[-1]]) if len(named) > 1 else named[0]


def _names(hosts: Sequence[str]) -> str:
    shown = ", ".join(hosts[:MAX_HOSTS_NAMED])
    more = len(hosts) - MAX_HOSTS_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


def _count(items: Sequence[Any] | range, word: str) -> str:
    n = len(items)
    return f"{n} {word}{'' if n == 1 else 's'}"


def _last_time(events: Sequence[Event], name: str) -> float | None:
    return next((e.time for e in reversed(events) if e.event == name), None)


# -- text ---------------------------------------------------------------------------------


def render(d: Diagnosis) -> str:
    """The diagnosis for a terminal: a summary, the verdict, the history, the live view."""
    inst = d.instance
    head = views.key_values(
        [
            ("server", f"{inst.uuid} ({inst.name}, project {inst.project_id})"),
            ("flavor", views.flavor_text(inst.flavor)),
            ("class", scheduling_class(inst)),
            ("state", _state_text(d)),
            ("attempts", f"{inst.attempts} of {d.max_attempts}"),
            ("tried hosts", _tried_text(d)),
            *([("server group", d.group.explain())] if d.group else []),
        ]
    )
    lines = [head, "", f"why: {d.verdict}", "", "history:"]
    if d.events_trimmed:
        lines.append(f"  ({d.events_trimmed} older events trimmed)")
    lines += [f"  {views.when(step['time'])}  {step['text']}" for step in d.history]
    if d.live is not None and d.outcome in ("waiting", "error"):
        lines += ["", "now:", _live_text(d.live)]
    return "\n".join(lines)


def _tried_text(d: Diagnosis) -> str:
    """The hosts that failed it (the alternates rule avoids them), and its hand-backs."""
    inst = d.instance
    if not inst.tried_hosts:
        return "none"
    text = ", ".join(inst.tried_hosts)
    if inst.handbacks:
        text += f" (handed back {_count(range(inst.handbacks), 'time')})"
    return text


def _state_text(d: Diagnosis) -> str:
    inst = d.instance
    text = inst.state.value
    if inst.task_state.value:
        text += f" ({inst.task_state.value})"
    if inst.host:
        text += f" on {inst.host} ({inst.node})"
    return text


def _live_text(live: Live) -> str:
    consumers = _names(live.consumers) if live.consumers else "none"
    pairs: list[tuple[str, Any]] = [
        ("live agents", len(live.agents)),
        (f"consuming {live.scheduling_class}", consumers),
    ]
    report = live.report
    if report is not None:
        largest = ", ".join(f"{f.amount} {rc} on {f.provider}" for rc, f in report.largest.items())
        pairs += [
            ("nodes that fit it", f"{len(report.fitting)} of {report.nodes}"),
            ("largest free", largest or "-"),
        ]
        if not report.zone_checked:
            pairs.append(
                ("note", "availability zones not checked: some agents do not report theirs")
            )
    return "\n".join("  " + line for line in views.key_values(pairs).splitlines())
