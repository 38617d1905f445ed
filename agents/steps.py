"""What every step of one agent works with, and the builds it has in flight.

An agent places a boot request in named steps (:mod:`agents.placing`:
admit, pick, claim, refuse; :mod:`agents.spawning`: spawn, settle, give back).
Each step is a method of a small class built on one :class:`AgentParts`, so a new
rule (a server group's affinity, a gang that must hold all its claims before any
spawn) is a new step or a change to one, not a longer loop in the service. A step
of the consumer thread says what becomes of the delivery with an
:class:`~agents.outcome.Outcome`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from agents.consuming import ClassGate
from agents.lease import Lease
from agents.metrics import AgentMetrics
from agents.nodes import NodeIndex, Pick
from agents.reconcile import Reconciler
from agents.virt.base import VirtDriver
from qsched import exception
from qsched.bus.base import Bus
from qsched.ledger import Stores
from qsched.notifications import NULL, Notifier
from qsched.recovery.reaper import fail_no_valid_host
from qsched.scheduling.message import BootRequest

LOG = logging.getLogger(__name__)
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Build:
    """A claimed instance whose spawn is in flight: the request and where it was claimed.

    ``batch``: the multi-create it is a member of; ``permitted``: whether every member
    held its claim when this one was claimed (else the spawn waits, :mod:`agents.permit`);
    ``told``: the claim's ``instance.create.start`` payload under that name, once sent,
    which ``.end`` is built from (empty: none was sent). ``term``: the agent's lease term
    when it claimed (None: its lease did not hold then); while that term holds the
    claim is its own, after a lapse the ledger must say so again.
    """

    request: BootRequest
    pick: Pick
    batch: str | None = None
    permitted: bool = True
    told: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    term: int | None = dataclasses.field(default=None, compare=False)  # agents.lease


class Builds:
    """The agent's builds in flight by instance uuid; thread-safe, O(1) per call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._builds: dict[str, Build] = {}

    def add(self, build: Build) -> None:
        with self._lock:
            self._builds[build.request.instance_uuid] = build

    def get(self, uuid: str) -> Build | None:
        with self._lock:
            return self._builds.get(uuid)

    def pop(self, uuid: str) -> Build | None:
        with self._lock:
            return self._builds.pop(uuid, None)

    def __contains__(self, uuid: object) -> bool:
        with self._lock:
            return uuid in self._builds

    def __len__(self) -> int:
        with self._lock:
            return len(self._builds)


@dataclasses.dataclass
class AgentParts:
    """One agent's host name and the parts its steps share."""

    host: str
    stores: Stores
    bus: Bus
    driver: VirtDriver
    index: NodeIndex
    builds: Builds
    reconciler: Reconciler
    counters: Counter[str]
    stopped: threading.Event
    retry_max_s: float  # [agent] ledger_retry_max_s
    gate: ClassGate  # the classes the consumer takes (a hand-back pauses one)
    metrics: AgentMetrics
    lease: Lease  # until when the ledger counts this agent alive (agents.lease)
    notifier: Notifier = NULL  # versioned notifications (docs/notifications.rst)

    def no_valid_host(self, uuid: str, reason: str, due_only: bool = False) -> bool:
        """End a waiting instance in ERROR NoValidHost for ``reason``, counted and told;
        False if it was not waiting any more (:func:`qsched.recovery.reaper.fail_no_valid_host`).

        :raises NotItsRequest: ``due_only`` and the record's deadline has not passed.
        """
        ended = fail_no_valid_host(self.stores, uuid, reason, self.notifier, due_only)
        if ended:
            self.metrics.no_valid_host(reason.replace(" ", "_"))
        return ended

    def republish_if_waiting(self, uuid: str, why: str) -> bool:
        """After this agent found the ledger no longer holds its claim of ``uuid``: if the
        instance waits for a host again, leave its request to the outbox (the janitor
        publishes it after ``[scheduler] outbox_grace_s``). Whether it did.

        A claim taken back by a janitor or a requeue was published again by whoever
        took it; one the ledger lost (a crash under ``[ledger] durability = async``
        rolled it back, after this agent had acked its request) was published by
        nobody, and nothing else on the bus holds it. A copy too many is harmless: the
        claim is idempotent, a request for an instance placed since is dropped.
        """
        parked = self.stores.instances.park(uuid, self.host, why)
        if parked:
            self.counters["republished"] += 1
            LOG.warning("agent %s: %s waits for a host again (%s): its request goes out "
                        "again from the outbox", self.host, uuid, why)  # fmt: skip
        return parked

    def persist(self, msg: BootRequest, write: Callable[[], T]) -> T:
        """Run ``write``, retrying while the ledger or bus is down, up to the deadline.

        A step that holds a claim nobody else will finish keeps trying instead of
        giving up at the first outage.

        :raises BackendUnavailable: still down at the request's deadline or at stop.
        """
        backoff = Backoff(self.retry_max_s)
        while True:
            try:
                return write()
            except exception.BackendUnavailable:
                if msg.expired() or self.stopped.is_set():
                    raise
                self.stopped.wait(backoff.next())


class Backoff:
    """Exponential delays from 0.1 s, doubling up to ``max_s``."""

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self._delay_s = 0.05

    def next(self) -> float:
        self._delay_s = min(self.max_s, self._delay_s * 2)
        return self._delay_s

    def reset(self) -> None:
        self._delay_s = 0.05
