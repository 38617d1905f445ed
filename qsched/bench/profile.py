"""Sample the cloud's processes with py-spy during a phase, and name the top frames.

py-spy (``pip install py-spy``; it attaches with ptrace, so it needs the
permission to) records each process for the phase in collapsed-stack form
(``<name>.txt``, one ``frame;frame;... count`` per line, readable by
flamegraph.pl or speedscope). The report keeps, per process, the frames with
the most samples on top of the stack (self) and anywhere in it (total).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

TOP = 15


def find_py_spy() -> str | None:
    """py-spy next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Profiler:
    """One py-spy recorder per process for the length of a phase."""

    def __init__(self, outdir: Path, py_spy: str, rate_hz: int = 200) -> None:
        self.outdir = outdir
        self.py_spy = py_spy
        self.rate_hz = rate_hz
        self._running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(self, label: str, targets: dict[str, int], duration_s: float) -> None:
        """Record each of ``targets`` ({name: pid}) for ``duration_s`` seconds."""
        self.outdir.mkdir(parents=True, exist_ok=True)
        for name, pid in targets.items():
            path = self.outdir / f"{label}-{name}.txt".replace(" ", "_").replace("/", "_")
            cmd = [self.py_spy, "record", "--pid", str(pid), "--duration", str(int(duration_s) + 1),
                   "--rate", str(self.rate_hz), "--format", "raw", "--nonblocking", "--gil",
                   "--output", str(path)]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self._running[name] = (proc, path)

    def stop(self) -> dict[str, Any]:
        """Wait for the recorders; the top frames of each role (agents, API workers, bench)."""
        texts: dict[str, list[str]] = {}
        errors: dict[str, str] = {}
        for name, (proc, path) in self._running.items():
            try:
                _out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
            role = name.rstrip("0123456789-").removesuffix("-worker").removesuffix("-")
            if path.exists():
                texts.setdefault(role, []).append(path.read_text())
            else:
                errors[name] = err.decode(errors="replace")[-300:]
        self._running.clear()
        found: dict[str, Any] = {role: top_frames(parts) for role, parts in texts.items()}
        return found | ({"errors": errors} if errors else {})


OURS = ("qsched/", "agents/")


def top_frames(collapsed: list[str], top: int = TOP) -> dict[str, Any]:
    """Where the samples of some processes went (shares of all their samples, %).

    ``self``: the frame on top of the stack. ``ours``: the innermost qsched or agents
    frame of the stack (the code of this project that is responsible, library time
    below it included). ``ours_total``: qsched and agents frames anywhere in the stack.
    """
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    ours_total: Counter[str] = Counter()
    samples = 0
    for line in (line for text in collapsed for line in text.splitlines()):
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        samples += n
        own[_short(frames[-1])] += n
        mine = [f for f in frames if _ours(f)]
        if mine:
            ours[_short(mine[-1])] += n
        for frame in {_short(f) for f in mine}:
            ours_total[frame] += n

    def share(counter: Counter[str]) -> list[list[Any]]:
        return [[f, round(100 * n / samples, 1)] for f, n in counter.most_common(top)]

    if not samples:
        return {"samples": 0}
    return {"samples": samples, "self": share(own), "ours": share(ours),
            "ours_total": share(ours_total)}  # fmt: skip


def _ours(frame: str) -> bool:
    where = frame.partition(" (")[2]
    return where.startswith(OURS) and not where.startswith("qsched/bench/")


def _short(frame: str) -> str:
    """``fn (path/to/module.py:12)`` -> ``fn (to/module.py:12)``: short, still telling."""
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    path, _, line = where.rstrip(")").rpartition(":")
    return f"{name} ({'/'.join(path.split('/')[-2:])}:{line})"
