"""End requests that nobody placed before their deadline.

A request can sit in a queue no agent consumes (nothing fits its class), or
keep circulating between agents that refuse it. Either way its instance stays
in the deadline index, ordered by deadline, and this reaper ends it in ERROR
with Nova's NoValidHost fault and its quota returned. It reads only what has
expired, never every instance.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from qsched import exception
from qsched.ledger import Stores
from qsched.ledger.base import Event
from qsched.notifications import NULL, Notifier, payloads
from qsched.notifications.base import ERROR

LOG = logging.getLogger(__name__)

NO_VALID_HOST = "No valid host was found. There are not enough hosts available."


def refusal_summary(events: list[Event]) -> dict[str, Any]:
    """Admin-only fault details: who refused the request and why, from its history."""
    refusals = {e.host: e.detail.get("reason", "") for e in events if e.event == "refused"}
    failures = {e.host: e.detail.get("reason", "") for e in events if e.event == "requeued"}
    counts = Counter(e.event for e in events)
    return {"refused_by": refusals, "failed_on": failures, "events": dict(counts)}


def fail_no_valid_host(
    stores: Stores, uuid: str, reason: str, notifier: Notifier = NULL, due_only: bool = False
) -> bool:
    """End a waiting instance in ERROR NoValidHost; False if it was not waiting any more.

    Only the caller that ended it sends ``instance.create.error`` with the fault (one
    more read of the record, on this path only). ``due_only``: see
    :meth:`~qsched.ledger.base.InstanceStore.set_error`.

    :raises NotItsRequest: ``due_only`` and the record's deadline has not passed.
    """
    details = {"reason": reason, **refusal_summary(stores.instances.events(uuid))}
    ended = stores.instances.set_error(uuid, NO_VALID_HOST, details, due_only)
    if ended and notifier.enabled:
        inst = stores.instances.get(uuid)
        payload = payloads.create_from_record(inst, payloads.fault(NO_VALID_HOST))
        notifier.notify("instance.create.error", payload, ERROR)
    return ended


#: the fault of a move no destination took before its deadline (docs/moves.rst)
MOVE_NO_VALID_HOST = "No valid host was found: no destination took the move before its deadline."


def reap_expired_moves(stores: Stores, now: float | None = None, batch: int = 500) -> int:
    """End up to ``batch`` moves still waiting for a destination past their deadline (the
    server stays where it is); forget those a destination holds. Return how many ended."""
    now = time.time() if now is None else now
    ended = 0
    for migration in stores.migrations.expired(now, batch):
        try:
            waiting = stores.migrations.get(migration).waiting
            if waiting and not stores.migrations.fail(migration, "", MOVE_NO_VALID_HOST, False):
                LOG.info("migration %s: no destination took it before its deadline", migration)
                ended += 1
                continue
        except (exception.MigrationNotFound, exception.MoveNotUnderWay):
            pass
        stores.migrations.forget_deadline(migration)
    return ended


def confirm_unconfirmed(
    stores: Stores, window_s: float, now: float | None = None, batch: int = 500
) -> int:
    """Confirm up to ``batch`` moves that have waited for a confirm longer than
    ``window_s`` (``[scheduler] resize_confirm_window``, as Nova's periodic task): the
    ledger's confirm, whose step the source's agent takes when it sweeps its moves
    (:mod:`agents.moves`). Return how many were confirmed or are confirming now."""
    now = time.time() if now is None else now
    done = 0
    for migration in stores.migrations.finished_before(now - window_s, batch):
        try:
            stores.migrations.confirm(migration, "ask")
        except (exception.MoveNotUnderWay, exception.MigrationNotFound):
            continue  # confirming already, or it moved on
        LOG.info("migration %s: confirmed after the resize confirm window", migration)
        done += 1
    return done


def reap_expired(
    stores: Stores, now: float | None = None, batch: int = 500, notifier: Notifier = NULL
) -> int:
    """End up to ``batch`` waiting instances whose deadline has passed, then as many moves
    (:func:`reap_expired_moves`); return how many instances ended."""
    now = time.time() if now is None else now
    reap_expired_moves(stores, now, batch)
    ended = 0
    for uuid in stores.instances.expired(now, batch):
        try:
            done = fail_no_valid_host(stores, uuid, "deadline", notifier)
        except exception.InstanceNotFound:
            stores.instances.forget_deadline(uuid)
            continue
        if done:
            LOG.info("instance %s: no host took it before its deadline", uuid)
            ended += 1
    return ended
