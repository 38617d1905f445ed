"""Client-driven retries after generation conflicts, done the Placement way.

A conflict is never retried blindly: the caller re-reads what changed, checks
whether what it wanted is already true or still possible, and only then tries
again with the generations it just read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from qsched import exception
from qsched.ledger.base import (
    DEFAULT_MAX_HANDBACKS,
    Allocations,
    ClaimGuard,
    Ledger,
    MigrationStore,
    MoveClaim,
    Provider,
)

#: Re-reads after conflicts before a claim gives up (``[ledger] max_conflict_retries``).
DEFAULT_RETRIES = 10


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    generation: int
    conflicts: int  # how many conflicts were resolved on the way
    already: bool = False  # the ledger already held exactly this claim (a redelivery)
    batch: str | None = None  # the multi-create it belongs to
    permitted: bool = True  # every member of its batch holds its claim: it may spawn


def claim(
    ledger: Ledger,
    instance_uuid: str,
    allocations: Allocations,
    host: str,
    node: str,
    provider_generations: Mapping[str, int] | None = None,
    max_retries: int = DEFAULT_RETRIES,
    on_conflict: Callable[[exception.Conflict], None] | None = None,
    max_handbacks: int = DEFAULT_MAX_HANDBACKS,
    guard: ClaimGuard | None = None,
    on_reread: Callable[[Provider], object] | None = None,
    scheduling_class: str | None = None,
) -> ClaimResult:
    """Claim ``allocations`` for an instance, resolving generation conflicts.

    :param provider_generations: generations the caller's view was built on; a
        stale one is re-read and the claim retried only if it still fits.
    :param on_conflict: called with each conflict resolved (to record it).
    :param on_reread: called with each provider re-read after a conflict on it, before
        the check that the claim still fits (to bring the caller's view up to date).
    :param max_handbacks: see :meth:`~qsched.ledger.base.Ledger.claim`.
    :param guard: aggregate rules the claim checks on the node's root.
    :param scheduling_class: the class the allocations were fitted for, which must be
        the one the instance's record names.
    :raises CapacityExceeded: the re-read shows the claim no longer fits.
    :raises ClaimRuleBroken: the node no longer satisfies the guard (not retried).
    :raises NotItsRequest: not the class the record names (not retried).
    :raises InstanceNotWaiting, InstanceNotFound: nothing to place any more.
    :raises TriedHost: ``host`` already tried it and another host can take it:
        not a conflict to retry, the request goes back to the queue.
    :raises Conflict: still conflicting after ``max_retries`` re-reads.
    """
    gens = dict(provider_generations or {})
    consumer_generation: int | None = None
    last: exception.Conflict | None = None
    for conflicts in range(max_retries + 1):
        try:
            done = ledger.claim(
                instance_uuid,
                allocations,
                host,
                node,
                consumer_generation,
                gens or None,
                max_handbacks=max_handbacks,
                guard=guard,
                scheduling_class=scheduling_class,
            )
            return ClaimResult(done.generation, conflicts, done.already, done.batch, done.permitted)
        except exception.ConsumerGenerationConflict as exc:
            # Allocations without a claim on the record (written by hand, say): take them
            # over with the generation just read; the claim marks the instance this time.
            consumer_generation, last = ledger.get_allocations(instance_uuid).generation, exc
        except exception.ProviderGenerationConflict as exc:
            last = _reread(ledger, exc, allocations, gens, on_reread)
        if on_conflict is not None:
            on_conflict(last)
    assert last is not None
    raise last


def claim_move(
    migrations: MigrationStore,
    ledger: Ledger,
    migration_uuid: str,
    allocations: Allocations,
    host: str,
    node: str,
    provider_generations: Mapping[str, int] | None = None,
    max_retries: int = DEFAULT_RETRIES,
    on_conflict: Callable[[exception.Conflict], None] | None = None,
    guard: ClaimGuard | None = None,
    on_reread: Callable[[Provider], object] | None = None,
    scheduling_class: str | None = None,
) -> MoveClaim:
    """A destination's claim of a move (:meth:`MigrationStore.claim`), its provider
    generation conflicts resolved as :func:`claim` resolves them.

    :raises CapacityExceeded: the re-read shows the claim no longer fits.
    :raises Conflict: still conflicting after ``max_retries`` re-reads; any other
        refusal of :meth:`MigrationStore.claim` as it is.
    """
    gens = dict(provider_generations or {})
    last: exception.Conflict | None = None
    for _ in range(max_retries + 1):
        try:
            return migrations.claim(
                migration_uuid, allocations, host, node, gens or None, guard, scheduling_class
            )
        except exception.ProviderGenerationConflict as exc:
            last = _reread(ledger, exc, allocations, gens, on_reread)
        if on_conflict is not None:
            on_conflict(last)
    assert last is not None
    raise last


def _reread(
    ledger: Ledger,
    exc: exception.ProviderGenerationConflict,
    allocations: Allocations,
    gens: dict[str, int],
    on_reread: Callable[[Provider], object] | None,
) -> exception.ProviderGenerationConflict:
    """Read the provider a conflict names again; go on with its generation only if the
    claim still fits it.

    :raises CapacityExceeded: it does not.
    """
    provider = ledger.get_provider(exc.kwargs["provider"])
    if on_reread is not None:
        on_reread(provider)
    _check_still_fits(provider, allocations)
    gens[provider.uuid] = provider.generation
    return exc


def _check_still_fits(provider: Provider, allocations: Allocations) -> None:
    provider_uuid = provider.uuid
    for rc, amount in allocations[provider_uuid].items():
        free = provider.free(rc)
        if amount > free:
            raise exception.CapacityExceeded(
                provider=provider_uuid,
                resource_class=rc,
                requested=amount,
                used=provider.usages.get(rc, 0),
                capacity=provider.inventories[rc].capacity if rc in provider.inventories else 0,
            )
