"""The thread under kombu consumers: one connection, drained by one thread, for one host or many.

A :class:`ConsumerLoop` owns a consumer connection and the only thread that
touches it (kombu and py-amqp are not thread-safe). Its *members* are consumers
(:class:`~qsched.bus.kombu.consumer.KombuConsumer`), one per host, each on a
channel of its own: its prefetch, subscriptions, deliveries and acks stay on its
channel, so every promise of :mod:`qsched.bus.base` holds per host whether the
loop has one member or hundreds.

* A host's own loop (``KombuBus.consumer``): one member, closed when it stops,
  what ``qsched-agent`` runs.
* A shared loop (``KombuBus.sharing_consumers``): the consumers of several hosts
  in one process on one connection and one thread. A benchmark's agent process
  of 250 hosts then holds one AMQP connection instead of 250, and one thread
  wakes to poll instead of 250. Callbacks take turns: while one host's callback
  runs, no other host of the loop gets a message, and no heartbeat goes out.
  On kombu's virtual transports (``memory://``, ``redis://``), which route a
  queue's messages to one channel per connection, each host keeps a connection
  of its own there, and the one thread drains them in turn, pausing
  ``[bus] poll_interval_s`` when none had a message.

Work for the thread (a member opening or closing its channel, class changes,
settles from other threads) is queued to it and run between ``drain_events``
calls, every ``[bus] poll_interval_s`` at the latest. A broken connection
(any error of the transport, even one a callback caught) is closed and made
again, with every member's channel, its unsettled deliveries given back to the
broker.

Cost: one connection and one thread per loop, whatever the number of members;
a reconnect opens one channel per member.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Protocol

import kombu

from qsched import exception
from qsched.bus import base
from qsched.bus.kombu.wire import KombuWire, drop, release

LOG = logging.getLogger(__name__)


class Member(Protocol):
    """What a loop asks of a consumer on it (all in the loop's thread)."""

    @property
    def host(self) -> str: ...

    def opened(self, connection: kombu.Connection) -> None:
        """Open a channel on ``connection`` and consume (a no-op if open, or stopped)."""

    def lost(self) -> None:
        """The connection is gone: forget the channel, give back what is unsettled."""

    def closed(self) -> None:
        """Leave the loop: give back what is unsettled, close the channel."""


@dataclasses.dataclass
class _Command:
    """Work for the loop's thread; ``check`` raises when it no longer applies."""

    run: Callable[[], None]
    future: Future[None]
    check: Callable[[], None] | None = None  # settles only: their channel still lives


class ConsumerLoop:
    """One reconnecting consumer connection and its thread, for its members (hosts).

    ``name`` is for logs and the thread. ``shared``: the loop stays up when its
    members leave, until :meth:`close`; else it closes with its only member.
    """

    def __init__(self, wire: KombuWire, name: str, shared: bool = False) -> None:
        self.wire = wire
        self.name = name
        self.shared = shared
        self.connection: kombu.Connection | None = None
        self._lock = threading.Lock()
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._members: dict[str, Member] = {}
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        # kombu's virtual transports (memory://, redis://) route a queue's messages to
        # one channel per connection: sharing there, each member has a connection of
        # its own, and this thread drains them in turn.
        self._each_own = shared and not wire.amqp
        self._connections: dict[str, kombu.Connection] = {}
        self._up = False  # connected: members attached now open at once
        self._consuming_since: float | None = None  # when every member was open

    # -- members --

    def attach(self, member: Member) -> None:
        """Add a member (its channel opens in the loop's thread); start the thread.

        :raises Invalid: the loop already has a member of that host, or is closed.
        """
        with self._lock:
            if self._thread is None:  # never started, or closed: a new connection
                self._closing.clear()
            elif self._closing.is_set():
                raise exception.Invalid(reason=f"bus consumer loop {self.name} is closing")
            if self._members.setdefault(member.host, member) is not member:
                raise exception.Invalid(reason=f"host {member.host} consumes on this loop already")
            self.later(lambda: self._open(member))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"qsched-bus-{self.name}", daemon=True
                )
                self._thread.start()

    def detach(self, member: Member, timeout_s: float) -> None:
        """Remove a member: a callback of it running finishes first (up to ``timeout_s``
        when called from another thread), then its channel closes."""
        if not self.shared:  # its own loop: closing it gives its deliveries back
            self.close(timeout_s)
            return
        with self._lock:
            if self._members.get(member.host) is not member:
                return
            del self._members[member.host]
        done = self.later(lambda: self._leave(member))
        if not self.in_loop():
            try:
                done.result(timeout_s)
            except FutureTimeout:
                LOG.warning("bus consumer %s: a callback still runs after %.1f s",
                            member.host, timeout_s)  # fmt: skip
            except Exception:  # the connection broke meanwhile: the broker takes all back
                LOG.debug("bus consumer %s: closing its channel failed", member.host,
                          exc_info=True)  # fmt: skip

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and close the connection; the members' deliveries go back.

        The members are dropped; a consumer attached later starts the loop again on
        a new connection. Idempotent, from any thread; from another, it waits up to
        ``timeout_s``.
        """
        self._closing.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout_s)
        if thread.is_alive():
            LOG.warning("bus consumer %s: a callback still runs after %.1f s", self.name,
                        timeout_s)  # fmt: skip

    # -- work for the thread --

    def in_loop(self) -> bool:
        """True in the loop's own thread."""
        return threading.current_thread() is self._thread

    def later(self, change: Callable[[], None]) -> Future[None]:
        """Have the thread run ``change`` (kept over reconnects); done once it has."""
        command = _Command(change, Future())
        self._commands.put(command)
        return command.future

    def call(
        self, check: Callable[[], None], work: Callable[[], None], lock: threading.Lock
    ) -> None:
        """Run ``work`` in the thread unless ``check`` raises, now or when it runs.

        From another thread, ``check`` runs under ``lock`` as the command is queued:
        a member bumps what it checks under the same lock when its channel goes, and
        the loop fails what is queued after that, so no settle waits for a channel
        that is gone.

        :raises BusUnavailable: the connection went, or the thread is stuck.
        """
        if self.in_loop():
            check()
            return work()
        command = _Command(work, Future(), check)
        with lock:
            check()
            self._commands.put(command)
        try:
            return command.future.result(self.wire.options.settle_timeout_s)
        except FutureTimeout:
            if command.future.cancel():
                raise base.BusUnavailable(
                    self.wire.safe_url, "the consumer thread is busy"
                ) from None
            return command.future.result()

    # -- the thread --

    def _run(self) -> None:
        delay_s = 0.0
        while not self._closing.is_set():
            broken = False
            self._consuming_since = None
            try:
                self._consume()
                delay_s = 0.0
            except Exception as exc:  # whatever broke, the answer is: reconnect
                broken = True
                delay_s = self._next_delay_s(delay_s)
                LOG.warning("bus consumer %s: %s; reconnecting in %.1f s", self.name,
                            base.describe(exc), delay_s)  # fmt: skip
            finally:
                self._disconnect(broken)
            self._closing.wait(delay_s)
        with self._lock:
            self._members.clear()
            self._fail_commands(keep_changes=False)
            self._thread = None

    def _next_delay_s(self, delay_s: float) -> float:
        """The pause before the next connection: doubled from 0.1 s up to ``[bus]
        reconnect_max_delay_s``, from 0.1 s again once a connection with every member
        open lasted that long (a new outage, not one that drops each new connection)."""
        max_delay_s = self.wire.options.reconnect_max_delay_s
        since = self._consuming_since
        if since is not None and time.monotonic() - since >= max_delay_s:
            delay_s = 0.0
        return min(max(2 * delay_s, 0.1), max_delay_s)

    def _consume(self) -> None:
        if self._each_own:
            return self._consume_each()
        self.connection = connection = self.wire.connect(self.wire.options.heartbeat_s)
        self._up = True
        for member in self._snapshot():
            member.opened(connection)
        self._consuming_since = time.monotonic()
        while not self._closing.is_set():
            self._run_commands()
            _check_connected(connection)
            with contextlib.suppress(TimeoutError):  # nothing came: a chance to run commands
                connection.drain_events(timeout=self.wire.options.poll_interval_s)
            _check_connected(connection)
            connection.heartbeat_check(rate=self.wire.transport.heartbeat_rate)
        self._run_commands()  # settles already asked for are finished work: do them

    def _consume_each(self) -> None:
        """Virtual transports: every member's connection in turn, a pause when none had
        anything (``poll_interval_s``)."""
        self._up = True
        for member in self._snapshot():
            self._open(member)
        self._consuming_since = time.monotonic()
        while not self._closing.is_set():
            self._run_commands()
            delivered = False
            for connection in list(self._connections.values()):
                with contextlib.suppress(TimeoutError):
                    connection.drain_events(timeout=0)
                    delivered = True
            if not delivered:
                self._closing.wait(self.wire.options.poll_interval_s)
        self._run_commands()

    def connection_of(self, host: str) -> kombu.Connection | None:
        """The connection a member's channel is on (None while disconnected)."""
        return self._connections.get(host) if self._each_own else self.connection

    def _open(self, member: Member) -> None:
        if not self._up or self._members.get(member.host) is not member:
            return  # connecting opens every member
        if not self._each_own:
            if self.connection is not None:
                _check_connected(self.connection)
                member.opened(self.connection)
            return
        connection = self._connections.get(member.host)
        if connection is None:
            connection = self._connections[member.host] = self.wire.connect()
        member.opened(connection)

    def _leave(self, member: Member) -> None:
        member.closed()
        connection = self._connections.pop(member.host, None)
        if connection is not None:
            release(connection)

    def _snapshot(self) -> list[Member]:
        with self._lock:
            return list(self._members.values())

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if not command.future.set_running_or_notify_cancel():
                continue
            try:
                if command.check is not None:
                    command.check()
                command.run()
            except Exception as exc:
                command.future.set_exception(exc)
                if isinstance(exc, self.wire.errors):
                    raise
            else:
                command.future.set_result(None)

    def _disconnect(self, broken: bool = False) -> None:
        """Give back what is unsettled and close the connections (``broken``: drop them,
        as a close handshake with a hung node would wait without a timeout)."""
        self._up = False
        for member in self._snapshot():
            member.lost()
        connections = [self.connection, *self._connections.values()]
        self.connection = None
        self._connections.clear()
        for connection in connections:
            if connection is not None:
                (drop if broken else release)(connection)
        with self._lock:
            self._fail_commands(keep_changes=True)

    def _fail_commands(self, keep_changes: bool) -> None:
        """Fail the settles queued (and the changes unless ``keep_changes``); under the lock."""
        kept = []
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if keep_changes and command.check is None:
                kept.append(command)
            elif command.future.set_running_or_notify_cancel():
                reason = "the consumer disconnected or stopped"
                command.future.set_exception(base.BusUnavailable(self.wire.safe_url, reason))
        for command in kept:
            self._commands.put(command)


def _check_connected(connection: kombu.Connection) -> None:
    """Raise if ``connection`` broke under something that swallowed the error.

    A callback's ack can be the first to meet a broken connection, and the callback
    may catch what it raises. py-amqp has marked the connection down, and kombu's
    next ``drain_events``, ``heartbeat_check`` or ``channel`` on it connects again by
    itself: to a new connection with none of the members' channels, on which the
    loop would wait for deliveries forever while its members still said they were
    ready. Checked before each of those, so the loop reconnects as for any break.

    :raises ConnectionError: it is down.
    """
    if not connection.connected:
        raise ConnectionError("the connection broke under a callback or a command")
