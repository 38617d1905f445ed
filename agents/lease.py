"""An agent's lease: until when the ledger counts it alive, as the agent can know it.

The ledger keeps an agent's heartbeat for ``heartbeat_ttl_s`` from when it wrote it.
Once that has expired, the API deletes the agent's instances locally and a janitor
(``[scheduler] janitor_grace_s`` later) takes its builds: the agent may only be
starved of CPU, and still spawning. The agent cannot read the ledger's clock, but it
knows when it *sent* its last acknowledged heartbeat: its lease ends
``heartbeat_ttl_s`` after that, never later than the ledger's expiry, so while its
lease holds nobody has taken anything from it. A heartbeat acknowledged after the
lease ended starts a new term: the ledger may have been without this agent's
heartbeat in between, and what the old term covered may have been taken.

The agent honours it where a VM would start (:mod:`agents.spawning`): a driver starts
no VM unless the lease has held, in one term, since the claim was known to be the
agent's (``fence``, :meth:`~agents.virt.base.VirtDriver.spawn`); after a lapse a build
asks the ledger whether its claim is still its own before it starts the VM. So a
build a janitor took from a starved agent is not started a second time there; and
what the janitor or the API took is held for the host until its agent says the VM is
gone (:mod:`qsched.recovery.janitor`).

A lease starts with the first heartbeat: before it, the agent consumes nothing. An
operator forcing the host's service down ends it at once (forced down is down: the
janitor takes its builds without waiting for its heartbeat to expire).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Lease:
    """Thread-safe; every call is O(1) and reads no ledger.

    ``term`` counts the lapses: it moves on when a heartbeat renews a lease that had
    ended before that heartbeat was acknowledged (or that an operator ended). A claim
    known to be this agent's while the lease held in a term stays its own as long as
    that term holds (:meth:`holds`); after a lapse, only the ledger can tell.
    """

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._until: float | None = None  # no heartbeat yet: no janitor judges it
        self.term = 0
        self._renewed = threading.Condition()

    def renew(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (this lease's clock) was acknowledged now."""
        with self._renewed:
            if self._until is not None and self._clock() >= self._until:
                self.term += 1  # it lapsed: what it covered may have been taken meanwhile
            self._until = sent_at + self.ttl_s
            self._renewed.notify_all()

    def end(self) -> None:
        """The ledger no longer counts this agent alive (its service forced down)."""
        with self._renewed:
            self._until = float("-inf")

    def valid(self) -> bool:
        """Whether nobody may have taken this agent's claims yet."""
        until = self._until
        return until is None or self._clock() < until

    def current(self) -> int | None:
        """The term, if the lease holds now; else None."""
        with self._renewed:
            return self.term if self.valid() else None

    def holds(self, term: int | None) -> bool:
        """Whether the lease has held without a lapse since ``term`` (None: never)."""
        with self._renewed:
            return term == self.term and self.valid()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the lease to hold; whether it does."""
        with self._renewed:
            return self._renewed.wait_for(self.valid, timeout_s)
