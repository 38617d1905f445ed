"""ArchiveStore: ended instances taken out of the cell, their history handed over.

Nova keeps deleted rows until ``nova-manage db archive_deleted_rows`` moves them to
shadow tables. Here a DELETED instance keeps its record and its history in the
ledger until an archive takes it out: one :meth:`ArchiveStore.step` at a time,
oldest deletion first, O(log n + batch) each, while the cloud runs. A step never
takes an instance something still refers to (allocations, quota, an index of live
instances, the outbox, its host's build, delete or action sets, a server group).

What a step takes out waits in a staging area, one JSON text per instance, until
the caller has written it where operators keep history and clears it
(:meth:`ArchiveStore.clear`); a caller that stops in between leaves it there for
the next one (:meth:`ArchiveStore.staged`). Once out, the instance is unknown to
the ledger: reads raise ``InstanceNotFound``, and the API answers 404, as Nova does
for a purged server. :mod:`qsched.admin.archive` drives the steps.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class ArchiveStep:
    """What one step did (or, in a dry run, would do).

    ``archived``: instances taken out, their history staged (a dry run: those it would
    take). ``held``: DELETED instances kept, each with why. ``stale``: entries of the
    index of deleted instances without a record, dropped. ``cursor``: where the next
    step starts (pass it as ``after``). ``done``: no entry deleted before the cut-off
    lies past the cursor. ``left``: entries deleted before the cut-off still in the
    index after the step (the held ones among them).
    """

    archived: tuple[str, ...]
    held: tuple[tuple[str, str], ...]
    stale: tuple[str, ...]
    cursor: str | None
    done: bool
    left: int


class ArchiveStore(abc.ABC):
    """The cell's DELETED instances, oldest deletion first, and the staging area."""

    @abc.abstractmethod
    def step(
        self, before: float, batch: int, after: str | None = None, dry_run: bool = False
    ) -> ArchiveStep:
        """Take out up to ``batch`` DELETED instances deleted before ``before`` (epoch
        seconds), past ``after`` (a cursor of the step before; None: from the oldest),
        in one atomic step; ``dry_run`` changes nothing. O(log n + batch).

        :raises Invalid: ``batch`` below 1.
        """

    @abc.abstractmethod
    def staged(self, uuids: Sequence[str] | None = None, limit: int = 1000) -> dict[str, str]:
        """Staged histories (uuid -> JSON text): what a step took out and nobody cleared
        yet; those of ``uuids`` (a step's ``archived``), or (None) any, up to ``limit``:
        what a run that stopped left. The staging area holds about a batch per run."""

    @abc.abstractmethod
    def clear(self, uuids: Sequence[str]) -> int:
        """Forget staged histories once they are written; return how many were staged."""

    @abc.abstractmethod
    def deleted_count(self, before: float | None = None) -> int:
        """DELETED instances the cell still keeps, those deleted before ``before`` only
        when given. O(log n)."""
