"""How healthy a bus is, for ``/healthcheck``: what boot publishes told, and a cached probe.

A load balancer polls every API worker every few seconds, so a health check must
be cheap and say what it saw. Two sources, both per process:

* :class:`PublishHistory`: the outcome of this process's boot publishes. A probe
  can succeed while boots fail: RabbitMQ that accepts connections but refuses to
  declare queues (its dead-letter supervisor died after a restart: every new
  boot queue failed with INTERNAL_ERROR 541) looked healthy to a probe.
* :class:`ProbeCache`: the last outcome of a probe (a real round trip to the
  broker), kept for about a second, and one probe at a time.

Nothing here does I/O or knows kombu; the clock is passed in for tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from qsched.bus import base

#: How long the outcome of boot publishes counts.
WINDOW_S = 10.0
#: How long a probe's outcome is reused: a load balancer polls every worker every few seconds.
PROBE_TTL_S = 1.0

Clock = Callable[[], float]


class PublishHistory:
    """What this process's boot publishes said about the bus lately. Thread-safe, O(1).

    The bus is down when, within the window, boot publishes failed and none
    succeeded, and the failures were about the broker, not one queue. A queue the
    broker refuses (``PRECONDITION_FAILED``: declared elsewhere with other
    arguments; a full queue that rejects publishes) is one class's problem: its
    boots get 503 and the API log names the queue, but the API stays healthy,
    since a load balancer that took every worker out would turn one class's
    failures into everyone's. Refusals on two classes or more with no success
    count as the broker's (e.g. no permission to declare any queue).
    """

    def __init__(self, window_s: float = WINDOW_S, clock: Clock = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ok_at: float | None = None
        self._failed: tuple[float, str] | None = None  # the broker's: when, category
        self._refused: dict[str, float] = {}  # class -> when its queue was last refused

    def succeeded(self) -> None:
        """A boot publish was confirmed."""
        with self._lock:
            self._ok_at = self._clock()
            self._refused.clear()

    def failed(self, scheduling_class: str, category: str) -> None:
        """A boot publish for ``scheduling_class`` failed (``category``: a ``base`` word)."""
        now = self._clock()
        with self._lock:
            if category != base.REFUSED:
                self._failed = (now, category)
                return
            self._refused[scheduling_class] = now
            if len(self._refused) > 2:  # two recent ones are all the verdict needs
                oldest = min(self._refused, key=self._refused.__getitem__)
                del self._refused[oldest]

    def verdict(self) -> str | None:
        """Why the bus is down (a ``base`` category), or None if publishes say nothing bad."""
        since = self._clock() - self.window_s
        with self._lock:
            if self._ok_at is not None and self._ok_at >= since:
                return None
            if self._failed is not None and self._failed[0] >= since:
                return self._failed[1]
            recent = sum(1 for at in self._refused.values() if at >= since)
        return base.REFUSED if recent >= 2 else None


class ProbeCache:
    """Run ``probe`` at most once per ``ttl_s`` and give its outcome to every caller.

    One probe runs at a time: callers that come while it runs wait for it and
    share its outcome, so a slow broker costs one connection attempt per
    ``ttl_s``, not one per poll.
    """

    def __init__(
        self, probe: Callable[[], None], ttl_s: float = PROBE_TTL_S, clock: Clock = time.monotonic
    ) -> None:
        self._probe = probe
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._error: base.BusUnavailable | None = None

    def check(self) -> None:
        """:raises BusUnavailable: the last probe (at most ``ttl_s`` old) failed."""
        with self._lock:
            if self._at is None or self._clock() - self._at >= self.ttl_s:
                self._error = self._run()
                self._at = self._clock()
            error = self._error
        if error is not None:  # a new one each time: callers in other threads raise it too
            raise base.BusUnavailable(error.url, error.reason, error.category)

    def _run(self) -> base.BusUnavailable | None:
        try:
            self._probe()
        except base.BusUnavailable as exc:
            return exc
        return None
