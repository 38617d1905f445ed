"""AggregateStore: host aggregates, and their mirror in the hosts' providers."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Mapping

from qsched.aggregates import Aggregate


class AggregateStore(abc.ABC):
    """Host aggregates, mirrored into the providers of their hosts (Nova's, into Placement).

    A host's root providers carry the aggregates of the host in their aggregate sets
    (each change bumps the provider's generation, so a claim made on a view from
    before it conflicts), merged with the aggregates its agent registers itself.
    """

    @abc.abstractmethod
    def create(
        self,
        name: str,
        availability_zone: str | None = None,
        aggregate_id: int | None = None,
        uuid: str | None = None,
    ) -> Aggregate:
        """A new aggregate, with the next integer id and a new UUID, or with those given
        (the front door of several cells gives every cell the same; the cell's next id
        is then past the given one). An id and UUID given that this cell holds together
        already return that aggregate as it is (a create that meets a copy of it). A copy
        of another cell's aggregate, its metadata with it, is :meth:`put`.

        :raises AggregateNameExists: the name is taken.
        :raises Conflict: the given id is taken.
        """

    @abc.abstractmethod
    def put(self, aggregate: Aggregate) -> bool:
        """Write ``aggregate`` as it is: its id, uuid, name, metadata (its zone too) and
        creation time, none of its hosts (the front door of several cells copies every
        aggregate so into a cell joined late). Idempotent: False when this keyspace holds
        the very aggregate already (its id, uuid, name and metadata), True when written.

        :raises Conflict: another aggregate holds its id or name here
            (:class:`AggregateNameExists` for its name), or one of its id and uuid with
            another name or metadata; nothing is written.
        """

    @abc.abstractmethod
    def last_id(self) -> int:
        """The highest id given in this keyspace so far (0: none; O(1))."""

    @abc.abstractmethod
    def get(self, aggregate_id: int) -> Aggregate:
        """One aggregate by its integer id (O(1) in hosts' number: it reads its own host set).

        :raises AggregateNotFound:
        """

    @abc.abstractmethod
    def list(self) -> builtins.list[Aggregate]:
        """Every aggregate, by id (O(number of aggregates))."""

    @abc.abstractmethod
    def update(self, aggregate_id: int, changes: Mapping[str, str | None]) -> Aggregate:
        """Rename it (``name``) or move it to a zone (``availability_zone``; None takes
        it out of any); keys left out are unchanged.

        :raises AggregateNotFound, AggregateNameExists:
        :raises InvalidAggregateAction: a host of it is in another zone already.
        """

    @abc.abstractmethod
    def delete(self, aggregate_id: int) -> None:
        """Delete an aggregate that has no host.

        :raises AggregateNotFound:
        :raises InvalidAggregateAction: it still has hosts.
        """

    @abc.abstractmethod
    def set_metadata(self, aggregate_id: int, changes: Mapping[str, str | None]) -> Aggregate:
        """Set keys (a value) and remove keys (None) of its metadata, in one step.

        :raises AggregateNotFound:
        :raises InvalidAggregateAction: an empty zone, or a zone some host of it
            cannot join (it is in another zone already).
        """

    @abc.abstractmethod
    def add_host(self, aggregate_id: int, host: str) -> Aggregate:
        """Put ``host`` in the aggregate, then the aggregate in its root providers.

        :raises AggregateNotFound:
        :raises ComputeHostNotFound: no agent ever registered ``host``.
        :raises AggregateHostExists:
        :raises InvalidAggregateAction: the host is in another zone already.
        """

    @abc.abstractmethod
    def remove_host(self, aggregate_id: int, host: str) -> Aggregate:
        """Take ``host`` out of the aggregate, then the aggregate out of its providers.

        :raises AggregateNotFound, AggregateHostNotFound:
        """

    @abc.abstractmethod
    def version(self) -> int:
        """A number every aggregate change bumps (O(1)): readers rebuild what they
        derived from :meth:`list` when it moves."""

    @abc.abstractmethod
    def host_aggregates(self, host: str) -> set[str]:
        """The UUIDs of the aggregates ``host`` is in (O(1))."""
