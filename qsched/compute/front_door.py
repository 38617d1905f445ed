"""What the HTTP layer calls: :class:`FrontDoor`, the interface of the front door.

:class:`qsched.compute.api.ComputeAPI` is its one implementation, over one cell or
several (:mod:`qsched.compute.target`); :mod:`qsched.api`'s handlers, ``qsched-admin``
and the benchmarks name this protocol, not the class, so that a call they make is one
the front door declares here, with its arguments and its answer.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from qsched.compute.aggregates import Aggregates
from qsched.compute.boot import Reservation
from qsched.compute.host_rules import HostRequest
from qsched.compute.list_query import ServerQuery
from qsched.compute.parts import Actions, Hypervisors, Keypairs, Migrations, Moves, Services, Zones
from qsched.compute.quotas import FileLimits, QuotaAPI
from qsched.compute.server_groups import Groups
from qsched.conf import APIOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor, FlavorQuery
from qsched.ledger.base import Instance
from qsched.policy import Policy
from qsched.scheduling.records import ServerFields


class FrontDoor(Protocol):
    """The front door of servers, flavors and the operators' views; each call's
    arguments and errors are :class:`~qsched.compute.api.ComputeAPI`'s."""

    policy: Policy
    api: APIOptions
    max_limit: int
    quotas: QuotaAPI
    keypairs: Keypairs
    actions: Actions
    moves: Moves
    migrations: Migrations
    hypervisors: Hypervisors
    services: Services
    zones: Zones
    groups: Groups
    aggregates: Aggregates

    # -- servers --

    def boot_many(
        self,
        context: RequestContext,
        name: str,
        flavor_ref: str | int,
        image_ref: str = "",
        availability_zone: str | None = None,
        metadata: Mapping[str, str] | None = None,
        group: str | None = None,
        min_count: int = 1,
        max_count: int = 1,
        server: ServerFields | None = None,
        hosts: HostRequest | None = None,
    ) -> Reservation: ...

    def list(
        self,
        context: RequestContext,
        project_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        marker: str | None = None,
        detail: bool = False,
        reservation_id: str | None = None,
        params: Mapping[str, Sequence[str]] | None = None,
        version: tuple[int, int] = (2, 1),
    ) -> builtins.list[Instance]: ...

    def list_query(
        self,
        context: RequestContext,
        project_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        marker: str | None = None,
        detail: bool = False,
        reservation_id: str | None = None,
        params: Mapping[str, Sequence[str]] | None = None,
        version: tuple[int, int] = (2, 1),
    ) -> ServerQuery: ...

    def get(self, context: RequestContext, uuid: str) -> Instance: ...

    def update(
        self, context: RequestContext, uuid: str, changes: Mapping[str, Any]
    ) -> Instance: ...

    def delete(self, context: RequestContext, uuid: str) -> Instance: ...

    def metadata(
        self, context: RequestContext, uuid: str, key: str | None = None
    ) -> dict[str, str]: ...

    def set_metadata(
        self,
        context: RequestContext,
        uuid: str,
        items: Mapping[str, str],
        replace: bool = False,
        rule: str = ...,
    ) -> dict[str, str]: ...

    def delete_metadata(self, context: RequestContext, uuid: str, key: str) -> None: ...

    def host_status(self, context: RequestContext, instance: Instance) -> str | None: ...

    def file_limits(self, context: RequestContext) -> FileLimits: ...

    def page_size(self, limit: int | None) -> int: ...

    def shows_host(self, context: RequestContext) -> bool: ...

    # -- flavors --

    def get_flavor(self, flavor_id: str, context: RequestContext | None = None) -> Flavor: ...

    def list_flavors(
        self, context: RequestContext | None = None, query: FlavorQuery | None = None
    ) -> builtins.list[Flavor]: ...

    def flavor_access(self, context: RequestContext, flavor_id: str) -> Flavor: ...

    def flavor_extra_specs(self, context: RequestContext, flavor_id: str) -> Mapping[str, str]: ...

    def flavor_extra_spec(self, context: RequestContext, flavor_id: str, key: str) -> str: ...

    def shows_extra_specs(self, context: RequestContext) -> bool: ...

    def show_extra_specs_in_views(self, context: RequestContext) -> bool: ...

    def create_flavor(self, context: RequestContext, flavor: Flavor) -> Flavor: ...

    def update_flavor(
        self, context: RequestContext, flavor_id: str, description: str | None
    ) -> Flavor: ...

    def delete_flavor(self, context: RequestContext, flavor_id: str) -> Flavor: ...

    def add_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str, refuse_public: bool
    ) -> Flavor: ...

    def remove_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str
    ) -> Flavor: ...

    def set_flavor_extra_spec(
        self, context: RequestContext, flavor_id: str, key: str, value: str
    ) -> Flavor: ...

    def set_flavor_extra_specs(
        self, context: RequestContext, flavor_id: str, specs: Mapping[str, str]
    ) -> Flavor: ...

    def delete_flavor_extra_spec(
        self, context: RequestContext, flavor_id: str, key: str
    ) -> Flavor: ...

    def seed_flavors(self) -> builtins.list[Flavor]: ...

    # -- the rest --

    def host_zones(self) -> dict[str, str]: ...

    def check_health(self) -> dict[str, str | None]: ...
