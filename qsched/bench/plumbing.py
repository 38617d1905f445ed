"""What notifications and metrics cost the agents, per placement, measured in turns.

Two runs of a cloud, one with a feature and one without, differ by more than the
feature: the machine's load drifts between them, and on this 2-core machine that
drift has been as large as the cost measured (docs/notifications.rst, "Cost"). This
scenario starts one cloud with both configured (its agents send notifications to
RabbitMQ and serve metrics) and switches them in the running agents
(:mod:`qsched.bench.switch`) between slices of the same load: library-path boots at
the sweep's rate for ``plumbing_slice_s`` each. The agents' CPU of a slice is their
processes' own clock read at each end (every thread, to the nanosecond; /proc counts
10 ms ticks, a few percent of a slice), from the switch to a second after its last
boot settled, so what the boots cost after their sending is in it; the broker's is
read from /proc while the boots are sent, as in the sweep
(:func:`~qsched.bench.phase.run_phase`).

Each comparison (nothing, the control, whose "on" slices are as "off" as the others:
its change is the noise of the measure; notifications alone; metrics alone; both)
runs blocks of four slices, off, on, on, off: a drift that is linear over a block
weighs on both sides alike. A block's change is ``(on1 + on2) / (off1 + off2) - 1``
of the agents' CPU ms per placement; the comparison reports the median of its
blocks' changes and their range, and, for ``both``, whether the median is within
:data:`LIMIT_PCT` (the plumbing issue's 10%: what notifications and metrics together
may add to an agent's CPU per placement).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from qsched.bench.load import LibrarySubmitter
from qsched.bench.measure import BenchFailure
from qsched.bench.phase import run_phase, summarize
from qsched.bench.runner import SCALE_FLAVOR, Runner
from qsched.bench.stack import Cloud, notification_url

#: What notifications and metrics together may add to an agent's CPU per placement.
LIMIT_PCT = 10.0
#: The comparisons: name -> the switch state of its "off" and its "on" slices.
COMPARISONS: dict[str, tuple[dict[str, bool], dict[str, bool]]] = {
    # the control: both sides off, so its change is the measure's own noise
    "nothing": (
        {"notifications": False, "metrics": False},
        {"notifications": False, "metrics": False},
    ),
    "notifications": (
        {"notifications": False, "metrics": False},
        {"notifications": True, "metrics": False},
    ),
    "metrics": (
        {"notifications": False, "metrics": False},
        {"notifications": False, "metrics": True},
    ),
    "both": ({"notifications": False, "metrics": False}, {"notifications": True, "metrics": True}),
}
#: The parts whose CPU per placement a slice keeps: the agents (what the limit is
#: about) and the broker the notifications go to. Not the whole machine's: over a
#: slice's sending, in /proc's ticks, with whatever else the machine runs, it moved
#: by tens of percent from slice to slice.
PARTS = ("agents", "rabbitmq")
BLOCK = (False, True, True, False)  # off, on, on, off
#: The agents' reconcile interval here: past the run, so no pass falls in a slice. A
#: pass reads every claim of the agent's nodes, so it grows with the instances the
#: slices leave (the agents' CPU per placement doubled over a run with passes every
#: 10 s), the same with the features and without, and at 10 s a slice it fell in one
#: slice of a block or another: noise as large as what is measured.
RECONCILE_S = 3600.0
#: What an agent sends of a placement: scheduler.claim, instance.create.start and .end.
PER_PLACEMENT = 3
#: After a slice's last boot settled, what it still sends: the notification sender
#: gathers for 500 ms (qsched.notifications.queued) before it writes a batch.
TAIL_S = 1.0


def run_plumbing(runner: Runner) -> dict[str, Any]:
    """The comparisons on one cloud of ``plumbing_hosts``; ``skipped`` says why not."""
    settings = runner.settings
    amqp = settings.transports.get("rabbitmq")
    if settings.embedded or amqp is None:
        why = "embedded" if settings.embedded else "no RabbitMQ bus in this run (--bus)"
        runner.say(f"[plumbing] skipped: it needs agent processes and RabbitMQ ({why})")
        return {"skipped": f"needs agent processes and RabbitMQ: {why}"}
    hosts = settings.plumbing_hosts
    runner.say(f"[plumbing] N = {hosts:,} hosts: notifications and metrics off and on in "
               f"turns, {settings.plumbing_blocks} blocks of 4 slices of "
               f"{settings.plumbing_slice_s:g}s per comparison")  # fmt: skip
    entry: dict[str, Any] = {
        "hosts": hosts,
        "rate_per_s": settings.rate_per_s,
        "slice_s": settings.plumbing_slice_s,
        "limit_pct": LIMIT_PCT,
    }
    spec = runner.spec(hosts, (SCALE_FLAVOR,), http=False, metrics=True, notifications=False,
                       transport_url=amqp, notification_url=notification_url(amqp),
                       switchable=True, reconcile_interval_s=RECONCILE_S)  # fmt: skip
    with runner.cloud(spec, entry) as cloud:
        cloud.prime_classes([SCALE_FLAVOR.name])
        submit = LibrarySubmitter(cloud.compute)
        runner.warm_up(cloud, SCALE_FLAVOR.name, [(submit, settings.library_workers)])
        time.sleep(TAIL_S)
        held = cloud.notifications_held()
        comparisons = {}
        for name, states in COMPARISONS.items():
            comparisons[name] = compare(runner, cloud, submit, name, states)
            runner.partial["plumbing"] = {**entry, "comparisons": comparisons}
        entry["comparisons"] = comparisons
        told = sum(s["placed"] for c in comparisons.values() for b in c["blocks"] for s in b
                   if s["notifications"])  # fmt: skip
        entry["notifications"] = check_told(cloud, held, told)
    return entry


def check_told(cloud: Cloud, held: int, told: int) -> dict[str, int]:
    """Every placement of an "on" slice told of (:data:`PER_PLACEMENT` notifications
    each) and none of an "off" one, or the switch did not hold and the run fails.

    :raises BenchFailure: the cloud's notification queues hold more or fewer.
    """
    expected = held + PER_PLACEMENT * told
    deadline = time.monotonic() + 10
    while (found := cloud.notifications_held()) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    if found != expected:
        raise BenchFailure(
            f"plumbing: the agents sent {found - held} notifications in the slices, "
            f"{PER_PLACEMENT} for each of the {told} placements of the slices with them on "
            f"({PER_PLACEMENT * told}) expected: a switch did not hold"
        )
    return {"placements": told, "sent": found - held}


def compare(
    runner: Runner,
    cloud: Cloud,
    submit: LibrarySubmitter,
    name: str,
    states: tuple[dict[str, bool], dict[str, bool]],
) -> dict[str, Any]:
    """The blocks of one comparison, and their summary (:func:`summary`)."""
    settings = runner.settings
    count = max(1, int(settings.rate_per_s * settings.plumbing_slice_s))
    blocks = []
    for b in range(settings.plumbing_blocks):
        block: list[dict[str, Any]] = []
        for on in BLOCK:
            label = f"{name} {'on' if on else 'off'} ({b + 1}.{len(block) + 1})"
            found = run_slice(runner, cloud, submit, label, states[on], count)
            block.append({**found, **states[on], "on": on})
        blocks.append(block)
        runner.say(f"  {name} block {b + 1}: agents {_row(block)}")
    found = summary(blocks)
    runner.say(f"  {name}: {verdict(found)}")
    return {"blocks": blocks, **found}


def verdict(found: dict[str, Any]) -> str:
    """The agents' figures of a comparison, in words."""
    agents = found.get("agents")
    if agents is None:
        return "no slice placed anything while metered: no figure"
    return (f"agents {agents['off_ms']} -> {agents['on_ms']} ms per placement, "
            f"{agents['change_pct']:+.1f}% (blocks {agents['min_pct']:+.1f}% to "
            f"{agents['max_pct']:+.1f}%)")  # fmt: skip


