"""What the moves scenario reports (:mod:`qsched.bench.moves`): its tables and targets."""

from __future__ import annotations

from typing import Any

from qsched.bench.tables import ms, other, row, simple_table

#: the two timed kinds of move, by their key in a cloud's entry
KINDS = {"resize": "resize", "live_migration": "live migration"}
#: the two ways a host is emptied, by their key in a cloud's entry
WAYS = {"drain": "drain (live, 4 at a time)", "evacuation": "evacuation (forced down)"}


def moves_table(moves: list[dict[str, Any]]) -> list[str]:
    """Per N and kind: submit to claimed and to done, API call, failures."""
    rows = [
        (entry["hosts"], label, s["moved"], ms(s["submit_to_claimed_ms"]),
         ms(s["submit_to_done_ms"]), ms(s["api_call_ms"]), s["failed"], s["refused"], other(s))
        for entry in moves
        for key, label in KINDS.items()
        if (s := entry.get(key))
    ]  # fmt: skip
    header = ("hosts", "move", "moved", "to claimed ms p50/p95/p99", "to done ms p50/p95/p99",
              "API call ms p50/p95/p99", "failed", "refused", "other CPU")  # fmt: skip
    return simple_table(header, rows)


def emptied_table(moves: list[dict[str, Any]]) -> list[str]:
    """Per N and way: the servers of the host, how many moved, in how long."""
    rows = [
        (entry["hosts"], label, e["servers"], e["moved"], e["could_not_move"], _s(e["seconds"]),
         ms(e["to_claimed_ms"]), ms(e["to_done_ms"]), _note(e))
        for entry in moves
        for key, label in WAYS.items()
        if (e := entry.get(key))
    ]  # fmt: skip
    header = ("hosts", "emptied by", "servers", "moved", "could not move", "seconds",
              "each: to claimed ms p50/p95/p99", "each: to done ms p50/p95/p99",
              "note")  # fmt: skip
    return simple_table(header, rows)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def _note(emptied: dict[str, Any]) -> str:
    if "engine_s" in emptied:
        return f"listing {emptied['listing_s']}s, engine {emptied['engine_s']}s"
    return f"calls {emptied.get('calls_s')}s"


def moves_targets(moves: list[dict[str, Any]], flat_ratio: float, full_n: int) -> list[dict]:
    """Submit to claimed of each kind flat in N (judged from 100 to ``full_n`` hosts),
    and every server of a drained and of an evacuated host moved."""
    found = []
    low, high = moves[0], moves[-1]
    for key, label in KINDS.items():
        if key not in low or key not in high:
            continue
        a = low[key]["submit_to_claimed_ms"]["p50"]
        b = high[key]["submit_to_claimed_ms"]["p50"]
        if a is None or b is None:
            continue
        measured = (f"p50 {b:.1f} ms at N={high['hosts']:,} vs {a:.1f} ms at "
                    f"N={low['hosts']:,}: {b / a:.2f}x")  # fmt: skip
        met = b / a <= flat_ratio if low["hosts"] <= 100 and high["hosts"] >= full_n else None
        target = (f"moves flat: {label} submit-to-claimed p50 at {full_n:,} hosts within "
                  f"{flat_ratio}x of 100 hosts")  # fmt: skip
        found.append(row(target, measured, met))
    emptied = [(entry["hosts"], key, entry[key]) for entry in moves for key in WAYS if key in entry]
    if emptied:
        left = sum(e["could_not_move"] for _n, _k, e in emptied)
        measured = "; ".join(f"{key} at N={n:,}: {e['moved']} of {e['servers']} in "
                             f"{e['seconds']}s" for n, key, e in emptied)  # fmt: skip
        target = "every server of a drained host and of an evacuated host moves"
        found.append(row(target, measured, left == 0))
    return found
