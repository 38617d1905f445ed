"""One cell as the front door uses it: :class:`Cell`, its stores and bus, and the steps
that run inside it.

:class:`~qsched.compute.api.ComputeAPI` writes each Nova call once and runs it in the
cell it targets (:mod:`qsched.compute.target`); a :class:`Cell` holds what that cell
has (its stores, its bus, the parts that read its ledger, the caches of its flavors
and classes) and the steps that must run where the records are: a boot accepted into
it (:mod:`qsched.compute.boot`), a server ended or handed to its agent for deletion
(:meth:`Cell.remove`), a boot abandoned (:meth:`Cell.abandon`), its health. No HTTP
and no policy of a Nova call here but what those steps need.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from qsched import exception
from qsched.aggregates import FilterOptions
from qsched.bus.base import BusUnavailable, Publisher
from qsched.compute.aggregates import AggregateAPI
from qsched.compute.boot import Boot
from qsched.compute.host_rules import HostRules
from qsched.compute.hypervisors import HypervisorAPI
from qsched.compute.keypairs import KeypairAPI
from qsched.compute.migrations import MigrationsAPI
from qsched.compute.moves import ServerMoves
from qsched.compute.quotas import QuotaAPI
from qsched.compute.server_actions import ServerActions
from qsched.compute.server_groups import ServerGroups
from qsched.compute.services import ServiceAPI
from qsched.compute.visible import visible
from qsched.compute.zones import ZoneAPI
from qsched.conf import APIOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.images.base import ImageService, OpaqueImages
from qsched.ledger import Stores
from qsched.ledger.base import Instance, LedgerUnavailable, State
from qsched.metrics import APIMetrics, NoMetrics
from qsched.notifications import NULL, Notifier, payloads
from qsched.policy import Policy
from qsched.recovery.outbox import Abandoner, Confirmations
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import DeleteRequest

LOG = logging.getLogger(__name__)

_DELETE_RACES = 5  # re-reads when an instance moves while it is being deleted


class Cell(Boot):
    """One cell's stores and bus, and the options its steps use.

    ``scheduler``: deadlines and attempts of boot requests; ``api``: list limits
    and the configured flavors; ``policy``: who may do what (None: Nova's
    defaults, :mod:`qsched.policies`); ``images``: where images are looked up
    (None: nowhere, ``imageRef`` is opaque); ``metrics``: where boots are counted
    (None: nowhere); ``serves_boots`` False: a boot not given its uuids by the front
    door of several cells (:mod:`qsched.cells`) is refused (:class:`BootsNotServedHere`);
    ``quotas``: where the limits this cell checks in code are read (``key_pairs``,
    ``metadata_items``, ``injected_file*``, and ``server_group_members``, which the
    create script then checks as given; None: this cell's quota; the front door of
    several cells gives the API keyspace's, the deployment's limits).
    """

    def __init__(
        self,
        stores: Stores,
        bus: Publisher,
        scheduler: SchedulerOptions | None = None,
        api: APIOptions | None = None,
        policy: Policy | None = None,
        images: ImageService | None = None,
        metrics: APIMetrics | None = None,
        notifier: Notifier = NULL,
        serves_boots: bool = True,
        quotas: QuotaAPI | None = None,
    ) -> None:
        self.stores = stores
        #: False: boots are refused unless a front door of several cells gives their
        #: uuids (the cell is one of [cells]', whose quota the API keyspace holds)
        self.serves_boots = serves_boots
        self.metrics = metrics or NoMetrics()
        self.bus: Publisher = self.metrics.counted(bus)  # its failed publishes counted
        self.notifier = notifier  # tells the deletes ended here (docs/notifications.rst)
        self.policy = policy or Policy()
        self.images = images or OpaqueImages()
        self.flavors = stores.flavors
        self.scheduler = scheduler or SchedulerOptions.defaults()
        self.api = api or APIOptions.defaults()
        self.max_limit: int = self.api.max_limit  # most items one list call returns
        # scheduling class name -> the class and its definition
        self._classes: dict[str, tuple[SchedulingClass, dict[str, Any]]] = {}
        self._flavor_cache: dict[str, tuple[Flavor, str]] = {}  # id -> (flavor, stored form)
        self._zones: set[str] = set()  # zones known to exist (zones are never removed)
        self.aggregates = AggregateAPI(stores, self.policy, _filter_options(self.scheduler))
        self.confirmations = Confirmations(stores)  # published boots leave the outbox
        self.abandoner = Abandoner(self.abandon)  # boots told 503 must never run
        self.groups = ServerGroups(stores, self.policy)
        # limit_for: what other checks enforce
        self.quotas = quotas or QuotaAPI(stores, self.policy)
        #: the deployment's limits are not this keyspace's (a cell of several): a group's
        #: member limit is read there and given to the create script as final
        self._limits_elsewhere = quotas is not None
        self.keypairs = KeypairAPI(stores, self.policy, self.quotas)
        self.host_rules = HostRules(stores, self.policy)
        # the operators' views and the server actions of this cell
        self.hypervisors = HypervisorAPI(stores, self.policy)
        self.services = ServiceAPI(stores, self.policy)
        self.zones = ZoneAPI(stores, self.policy, self.aggregates)
        self.actions = ServerActions(stores, self.bus, self.policy, self.max_limit, self.images,
                                     self.keypairs)  # fmt: skip
        self.moves = ServerMoves(stores, self.bus, self.policy, self.scheduler, self.actions)
        self.migrations = MigrationsAPI(stores, self.policy)

    # -- a server of this cell --

    def visible(self, context: RequestContext, uuid: str) -> Instance:
        """The record of a server the caller may see, before any rule is asked.

        :raises InstanceNotFound: unknown, malformed uuid, deleted, or another
            project's and the caller is no admin (404, as in Nova).
        """
        return visible(self.stores.instances, context, uuid)

    def host_status(self, host: str | None) -> str:
        """Nova's ``host_status`` of a server on ``host``: UP, DOWN (forced down),
        MAINTENANCE (disabled), UNKNOWN (heartbeat expired), "" (no host). Two O(1) reads."""
        if not host:
            return ""
        try:
            service = self.stores.agents.service(host)
        except exception.NotFound:
            return ""
        if service.forced_down:
            return "DOWN"
        if service.disabled:
            return "MAINTENANCE"
        return "UP" if self.stores.agents.alive(host) else "UNKNOWN"

    def sees(self, context: RequestContext, flavor: Flavor) -> bool:
        """Whether the caller may see and boot ``flavor``: public, granted to its
        project, or the caller is an admin (O(1))."""
        return flavor.visible_to(context.project_id) or self.policy.is_admin(context)

    # -- ending a server --

    def remove(self, instance: Instance, request_id: str) -> Instance:
        """Delete a server the caller may delete; its record after.

        Not placed (or ended in ERROR): ended DELETED here, quota returned; a queued
        boot request is dropped by the agent that meets it. Placed on a host whose
        agent is alive: marked deleting and a delete request published to that host,
        whose agent destroys it and releases everything. Placed on a host whose
        agent's heartbeat expired: deleted here, as Nova does for a down compute, its
        quota returned; its claim stays held for that host until its agent, back,
        reaps the VM (Nova releases it at once, under a VM that may still run).

        :raises BusUnavailable: the broker did not confirm (503); the instance
            stays deleting and a retried delete publishes again.
        :raises Conflict: it kept moving while being deleted.
        """
        for _ in range(_DELETE_RACES):
            host = instance.host
            if host is None or instance.state not in (State.BUILD, State.ACTIVE):
                return self._end_here(
                    instance, functools.partial(self.stores.instances.delete, instance.uuid)
                )
            if not self.stores.agents.alive(host):
                try:
                    return self._end_here(
                        instance, functools.partial(self._release_locally, instance, host)
                    )
                except exception.AgentAlive:  # it beat again meanwhile: decide again
                    instance = self.stores.instances.get(instance.uuid)
                    continue
            try:
                instance = self.stores.instances.mark_deleting(instance.uuid)
            except exception.InstanceNotWaiting:
                instance = self.stores.instances.get(instance.uuid)  # moved: decide again
                if instance.state == State.DELETED:
                    raise exception.InstanceNotFound(instance=instance.uuid) from None
                continue
            if instance.host == host:
                node = instance.node or host
                msg = DeleteRequest(request_id, instance.uuid, host, node)
                self.bus.publish_delete(host, msg)
                return instance
        raise exception.Conflict(
            reason=f"instance {instance.uuid} kept changing while being deleted"
        )

    def _end_here(self, instance: Instance, delete: Callable[[], Instance]) -> Instance:
        """Delete a record here with ``delete``, sending ``instance.delete.start`` and
        ``.end`` around it unless it was DELETED already."""
        tell = self.notifier.enabled and instance.state != State.DELETED
        if tell:
            self.notifier.notify("instance.delete.start", payloads.action_from_record(instance))
        ended = delete()
        if tell:
            self.notifier.notify("instance.delete.end", payloads.deleted(ended))
        return ended

    def _release_locally(self, instance: Instance, host: str) -> Instance:
        self.stores.instances.add_event(
            instance.uuid, "local_delete", host=host, reason="agent heartbeat expired"
        )
        LOG.info("instance %s: agent on %s is down; deleted locally", instance.uuid, host)
        # its VM may still run (a starved agent): the claim stays held for that host
        # until its agent reaps the VM
        return self.stores.instances.delete(instance.uuid, take_over=True)

    def abandon(self, uuid: str, reason: str) -> None:
        """Make sure a boot whose client was told it failed never runs.

        Whether or not its create ran (see :meth:`InstanceStore.abandon`); one the
        janitor published and an agent placed meanwhile is deleted.

        :raises BackendUnavailable: try again (:class:`~qsched.recovery.outbox.Abandoner` does).
        """
        state, host = self.stores.instances.abandon(uuid, reason)
        if host is not None and state in (State.BUILD, State.ACTIVE):
            with contextlib.suppress(exception.InstanceNotFound):
                self.remove(self.stores.instances.get(uuid), f"req-abandon-{uuid}")

    # -- health --

    def health(self) -> dict[str, str | None]:
        """Each part a boot needs, and why it does not answer (None: it does).

        ``ledger``: a PING. ``bus``: :meth:`qsched.bus.base.Bus.check_health` (a
        cached probe, and what boot publishes met lately). The reasons are single
        words fit for a public page, no URL, host or password; the errors go to the log.
        """
        health: dict[str, str | None] = {"ledger": None, "bus": None}
        try:
            self.stores.backend.ping()
        except LedgerUnavailable as exc:
            LOG.warning("healthcheck: the ledger does not answer: %s", exc.reason)
            health["ledger"] = exc.category
        try:
            self.bus.check_health()
        except BusUnavailable as exc:
            LOG.warning("healthcheck: %s", exc)
            health["bus"] = exc.category
        return health


def _filter_options(scheduler: SchedulerOptions) -> FilterOptions:
    return FilterOptions(
        limit_tenants_to_placement_aggregate=scheduler.limit_tenants_to_placement_aggregate,
        placement_aggregate_required_for_tenants=scheduler.placement_aggregate_required_for_tenants,
        enable_isolated_aggregate_filtering=scheduler.enable_isolated_aggregate_filtering,
    )
