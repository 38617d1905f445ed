"""What a run reports: the targets of issue 6, tables for people, the plot.

The reference figures of Nova and Placement come from the issue; this bench does
not measure them, and every output that shows them says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qsched.bench.moves_report import emptied_table, moves_table, moves_targets
from qsched.bench.tables import ms, other, p50_p99, row, simple_table

REFERENCE: dict[str, Any] = {
    "note": "from issue 6 (same kind of 2-core machine); NOT measured by this run",
    "placement_allocation_candidates_median_ms": {"100": 36, "1000": 116, "10000": 870},
    "nova_filter_weigh_ms": {"100": 7, "1000": 77, "10000": 1400},
    "placement_claims_per_s": {"sqlite": 45, "mariadb_8_threads": 80},
    "placement_providers_registered_per_s": 57,
    "kube_scheduler_pods_per_s": "100-300 at 5,000-30,000 nodes",
    "nomad_placements_per_s": "about 3,750 (1M containers on 5,000 hosts, 5 servers)",
}
FLAT_RATIO = 1.3
P99_CLAIMED_MS = 50.0
SUSTAINED_PER_S = 1000.0
REGISTRATION_PER_S = 5000.0
FILL_WITHIN = 0.05
FULL_N = 100_000


# -- targets ---------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 6 with what this run measured; ``met`` None if not measured."""
    found: list[dict[str, Any]] = []
    scale = results.get("scale") or []
    deployed = [e for e in scale if e.get("metrics", True) and not e.get("notifications")]
    scale = deployed or scale  # judged at the defaults; --metrics/--notifications both add runs
    if scale:
        found += _flat_targets(scale) + _p99_targets(scale) + [_registration_target(scale)]
    amqp = (results.get("saturation") or {}).get("rabbitmq")
    if "saturation" in results and amqp is None:
        why = results.get("backends", {}).get("rabbitmq_unreachable", "not in this run")
        target = f"over {SUSTAINED_PER_S:,.0f} placements/s sustained (RabbitMQ bus, Redis ledger)"
        found.append(row(target, f"RabbitMQ not measured: {why}", None))
    if amqp is not None:
        measured = f"{amqp['sustained_per_s']:,.0f}/s sustained, peak {amqp['peak_per_s']:,.0f}/s"
        if not amqp.get("saturated", True):
            measured += " (the ladder ended before saturation)"
        target = f"over {SUSTAINED_PER_S:,.0f} placements/s sustained (RabbitMQ bus, Redis ledger)"
        found.append(row(target, measured, amqp["sustained_per_s"] > SUSTAINED_PER_S))
    fill = results.get("fill")
    if fill:
        found += _fill_targets(fill)
    if "plumbing" in results:
        found.append(_plumbing_target(results["plumbing"]))
    if results.get("moves"):
        found += moves_targets(results["moves"], FLAT_RATIO, FULL_N)
    return found


def _plumbing_target(plumbing: dict[str, Any]) -> dict[str, Any]:
    limit = plumbing.get("limit_pct", 10.0)
    target = f"notifications and metrics add at most {limit:g}% to the agents' CPU per placement"
    agents = plumbing.get("comparisons", {}).get("both", {}).get("agents")
    if agents is None:
        return row(target, plumbing.get("skipped", "not measured"), None)
    measured = (f"{agents['off_ms']} -> {agents['on_ms']} ms, {agents['change_pct']:+.1f}% "
                f"(median of {agents['blocks']} blocks, {agents['min_pct']:+.1f}% to "
                f"{agents['max_pct']:+.1f}%)")  # fmt: skip
    return row(target, measured, agents["change_pct"] <= limit)


def _flat_targets(scale: list[dict[str, Any]]) -> list[dict[str, Any]]:
    low, high = scale[0], scale[-1]
    rows = []
    for path in ("library", "http"):
        a = low["paths"][path]["submit_to_claimed_ms"]["p50"]
        b = high["paths"][path]["submit_to_claimed_ms"]["p50"]
        if a is None or b is None:
            continue
        ratio = b / a
        measured = (
            f"p50 {b:.1f} ms at N={high['hosts']:,} vs {a:.1f} ms at "
            f"N={low['hosts']:,}: {ratio:.2f}x"
        )
        met = ratio <= FLAT_RATIO if low["hosts"] <= 100 and high["hosts"] >= FULL_N else None
        rows.append(
            row(
                f"flat: submit-to-claimed p50 at 100,000 hosts within "
                f"{FLAT_RATIO}x of 100 hosts ({path})",
                measured,
                met,
            )
        )
    return rows


