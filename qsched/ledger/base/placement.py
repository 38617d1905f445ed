"""Ledger: resource providers, inventories and allocations with generations, and the
claim that places an instance (Placement's semantics, atomic with the instance record).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qsched.ledger.records import (
    Allocations,
    Claim,
    ClaimGuard,
    Consumer,
    Inventory,
    Provider,
    ProviderSpec,
)

#: Hand-backs of one request by hosts that already tried it before one of them may
#: claim it again (``[agent] max_handbacks``).
DEFAULT_MAX_HANDBACKS = 10


class Ledger(abc.ABC):
    """Resource providers, inventories and allocations with generations."""

    @abc.abstractmethod
    def create_provider(self, uuid: str, name: str, parent_uuid: str | None = None) -> Provider:
        """Create a provider at generation 0.

        :raises ProviderExists: the uuid or the name is taken.
        :raises ProviderNotFound: ``parent_uuid`` does not exist.
        :raises InvalidUUID: a uuid is malformed.
        """

    @abc.abstractmethod
    def get_provider(self, uuid: str) -> Provider:
        """Read one provider with inventories, usages, traits and aggregates (O(1)).

        :raises ProviderNotFound:
        """

    @abc.abstractmethod
    def find_provider(self, name: str) -> Provider | None:
        """The provider named ``name`` (names are unique), or None; O(1)."""

    @abc.abstractmethod
    def delete_provider(self, uuid: str, generation: int) -> None:
        """Delete a provider that has no allocations and no children.

        :raises ProviderGenerationConflict: ``generation`` is stale.
        :raises ProviderInUse: it still has allocations or children.
        """

    @abc.abstractmethod
    def set_inventory(
        self, uuid: str, generation: int, inventories: Mapping[str, Inventory]
    ) -> int:
        """Replace all inventories; return the new generation.

        :raises ProviderGenerationConflict: carries the current generation.
        :raises InvalidInventory, InvalidResourceClass: bad input; nothing written.
        :raises InventoryInUse: capacity would drop below usage.
        """

    @abc.abstractmethod
    def set_traits(self, uuid: str, generation: int, traits: Iterable[str]) -> int:
        """Replace all traits; return the new generation. Raises as set_inventory."""

    @abc.abstractmethod
    def set_aggregates(self, uuid: str, generation: int, aggregates: Iterable[str]) -> int:
        """Replace the aggregate UUIDs; return the new generation."""

    @abc.abstractmethod
    def register_providers(self, specs: Sequence[ProviderSpec]) -> list[Provider]:
        """Create or update providers to match ``specs`` in one atomic step; read them back.

        Idempotent: a provider already as specified keeps its generation; one that
        changes gets it bumped once. Usages are kept. Parents come before children.

        :raises ProviderExists: a name belongs to another provider.
        :raises ProviderNotFound: a parent neither exists nor comes earlier.
        :raises InventoryInUse: an inventory would drop below its usage.
        :raises Invalid: a malformed spec; nothing is written.
        """

    @abc.abstractmethod
    def get_providers(self, uuids: Sequence[str]) -> dict[str, Provider]:
        """Those of ``uuids`` that exist, in few round trips (a thousand per trip)."""

    @abc.abstractmethod
    def sharing_providers(self, aggregates: Iterable[str] | None = None) -> dict[str, Provider]:
        """The sharing providers (trait ``MISC_SHARES_VIA_AGGREGATE``) in at least one of
        ``aggregates`` (None: every one), read from the cell's index of them: O(sharing
        providers), never O(providers) or O(hosts).
        """

    @abc.abstractmethod
    def list_providers(self) -> list[Provider]:
        """Every provider of the cell. An admin view: it scans."""

    @abc.abstractmethod
    def hypervisors(self, after: int = 0, limit: int | None = None) -> list[tuple[int, str]]:
        """The hosts' root providers (Nova's hypervisors) as (integer id, uuid), by id,
        those with an id above ``after``, at most ``limit`` (None: all; admin view).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def hypervisor_ids(self, uuids: Sequence[str]) -> dict[str, int]:
        """The integer ids of those of ``uuids`` that are hypervisors (O(len(uuids))).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def hypervisor_uuid(self, hypervisor_id: int) -> str | None:
        """The uuid of the hypervisor with that integer id; None if there is none (O(log n)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def get_allocations(self, consumer_uuid: str) -> Consumer:
        """Read a consumer's allocations (generation None if it holds nothing)."""

    @abc.abstractmethod
    def provider_consumers(self, uuid: str) -> set[str]:
        """UUIDs of the consumers holding allocations on one provider."""

    @abc.abstractmethod
    def providers_consumers(self, uuids: Sequence[str]) -> dict[str, set[str]]:
        """:meth:`provider_consumers` of many providers, in few round trips."""

    @abc.abstractmethod
    def project_usages(self, project_id: str) -> dict[str, int]:
        """Sum of a project's allocations per resource class (O(1))."""

    @abc.abstractmethod
    def put_allocations(
        self,
        consumer_uuid: str,
        allocations: Allocations,
        consumer_generation: int | None,
        project_id: str,
        user_id: str,
        provider_generations: Mapping[str, int] | None = None,
    ) -> int:
        """Replace a consumer's allocations as one unit; return its new generation.

        Every provider touched (before or after) gets its generation bumped once.
        An empty ``allocations`` releases everything.

        :raises ConsumerGenerationConflict: ``consumer_generation`` does not match
            (None means "a new consumer").
        :raises ProviderGenerationConflict: a generation in ``provider_generations``
            is stale.
        :raises CapacityExceeded: with the provider and class that did not fit.
        :raises InvalidAmount, InvalidResourceClass, ProviderNotFound: bad input.
        """

    @abc.abstractmethod
    def claim(
        self,
        instance_uuid: str,
        allocations: Allocations,
        host: str,
        node: str,
        consumer_generation: int | None = None,
        provider_generations: Mapping[str, int] | None = None,
        max_handbacks: int = DEFAULT_MAX_HANDBACKS,
        guard: ClaimGuard | None = None,
        scheduling_class: str | None = None,
    ) -> Claim:
        """Allocate for an instance that is still waiting to be placed, and mark it claimed.

        Atomic with the instance record: the instance must exist in BUILD with no
        host. A repeated claim with the same host, node and allocations changes
        nothing and returns ``already=True``, so a redelivered request cannot place
        twice. ``guard``: aggregate rules checked on the node's root in the same step.
        ``scheduling_class``: the class the allocations were fitted for; the record's
        must be the same (None: not checked, for callers that place no boot request).

        Alternates: a ``host`` among the record's ``tried_hosts`` is refused while
        another live agent that has not tried it consumes its scheduling class
        (:meth:`AgentRegistry.set_classes`), until the instance was handed back
        ``max_handbacks`` times (0: never refused). The refusal counts a hand-back
        in the record and its history. O(tried hosts), whatever the number of hosts.

        :raises InstanceNotFound:
        :raises InstanceNotWaiting: deleted, in error, or claimed by another host.
        :raises ServiceDisabled: ``host``'s service is disabled or forced down
            (:meth:`AgentRegistry.update_service`): it takes no new boot.
        :raises TriedHost: ``host`` must hand the request back (``alternate`` names a
            host that can take it, ``handbacks`` how many hand-backs so far).
        :raises ClaimRuleBroken: the guard failed; nothing written.
        :raises NotItsRequest: ``scheduling_class`` is not the one the front door
            recorded for the instance; nothing written.
        :raises: everything :meth:`put_allocations` raises.
        """

    @abc.abstractmethod
    def release_unexplained(self, consumer_uuid: str, host: str, provider_uuid: str) -> bool:
        """Release a consumer's allocations found on ``host``'s provider, in one atomic
        step with the check that no live instance of ``host`` explains them (its record
        is gone, ended, or names another host). False if they are explained or moved,
        or are a claim held for a host (:meth:`release_held` ends those).
        """

    @abc.abstractmethod
    def held_claims(self, host: str) -> dict[str, str]:
        """The claims taken from ``host`` while its agent was silent and held for it
        (:meth:`InstanceStore.requeue` and :meth:`InstanceStore.delete` with
        ``take_over``): instance uuid -> the consumer holding them on the same
        providers. O(claims held for the host)."""

    @abc.abstractmethod
    def release_held(self, host: str, instance_uuid: str) -> bool:
        """Release the claim held for ``host`` of an instance: its agent says the
        instance no longer runs there. False if none was held. Idempotent."""

    @abc.abstractmethod
    def release(self, instance_uuid: str, host: str | None = None, reason: str = "") -> bool:
        """Drop the claim of an instance in BUILD, so it can be placed again.

        With ``host`` given, only if the instance is claimed by that host. An
        ACTIVE, ERROR or DELETED instance is left alone. Returns False when there
        was nothing to release. Idempotent.
        """

    @abc.abstractmethod
    def default_inventory(self, resource_class: str, total: int, **fields: Any) -> Inventory:
        """An Inventory of ``total`` with the configured allocation ratio of its class
        (``fields`` override any other field). Pure: nothing is read or written.

        :raises: nothing; a bad value fails when the inventory is set.
        """
