"""Helpers shared by the tests: waiting for a condition, and hooks into an agent's steps."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.nodes import Pick
from agents.service import ComputeAgent
from qsched.scheduling.message import BootRequest

#: The project's root: tests sit in folders by package, at any depth below it.
ROOT = Path(__file__).resolve().parent.parent


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.01) -> bool:
    """Poll ``predicate`` until true or timed out."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def before_claim(agent: ComputeAgent, hook: Callable[[BootRequest], object]) -> None:
    """Call ``hook`` with every request ``agent`` is about to claim, in its consumer thread."""
    claim = agent.placer.claim

    def hooked(msg: BootRequest, pick: Pick) -> bool:
        hook(msg)
        return claim(msg, pick)

    agent.placer.claim = hooked  # type: ignore[method-assign]


class RecordingDelivery:
    """A delivery handed straight to the agent: records how it was settled."""

    queue = "qsched.boot.small"
    routing_key = "boot.small"
    redelivered = False
    headers: dict = {}

    def __init__(self) -> None:
        self.settled: list[tuple[str, object]] = []

    def ack(self) -> None:
        self.settled.append(("ack", None))

    def requeue(self, new_body: bytes) -> None:
        self.settled.append(("requeue", BootRequest.decode(new_body)))

    def reject(self, reason: str) -> None:
        self.settled.append(("reject", reason))


def failed_invariants(report: dict[str, Any]) -> str:
    """The invariants a chaos report failed, every field in full: pytest cuts a long
    dict's repr in an assertion message, and with it the ``problem`` of a finding."""
    failed = {k: v for k, v in report["invariants"].items() if not v["ok"]}
    return json.dumps(failed, indent=1, sort_keys=True, default=str)
