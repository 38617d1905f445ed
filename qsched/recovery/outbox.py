"""The outbox: boot requests the ledger recorded and the broker has not confirmed yet.

The instance record is the outbox. The script that records a boot (or requeues one)
also puts the instance in the ledger's outbox index, scored by the ledger server's
clock; a confirmed publish, a claim or the end of the instance takes it out. So a
request is never lost between the ledger and the broker:

* the publisher clears what the broker confirmed, in batches (:class:`Confirmations`:
  one round trip per batch, off the request path);
* :func:`publish_stranded` (the janitor, every ``[scheduler] outbox_interval_s``)
  publishes what stayed longer than ``outbox_grace_s``: a front door killed between
  the record and the publish, an agent that could not reschedule while the broker
  was down. A duplicate is harmless: the claim is idempotent per instance;
* a front door that answered 503 while the outcome of its create was unknown (the
  ledger timed out, a create may still run once it answers) hands the instance to
  :class:`Abandoner`, which makes sure it never boots (:meth:`InstanceStore.abandon`),
  retrying until the ledger answers.

Costs: per boot, nothing on the request path beyond the create script's own ZADD; per
batch of confirmations, one script; per janitor run, one script over the oldest
entries (at most ``limit``) and their records. Nothing grows with the number of hosts.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from qsched import exception
from qsched.bus.base import BootPublisher
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.scheduling.records import request_for

LOG = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.1  # how long a confirmation waits to be cleared with others
IDLE_EXIT_S = 5.0  # a helper thread with nothing to do for this long ends (one starts again)
MAX_PENDING = 100_000  # confirmations kept while the ledger is down; older ones are dropped
RETRY_MAX_S = 1.0  # an abandon is retried at least this often while the ledger is down


class Confirmations:
    """Outbox entries whose boot request the broker confirmed, cleared in batches.

    Thread-safe; the flushing thread starts on first use and ends after
    :data:`IDLE_EXIT_S` without work. Losing a batch (the process dies) costs only
    a duplicate publish by the janitor.
    """

    def __init__(self, stores: Stores, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.stores = stores
        self.interval_s = interval_s
        self._pending: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._work = threading.Event()  # something is pending
        self._failing = False  # the last flush failed: say so once per outage

    def confirmed(self, uuid: str, outbox: str | None) -> None:
        """The boot request of ``uuid`` (outbox entry ``outbox``) is with the broker."""
        if outbox is None:
            return
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                del self._pending[: MAX_PENDING // 10]  # the janitor publishes those again
            self._pending.append((uuid, outbox))
            self._work.set()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="outbox-confirmations", daemon=True
                )
                self._thread.start()

    def flush(self) -> int:
        """Clear what is pending now; how many entries were cleared.

        :raises BackendUnavailable: the ledger did not answer; they stay pending.
        """
        with self._lock:
            batch, self._pending = self._pending, []
        try:
            return self.stores.instances.outbox_done(batch)
        except exception.BackendUnavailable:
            with self._lock:
                self._pending[:0] = batch
            raise

    def _run(self) -> None:
        while True:
            if not self._work.wait(IDLE_EXIT_S):
                with self._lock:
                    if not self._pending:  # confirmed() starts another when work comes
                        self._thread = None
                        return
                continue
            time.sleep(self.interval_s)  # let a batch gather
            self._work.clear()
            self._flush_quietly()

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except exception.BackendUnavailable as exc:
            if not self._failing:
                LOG.warning("outbox: confirmations kept until the ledger answers: %s", exc)
            self._failing = True
            time.sleep(RETRY_MAX_S)  # no need to knock ten times a second
            self._work.set()  # and try again
        except Exception:
            LOG.exception("outbox: clearing confirmations failed")
        else:
            if self._failing:
                LOG.info("outbox: the ledger answers again; confirmations cleared")
            self._failing = False


class Abandoner:
    """Make sure boots whose client was told 503 never run, retrying until it lands.

    ``abandon(uuid, reason)`` does the work (one ledger script, and a delete if
    the janitor had published and an agent placed it meanwhile). It runs in a
    thread of its own, retried with a backoff of at most :data:`RETRY_MAX_S`
    while the ledger is down, so that it lands before the janitor's outbox pass
    (which waits for the ledger to have answered for a while) could publish it.
    """

    def __init__(self, abandon: Callable[[str, str], Any]) -> None:
        self._abandon = abandon
        self._queue: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.pending = 0

    def add(self, uuid: str, reason: str) -> None:
        """Abandon ``uuid`` as soon as the ledger answers."""
        with self._lock:
            self.pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="abandoner", daemon=True)
                self._thread.start()
        self._queue.put((uuid, reason))

    def _run(self) -> None:
        while True:
            try:
                uuid, reason = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self.pending == 0:  # add() starts another when work comes
                        self._thread = None
                        return
                continue
            delay_s = 0.05
            while True:
                try:
                    self._abandon(uuid, reason)
                    LOG.warning("instance %s: abandoned (%s)", uuid, reason)
                    break
                except exception.BackendUnavailable:
                    time.sleep(delay_s)
                    delay_s = min(RETRY_MAX_S, delay_s * 2)
                except Exception:
                    LOG.exception("instance %s: abandon failed; the janitor may boot it", uuid)
                    break
            with self._lock:
                self.pending -= 1


def publish_stranded(
    stores: Stores,
    bus: BootPublisher,
    grace_s: float,
    limit: int = 100,
) -> list[str]:
    """Publish the boot requests that waited longer than ``grace_s`` in the outbox.

    Each request is rebuilt from its record (:func:`~qsched.scheduling.records.request_for`).
    Entries of instances that no longer wait (claimed, ended, gone) are cleared, as
    is one whose record cannot be rebuilt (logged; its deadline ends it). Returns
    the instances published. A failed publish leaves its entry: it is taken again
    after another ``grace_s``.

    :raises BackendUnavailable: the ledger did not answer (nothing was taken).
    """
    taken = stores.instances.outbox_take(grace_s, limit)
    if not taken:
        return []
    records = stores.instances.get_many([uuid for uuid, _ in taken])
    done: list[tuple[str, str]] = []
    published: list[str] = []
    for uuid, outbox in taken:
        inst = records.get(uuid)
        if inst is not None and inst.state == State.BUILD and inst.host is None:
            try:
                bus.publish_boot(request_for(inst))
            except exception.BackendUnavailable as exc:
                LOG.warning("outbox: could not publish %s yet: %s", uuid, exc)
                continue
            except exception.Invalid as exc:
                LOG.error("outbox: %s cannot be published, its deadline ends it: %s", uuid, exc)
            else:
                stores.instances.add_event(uuid, "published", reason="stranded in the outbox")
                published.append(uuid)
        done.append((uuid, outbox))
    stores.instances.outbox_done(done)
    if published:
        LOG.warning("outbox: published %d boot requests nobody had confirmed", len(published))
    return published
