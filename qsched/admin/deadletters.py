"""Dead letters for admins: list them, requeue them, purge them, without losing one.

The bus takes dead letters (:meth:`~qsched.bus.base.Bus.take_dead_letters`
removes them) and shows them for review
(:meth:`~qsched.bus.base.Bus.review_dead_letters`): each letter is held while a
decision is made, and one kept goes back to the dead letters, confirmed, before
it is acked. So reading loses none on any broker, and does not count as a
delivery either (RabbitMQ 4 gives quorum queues a default delivery limit, so
"get and give back" would in the end drop them). The decisions are here: list
keeps every letter, purge drops the selected ones, requeue publishes the
selected ones to their queue when that can still help. Letters kept move to the
tail; when they died stays in their headers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import Any

from qsched import exception
from qsched.bus import Bus, base
from qsched.bus.kombu import message as kombu_message
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.scheduling.message import (
    ActionRequest,
    DeleteRequest,
    Message,
    MoveStep,
    PoisonMessage,
    decode,
)

DEFAULT_LIMIT = 1000
NOT_SELECTED = "not selected"
MAX_DEPTH = 16  # header nesting shown; deeper is shown as text

#: What to do with one letter: None when it leaves the dead letters, else why it stays.
Action = Callable[["Letter"], str | None]


@dataclasses.dataclass(frozen=True)
class Letter:
    """A dead letter with a short id and, when its body decodes, the message."""

    id: str
    dead: base.DeadLetter
    message: Message | None
    problem: str | None  # why the body does not decode

    def row(self, now: float) -> dict[str, Any]:
        msg = self.message
        key = self.dead.routing_key or ""
        return {
            "id": self.id,
            "dead_at": self.dead.dead_at,
            "age_s": now - self.dead.dead_at if self.dead.dead_at else None,
            "queue": self.dead.queue,
            "class": key.removeprefix("boot.") if key.startswith("boot.") else None,
            "reason": self.dead.reason,
            "kind": msg.KIND if msg is not None else None,
            "instance": msg.instance_uuid if msg is not None else None,
            "bytes": len(self.dead.body),
        }

    def doc(self, now: float) -> dict[str, Any]:
        msg = self.message
        fields = dataclasses.asdict(msg) if msg is not None else None
        return {
            **self.row(now),
            "routing_key": self.dead.routing_key,
            "problem": self.problem,
            "message": fields,
            "body_hex": self.dead.body[:256].hex() if msg is None else None,
            "headers": _plain(dict(self.dead.headers)),
        }


def _plain(value: Any, depth: int = 0) -> Any:
    """Header values as JSON can carry them (AMQP tables hold bytes, dates, lists).

    Anything else, a float JSON has no word for (NaN, infinity) or nesting past
    :data:`MAX_DEPTH` becomes printable text: a letter's headers are anyone's.
    """
    if depth >= MAX_DEPTH:
        return kombu_message.text(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {kombu_message.text(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return kombu_message.text(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return kombu_message.text(value)


def letter_id(dead: base.DeadLetter) -> str:
    """12 hex digits from the body and when it died: stable while it stays a dead letter."""
    digest = hashlib.sha256(dead.body)
    digest.update(repr((dead.dead_at, dead.reason, dead.queue)).encode())
    return digest.hexdigest()[:12]


def _letter(dead: base.DeadLetter) -> Letter:
    try:
        message: Message | None = decode(dead.body)
        problem = None
    except PoisonMessage as exc:
        message, problem = None, str(exc)
    return Letter(letter_id(dead), dead, message, problem)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One letter handled: ``kept`` says why it stayed a dead letter (None: it left)."""

    letter: Letter
    kept: str | None

    def row(self, done: str) -> dict[str, Any]:
        """``done`` is what happened to a letter that left."""
        msg = self.letter.message
        return {
            "id": self.letter.id,
            "instance": msg.instance_uuid if msg is not None else None,
            "result": done if self.kept is None else self.kept,
        }


class DeadLetterBox:
    """The dead letters of one bus, handled so that none is ever lost."""

    def __init__(self, bus: Bus, limit: int = DEFAULT_LIMIT) -> None:
        self.bus = bus
        self.limit = limit

    def read(self) -> list[Letter]:
        """Up to ``limit`` letters, all kept."""
        return [o.letter for o in self.handle(lambda letter: "listed")]

    def find(self, letter_id: str) -> Letter:
        """:raises NotFound: no letter with that id among the first ``limit``."""
        for letter in self.read():
            if letter.id == letter_id:
                return letter
        raise exception.NotFound(what=f"dead letter {letter_id} (among the first {self.limit})")

    def purge(self, ids: set[str] | None = None) -> list[Outcome]:
        """Drop the letters with these ids (all when None); the others stay."""
        return self.handle(lambda letter: _unless_selected(letter, ids))

    def requeue(self, stores: Stores, ids: set[str] | None = None) -> list[Outcome]:
        """Publish the selected letters back to their queue when that can still help."""

        def act(letter: Letter) -> str | None:
            return _unless_selected(letter, ids) or self._requeue_one(stores, letter)

        return self.handle(act)

    def _requeue_one(self, stores: Stores, letter: Letter) -> str | None:
        msg = letter.message
        if msg is None:
            return f"not requeued: {letter.problem}"
        if isinstance(msg, DeleteRequest):
            self.bus.publish_delete(msg.host, msg)
            return None
        if isinstance(msg, ActionRequest | MoveStep):  # dropped unless it still waits
            self.bus.publish_action(msg.host, msg)
            return None
        try:
            inst = stores.instances.get(msg.instance_uuid)
        except exception.InstanceNotFound:
            return "not requeued: its instance is gone"
        if inst.state != State.BUILD or inst.host:
            return f"not requeued: its instance is {inst.state.value}, nothing to place"
        self.bus.publish_boot(msg)
        return None

    def handle(self, act: Action) -> list[Outcome]:
        """Show up to ``limit`` letters to ``act``; those it keeps stay dead letters.

        :raises BusUnavailable: letters not yet handled are given back to the broker.
        """
        outcomes = []

        def keep(dead: base.DeadLetter) -> bool:
            letter = _letter(dead)
            outcomes.append(Outcome(letter, act(letter)))
            return outcomes[-1].kept is not None

        self.bus.review_dead_letters(keep, self.limit)
        return outcomes


def _unless_selected(letter: Letter, ids: set[str] | None) -> str | None:
    return None if ids is None or letter.id in ids else NOT_SELECTED
