"""AgentRegistry: live agents, their services, the scheduling classes and zones."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterable, Mapping
from typing import Any

from qsched.ledger.records import AgentInfo, Service


class AgentRegistry(abc.ABC):
    """Which agents are alive, and the scheduling classes and zones they consume."""

    @abc.abstractmethod
    def heartbeat(
        self,
        host: str,
        ttl_s: float,
        free: Mapping[str, int] | None = None,
        **detail: Any,
    ) -> Service | None:
        """Say ``host`` is alive for ``ttl_s`` seconds more; ``detail`` is shown to admins.
        ``free``: what its nodes have free, by resource class, counted in the cell's
        free capacity (:meth:`free`) until its heartbeat expires, its service stops
        taking boots, it beats again or it stops (None: it counts nothing).

        Returns the host's service record as operators left it (None: it has none),
        so that an agent learns it is disabled without another round trip.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def alive(self, host: str) -> bool:
        """True while the host's last heartbeat has not expired and its service is not
        forced down: Nova's service state "up" (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def last_seen(self, host: str) -> float | None:
        """When ``host`` last beat, expired or not; None if it never did (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def forget(self, host: str) -> None:
        """An agent that stops cleanly says so at once instead of waiting for its TTL;
        its free capacity no longer counts.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def free(self) -> dict[str, int]:
        """The cell's free capacity by resource class: what its live agents whose
        services take boots said they have free at their last heartbeat, summed (O(1)
        in hosts: one read). An agent that died counts until the next heartbeat of
        another after its own expired.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def list(self) -> builtins.list[AgentInfo]:
        """Every agent ever seen in the cell, alive or not (admin view: it scans).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def register_service(self, host: str, availability_zone: str | None = None) -> Service:
        """Make sure ``host`` has a compute service record, and return it: a new one is
        enabled, not forced down, with a new UUID and the next integer id; every one is
        in the zone given now (None: none). O(1).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def update_service(
        self,
        host: str,
        disabled: bool | None = None,
        disabled_reason: str | None = None,
        forced_down: bool | None = None,
    ) -> Service:
        """Enable or disable ``host``'s service (a reason with a disable; enabling
        clears it), force it down or up; None leaves a field as it is. Atomic: once
        it returns, no claim of the host succeeds while it is disabled or forced down.

        :raises ComputeHostNotFound: the host has no service.
        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def service(self, host: str) -> Service:
        """The service of ``host`` (O(1)).

        :raises ComputeHostNotFound:
        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def service_host(self, service_id: str) -> str:
        """The host of the service whose UUID is ``service_id`` (O(1)).

        :raises ServiceNotFound:
        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def services(self) -> builtins.list[Service]:
        """Every service, by integer id (admin view: it scans).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def add_class(self, name: str, definition: Mapping[str, Any]) -> bool:
        """Publish a scheduling class for agents to consider; False if it was known.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def classes(self) -> dict[str, dict[str, Any]]:
        """Every live class: O(number of classes), never O(number of hosts).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def set_classes(self, host: str, classes: Iterable[str]) -> None:
        """Say that ``host`` has room for exactly ``classes`` now (none: it consumes
        nothing), replacing what it said before. O(its classes).

        A claim reads the consumers of a class to decide whether a host that already
        tried a request must hand it back; a consumer whose heartbeat has expired
        does not count.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def class_consumers(self, name: str) -> set[str]:
        """The hosts that said they have room for class ``name``, alive or not (admin
        view: O(its consumers)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def add_zone(self, zone: str) -> None:
        """Make ``zone`` bootable. Never removed: a zone outlives its hosts being down.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def zones(self) -> set[str]:
        """Every known availability zone (admin view).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def has_zone(self, zone: str) -> bool:
        """Whether a boot may name ``zone``: O(1).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def zones_available(self, zones: Iterable[str]) -> dict[str, bool]:
        """Per zone, whether one of the hosts serving it (through its agent's own zone
        or its aggregate's) is up and its service enabled and not forced down: Nova's
        ``zoneState.available``. O(number of zones), never O(number of hosts): every
        heartbeat keeps its host in its zones' sets until it expires, and a service
        update takes it out or puts it back at once. Joining or leaving an aggregate
        zone shows at the host's next heartbeat or when the last one expires.

        :raises BackendUnavailable:
        """
