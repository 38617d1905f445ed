"""``[ledger] durability``: the modes, and what each needs of the ledger's servers.

Pure: no client here. :class:`~qsched.ledger.redis.RedisStore` asks a single
server (or the master a Sentinel set names), :mod:`qsched.ledger.cluster` every
node of a cluster, and both hand the replies to :func:`disk_mismatches`.

``disk`` (the default) needs each server to write and fsync its AOF before it
answers, and to keep doing so while the AOF is rewritten: the
:data:`DISK_SETTINGS`, which ``deploy/redis-ledger.conf`` sets. Redis 7.0 has no
``WAITAOF`` (7.2 does), so the settings are the promise, checked when the stores
open. ``replica`` needs replicas that ``WAIT`` counts; ``async`` needs nothing
and promises no more than what the server had written when its machine died.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from qsched import exception
from qsched.conf.ledger import DEFAULT_DURABILITY, DURABILITY_MODES

#: What ``disk`` needs of a server, as its ``CONFIG GET`` answers: the AOF on, fsynced
#: before each answer, and still fsynced while a rewrite runs (``yes`` there would
#: skip the fsyncs of a rewrite's seconds).
DISK_SETTINGS = {"appendonly": "yes", "appendfsync": "always", "no-appendfsync-on-rewrite": "no"}
#: where the settings are shipped, for the messages
RECIPE = "deploy/redis-ledger.conf"


class DurabilityRefused(exception.Invalid):
    """The ledger's servers cannot keep the promise of ``[ledger] durability``."""

    msg_fmt = "[ledger] durability = {mode}: {reason}"
    mode: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Durability:
    """When a write counts as done; the ``[ledger] durability`` options (see the module doc)."""

    mode: str = DEFAULT_DURABILITY
    replicas: int = 1  # replica: how many must hold a write
    timeout_ms: int = 1000  # replica: how long a write waits for them

    def __post_init__(self) -> None:
        if self.mode not in DURABILITY_MODES:
            modes = ", ".join(DURABILITY_MODES)
            raise exception.Invalid(reason=f"[ledger] durability {self.mode!r}: use one of {modes}")
        if self.replicas < 1 or self.timeout_ms < 1:
            raise exception.Invalid(
                reason="[ledger] durability_replicas and durability_timeout_ms must be >= 1"
            )


def disk_mismatches(found: Mapping[str, str]) -> dict[str, str]:
    """The :data:`DISK_SETTINGS` a server's ``CONFIG GET`` reply ``found`` lacks:
    name -> what the server has (``?`` when it did not say)."""
    return {
        name: found.get(name, "?")
        for name, wanted in DISK_SETTINGS.items()
        if found.get(name) != wanted
    }


def describe(mismatches: Mapping[str, str]) -> str:
    """``appendonly no, appendfsync everysec``: what a server has instead."""
    return ", ".join(f"{name} {value}" for name, value in mismatches.items())


def the_fix() -> str:
    """What an operator changes: the redis.conf lines, or another setting."""
    lines = "; ".join(f"{name} {value}" for name, value in DISK_SETTINGS.items())
    return (
        f"set in its redis.conf ({RECIPE}): {lines} (or CONFIG SET each, then CONFIG "
        "REWRITE); or choose [ledger] durability = replica (replicas that WAIT counts) "
        "or async (opting out: a crash of the ledger's machine then loses about the last "
        "second of acknowledged writes; docs/ledger.rst)"
    )


def refuse_disk(server: str, mismatches: Mapping[str, str]) -> DurabilityRefused:
    """The error for one server (or a cluster's nodes, in ``server``) without the settings."""
    return DurabilityRefused(
        mode="disk",
        reason=f"{server} must write and fsync every write to its AOF before it answers, "
        f"and it runs {describe(mismatches)}: {the_fix()}",
    )


def refuse_unchecked(server: str, error: object) -> DurabilityRefused:
    """The error for a server that refused ``CONFIG GET`` (a managed Redis, an ACL)."""
    return DurabilityRefused(
        mode="disk",
        reason=f"{server} refused CONFIG GET ({error}), so its AOF settings cannot be "
        "checked: allow CONFIG GET to qsched's Redis user, or choose [ledger] durability "
        "= replica or async",
    )


def refuse_embedded(mode: str) -> DurabilityRefused:
    """The error for ``replica`` or ``disk`` on the embedded ledger (fakeredis)."""
    return DurabilityRefused(
        mode=mode,
        reason="needs a real Redis: the embedded ledger (fakeredis://) keeps nothing past "
        "this process and has no replicas. Set [ledger] url to a Redis (for disk, "
        f"with {RECIPE}'s settings), or durability = async to run on the embedded ledger "
        "anyway, as the demo and the tests do",
    )
