"""Migrations as Nova lists them, read-only from the ledger's migration records
(docs/moves.rst, "The record"): one cell's part of ``os-migrations``, and a server's
live migrations in progress (``/servers/{server_id}/migrations``).

No HTTP here: :mod:`qsched.api.migrations` parses and renders, and the front door's
:class:`qsched.compute.parts.Migrations` merges the cells. Both are admin views.

``os-migrations`` lists newest first, Nova's order from 2.59 (``created_at``, then
``id``, descending; :func:`order`). The ledger numbers a cell's moves as they start,
so a cell reads its index of moves (``migrations``, by id) from the newest, a chunk of
:data:`CHUNK` at a time, and filters what it reads: a page costs the moves read until
it is full, the whole index when the filters find fewer than a page. The
``instance_uuid`` filter reads that server's moves only. A server's live migrations
read its own moves: O(its moves).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from qsched import exception
from qsched.compute.visible import visible
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import Migration
from qsched.ledger.base.migrations import LISTED_KINDS, LIVE_MIGRATION
from qsched.policies import migrations as migrations_policy
from qsched.policy import Policy

#: Moves read per round trip when a cell's index of moves is scanned.
CHUNK = 200
#: Nova's statuses of a live migration in progress: those a server lists, and those
#: ``os-migrations`` links to from 2.23.
LIVE_IN_PROGRESS = frozenset({"queued", "preparing", "running", "post-migrating"})


class MigrationNotFoundForInstance(exception.NotFound):
    msg_fmt = "In-progress live migration {id} is not found for server {uuid}."


class NotLiveMigration(exception.NotFound):
    msg_fmt = "Migration {id} for server {uuid} is not live-migration."


class LiveMigrationNotInProgress(exception.NotFound):
    msg_fmt = "Live migration {id} for server {uuid} is not in progress."


@dataclasses.dataclass(frozen=True)
class MigrationFilter:
    """What ``os-migrations`` filters by, each an exact match as Nova's database query
    (None: no filter). ``host``: the source or the destination (it wins over
    ``source_compute``, as in Nova); ``hidden`` true finds nothing, false everything
    (qsched hides no migration; Nova's are hidden only in a cross-cell resize);
    ``changes_since`` and ``changes_before`` (epoch seconds): ``updated_at`` at or
    after, at or before; ``user_id`` and ``project_id`` (2.80): of the caller who
    asked for the move."""

    hidden: bool | None = None
    host: str | None = None
    status: str | None = None
    instance_uuid: str | None = None
    source_compute: str | None = None
    migration_type: str | None = None
    user_id: str | None = None
    project_id: str | None = None
    changes_since: float | None = None
    changes_before: float | None = None

    def finds(self, migration: Migration) -> bool:
        """Whether ``migration`` passes every filter."""
        if self.hidden:
            return False
        if self.host is not None:
            if self.host not in (migration.source_compute, migration.dest_compute):
                return False
        elif self.source_compute is not None and migration.source_compute != self.source_compute:
            return False
        exact = (
            (self.status, migration.status),
            (self.instance_uuid, migration.instance_uuid),
            (self.migration_type, migration.kind),
            (self.user_id, migration.user_id),
            (self.project_id, migration.caller_project_id),
        )
        if any(wanted is not None and wanted != value for wanted, value in exact):
            return False
        return self._in_window(migration.updated_at)

    def _in_window(self, updated_at: float) -> bool:
        if self.changes_since is not None and updated_at < self.changes_since:
            return False
        return self.changes_before is None or updated_at <= self.changes_before


def order(migration: Migration) -> tuple[float, int, str]:
    """Nova's order of ``os-migrations`` as a sort key: ``created_at`` and ``id``
    descending, then ``uuid`` (what Nova adds over several cells, whose ids repeat)."""
    return (-migration.created_at, -migration.id, migration.uuid)


def live_in_progress(migration: Migration) -> bool:
    """A live migration in progress, as Nova's server migrations list them."""
    return migration.kind == LIVE_MIGRATION and migration.status in LIVE_IN_PROGRESS


class MigrationsAPI:
    """One cell's migrations (see the module docstring). ``chunk``: the moves read per
    round trip of a scan of the cell's index."""

    def __init__(self, stores: Stores, policy: Policy, chunk: int = CHUNK) -> None:
        self.stores = stores
        self.policy = policy
        self.chunk = chunk

    # -- os-migrations --

    def authorize(self, context: RequestContext) -> None:
        """:raises Forbidden: ``os_compute_api:os-migrations:index`` refuses the caller."""
        self.policy.authorize(context, migrations_policy.INDEX)

    def find(self, uuid: str) -> Migration | None:
        """The migration ``uuid`` of this cell (a list's marker), or None."""
        try:
            return self.stores.migrations.get(uuid)
        except exception.MigrationNotFound:
            return None

    def page(
        self,
        wanted: MigrationFilter,
        size: int,
        after: Migration | None = None,
        below: int | None = None,
    ) -> list[Migration]:
        """At most ``size`` of the cell's migrations that ``wanted`` finds, newest first:
        those whose id is under ``below`` (the marker is this cell's), and that come
        after ``after`` in :func:`order` (the marker is another cell's)."""
        found: list[Migration] = []
        if size <= 0:
            return found
        for migration in self._newest(below, wanted.instance_uuid):
            if (after is None or order(migration) > order(after)) and wanted.finds(migration):
                found.append(migration)
                if len(found) == size:
                    break
        return found

    def _newest(self, below: int | None, instance_uuid: str | None) -> Iterator[Migration]:
        """The cell's moves by id from the newest (under ``below``), read as needed;
        only the moves of server ``instance_uuid`` when it is given."""
        if instance_uuid is not None:
            moves = self.stores.migrations.of_instance(instance_uuid)
            yield from (m for m in moves if (below is None or m.id < below)
                        and m.kind in LISTED_KINDS)  # fmt: skip
            return
        while True:
            chunk = self.stores.migrations.newest(below, self.chunk)
            yield from chunk
            if len(chunk) < self.chunk:
                return
            below = chunk[-1].id

    # -- a server's live migrations --

    def live(self, context: RequestContext, uuid: str) -> list[Migration]:
        """A server's live migrations in progress, oldest first.

        :raises InstanceNotFound: as :meth:`qsched.compute.api.ComputeAPI.get`.
        :raises Forbidden: ``os_compute_api:servers:migrations:index`` refuses the caller.
        """
        moves = self._moves_of(context, uuid, migrations_policy.SERVER_INDEX)
        return [m for m in reversed(moves) if live_in_progress(m)]

    def live_one(self, context: RequestContext, uuid: str, migration_id: str) -> Migration:
        """One live migration in progress of a server, by its integer id.

        :raises InstanceNotFound: as :meth:`live`.
        :raises Forbidden: ``os_compute_api:servers:migrations:show`` refuses the caller.
        :raises MigrationNotFoundForInstance: the server has no migration of that id.
        :raises NotLiveMigration: it is not a live migration (404, as Nova).
        :raises LiveMigrationNotInProgress: it ended, or is not under way yet (404).
        """
        moves = self._moves_of(context, uuid, migrations_policy.SERVER_SHOW)
        wanted = int(migration_id) if migration_id.isascii() and migration_id.isdigit() else None
        found = next((m for m in moves if m.id == wanted), None)
        if found is None:
            raise MigrationNotFoundForInstance(id=migration_id, uuid=uuid)
        if found.kind != LIVE_MIGRATION:
            raise NotLiveMigration(id=migration_id, uuid=uuid)
        if found.status not in LIVE_IN_PROGRESS:
            raise LiveMigrationNotInProgress(id=migration_id, uuid=uuid)
        return found

    def _moves_of(self, context: RequestContext, uuid: str, rule: str) -> list[Migration]:
        """A server's moves, newest first, once ``rule`` lets the caller read them."""
        instance = visible(self.stores.instances, context, uuid)
        self.policy.authorize(context, rule, {"project_id": instance.project_id})
        return [m for m in self.stores.migrations.of_instance(instance.uuid)
                if m.kind in LISTED_KINDS]  # fmt: skip
