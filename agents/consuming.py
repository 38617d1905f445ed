"""Which scheduling classes an agent consumes: those its nodes fit now, less those paused,
and none while its service is disabled.

The node index says which classes some node fits (:class:`~agents.nodes.NodeIndex`, its
``on_change`` transitions); a class is also *paused* for a moment after the agent handed
a request of it back (alternates, :mod:`agents.placing`): while paused, the broker gives
that class's requests to the other agents only. An operator may disable the agent's
service or force it down (``os-services``): it then consumes no class at all, and keeps
its host queue (deletes) and what it runs. :class:`ClassGate` keeps all three and tells
the consumer to add or cancel a queue whenever the answer changes.

Every decision is taken under the gate's own lock and sent to the consumer in that order,
so the consumer ends where the gate does whichever thread changed what. The gate never
calls into the index: ``changed`` is called under the index's lock, and taking the two
locks in the other order anywhere could deadlock.

Cost: O(1) per transition or pause, one short-lived timer thread per pause.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from qsched.bus.base import Consumer


class ClassGate:
    """The classes to consume: fittable (as the index last said) and not paused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fittable: set[str] = set()
        self._paused: dict[str, threading.Timer] = {}
        self._consumer: Consumer | None = None
        self._closed = False
        self._enabled = True

    def open(self, build: Callable[[frozenset[str]], Consumer]) -> Consumer:
        """Build the consumer with the classes wanted now; later changes go to it."""
        with self._lock:
            self._consumer = build(self._wanted())
            return self._consumer

    def wanted(self) -> frozenset[str]:
        """The classes the consumer should take now."""
        with self._lock:
            return self._wanted()

    def paused(self) -> frozenset[str]:
        """The classes paused now."""
        with self._lock:
            return frozenset(self._paused)

    @property
    def enabled(self) -> bool:
        """False while the service takes no new boots (disabled, forced down)."""
        with self._lock:
            return self._enabled

    def enable(self, enabled: bool) -> None:
        """Take new boots again, or stop taking any: every class is added or cancelled."""
        with self._lock:
            if enabled == self._enabled:
                return
            before = self._wanted()
            self._enabled = enabled
            after = self._wanted()
            for name in sorted(before - after):
                self._tell(name, False)
            for name in sorted(after - before):
                self._tell(name, True)

    def changed(self, name: str, fittable: bool) -> None:
        """The index's ``on_change``: class ``name`` became fittable or not."""
        with self._lock:
            if fittable:
                self._fittable.add(name)
            else:
                self._fittable.discard(name)
            if self._enabled and name not in self._paused:
                self._tell(name, fittable)

    def pause(self, name: str, pause_s: float) -> None:
        """Stop consuming class ``name`` for ``pause_s`` seconds (0: no pause).

        A pause of a class already paused starts over.
        """
        if pause_s <= 0:
            return
        timer = threading.Timer(pause_s, self._resume, (name,))
        timer.daemon = True
        with self._lock:
            if self._closed:
                return
            earlier = self._paused.pop(name, None)
            if earlier is not None:
                earlier.cancel()
            elif self._enabled and name in self._fittable:
                self._tell(name, False)
            self._paused[name] = timer
            timer.start()

    def close(self) -> None:
        """Cancel the pauses; nothing is told to the consumer any more."""
        with self._lock:
            self._closed = True
            for timer in self._paused.values():
                timer.cancel()
            self._paused.clear()
            self._consumer = None

    def _resume(self, name: str) -> None:
        with self._lock:
            if self._paused.get(name) is not threading.current_thread():
                return  # paused again since, or closed
            del self._paused[name]
            if self._enabled and name in self._fittable:
                self._tell(name, True)

    def _wanted(self) -> frozenset[str]:
        if not self._enabled:
            return frozenset()
        return frozenset(self._fittable.difference(self._paused))

    def _tell(self, name: str, consume: bool) -> None:
        consumer = self._consumer
        if consumer is None:
            return  # before open: the consumer is built with what is wanted then
        if consume:
            consumer.add_class(name)
        else:
            consumer.remove_class(name)
