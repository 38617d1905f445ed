"""Rendering for qsched-admin: aligned tables for people, JSON and CSV for scripts.

Rows are plain dicts of raw values (numbers stay numbers, missing values are
None), so JSON and CSV carry what the ledger and the broker said; only the
table turns them into short text.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import click

FORMATS = ("table", "json", "csv")  # listings
SHOWS = ("table", "json")  # one object: CSV would not say more
NONE = "-"


def echo(output: str) -> None:
    """Print a rendering, unless it is empty."""
    if output:
        click.echo(output)


def text(value: Any) -> str:
    """A value as a table cell: '-' for None, lists joined, floats with one decimal."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in value) or NONE
    if isinstance(value, Mapping):
        return " ".join(f"{k}={text(v)}" for k, v in value.items()) or NONE
    return str(value)


def age(seconds: float | None) -> str:
    """A duration for people: 4.2s, 3m12s, 2h03m, 3d04h."""
    if seconds is None:
        return NONE
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d{hours:02d}h"


def when(epoch: float | None) -> str:
    """Local wall-clock time with milliseconds: 2024-05-01 14:02:01.123."""
    if epoch is None:
        return NONE
    millis = round((epoch % 1) * 1000) % 1000
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) + f".{millis:03d}"


def short(value: str | None, width: int) -> str:
    """Cut a long cell to ``width`` characters, marking the cut."""
    if value is None:
        return NONE
    return value if len(value) <= width else value[: width - 3] + "..."


def flavor_text(flavor: Mapping[str, Any]) -> str:
    """``m1.small: 1 VCPU, 2048 MB RAM, 20 GB disk`` (and its extra specs)."""
    text_ = (
        f"{flavor.get('name')}: {flavor.get('vcpus')} VCPU, {flavor.get('ram_mb')} MB RAM, "
        f"{flavor.get('disk_gb', 0)} GB disk"
    )
    specs = flavor.get("extra_specs") or {}
    return text_ + (f", {text(specs)}" if specs else "")


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: the row key (or ``pick``, a value computed from the row), its header,
    how a table shows the value, and its alignment. CSV writes the value itself."""

    key: str
    header: str
    show: Callable[[Any], str] = text
    right: bool = False  # numbers read best right-aligned
    pick: Callable[[Mapping[str, Any]], Any] | None = None

    def value(self, row: Mapping[str, Any]) -> Any:
        return self.pick(row) if self.pick is not None else row.get(self.key)

    def cell(self, row: Mapping[str, Any]) -> str:
        return self.show(self.value(row))


def number(key: str, header: str) -> Column:
    return Column(key, header, text, right=True)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """Rows under an upper-case header, columns two spaces apart."""
    cells = [[c.header.upper() for c in columns]]
    cells += [[c.cell(row) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        parts = [
            value.rjust(width) if column.right else value.ljust(width)
            for value, width, column in zip(line, widths, columns, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    """``name  value`` lines with the names aligned (the body of a 'show' command)."""
    items = [(name, value if isinstance(value, str) else text(value)) for name, value in pairs]
    if not items:
        return ""
    width = max(len(name) for name, _ in items)
    return "\n".join(f"{name:<{width}}  {value}".rstrip() for name, value in items)


def to_json(document: Any) -> str:
    """Indented JSON with sorted keys, so diffs of two runs stay readable."""
    return json.dumps(document, indent=2, sort_keys=True, default=_jsonable)


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def to_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """CSV with the row keys as header; lists joined by spaces, mappings as JSON."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c.key for c in columns])
    for row in rows:
        writer.writerow([_csv_cell(c.value(row)) for c in columns])
    return out.getvalue().rstrip("\n")


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list | tuple | set | frozenset):
        return " ".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True)
    return value


def render_rows(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], fmt: str, empty: str = ""
) -> str:
    """A listing in ``fmt``: JSON gets the raw rows, CSV and tables the columns."""
    if fmt == "json":
        return to_json(list(rows))
    if fmt == "csv":
        return to_csv(rows, columns)
    if not rows and empty:
        return empty
    return table(rows, columns)