def _p99_targets(scale: list[dict[str, Any]]) -> list[dict[str, Any]]:
    high = scale[-1]
    rows = []
    for path in ("library", "http"):
        p99 = high["paths"][path]["submit_to_claimed_ms"]["p99"]
        met = p99 < P99_CLAIMED_MS if high["hosts"] >= FULL_N and p99 is not None else None
        rows.append(
            row(
                f"p99 submit-to-claimed at 100,000 hosts under {P99_CLAIMED_MS:.0f} ms ({path})",
                f"{p99} ms at N={high['hosts']:,}",
                met,
            )
        )
    return rows


def _registration_target(scale: list[dict[str, Any]]) -> dict[str, Any]:
    high = scale[-1]
    reg = high["registration"]
    met = reg["hosts_per_s"] > REGISTRATION_PER_S if high["hosts"] >= FULL_N else None
    return row(
        f"host registration over {REGISTRATION_PER_S:,.0f} hosts/s",
        f"{reg['hosts_per_s']:,.0f} hosts/s ({high['hosts']:,} hosts in "
        f"{reg['seconds']:.1f}s, {reg['agents']} agents)",
        met,
    )


def _fill_targets(fill: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    pairs = (
        (
            "at the first NoValidHost",
            fill["qsched"]["at_first_nvh"],
            fill["reference"]["at_first_failure"]["fractions"],
        ),
        (
            "after the queue drains",
            fill["qsched"]["after_drain"],
            fill["reference"]["same_requests"]["fractions"],
        ),
    )
    for when, ours, ref in pairs:
        mine, best = ours.get("bottleneck", 0.0), ref.get("bottleneck", 0.0)
        met = bool(best) and mine >= (1 - FILL_WITHIN) * best
        rows.append(
            row(
                f"fill within 5% of best fit, {when}",
                f"{mine:.1%} vs {best:.1%} of the bottleneck resource",
                met,
            )
        )
    return rows


# -- tables ----------------------------------------------------------------------------


def scale_table(scale: list[dict[str, Any]]) -> list[str]:
    rows = []
    for entry in scale:
        reg, rss = entry["registration"], entry.get("peak_rss", {})
        for path in ("http", "library"):
            s = entry["paths"][path]
            rows.append((entry["hosts"], path_label(entry, path), ms(s["submit_to_claimed_ms"]),
                         ms(s["submit_to_active_ms"]), ms(s["api_call_ms"]),
                         s["placements_per_s"], s["refused"], reg["seconds"], reg["hosts_per_s"],
                         _mb(rss.get("max_kb")), reconcile_cell(entry), other(s),
                         _note(s)))  # fmt: skip
    header = ("hosts", "path", "to claimed ms p50/p95/p99", "to ACTIVE ms p50/p95/p99",
              "API call ms p50/p95/p99", "placed/s", "refused", "register s", "hosts/s",
              "agent RSS MB", "reconcile s start / ms per pass", "other CPU",
              "note")  # fmt: skip
    return simple_table(header, rows)


def path_label(entry: dict[str, Any], path: str) -> str:
    """A path of the scale sweep, and what of metrics and notifications was not at its
    default for it."""
    return ", ".join((path, *variant_notes(entry)))


def variant_notes(entry: dict[str, Any]) -> list[str]:
    notes = [] if entry.get("metrics", True) else ["no metrics"]
    return notes + (["notifications"] if entry.get("notifications") else [])


#: The parts whose CPU metrics and notifications may change: the API workers, the
#: agents, the bench process (everything, when embedded), the whole machine.
METRICS_PARTS = ("api", "agents", "generator", "busy")
MIN_PART_MS = 0.1  # a part that did (next to) nothing: no percentage to give
FEATURES = ("metrics", "notifications")
_FEATURE_DEFAULTS = {"metrics": True, "notifications": False}


def plumbing_cost(scale: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per N, path and feature (metrics, notifications) measured without and with it, all
    else equal: each part's CPU ms per placement both ways and the change in percent."""
    rows = []
    for feature in FEATURES:
        others = [f for f in FEATURES if f != feature]
        pairs: dict[tuple[Any, ...], dict[bool, dict[str, Any]]] = {}
        for entry in scale:
            key = (entry["hosts"], *(entry.get(f, _FEATURE_DEFAULTS[f]) for f in others))
            pairs.setdefault(key, {})[entry.get(feature, _FEATURE_DEFAULTS[feature])] = entry
        for key, both in pairs.items():
            for path in ("http", "library") if len(both) == 2 else ():
                off, on = (
                    both[m]["paths"][path].get("cpu_ms_per_placement", {}) for m in (False, True)
                )
                for part in (p for p in METRICS_PARTS if off.get(p, 0) >= MIN_PART_MS and p in on):
                    change = round(100 * (on[part] - off[part]) / off[part], 1)
                    rows.append({"feature": feature, "hosts": key[0], "path": path, "part": part,
                                 "off_ms": off[part], "on_ms": on[part],
                                 "change_pct": change})  # fmt: skip
    return rows


def plumbing_cost_table(rows: list[dict[str, Any]]) -> list[str]:
    body = [(r["feature"], r["hosts"], r["path"], r["part"], _cost_cell(r["off_ms"]),
             _cost_cell(r["on_ms"]), f"{r['change_pct']:+.1f}") for r in rows]  # fmt: skip
    return simple_table(("feature", "hosts", "path", "part", "off ms", "on ms", "change %"), body)


def plumbing_table(plumbing: dict[str, Any]) -> list[str]:
    """Per comparison and part: CPU ms per placement off and on (medians over the
    slices) and the blocks' change (median, least, most)."""
    body = [
        (name, part, _cost_cell(f["off_ms"]), _cost_cell(f["on_ms"]), f"{f['change_pct']:+.1f}",
         f"{f['min_pct']:+.1f} .. {f['max_pct']:+.1f}")
        for name, comparison in plumbing.get("comparisons", {}).items()
        for part, f in comparison.items()
        if part != "blocks"
    ]  # fmt: skip
    return simple_table(("switched", "part", "off ms", "on ms", "change %", "blocks %"), body)


def rules_table(rules: list[dict[str, Any]]) -> list[str]:
    rows = [
        (entry["hosts"], name, ms(s["submit_to_claimed_ms"]), ms(s["submit_to_active_ms"]),
         s["placements_per_s"], s["refused"], s["error"])
        for entry in rules
        for name, s in entry["classes"].items()
    ]  # fmt: skip
    header = ("hosts", "class", "to claimed ms p50/p95/p99", "to ACTIVE ms p50/p95/p99",
              "placed/s", "refused", "ERROR")  # fmt: skip
    return simple_table(header, rows)


def contention_table(rules: list[dict[str, Any]]) -> list[str]:
    """The shared provider's contention per N: every host in its aggregate."""
    rows = []
    for entry in rules:
        found = entry["classes"].get("shared storage (sharing provider)", {}).get("contention")
        if found:
            provider = found["provider"]
            rows.append((entry["hosts"], entry["shared_provider"]["hosts"],
                         found["claiming_hosts"], found["claims"], found["conflicts_per_claim"],
                         found["max_conflicts"], found["generation_conflicts"],
                         f"{provider['used_gb']:,} / {provider['capacity_gb']:,}"))  # fmt: skip
    header = ("hosts", "hosts sharing", "hosts claimed", "claims", "conflicts/claim",
              "max", "generation conflicts", "GB used / capacity")  # fmt: skip
    return simple_table(header, rows) if rows else []


def reconcile_cell(entry: dict[str, Any]) -> str:
    """The agents' reconcile: the longest at start (every node), and the mean periodic
    pass (a slice of ``[agent] reconcile_batch`` nodes), from their own counters."""
    agents = entry["registration"].get("per_agent") or []
    start_s = max((a.get("reconcile_s", 0.0) for a in agents), default=0.0)
    counters = entry.get("agent_counters") or []
    passes = sum(c.get("reconcile_passes", 0) for c in counters)
    pass_ms = sum(c.get("reconcile_ms", 0) for c in counters) / passes if passes else None
    return f"{start_s:.2f} / {'-' if pass_ms is None else f'{pass_ms:.1f}'} ({passes})"


def burst_table(scale: list[dict[str, Any]]) -> list[str]:
    rows = []
    for entry in scale:
        b = entry.get("burst")
        if b:
            note = ", ".join(n for n in (_note(b), *variant_notes(entry)) if n)
            rows.append((entry["hosts"], b["requests"], b["refused"], b["sent_per_s"],
                         b["capacity_per_s"], ms(b["submit_to_claimed_ms"]), other(b),
                         note))  # fmt: skip
    header = ("hosts", "boots", "refused", "sent/s", "placed/s with backlog",
              "to claimed ms p50/p95/p99", "other CPU", "note")  # fmt: skip
    return simple_table(header, rows) if rows else []


COST_PARTS = ("generator", "api", "agents", "redis", "rabbitmq", "other")


def cost_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """CPU ms per placement of each part: what one placement costs, where."""
    body = [(label, *(stats.get("cpu_ms_per_placement", {}).get(k) for k in COST_PARTS),
             stats.get("placed_in_window_per_s")) for label, stats in rows]  # fmt: skip
    header = ("phase", "front door (bench process)", "API workers", "agents", "Redis",
              "RabbitMQ", "other", "placed/s")  # fmt: skip
    return simple_table(header, [tuple(_cost_cell(c) for c in line) for line in body])


def _cost_cell(value: Any) -> Any:
    return f"{value:.2f}" if isinstance(value, float) and value < 100 else value


def cost_rows(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    for entry in results.get("scale") or []:
        for path in ("http", "library"):
            rows.append((f"N={entry['hosts']:,} {path_label(entry, path)}", entry["paths"][path]))
        if entry.get("burst"):
            rows.append((f"N={entry['hosts']:,} {path_label(entry, 'burst')}", entry["burst"]))
    for name, entry in (results.get("saturation") or {}).items():
        for step in entry["steps"]:
            rows.append((f"{name} {step['offered_per_s']:g}/s", step))
    return [(label, stats) for label, stats in rows if stats.get("cpu_ms_per_placement")]


def redis_sample(results: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The Redis commands of the fastest sustained RabbitMQ step (else any phase that has them)."""
    steps = (results.get("saturation") or {}).get("rabbitmq", {}).get("steps", [])
    for step in sorted(steps, key=lambda s: -s["offered_per_s"]):
        if step.get("sustained") and step.get("redis_per_placement"):
            return f"RabbitMQ bus, {step['offered_per_s']:g}/s", step["redis_per_placement"]
    for label, stats in cost_rows(results):
        if stats.get("redis_per_placement"):
            return label, stats["redis_per_placement"]
    return "", {}


def redis_table(commands: dict[str, Any]) -> list[str]:
    rows = [(name, c["calls"], c["usec"]) for name, c in commands.items()]
    return simple_table(("command", "calls", "server µs"), rows)


def _note(stats: dict[str, Any]) -> str:
    """Why a row's figures may be disturbed: a server restarted, boots refused."""
    notes = [f"{name} restarted" for name in stats.get("servers_restarted") or []]
    notes += [f"{n} refused: {why}" for why, n in (stats.get("refusals") or {}).items()]
    return ", ".join(notes)


def _mb(kb: int | None) -> str:
    return "-" if kb is None else f"{kb / 1024:,.0f}"


def saturation_table(saturation: dict[str, Any]) -> list[str]:
    rows = []
    for name, entry in saturation.items():
        for s in entry["steps"]:
            verdict = "yes" if s["sustained"] else "no"
            rows.append((name, s["offered_per_s"], s["sent_per_s"], s["placed_in_window_per_s"],
                         ms(s["submit_to_claimed_ms"]), ms(s["submit_to_active_ms"]), verdict,
                         s["refused"], other(s), _note(s)))  # fmt: skip
    header = ("bus", "offered/s", "sent/s", "placed/s", "to claimed ms p50/p95/p99",
              "to ACTIVE ms p50/p95/p99", "sustained", "refused", "other CPU", "note")  # fmt: skip
    return simple_table(header, rows)


def fill_table(fill: dict[str, Any]) -> list[str]:
    ref = fill["reference"]
    rows = [
        ("qsched, at the first NoValidHost", *_fractions(fill["qsched"]["at_first_nvh"])),
        (
            "best fit, arrival order, until its first failure",
            *_fractions(ref["at_first_failure"]["fractions"]),
        ),
        ("qsched, after the queue drained", *_fractions(fill["qsched"]["after_drain"])),
        ("best fit, arrival order, same requests", *_fractions(ref["same_requests"]["fractions"])),
    ]
    return simple_table(("packing", "VCPU", "MEMORY_MB", "DISK_GB", "bottleneck"), rows)


def _fractions(shares: dict[str, float]) -> list[str]:
    return [f"{shares.get(rc, 0.0):.1%}" for rc in ("VCPU", "MEMORY_MB", "DISK_GB", "bottleneck")]


def targets_table(rows: list[dict[str, Any]]) -> list[str]:
    verdict = {True: "met", False: "MISSED", None: "not measured"}
    return simple_table(
        ("target", "measured", "verdict"),
        [(r["target"], r["measured"], verdict[r["met"]]) for r in rows],
    )


def render(results: dict[str, Any]) -> str:
    """Every table of a run, as text that is also reStructuredText."""
    parts: list[str] = [f"qsched-bench ({results['mode']}): {results['command']}", ""]
    if results.get("scale"):
        bus = results["scale"][0].get("bus", "?")
        parts += [f"Scale sweep ({bus} bus)", "", *scale_table(results["scale"]), ""]
        burst = burst_table(results["scale"])
        if burst:
            parts += ["Burst (library path, backlog)", "", *burst, ""]
    if results.get("saturation"):
        parts += ["Saturation", "", *saturation_table(results["saturation"]), ""]
    if results.get("fill"):
        fill = results["fill"]
        title = (f"Fill ({fill['hosts']} hosts, {fill.get('bus', '?')} bus, {fill['accepted']} "
                 f"boots, the first NoValidHost is boot {fill['first_nvh_index']})")  # fmt: skip
        parts += [title, "", *fill_table(fill), ""]
    if results.get("rules"):
        bus = results["rules"][0].get("bus", "?")
        first = results["rules"][0]
        parts += [f"Placement rules (library path, {bus} bus, "
                  f"{first.get('agent_hosts', '?')} compute hosts)", "",
                  *rules_table(results["rules"]), ""]  # fmt: skip
        contention = contention_table(results["rules"])
        if contention:
            parts += ["Shared provider contention (conflicts from the instances' histories, "
                      "each retried)", "", *contention, ""]  # fmt: skip
    moves = [entry for entry in results.get("moves") or [] if "resize" in entry or "drain" in entry]
    if moves:
        bus = moves[0].get("bus", "?")
        parts += [f"Moves (library path, {bus} bus; from the call to the destination's claim "
                  "and to the move's end)", "", *moves_table(moves), "",
                  "Hosts emptied (from the first move asked to the last one ended)", "",
                  *emptied_table(moves), ""]  # fmt: skip
    if results.get("instances"):
        parts += ["Instances (library path; memory: INFO used_memory)", "",
                  *instances_table(results["instances"]), ""]  # fmt: skip
    costs = cost_rows(results)
    if costs:
        parts += ["CPU ms per placement", "", *cost_table(costs), ""]
    if results.get("plumbing_cost"):
        parts += ["Cost of metrics and notifications (CPU ms per placement, scale sweep "
                  "without and with each)", "", *plumbing_cost_table(results["plumbing_cost"]),
                  ""]  # fmt: skip
    plumbing = results.get("plumbing") or {}
    if plumbing.get("comparisons"):
        parts += [f"Cost of notifications and metrics, switched in turns ({plumbing['hosts']} "
                  f"hosts, library path at {plumbing['rate_per_s']:g}/s, slices of "
                  f"{plumbing['slice_s']:g}s; CPU ms per placement)", "",
                  *plumbing_table(plumbing), ""]  # fmt: skip
    label, commands = redis_sample(results)
    if commands:
        parts += [f"Redis commands per placement ({label}; server-wide INFO commandstats; "
                  "commands that scripts run count in their own rows and in EVALSHA's time)",
                  "", *redis_table(commands), ""]  # fmt: skip
    parts += ["Targets", "", *targets_table(results["targets"]), ""]
    parts.append(f"Reference figures are {REFERENCE['note']}.")
    return "\n".join(parts)


# -- the plot --------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> str | None:
    """Latency percentiles and throughput against N; None, or why no plot was made."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    scale = results.get("scale") or []
    if not scale:
        return "no scale sweep in this run: no plot"
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(16, 5.2))
    _latency_panel(left, scale)
    _throughput_panel(mid, scale, results.get("saturation") or {})
    _registration_panel(right, scale)
    machine = results["machine"]
    fig.suptitle(
        f"{results['command']}\n{machine['cpu_count']} CPUs ({machine['cpu_model']}), "
        f"{results['backends']['summary']}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _latency_panel(ax: Any, scale: list[dict[str, Any]]) -> None:
    hosts = [e["hosts"] for e in scale]
    colors = {"p50": "tab:blue", "p95": "tab:orange", "p99": "tab:red"}
    for path, style in (("library", "-"), ("http", "--")):
        for q, color in colors.items():
            ys = [e["paths"][path]["submit_to_claimed_ms"][q] for e in scale]
            ax.plot(hosts, ys, style, marker="o", color=color, label=f"qsched {q}, {path}")
    references = (
        ("placement_allocation_candidates_median_ms", "Placement GET a_c median", ":"),
        ("nova_filter_weigh_ms", "Nova filter+weigh", "-."),
    )
    for key, label, style in references:
        ref = REFERENCE[key]
        xs = [int(n) for n in ref]
        ax.plot(xs, list(ref.values()), style, color="grey", label=f"{label} (not measured)")
    ax.set(xscale="log", yscale="log", xlabel="hosts (N)", ylabel="ms")
    ax.set_title("submit to claimed; solid: library call, dashed: HTTP", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="upper left")


def _throughput_panel(ax: Any, scale: list[dict[str, Any]], saturation: dict[str, Any]) -> None:
    hosts = [e["hosts"] for e in scale]
    for path in ("library", "http"):
        ys = [e["paths"][path]["placements_per_s"] for e in scale]
        ax.plot(hosts, ys, "o-", label=f"{path}, fixed offered load")
    bursts = [(e["hosts"], e["burst"]["capacity_per_s"]) for e in scale if e.get("burst")]
    if bursts:
        ax.plot([b[0] for b in bursts], [b[1] for b in bursts], "s-",
                label="library, burst: placed/s with a backlog")  # fmt: skip
    for (name, entry), (marker, shift) in zip(
        saturation.items(), (("*", 0.85), ("P", 1.15)), strict=False
    ):
        ax.plot([entry["hosts"] * shift], [entry["sustained_per_s"]], marker, markersize=11,
                linestyle="none", label=f"saturation: highest sustained, {name} bus")  # fmt: skip
    ax.axhline(SUSTAINED_PER_S, color="red", linestyle=":", label="target 1,000/s")
    ax.set(xscale="log", xlabel="hosts (N)", ylabel="placements/s")
    ax.set_title("throughput", fontsize=10)
    ax.set_ylim(0, 1150)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="upper left")


def _registration_panel(ax: Any, scale: list[dict[str, Any]]) -> None:
    hosts = [e["hosts"] for e in scale]
    ax.plot(hosts, [e["registration"]["hosts_per_s"] for e in scale], "o-", label="qsched")
    ax.axhline(REGISTRATION_PER_S, color="red", linestyle=":", label="target 5,000/s")
    ax.axhline(REFERENCE["placement_providers_registered_per_s"], color="grey", linestyle="-.",
               label="Placement (reference, not measured)")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="hosts (N)", ylabel="hosts/s")
    ax.set_title("registration (all agents together)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")


def instances_table(entries: list[dict[str, Any]]) -> list[str]:
    """One row per cloud of the scenario."""
    header = ["preloaded", "used_memory MiB", "B/host", "B/live", "B/past", "agents restart s",
              "claimed p50/p99 ms", "ACTIVE p50/p99 ms", "delete p50/p99 ms",
              "archived/s"]  # fmt: skip
    rows = []
    for e in entries:
        boots, deletes = e["boots"], e["deletes"]["delete_to_deleted_ms"]
        mem, per = e.get("memory", {}), e.get("per_item_bytes", {})
        last = next((mem[k] for k in ("past", "live", "hosts") if mem.get(k) is not None), None)
        restart = e.get("agent_restart") or {}
        rows.append([
            f"{e['preloaded']:,}", _mib(last), per.get("host"), per.get("live_instance"),
            per.get("past_instance"), restart.get("ready_s", "n/a"),
            p50_p99(boots["submit_to_claimed_ms"]), p50_p99(boots["submit_to_active_ms"]),
            p50_p99(deletes), (e.get("archive") or {}).get("per_s", "-"),
        ])  # fmt: skip
    return simple_table(header, rows)


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.1f}"
