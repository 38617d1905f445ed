"""Who used the CPU during a phase: agents, API, load generator, servers, everything else.

The machine is shared (other test suites, the servers, the bench itself), so a
latency figure means little without knowing how busy the cores were, and a
throughput ceiling is best explained by what each placement costs where. Read
from /proc: the machine's busy time; each group of the cloud's processes with
their children (gunicorn's workers); this process (the load generator, and the
front door for library-path boots); Redis and RabbitMQ by process name. Figures
are in cores: 1.0 is one core busy for the whole phase.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

SERVERS = {"redis-server": "redis", "beam.smp": "rabbitmq"}
Groups = Callable[[], dict[str, list[int]]]
Jiffies = dict[str, dict[int, int]]  # part -> pid -> jiffies


def _machine() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, utime + stime, comm) of a process; None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[1]), int(rest[11]) + int(rest[12]), comm


def _processes() -> dict[int, tuple[int, int, str]]:
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                found[int(entry.name)] = stat
    return found


def _names(pid: int, marks: Iterable[str]) -> bool:
    """Whether the process's command line holds one of ``marks`` (False once it is gone)."""
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return any(mark in line for mark in marks)


def _serves(pid: int, ports: frozenset[int]) -> bool:
    """Whether a redis-server's title (``redis-server 127.0.0.1:6379``) names a port of ours."""
    return not ports or _names(pid, (f":{port}" for port in ports))


def _runs_from(pid: int, home: str | None) -> bool:
    """Whether a beam.smp's command line names ``home`` (its ``-home``: the nodes of a
    RabbitMQ cluster the run started); every one when None."""
    return home is None or _names(pid, (home,))


def snapshot(
    groups: dict[str, list[int]], redis_ports: frozenset[int], rabbit_home: str | None = None
) -> tuple[int, int, Jiffies]:
    """Machine (busy, total) jiffies, and per part the jiffies of each of its processes.

    Parts: ``generator`` (this process), each group with its children, ``redis`` (the
    redis-servers on ``redis_ports``), ``rabbitmq`` (the nodes run from ``rabbit_home``,
    every node when None).
    """
    busy, total = _machine()
    procs = _processes()
    me = os.getpid()
    parts: Jiffies = {"generator": {me: procs[me][1]} if me in procs else {}}
    for name, roots in groups.items():
        parts[name] = {p: procs[p][1] for p in _with_children(roots, procs)}
    for comm, name in SERVERS.items():
        parts[name] = {
            pid: t
            for pid, (_, t, c) in procs.items()
            if c == comm
            and (name != "redis" or _serves(pid, redis_ports))
            and (name != "rabbitmq" or _runs_from(pid, rabbit_home))
        }
    return busy, total, parts


def _with_children(roots: Iterable[int], procs: dict[int, tuple[int, int, str]]) -> set[int]:
    members = {p for p in roots if p in procs}
    return members | {pid for pid, (ppid, _, _) in procs.items() if ppid in members}


class CpuMeter:
    """Call :meth:`start`, then :meth:`stop` for the cores each part used in between.

    A process that started in between counts from zero; one that ended is lost (its
    time shows under ``other``), and a server that did either is in :attr:`restarted`.
    """

    def __init__(
        self,
        groups: Groups,
        redis_ports: frozenset[int] = frozenset(),
        rabbit_home: str | None = None,
    ) -> None:
        self.groups = groups
        self.redis_ports = redis_ports
        self.rabbit_home = rabbit_home
        self._start: tuple[int, int, Jiffies] | None = None
        self.restarted: list[str] = []  # servers that started or stopped in between

    def start(self) -> None:
        try:
            self._start = snapshot(self.groups(), self.redis_ports, self.rabbit_home)
        except (OSError, ValueError, IndexError):
            self._start = None  # no /proc: report nothing rather than guess

    def stop(self) -> dict[str, float]:
        if self._start is None:
            return {}
        try:
            busy, total, parts = snapshot(self.groups(), self.redis_ports, self.rabbit_home)
        except (OSError, ValueError, IndexError):
            return {}
        busy0, total0, parts0 = self._start
        self.restarted = sorted(
            name for name in SERVERS.values() if set(parts[name]) != set(parts0.get(name, {}))
        )
        cpus = os.cpu_count() or 1
        per_core = max(total - total0, 1) / cpus
        cores = {"busy": round((busy - busy0) / per_core, 3)}
        for name, pids in parts.items():
            before = parts0.get(name, {})
            spent = sum(max(t - before.get(pid, 0), 0) for pid, t in pids.items())
            cores[name] = round(spent / per_core, 3)
        mine = sum(v for k, v in cores.items() if k != "busy")
        cores["other"] = round(max(cores["busy"] - mine, 0.0), 3)
        return {"cpus": cpus, **cores}
