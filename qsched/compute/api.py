"""The front door's domain: boot, show, list, update and delete servers; the flavor catalog.

No HTTP here: :mod:`qsched.api` parses requests, calls one method of
:class:`ComputeAPI` and maps its errors; a benchmark or the demo can call it
straight. Every call does O(1) ledger work except the project-scoped list and
the admin flavor writes.

Its class is read in parts, one module each: the boot (:mod:`qsched.compute.boot`),
the list (:mod:`qsched.compute.listing`) and the flavor catalog
(:mod:`qsched.compute.flavor_catalog`); here are what it holds (the parts it
composes, the options, the caches), show, update, metadata, delete and health.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from qsched import exception
from qsched.aggregates import FilterOptions
from qsched.bus.base import BusUnavailable, Publisher
from qsched.compute import list_query as server_list
from qsched.compute.aggregates import AggregateAPI
from qsched.compute.boot import Boot, check_name
from qsched.compute.flavor_catalog import FlavorCatalog
from qsched.compute.host_rules import HostRules
from qsched.compute.hypervisors import HypervisorAPI
from qsched.compute.keypairs import KeypairAPI
from qsched.compute.listing import ServerListing
from qsched.compute.quotas import FileLimits, QuotaAPI
from qsched.compute.server_actions import ServerActions, record_delete
from qsched.compute.server_groups import ServerGroups
from qsched.compute.services import ServiceAPI
from qsched.compute.zones import ZoneAPI, aggregate_zones
from qsched.conf import APIOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import (
    Flavor,
)
from qsched.images.base import ImageService, OpaqueImages
from qsched.ledger import Stores
from qsched.ledger.base import Instance, LedgerUnavailable, State
from qsched.metrics import APIMetrics, NoMetrics
from qsched.notifications import NULL, Notifier, payloads
from qsched.policies import server_metadata as metadata_policy
from qsched.policies import servers as servers_policy
from qsched.policy import Policy
from qsched.recovery.outbox import Abandoner, Confirmations
from qsched.resources import check_uuid
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import DeleteRequest
from qsched.scheduling.records import (
    details,
    metadata_change,
    server_change,
)

LOG = logging.getLogger(__name__)

_DELETE_RACES = 5  # re-reads when an instance moves while it is being deleted


class MetadataItemNotFound(exception.NotFound):
    msg_fmt = "Metadata item was not found"


class MetadataLimitExceeded(exception.Forbidden):
    """Over the project's ``metadata_items`` quota (403, Nova's words)."""

    msg_fmt = "Maximum number of metadata items exceeds {allowed}"


class InstanceInvalidState(exception.Conflict):
    msg_fmt = "Cannot '{action}' instance {uuid} while it is in {attr} {state}"


#: boot details a client may change with PUT /servers/{id}
#: what an update may change of a server -> its name in the record's ServerFields
_UPDATABLE = {"description": "description", "access_ip_v4": "access_ipv4",
              "access_ip_v6": "access_ipv6", "disk_config": "disk_config"}  # fmt: skip


class ComputeAPI(Boot, ServerListing, FlavorCatalog):
    """Servers and flavors for one cell: its stores and bus, and the options it uses.

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
        self.host_rules = HostRules(stores, self.policy, _may_see)
        # the operators' views and the server actions of this cell (qsched.api's routes)
        self.hypervisors = HypervisorAPI(stores, self.policy)
        self.services = ServiceAPI(stores, self.policy)
        self.zones = ZoneAPI(stores, self.policy, self.aggregates)
        self.actions = ServerActions(stores, self.bus, self.policy, self.max_limit)

    def host_zones(self) -> dict[str, str]:
        """Host -> the availability zone its aggregate makes (what ``os-services`` shows
        over the agent's own zone); one read of the aggregates' index."""
        return aggregate_zones(self.aggregates.index())

    # -- servers --

    def file_limits(self, context: RequestContext) -> FileLimits:
        """The caller's project quotas on injected files (a create that injects some)."""
        limit = functools.partial(self.quotas.limit_for, context.project_id)
        return FileLimits(limit("injected_files"), limit("injected_file_path_bytes"),
                                     limit("injected_file_content_bytes"))  # fmt: skip

    def get(self, context: RequestContext, uuid: str) -> Instance:
        """One server the caller may see; DELETED ones are not found, as in Nova.

        :raises InstanceNotFound: unknown, malformed uuid, deleted, or another
            project's and the caller is no admin.
        :raises Forbidden: ``os_compute_api:servers:show`` refuses the caller.
        """
        instance = self._visible(context, uuid)
        self.policy.authorize(context, servers_policy.SHOW, _target(instance))
        return instance

    def update(self, context: RequestContext, uuid: str, changes: Mapping[str, Any]) -> Instance:
        """Change what a client may change of a server (``os_compute_api:servers:update``):
        ``name``, and ``description``, ``access_ip_v4``, ``access_ip_v6``,
        ``disk_config`` of its boot details. O(1): one read, one script.

        :raises InstanceNotFound: as :meth:`get`, or deleted meanwhile.
        :raises Forbidden: the rule refuses the caller.
        :raises Invalid: another field, or a bad name.
        """
        unknown = sorted(set(changes) - {"name", *_UPDATABLE})
        if unknown:
            raise exception.Invalid(reason=f"a server update cannot change {unknown}")
        if "name" in changes:
            check_name("name", changes["name"])
        instance = self._visible(context, uuid)
        self.policy.authorize(context, servers_policy.UPDATE, _target(instance))
        fields = {_UPDATABLE[k]: v for k, v in changes.items() if k in _UPDATABLE}
        return self.stores.instances.update(
            instance.uuid, changes.get("name"), server_change(fields)
        )

    def metadata(
        self, context: RequestContext, uuid: str, key: str | None = None
    ) -> dict[str, str]:
        """A server's metadata, or its item ``key`` (``server-metadata:index``/``show``).

        :raises InstanceNotFound: as :meth:`get`.
        :raises MetadataItemNotFound: no item ``key``.
        :raises Forbidden:
        """
        instance = self._visible(context, uuid)
        rule = metadata_policy.INDEX if key is None else metadata_policy.SHOW
        self.policy.authorize(context, rule, _target(instance))
        found = dict(details(instance).metadata)
        if key is None:
            return found
        if key not in found:
            raise MetadataItemNotFound()
        return {key: found[key]}

    def set_metadata(
        self,
        context: RequestContext,
        uuid: str,
        items: Mapping[str, str],
        replace: bool = False,
        rule: str = metadata_policy.CREATE,
    ) -> dict[str, str]:
        """Add or change metadata items (``replace``: the items become the whole of it);
        return the metadata after. The project's ``metadata_items`` quota counts the result.

        :raises InstanceNotFound: as :meth:`get`.
        :raises InstanceInvalidState: not ACTIVE, or a task under way (409, Nova's words).
        :raises MetadataLimitExceeded: over the ``metadata_items`` quota (403).
        :raises Forbidden: ``rule`` (``server-metadata:create``, ``update`` or
            ``update_all``) refuses the caller.
        """
        instance = self._visible(context, uuid)
        self.policy.authorize(context, rule, _target(instance))
        allowed = self.quotas.limit_for(instance.project_id, "metadata_items")
        _check_metadata_state(instance, "update metadata")
        change = metadata_change(items, replace=replace, limit=allowed)
        try:
            updated = self.stores.instances.update(instance.uuid, extra=change)
        except exception.ItemLimitExceeded:
            raise MetadataLimitExceeded(allowed=allowed) from None
        return dict(details(updated).metadata)

    def delete_metadata(self, context: RequestContext, uuid: str, key: str) -> None:
        """Remove one metadata item (``server-metadata:delete``).

        :raises InstanceNotFound, Forbidden, InstanceInvalidState:
        :raises MetadataItemNotFound: no item ``key``.
        """
        instance = self._visible(context, uuid)
        self.policy.authorize(context, metadata_policy.DELETE, _target(instance))
        if key not in details(instance).metadata:
            raise MetadataItemNotFound()
        _check_metadata_state(instance, "delete metadata")
        self.stores.instances.update(instance.uuid, extra=metadata_change(removed=(key,)))

    def host_status(self, context: RequestContext, instance: Instance) -> str | None:
        """Nova's ``host_status`` of a server (2.16): UP, DOWN (forced down), MAINTENANCE
        (disabled), UNKNOWN (heartbeat expired), "" (no host); None when neither
        ``...:show:host_status`` nor (for UNKNOWN) ``...:host_status:unknown-only``
        lets the caller see it. Two O(1) reads of the host's service.
        """
        full = self.policy.allows(context, servers_policy.SHOW_HOST_STATUS, _target(instance))
        if not full and not self.policy.allows(
            context, servers_policy.SHOW_HOST_STATUS_UNKNOWN, _target(instance)
        ):
            return None
        status = self._host_status(instance.host)
        return status if full or status == "UNKNOWN" else None

    def _host_status(self, host: str | None) -> str:
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

    def _visible(self, context: RequestContext, uuid: str) -> Instance:
        """The record of a server the caller may see, before any rule is asked (404)."""
        try:
            uuid = check_uuid(uuid, "Instance UUID")
            instance = self.stores.instances.get(uuid)
        except exception.InvalidUUID:
            raise exception.InstanceNotFound(instance=uuid) from None
        if instance.state == State.DELETED or not _may_see(context, instance):
            raise exception.InstanceNotFound(instance=uuid)
        return instance

    def delete(self, context: RequestContext, uuid: str) -> Instance:
        """Delete a server; return its record after.

        Not placed (or ended in ERROR): ended DELETED here, quota returned; a queued
        boot request is dropped by the agent that meets it. Placed on a host whose
        agent is alive: marked deleting and a delete request published to that host,
        whose agent destroys it and releases everything. Placed on a host whose
        agent's heartbeat expired: deleted here, as Nova does for a down compute, its
        quota returned; its claim stays held for that host until its agent, back,
        reaps the VM (Nova releases it at once, under a VM that may still run).

        :raises InstanceNotFound: as :meth:`get`.
        :raises Forbidden: ``os_compute_api:servers:delete`` refuses the caller.
        :raises BusUnavailable: the broker did not confirm (503); the instance
            stays deleting and a retried delete publishes again.
        """
        instance = self._visible(context, uuid)
        self.policy.authorize(context, servers_policy.DELETE, _target(instance))
        deleted = self._delete(instance, context.request_id)
        record_delete(self.stores, context, instance.uuid)  # its instance action
        return deleted

    def _delete(self, instance: Instance, request_id: str) -> Instance:
        """Delete a record the caller may delete; see :meth:`delete`."""
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

    def abandon(self, uuid: str, reason: str) -> None:
        """Make sure a boot whose client was told it failed never runs.

        Whether or not its create ran (see :meth:`InstanceStore.abandon`); one the
        janitor published and an agent placed meanwhile is deleted.

        :raises BackendUnavailable: try again (:class:`~qsched.recovery.outbox.Abandoner` does).
        """
        state, host = self.stores.instances.abandon(uuid, reason)
        if host is not None and state in (State.BUILD, State.ACTIVE):
            with contextlib.suppress(exception.InstanceNotFound):
                self._delete(self.stores.instances.get(uuid), f"req-abandon-{uuid}")

    # -- flavors --

    # -- health --

    def check_health(self) -> dict[str, str | None]:
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

    # -- helpers --

    def _release_locally(self, instance: Instance, host: str) -> Instance:
        self.stores.instances.add_event(
            instance.uuid, "local_delete", host=host, reason="agent heartbeat expired"
        )
        LOG.info("instance %s: agent on %s is down; deleted locally", instance.uuid, host)
        # its VM may still run (a starved agent): the claim stays held for that host
        # until its agent reaps the VM
        return self.stores.instances.delete(instance.uuid, take_over=True)


def _check_metadata_state(instance: Instance, action: str) -> None:
    """Nova changes metadata of a server that is ACTIVE (or stopped) with no task."""
    if instance.state != State.ACTIVE:
        raise InstanceInvalidState(
            action=action, uuid=instance.uuid, attr="vm_state",
            state=server_list.VM_STATES[instance.state],
        )  # fmt: skip
    if instance.task_state.value:
        raise InstanceInvalidState(
            action=action, uuid=instance.uuid, attr="task_state", state=instance.task_state.value
        )


def _may_see(context: RequestContext, instance: Instance) -> bool:
    return context.is_admin or instance.project_id == context.project_id


def _target(instance: Instance) -> dict[str, str]:
    """A server as a policy target: the project and user that own it."""
    return {"project_id": instance.project_id, "user_id": instance.user_id}


def _filter_options(scheduler: SchedulerOptions) -> FilterOptions:
    return FilterOptions(
        limit_tenants_to_placement_aggregate=scheduler.limit_tenants_to_placement_aggregate,
        placement_aggregate_required_for_tenants=scheduler.placement_aggregate_required_for_tenants,
        enable_isolated_aggregate_filtering=scheduler.enable_isolated_aggregate_filtering,
    )