def run_slice(
    runner: Runner,
    cloud: Cloud,
    submit: LibrarySubmitter,
    label: str,
    state: dict[str, bool],
    count: int,
) -> dict[str, Any]:
    """``count`` boots with the agents switched to ``state``: every part's CPU ms per
    placement. The agents' is their processes' own CPU time from the switch to
    :data:`TAIL_S` after the last boot settled (the sender's last batch leaves within
    it), over the boots placed; the other parts', from /proc while the boots were sent.
    """
    settings = runner.settings
    began = cloud.switch(**state)
    result = run_phase(cloud, label, submit, [SCALE_FLAVOR.name] * count, settings.rate_per_s,
                       settings.library_workers, settings.settle_timeout_s,
                       lambda _msg: None)  # fmt: skip
    time.sleep(TAIL_S)
    spent_s = cloud.switch(**state) - began
    stats = summarize(result, settings.rate_per_s)
    cost = stats["cpu_ms_per_placement"]
    placed = stats["active"]
    return {"placed": placed, "agents_cpu_s": round(spent_s, 4),
            "agents": round(1000 * spent_s / placed, 3) if placed else None,
            **{part: cost.get(part) for part in PARTS if part != "agents"}}  # fmt: skip


def _row(block: list[dict[str, Any]]) -> str:
    return ", ".join(f"{'on' if s['on'] else 'off'} {s['agents']}" for s in block)


def summary(blocks: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per part: the median CPU ms per placement off and on over every slice, and the
    median, least and most of the blocks' changes in percent (module doc)."""
    found: dict[str, Any] = {}
    for part in PARTS:
        changes, off, on = [], [], []
        for block in blocks:
            sides = {side: [s[part] for s in block if s["on"] is side] for side in (False, True)}
            if any(v is None for side in sides.values() for v in side):
                continue  # a slice that placed nothing while metered: no figure
            off += sides[False]
            on += sides[True]
            if sum(sides[False]) > 0:
                changes.append(100 * (sum(sides[True]) / sum(sides[False]) - 1))
        if changes:
            found[part] = {"off_ms": round(statistics.median(off), 3),
                           "on_ms": round(statistics.median(on), 3),
                           "change_pct": round(statistics.median(changes), 1),
                           "min_pct": round(min(changes), 1),
                           "max_pct": round(max(changes), 1), "blocks": len(changes)}  # fmt: skip
    return found
