"""Compute services, as Nova's ``os-services`` shows and changes them.

Every agent is a compute service of its host, listed with Nova's binary name
``nova-compute`` so that Nova's clients find it. An operator disables one (with a
reason) to drain its host for maintenance, enables it again, or forces it down
(a host known dead or fenced). What that does is the ledger's and the agents'
(:meth:`qsched.ledger.base.AgentRegistry.update_service`, :mod:`agents.service`):
no new boot is claimed there; forced down, the host also counts as down, so the
API deletes its instances locally and the janitor takes back its claims.

No HTTP here: :mod:`qsched.api.services` calls the front door's
:class:`qsched.compute.parts.Services`, which merges this, one cell's, over cells;
``qsched-admin service`` calls it in its cell.
Listing scans the cell's services (an admin view); an update is O(1).
"""

from __future__ import annotations

import builtins
import dataclasses

from qsched import exception
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import AgentInfo, Service
from qsched.policies import services as services_policy
from qsched.policy import Policy
from qsched.resources import check_uuid

COMPUTE_BINARY = "nova-compute"


class UnsupportedBinary(exception.Invalid):
    msg_fmt = (
        "Updating a {binary} service is not supported. Only nova-compute services can be updated."
    )


class ReasonWithEnable(exception.Invalid):
    msg_fmt = "Specifying 'disabled_reason' with status 'enabled' is invalid."


class NothingToUpdate(exception.Invalid):
    msg_fmt = "No updates were requested. Fields 'status' or 'forced_down' should be specified."


@dataclasses.dataclass(frozen=True)
class ServiceView:
    """A service with what its heartbeat says: ``up`` (alive and not forced down), and
    when it last reported (``reported_at``, None if it never did)."""

    service: Service
    up: bool
    reported_at: float | None

    @property
    def binary(self) -> str:
        return COMPUTE_BINARY


@dataclasses.dataclass(frozen=True)
class Change:
    """What to change: None leaves a field as it is."""

    disabled: bool | None = None
    disabled_reason: str | None = None
    forced_down: bool | None = None

    def check(self) -> None:
        """:raises Invalid: a reason without a disable, or nothing to change."""
        if self.disabled_reason and self.disabled is not True:
            raise ReasonWithEnable()
        if self.disabled is None and self.forced_down is None:
            raise NothingToUpdate()


class ServiceAPI:
    """List and update the compute services of one cell, as policy allows."""

    def __init__(self, stores: Stores, policy: Policy | None = None) -> None:
        self.stores = stores
        self.policy = policy or Policy()

    def list(
        self, context: RequestContext, host: str | None = None, binary: str | None = None
    ) -> builtins.list[ServiceView]:
        """Every service, or those of ``host`` and ``binary``, by integer id.

        :raises Forbidden: ``os_compute_api:os-services:list`` refuses the caller.
        """
        self.policy.authorize(context, services_policy.LIST, {})
        if binary and binary != COMPUTE_BINARY:
            return []
        return [view for view in self.views() if not host or view.service.host == host]

    def views(self) -> builtins.list[ServiceView]:
        """Every service with its heartbeat, by integer id (for other admin views: no
        policy check here; it scans)."""
        agents = {agent.host: agent for agent in self.stores.agents.list()}
        services = self.stores.agents.services()
        return [_view(service, agents.get(service.host)) for service in services]

    def authorize_update(self, context: RequestContext) -> None:
        """:raises Forbidden: ``os_compute_api:os-services:update`` refuses the caller."""
        self.policy.authorize(context, services_policy.UPDATE, {})

    def update(
        self, context: RequestContext, host: str, binary: str, change: Change
    ) -> ServiceView:
        """Change the service of ``host`` and ``binary`` (before microversion 2.53).

        :raises Forbidden: ``os_compute_api:os-services:update`` refuses the caller.
        :raises UnsupportedBinary: not ``nova-compute`` (400).
        :raises HostBinaryNotFound: no such service (404).
        :raises Invalid: see :meth:`Change.check`.
        """
        self.authorize_update(context)
        if binary != COMPUTE_BINARY:
            raise UnsupportedBinary(binary=binary)
        change.check()
        try:
            return self._apply(host, change)
        except exception.ComputeHostNotFound:
            raise exception.HostBinaryNotFound(binary=binary, host=host) from None

    def update_by_id(self, context: RequestContext, service_id: str, change: Change) -> ServiceView:
        """Change the service whose UUID is ``service_id`` (microversion 2.53).

        :raises InvalidUUID: ``service_id`` is not a UUID (400).
        :raises Forbidden: ``os_compute_api:os-services:update`` refuses the caller.
        :raises ServiceNotFound: no such service (404).
        :raises Invalid: see :meth:`Change.check`.
        """
        check_uuid(service_id, "Service id")
        self.authorize_update(context)
        host = self.stores.agents.service_host(service_id)
        change.check()
        return self._apply(host, change)

    def _apply(self, host: str, change: Change) -> ServiceView:
        service = self.stores.agents.update_service(
            host, change.disabled, change.disabled_reason, change.forced_down
        )
        up = self.stores.agents.alive(host)
        return ServiceView(service, up, self.stores.agents.last_seen(host))


def _view(service: Service, agent: AgentInfo | None) -> ServiceView:
    if agent is None:
        return ServiceView(service, False, None)
    return ServiceView(service, agent.alive, agent.last_seen)
