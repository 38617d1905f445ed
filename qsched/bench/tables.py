"""The text of a report: reStructuredText simple tables, their cells, and target rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def simple_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """An reStructuredText simple table (also readable as plain text)."""
    cells = [[str(c) for c in header]] + [[cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    rule = "  ".join("=" * w for w in widths)
    lines = [rule, _line(cells[0], widths), rule]
    lines += [_line(row, widths) for row in cells[1:]]
    return [*lines, rule]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _line(row: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def ms(stats: dict[str, Any]) -> str:
    """p50 / p95 / p99 of a :func:`~qsched.bench.measure.percentiles` (ms)."""
    return " / ".join(cell(stats[k]) for k in ("p50", "p95", "p99"))


def p50_p99(stats: dict[str, Any]) -> str:
    return f"{stats.get('p50')} / {stats.get('p99')}"


def other(stats: dict[str, Any]) -> str:
    """Cores used by processes outside the run (other work on the machine)."""
    found = stats.get("cpu_cores", {}).get("other")
    return "-" if found is None else f"{found:.2f}"


def row(target: str, measured: str, met: bool | None) -> dict[str, Any]:
    """A target of the report: what it is, what the run measured, and whether it is met
    (None: not measured at the sizes that judge it)."""
    return {"target": target, "measured": measured, "met": met}
