"""``qsched-admin top``: queues, placements, agents and fill, refreshed for watching a burst.

A frame compares two snapshots: queue depth changes give rates, and the
counters agents publish in their heartbeats (``active``, ``refused``) give
placements and refusals per second. Heartbeats come every
``[agent] heartbeat_interval_s``, so rates lag by about that much.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from qsched.admin import queries, views
from qsched.bus.base import Bus
from qsched.ledger import Stores
from qsched.ledger.base import AgentInfo


@dataclasses.dataclass
class Snapshot:
    time: float
    queues: list[dict[str, Any]]
    agents: list[AgentInfo]
    fill: dict[str, dict[str, Any]] | None


def snapshot(stores: Stores, bus: Bus, with_fill: bool = True) -> Snapshot:
    """Read the queues, the agents and (scanning every provider) the cluster fill."""
    now = time.time()
    queues = queries.queue_rows(stores, bus, now)
    agents = stores.agents.list()
    fill = queries.cluster_fill(queries.all_providers(stores)) if with_fill else None
    return Snapshot(now, queues, agents, fill)


def _counter_rate(prev: Snapshot | None, cur: Snapshot, name: str) -> float | None:
    """Per second, summed over agents alive in both snapshots (a restart resets counters)."""
    if prev is None or cur.time <= prev.time:
        return None
    before = {a.host: a.detail.get("counters", {}).get(name, 0) for a in prev.agents if a.alive}
    total = 0
    for agent in cur.agents:
        if agent.alive and agent.host in before:
            total += max(0, agent.detail.get("counters", {}).get(name, 0) - before[agent.host])
    return total / (cur.time - prev.time)


def _queue_rates(prev: Snapshot | None, cur: Snapshot) -> list[dict[str, Any]]:
    before = {q["queue"]: q["ready"] for q in prev.queues} if prev else {}
    span = cur.time - prev.time if prev else 0.0
    rows = []
    for q in cur.queues:
        old = before.get(q["queue"])
        rate = (q["ready"] - old) / span if span > 0 and None not in (old, q["ready"]) else None
        rows.append({**q, "rate_per_s": rate})
    return rows


def frame(prev: Snapshot | None, cur: Snapshot) -> dict[str, Any]:
    """What one refresh shows; rates need a previous snapshot."""
    alive = [a for a in cur.agents if a.alive]
    return {
        "time": cur.time,
        "interval_s": cur.time - prev.time if prev else None,
        "agents_alive": len(alive),
        "agents": len(cur.agents),
        "building": sum(int(a.detail.get("building") or 0) for a in alive),
        "placements_per_s": _counter_rate(prev, cur, "active"),
        "refusals_per_s": _counter_rate(prev, cur, "refused"),
        "fill": {rc: f["ratio"] for rc, f in cur.fill.items()} if cur.fill is not None else None,
        "queues": _queue_rates(prev, cur),
    }


def watch(
    stores: Stores,
    bus: Bus,
    show: Callable[[dict[str, Any]], None],
    interval_s: float,
    iterations: int | None = None,
    with_fill: bool = True,
) -> None:
    """Show a frame every ``interval_s`` seconds, ``iterations`` times or forever."""
    prev = None
    count = 0
    while iterations is None or count < iterations:
        if count:
            time.sleep(interval_s)
        cur = snapshot(stores, bus, with_fill)
        show(frame(prev, cur))
        prev, count = cur, count + 1


#: The class of a queue row; the dead letters' row has none.
CLASS_COLUMN = views.Column("class", "class", lambda v: views.text(v) if v else "(dead letters)")

COLUMNS: Sequence[views.Column] = (
    CLASS_COLUMN,
    views.number("ready", "ready"),
    views.number("rate_per_s", "rate/s"),
    views.number("consumers", "consumers"),
    views.number("agents", "agents"),
    views.number("waiting", "waiting"),
    views.Column("oldest_s", "oldest", views.age, right=True),
)


def render(f: dict[str, Any], interval_s: float) -> str:
    """A frame as text: one summary line, then a row per queue."""
    fill = f["fill"]
    fill_text = (
        " ".join(f"{rc} {v:.0%}" for rc, v in fill.items() if v is not None) if fill else "-"
    )
    head = (
        f"qsched top  {views.when(f['time'])}  (every {interval_s:g}s, Ctrl-C quits)\n"
        f"agents {f['agents_alive']} alive of {f['agents']}   building {f['building']}   "
        f"placed/s {_rate(f['placements_per_s'])}   refused/s {_rate(f['refusals_per_s'])}   "
        f"fill {fill_text}"
    )
    return head + "\n\n" + views.table(f["queues"], COLUMNS)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
