"""Facts about the machine and the servers a run used, for the JSON report."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from qsched.bus.kombu.wire import KombuWire
from qsched.ledger import server

PACKAGES = ("qsched", "kombu", "amqp", "redis", "fakeredis", "falcon", "gunicorn", "msgpack")


def machine_facts() -> dict[str, Any]:
    """CPU, memory, OS, Python and package versions; the load average right now."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpuinfo("model name"),
        "memory_mb": _meminfo_mb("MemTotal"),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": {name: _version(name) for name in PACKAGES},
        "qsched_commit": _commit(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def busy_cores(seconds: float = 0.5) -> float | None:
    """Cores busy (whoever uses them) over the next ``seconds``; None without /proc."""
    try:
        before = _jiffies()
        time.sleep(seconds)
        after = _jiffies()
    except (OSError, ValueError):
        return None
    total = max(after[1] - before[1], 1)
    return round((after[0] - before[0]) / total * (os.cpu_count() or 1), 2)


def _jiffies() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def broker_facts(url: str) -> dict[str, Any]:
    """Product and version the broker at ``url`` announces (RabbitMQ), or the transport."""
    wire = KombuWire(url, prefix="qsched-bench-probe")
    if not wire.amqp:
        return {"transport": wire.driver}
    connection = wire.connect()
    try:
        props = connection.connection.server_properties
        return {
            "transport": "amqp",
            "product": _str(props.get("product")),
            "version": _str(props.get("version")),
        }
    finally:
        connection.release()


def reachable(url: str) -> str | None:
    """None if the server at ``url`` (redis:// or amqp://) answers, else why not."""
    try:
        if url.startswith(("redis://", "rediss://", "unix://")):
            error = server.unreachable(url)
            if error is not None:
                return f"{type(error).__name__}: {error}"
        else:
            KombuWire(url, prefix="qsched-bench-probe").connect().release()
    except Exception as exc:  # whatever the client raises, the answer is "no"
        return f"{type(exc).__name__}: {exc}"
    return None


def _str(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return None if value is None else str(value)


def _cpuinfo(field: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _meminfo_mb(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The checked-out commit, read-only (``git rev-parse``); None outside a checkout."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
            cwd=Path(__file__).resolve().parent,
        )
    except OSError:
        return None
    return done.stdout.strip() or None
