"""The front door's domain: boot, show, list, update and delete servers; the flavor catalog.

No HTTP here: :mod:`qsched.api` parses requests, calls one method of
:class:`ComputeAPI` and maps its errors; a benchmark or the demo can call it
straight. Every call does O(1) ledger work except the project-scoped list and
the admin flavor writes.

Boot, step by step: check that a requested availability zone is one an agent
registered (kept in memory once seen; any other zone would make a scheduling
class and a broker queue of its own, so it is refused before anything is held),
resolve the flavor (kept in memory after the first HGET), reserve quota, record
the instance BUILD and make sure agents know its scheduling class (one Lua
script, which also checks the flavor is still what was kept), publish the boot
request. If anything fails after the record exists, the instance is ended
DELETED, which returns its quota; the DELETED record stays as a trace (its
history says why, and GET gives 404 as for any deleted server). A request the
broker did take although it did not confirm meets a DELETED instance, and the
agent drops it.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import logging
import secrets
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec

from qsched import exception
from qsched.aggregates import FilterOptions
from qsched.bus.base import BusUnavailable, Publisher
from qsched.compute import list_query as server_list
from qsched.compute.aggregates import AggregateAPI, Route
from qsched.compute.host_rules import HostRequest, HostRules
from qsched.compute.hypervisors import HypervisorAPI
from qsched.compute.keypairs import KeypairAPI
from qsched.compute.quotas import FileLimits, QuotaAPI
from qsched.compute.server_actions import ServerActions, record_delete
from qsched.compute.server_groups import ServerGroups
from qsched.compute.services import ServiceAPI
from qsched.compute.zones import ZoneAPI, aggregate_zones
from qsched.conf import APIOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.exception import FlavorNotFound
from qsched.flavors import (
    GROUP_POLICY_WARNING,
    Constraints,
    Flavor,
    FlavorQuery,
    NoAccessListForPublic,
    check_flavor,
    check_flavor_id,
    grant,
    missing_group_policy,
    ref_id,
    revoke,
    select,
)
from qsched.images.base import Image, ImageService, OpaqueImages
from qsched.ledger import Stores
from qsched.ledger.base import HostRule, Instance, LedgerUnavailable, ServerGroup, State
from qsched.metrics import APIMetrics, NoMetrics
from qsched.notifications import NULL, Notifier, payloads
from qsched.policies import flavors as flavors_policy
from qsched.policies import server_metadata as metadata_policy
from qsched.policies import servers as servers_policy
from qsched.policy import Policy
from qsched.recovery.outbox import Abandoner, Confirmations
from qsched.recovery.reaper import NO_VALID_HOST
from qsched.resources import check_uuid
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import BootRequest, DeleteRequest
from qsched.scheduling.records import (
    ServerFields,
    details,
    metadata_change,
    record_for,
    server_change,
)

LOG = logging.getLogger(__name__)

MAX_NAME_CHARS = 255
#: the most servers one create may ask for (each is a record of the same script)
MAX_COUNT = 1000
_DELETE_RACES = 5  # re-reads when an instance moves while it is being deleted
_SCAN_CHUNK = 1000  # records read per round trip when an admin's list scans the cell
_PAGE_CHUNK = 100  # the least read per round trip while an admin's filtered page fills
_CACHE_SIZE = 1024  # flavors, classes and zones kept in memory; emptied when full


class FlavorRefNotFound(exception.Invalid):
    """An unknown flavor in a boot request: the request is bad (400), not a missing URL."""

    msg_fmt = "Flavor {flavor} could not be found."


class AvailabilityZoneNotAvailable(exception.Invalid):
    """A zone no agent registered (400, Nova's words): each zone makes classes and queues."""

    msg_fmt = "The requested availability zone is not available"


class FlavorExtraSpecNotFound(exception.NotFound):
    msg_fmt = "Flavor {flavor} has no extra specs with key {key}."


class MarkerNotFound(exception.Invalid):
    msg_fmt = "marker [{marker}] not found"


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


@dataclasses.dataclass(frozen=True)
class Reservation:
    """What one create accepted: Nova's reservation id and the servers, in order."""

    reservation_id: str
    instances: list[Instance]


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What a create asks for, checked, before anything is held."""

    name: str
    flavor_id: str
    constraints: Constraints
    image: Image
    metadata: Mapping[str, str] | None
    group: ServerGroup | None
    min_count: int
    max_count: int
    reservation_id: str
    server: ServerFields
    hosts: HostRule | None = None


def reservation_id() -> str:
    """Nova's form: ``r-`` and 8 of ``[0-9a-z]``."""
    return "r-" + "".join(secrets.choice(_RESERVATION_CHARS) for _ in range(8))


_RESERVATION_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"


P = ParamSpec("P")


def _counted(
    boot_many: Callable[Concatenate[ComputeAPI, P], Reservation],
) -> Callable[Concatenate[ComputeAPI, P], Reservation]:
    """Count the servers a create accepted, or why it was refused (:mod:`qsched.metrics`)."""

    @functools.wraps(boot_many)
    def counted(self: ComputeAPI, *args: P.args, **kwargs: P.kwargs) -> Reservation:
        try:
            found = boot_many(self, *args, **kwargs)
        except Exception as exc:
            self.metrics.boot_refused(exc)
            raise
        self.metrics.boots_accepted(len(found.instances))
        return found

    return counted


class ComputeAPI:
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

    def boot(
        self,
        context: RequestContext,
        name: str,
        flavor_ref: str | int,
        image_ref: str = "",
        availability_zone: str | None = None,
        metadata: Mapping[str, str] | None = None,
        group: str | None = None,
    ) -> Instance:
        """Accept one server; see :meth:`boot_many`, which raises the same."""
        found = self.boot_many(context, name, flavor_ref, image_ref, availability_zone,
                               metadata, group)  # fmt: skip
        return found.instances[0]

    @_counted
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
        uuids: Sequence[str] | None = None,
    ) -> Reservation:
        """Accept servers: quota reserved, recorded BUILD, boot requests published.

        ``group``: the server group they join (the ``group`` scheduler hint); a member
        of an affinity group with a host is published to that host's queue
        (:meth:`qsched.compute.server_groups.ServerGroups.route`).

        ``min_count`` and ``max_count``: a multi-create, as Nova's. As many as the
        quota allows between them are recorded in one atomic step, named
        ``<name>-<n>`` when there are several; they are placed all or none (their
        spawns wait until every one holds its claim; one nobody places by its
        deadline ends them all in ERROR NoValidHost, claims released).

        ``server``: what the create asks of the servers themselves (kept in their
        records); its ``key_name`` must be one of the caller's keypairs, whose public key
        the records keep for the agent.

        ``hosts``: the servers to share a host with or keep away from, and the host
        and node asked for (:mod:`qsched.compute.host_rules`); the claim holds the rule they
        make. One that no host can satisfy ends the servers in ERROR NoValidHost at once.

        ``uuids``: the servers' uuids, ``max_count`` of them (None: new ones); the
        front door of several cells (:mod:`qsched.cells`) maps them first.

        :raises FlavorRefNotFound: no such flavor (400).
        :raises AvailabilityZoneNotAvailable: no agent registered the zone (400);
            checked first, so nothing is held.
        :raises Invalid: a bad name or zone name, or counts (``min_count`` must be
            <= ``max_count``, both >= 1).
        :raises ImageNotFound: an image the caller may not use (400).
        :raises FlavorMemoryTooSmall, FlavorDiskTooSmall: the image's ``min_ram``
            or ``min_disk`` (400). Image checks come before anything is held.
        :raises Forbidden: ``os_compute_api:servers:create`` refuses the caller (403).
        :raises BootsNotServedHere: ``serves_boots`` is off and no ``uuids`` came (409).
        :raises QuotaExceeded: not even ``min_count`` fit; nothing recorded (403); also
            a group at its member limit.
        :raises GroupRefNotFound: a group the caller may not see (400), before anything
            is held.
        :raises InvalidKeyName: ``key_name`` is none of the caller's keypairs (400).
        :raises RequestedHostNotFound: no such host or node (400); a caller the
            ``requested_destination`` rule refuses gets Forbidden (403).
        :raises BackendUnavailable: the ledger is unreachable (503).
        :raises BusUnavailable: the broker did not confirm (503); every instance
            is then ended DELETED and its quota returned. Any other failure
            after the records exist is rolled back the same way, then re-raised.
        """
        self.policy.authorize(context, servers_policy.CREATE)
        if uuids is None and not self.serves_boots:
            raise exception.BootsNotServedHere()
        _check_name("name", name)
        check_counts(min_count, max_count)
        if availability_zone is not None:
            _check_name("availability_zone", availability_zone)
            self._check_zone(availability_zone)
        flavor_id = ref_id(flavor_ref)
        image = self.images.get(context, image_ref)
        constraints = Constraints(
            availability_zone=availability_zone or None, required_traits=image.required_traits
        )
        server_group = self.groups.for_boot(context, group) if group is not None else None
        fields = self.keypairs.for_boot(context, server or ServerFields())
        placed_by = self.host_rules.resolve(context, hosts or HostRequest())
        asked = _Asked(name, flavor_id, constraints, image, metadata, server_group,
                       min_count, max_count, reservation_id(), fields,
                       placed_by.rule)  # fmt: skip
        if uuids is None:
            uuids = [str(uuidlib.uuid4()) for _ in range(max_count)]
        elif len(uuids) != max_count:
            raise exception.Invalid(reason=f"{len(uuids)} uuids for max_count {max_count}")
        try:
            made, route, flavor = self._create(context, uuids, asked)
        except exception.BackendUnavailable as exc:
            # The create may have run, or may still run once the ledger answers: the
            # client is told 503, so make sure none of them ever boots.
            for uuid in uuids:
                self.abandoner.add(uuid, f"the client was told 503: {exc}")
            raise
        # a request filter or the host rule leaves no host: NoValidHost now, as Nova
        fault = None
        if route.unplaceable:
            fault = route.unplaceable, {"filter": "aggregates"}
        elif placed_by.unplaceable:
            fault = NO_VALID_HOST, {"filter": "host rule", "reason": placed_by.unplaceable}
        elif (refused := missing_group_policy(flavor)) is not None:
            # Nova sends such a flavor's query anyway and Placement answers 400
            LOG.warning(GROUP_POLICY_WARNING)
            fault = NO_VALID_HOST, {"filter": "group_policy", "reason": refused}
        if fault is not None:
            for instance, _request in made:
                self.stores.instances.set_error(instance.uuid, *fault)
            self.metrics.no_valid_host("filter", len(made))
            return Reservation(asked.reservation_id, [instance for instance, _ in made])
        for instance, request in made:
            try:
                self._publish(request, server_group)
            except Exception as exc:
                for other, _request in made:
                    self._roll_back(other.uuid, exc)
                raise
            self.confirmations.confirmed(instance.uuid, instance.outbox)
        return Reservation(asked.reservation_id, [instance for instance, _ in made])

    def _publish(self, request: BootRequest, group: ServerGroup | None) -> None:
        """Publish to the class queue, or to the host a member's group is on, or to the
        first host its host rule allows whose agent lives."""
        host = self.groups.route(group) if group is not None else None
        rule = request.host_rule()
        if host is None and rule is not None:
            alive = self.stores.agents.alive
            host = next((h for h in rule.only if h not in rule.never and alive(h)), None)
        if host is None:
            self.bus.publish_boot(request)
        else:
            self.bus.publish_to_host(host, request)

    def _create(
        self, context: RequestContext, uuids: Sequence[str], asked: _Asked
    ) -> tuple[list[tuple[Instance, BootRequest]], Route, Flavor]:
        """Reserve quota and record the instances; their boot requests, not published yet,
        where the aggregates route them, and the flavor they were made with."""
        for fresh in (False, True):
            flavor, stored = self._boot_flavor(context, asked.flavor_id, fresh)
            asked.image.check_fits(flavor)
            route = self.aggregates.route(context.project_id, asked.constraints, flavor)
            requests = [
                self._request(context, uuid, flavor, asked, route.constraints) for uuid in uuids
            ]
            several = len(uuids) > 1
            records = [
                record_for(request, f"{asked.name}-{n}" if several else asked.name,
                           asked.image.id, asked.metadata, asked.reservation_id,
                           requested_zone=route.requested_zone, server=asked.server)
                for n, request in enumerate(requests, start=1)
            ]  # fmt: skip
            scheduling_class = SchedulingClass(flavor, route.constraints)
            name_and_definition = self._class(requests[0].scheduling_class, scheduling_class)
            expect = (asked.flavor_id, stored)
            deadline = requests[0].deadline
            members = self._members_limit(context, asked.group)
            try:
                if several:
                    made = self.stores.instances.create_batch(
                        records, asked.min_count, asked.reservation_id, deadline, expect,
                        name_and_definition, lone_name=asked.name, members_limit=members,
                    )  # fmt: skip
                else:
                    made = [self.stores.instances.create(
                        records[0], deadline, expect, name_and_definition, members
                    )]  # fmt: skip
            except exception.FlavorChanged:
                self._flavor_cache.pop(asked.flavor_id, None)
                if fresh:
                    raise
                continue
            return list(zip(made, requests, strict=False)), route, flavor
        raise AssertionError("unreachable: the second try raises or returns")

    def _members_limit(self, context: RequestContext, group: ServerGroup | None) -> int | None:
        """The member limit a boot into ``group`` is checked against, when it is not this
        keyspace's: the deployment's (one read of the API keyspace, for a group's boot
        only); None: the create script reads this keyspace's."""
        if group is None or not self._limits_elsewhere:
            return None
        return self.quotas.limit_for(context.project_id, "server_group_members")

    def _request(
        self,
        context: RequestContext,
        uuid: str,
        flavor: Flavor,
        asked: _Asked,
        constraints: Constraints,
    ) -> BootRequest:
        group = asked.group
        return BootRequest.create(
            uuid, context.project_id, context.user_id, flavor, constraints,
            max_attempts=self.scheduler.max_attempts,
            timeout_s=self.scheduler.build_timeout_s,
            request_id=context.request_id, global_request_id=context.global_request_id,
            group=(group.uuid, group.policy) if group is not None else None,
            hosts=asked.hosts,
        )  # fmt: skip

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
            _check_name("name", changes["name"])
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

    def shows_extra_specs(self, context: RequestContext) -> bool:
        """Whether the caller sees a server's flavor's extra specs (2.47)."""
        return self.policy.allows(context, flavors_policy.SPECS_INDEX)

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
        after: tuple[Any, ...] | None = None,
    ) -> builtins.list[Instance]:
        """Servers as Nova's ``GET /servers`` lists them, newest first unless sorted.

        ``params``: the query, each parameter's values in order, read as
        :func:`qsched.compute.list_query.parse` says for ``version``; the keywords are
        short forms of the same parameters (``project_id`` asks for ``all_tenants``).
        A member's list reads their project's records only; an admin's list of
        every project pages the cell's index of live servers (a sort other than
        the default, or DELETED servers, reads the whole index: admins only).

        :raises Forbidden: ``os_compute_api:servers:index`` (``:detail``) refuses them,
            or ``...:get_all_tenants`` refuses ``all_tenants``; see also
            :func:`~qsched.compute.list_query.parse`.
        ``after``: list what sorts after this
        :meth:`~qsched.compute.list_query.ServerQuery.sort_key` instead of after the
        marker (the marker is then another cell's: the front door of several cells,
        :mod:`qsched.cells`, passes it).

        :raises MarkerNotFound: ``marker`` is not among them.
        :raises Invalid: a negative ``limit``; see :func:`~qsched.compute.list_query.parse`.
        """
        query = self.list_query(context, project_id, status, limit, marker, detail,
                                reservation_id, params, version)  # fmt: skip
        if query.empty:
            return []
        size = self.page_size(query.limit)
        fast = query.project_id is None and query.newest_first and not query.with_deleted
        if fast and after is None:
            return self._page_all(query, size)
        found = query.ordered(i for i in self._candidates(query) if query.matches(i))
        if after is not None:
            return [i for i in found if query.sort_key(i) > after][:size]
        if query.marker:
            index = next((n for n, i in enumerate(found) if i.uuid == query.marker), None)
            if index is None:
                raise MarkerNotFound(marker=query.marker)
            found = found[index + 1 :]
        return found[:size]

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
    ) -> server_list.ServerQuery:
        """The query of a :meth:`list` call, read and allowed (same arguments and errors
        but ``MarkerNotFound``)."""
        rule, all_projects = _LIST_RULES[detail]
        self.policy.authorize(context, rule)
        if limit is not None and limit < 0:
            raise exception.Invalid(reason="limit must be an integer >= 0")
        asked = {k: list(v) for k, v in (params or {}).items()}
        shorthand = {"status": status, "marker": marker, "reservation_id": reservation_id,
                     "project_id": project_id}  # fmt: skip
        asked.update({k: [v] for k, v in shorthand.items() if v})
        if project_id:
            asked.setdefault("all_tenants", ["1"])
        all_filters = self.policy.allows(context, servers_policy.ALLOW_ALL_FILTERS)
        query, all_tenants = server_list.parse(
            asked, version, context.project_id, all_filters, context.is_admin, limit
        )
        if all_tenants:
            self.policy.authorize(context, all_projects)
        return query

    def _candidates(self, query: server_list.ServerQuery) -> builtins.list[Instance]:
        """The records a query looks at: one project's (and its recent deletions), or,
        for an admin, every live one and the cell's recent deletions."""
        instances = self.stores.instances
        if query.project_id is not None:
            found = [] if query.deleted else instances.list_project(query.project_id)
        else:
            found = [] if query.deleted else self._all_live()
        if query.with_deleted:
            since = query.changes_since or 0.0
            uuids = instances.deleted_since(since, query.project_id)
            found += [i for i in instances.get_many(uuids).values()
                      if query.project_id in (None, i.project_id)]  # fmt: skip
        return found

    def _all_live(self) -> builtins.list[Instance]:
        """Every live record of the cell (an admin's sorted list: it scans the index)."""
        found: builtins.list[Instance] = []
        after: str | None = None
        while True:
            uuids = self.stores.instances.newest(_SCAN_CHUNK, after)
            if not uuids:
                return found
            found += self.stores.instances.get_many(uuids).values()
            after = uuids[-1]

    def _page_all(self, query: server_list.ServerQuery, size: int) -> builtins.list[Instance]:
        """An admin's page of every project's servers, newest first: the live index
        read a chunk at a time from the marker until the page is full."""
        instances = self.stores.instances
        if query.marker and instances.newest(0, query.marker) is None:
            raise MarkerNotFound(marker=query.marker)
        found: builtins.list[Instance] = []
        after = query.marker
        while len(found) < size:
            uuids = instances.newest(max(size - len(found), _PAGE_CHUNK), after) or []
            if not uuids:
                break
            records = instances.get_many(uuids)
            found += [records[u] for u in uuids if u in records and query.matches(records[u])]
            after = uuids[-1]
        return found[:size]

    def shows_host(self, context: RequestContext) -> bool:
        """Whether the caller sees where servers run (Nova's extended server attributes)."""
        return self.policy.allows(context, servers_policy.EXTENDED_ATTRIBUTES)

    def page_size(self, limit: int | None) -> int:
        """How many items a list call returns at most for ``limit``."""
        return self.max_limit if limit is None else min(limit, self.max_limit)

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

    def get_flavor(self, flavor_id: str, context: RequestContext | None = None) -> Flavor:
        """A flavor; with ``context``, only one the caller may see (public, granted to
        its project, or any for an admin), as Nova shows flavors.

        :raises FlavorNotFound:
        """
        flavor = self.flavors.get(flavor_id)
        if context is not None and not self._sees(context, flavor):
            raise FlavorNotFound(flavor=flavor_id)
        return flavor

    def flavor_extra_specs(self, context: RequestContext, flavor_id: str) -> Mapping[str, str]:
        """A flavor's extra specs (``os-flavor-extra-specs:index``: readers and admins).

        :raises Forbidden, FlavorNotFound:
        """
        self.policy.authorize(context, flavors_policy.SPECS_INDEX)
        return self.get_flavor(flavor_id, context).extra_specs

    def flavor_extra_spec(self, context: RequestContext, flavor_id: str, key: str) -> str:
        """One extra spec (``os-flavor-extra-specs:show``: readers and admins).

        :raises Forbidden, FlavorNotFound, FlavorExtraSpecNotFound:
        """
        self.policy.authorize(context, flavors_policy.SPECS_SHOW)
        specs = self.get_flavor(flavor_id, context).extra_specs
        if key not in specs:
            raise FlavorExtraSpecNotFound(flavor=flavor_id, key=key)
        return specs[key]

    def list_flavors(
        self, context: RequestContext | None = None, query: FlavorQuery | None = None
    ) -> builtins.list[Flavor]:
        """Every flavor sorted by id; with ``context``, the page of those the caller may
        list that ``query`` asks for (:func:`qsched.flavors.select`).

        :raises Invalid, MarkerNotFound: a bad query.
        """
        catalog = self.flavors.list()
        if context is None:
            return catalog
        query = query or FlavorQuery()
        query = dataclasses.replace(query, limit=self.page_size(query.limit))
        return select(catalog, query, context.project_id, self.policy.is_admin(context))

    def show_extra_specs_in_views(self, context: RequestContext) -> bool:
        """Whether flavor views carry extra specs (2.61+): ``os-flavor-extra-specs:index``."""
        return self.policy.allows(context, flavors_policy.SPECS_INDEX)

    def update_flavor(
        self, context: RequestContext, flavor_id: str, description: str | None
    ) -> Flavor:
        """``os-flavor-manage:update`` (admin by default): set the description (2.55+).

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_UPDATE)
        return self.flavors.update(
            flavor_id, lambda f: dataclasses.replace(f, description=description)
        )

    def flavor_access(self, context: RequestContext, flavor_id: str) -> Flavor:
        """``os-flavor-access`` (admin by default): a private flavor, to list its grants.

        :raises Forbidden, FlavorNotFound, NoAccessListForPublic:
        """
        self.policy.authorize(context, flavors_policy.ACCESS)
        flavor = self.get_flavor(flavor_id, context)
        if flavor.is_public:
            raise NoAccessListForPublic()
        return flavor

    def add_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str, refuse_public: bool
    ) -> Flavor:
        """``os-flavor-access:add_tenant_access`` (admin by default): grant a project a
        private flavor; a public one is refused if ``refuse_public`` (2.7+).

        :raises Forbidden, FlavorNotFound, PublicFlavorAccess, FlavorAccessExists:
        """
        self.policy.authorize(context, flavors_policy.ACCESS_ADD, {})
        return self.flavors.update(flavor_id, lambda f: grant(f, project_id, refuse_public))

    def remove_flavor_access(
        self, context: RequestContext, flavor_id: str, project_id: str
    ) -> Flavor:
        """``os-flavor-access:remove_tenant_access`` (admin by default). A server booting
        meanwhile with the flavor kept in memory is refused: the grants are part of the
        stored form that the create script checks.

        :raises Forbidden, FlavorNotFound, FlavorAccessNotFound:
        """
        self.policy.authorize(context, flavors_policy.ACCESS_REMOVE, {})
        return self.flavors.update(flavor_id, lambda f: revoke(f, project_id))

    def set_flavor_extra_spec(
        self, context: RequestContext, flavor_id: str, key: str, value: str
    ) -> Flavor:
        """``os-flavor-extra-specs:update`` (admin by default): add or change one spec,
        checked with the others.

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.SPECS_UPDATE, {})
        return self.flavors.update(
            flavor_id,
            lambda f: dataclasses.replace(f, extra_specs={**f.extra_specs, key: value}),
        )

    def create_flavor(self, context: RequestContext, flavor: Flavor) -> Flavor:
        """``os-flavor-manage:create`` (admin by default). A flavor without an id gets a
        new UUID, as in Nova.

        :raises Forbidden, FlavorExists, Invalid:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_CREATE)
        if not flavor.id:
            flavor = dataclasses.replace(flavor, id=str(uuidlib.uuid4()))
        return self.flavors.create(flavor)

    def delete_flavor(self, context: RequestContext, flavor_id: str) -> Flavor:
        """``os-flavor-manage:delete`` (admin by default); servers keep the copy they
        were booted with.

        :raises Forbidden, FlavorNotFound:
        """
        self.policy.authorize(context, flavors_policy.MANAGE_DELETE)
        return self.flavors.delete(flavor_id)

    def set_flavor_extra_specs(
        self, context: RequestContext, flavor_id: str, specs: Mapping[str, str]
    ) -> Flavor:
        """``os-flavor-extra-specs:create`` (admin by default): add or change extra specs
        (Nova syntax), checked as a whole.

        :raises Forbidden, FlavorNotFound, Invalid:
        """
        self.policy.authorize(context, flavors_policy.SPECS_CREATE)
        return self.flavors.update(
            flavor_id,
            lambda f: dataclasses.replace(f, extra_specs={**f.extra_specs, **specs}),
        )

    def delete_flavor_extra_spec(self, context: RequestContext, flavor_id: str, key: str) -> Flavor:
        """``os-flavor-extra-specs:delete`` (admin by default): remove one extra spec.

        :raises Forbidden, FlavorNotFound, FlavorExtraSpecNotFound:
        """
        self.policy.authorize(context, flavors_policy.SPECS_DELETE)

        def drop(flavor: Flavor) -> Flavor:
            if key not in flavor.extra_specs:
                raise FlavorExtraSpecNotFound(flavor=flavor_id, key=key)
            specs = {k: v for k, v in flavor.extra_specs.items() if k != key}
            return dataclasses.replace(flavor, extra_specs=specs)

        return self.flavors.update(flavor_id, drop)

    def seed_flavors(self) -> builtins.list[Flavor]:
        """Create or update the flavors of ``[api] flavor``; return them.

        :raises Invalid: a malformed option line, or a flavor that does not check.
        :raises FlavorExists: a configured name is taken by another id.
        """
        seeded = flavors_from_config(self.api.flavor, self.api.flavor_extra_spec)
        for flavor in seeded:
            if self.flavors.put(flavor):
                LOG.info("flavor %s (%s) written from configuration", flavor.name, flavor.id)
        return seeded

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

    def _check_zone(self, zone: str) -> None:
        """Refuse a zone neither an agent registered nor an aggregate makes.

        Agents' zones are never removed, so those seen are kept (one SISMEMBER per
        zone not seen yet); an aggregate's zone lasts as long as the aggregate keeps
        it, so it is asked of the aggregates each time (one read of their version).
        An unknown zone is asked again on each boot, so a zone made meanwhile is
        accepted at once.
        """
        if zone in self._zones:
            return
        if self.stores.agents.has_zone(zone):
            if len(self._zones) >= _CACHE_SIZE:
                self._zones.clear()
            self._zones.add(zone)
        elif not self.aggregates.has_zone(zone):
            raise AvailabilityZoneNotAvailable(zone=zone)

    def _boot_flavor(
        self, context: RequestContext, flavor_id: str, fresh: bool
    ) -> tuple[Flavor, str]:
        """A flavor the caller may boot and its stored form, from memory unless ``fresh``.

        The create script checks the stored form against the catalog, so a flavor
        changed or deleted since it was kept here costs one more read, never a
        server booted with what the flavor was. The grants of a private flavor are
        part of that form: a project whose grant was removed is refused on the
        fresh read, as a project never granted it is (Nova's 400); a flavor kept
        from before a grant is read again for the project granted it.
        """
        found = None if fresh else self._flavor_cache.get(flavor_id)
        if found is not None and not self._sees(context, found[0]):
            found = None  # a grant may be newer than what was kept: one more read
        if found is None:
            try:
                found = self.flavors.get_stored(flavor_id)
            except FlavorNotFound:
                raise FlavorRefNotFound(flavor=flavor_id) from None
            if len(self._flavor_cache) >= _CACHE_SIZE:
                self._flavor_cache.clear()
            self._flavor_cache[flavor_id] = found
        if not self._sees(context, found[0]):
            raise FlavorRefNotFound(flavor=flavor_id)
        return found

    def _sees(self, context: RequestContext, flavor: Flavor) -> bool:
        """Public, granted to the caller's project, or the caller is an admin (O(1))."""
        return flavor.visible_to(context.project_id) or self.policy.is_admin(context)

    def _class(self, name: str, scheduling_class: SchedulingClass) -> tuple[str, Mapping[str, Any]]:
        """The class's name (the request's, hashed once) and definition, which the create
        script publishes."""
        known = self._classes.get(name)
        if known is None or known[0] != scheduling_class:
            known = (scheduling_class, scheduling_class.definition())
            if len(self._classes) >= _CACHE_SIZE:
                self._classes.clear()
            self._classes[name] = known
        return name, known[1]

    def _roll_back(self, uuid: str, cause: Exception) -> None:
        """End an instance that was never published; its quota comes back."""
        reason = f"{type(cause).__name__}: {cause}"
        try:
            self.stores.instances.add_event(uuid, "publish_failed", reason=reason)
            self.abandon(uuid, f"not published: {reason}")
        except exception.BackendUnavailable:
            # The client is told 503: it must not boot when the janitor finds it.
            LOG.warning("instance %s: rollback failed; abandoning it once the ledger answers",
                        uuid)  # fmt: skip
            self.abandoner.add(uuid, f"not published: {reason}")
        except Exception:
            LOG.exception("instance %s: rollback failed; the reaper will end it", uuid)
        else:
            LOG.warning("instance %s: not published (%s); ended DELETED", uuid, reason)

    def _release_locally(self, instance: Instance, host: str) -> Instance:
        self.stores.instances.add_event(
            instance.uuid, "local_delete", host=host, reason="agent heartbeat expired"
        )
        LOG.info("instance %s: agent on %s is down; deleted locally", instance.uuid, host)
        # its VM may still run (a starved agent): the claim stays held for that host
        # until its agent reaps the VM
        return self.stores.instances.delete(instance.uuid, take_over=True)


def flavors_from_config(lines: Sequence[str], spec_lines: Sequence[str] = ()) -> list[Flavor]:
    """Parse ``[api] flavor`` (name:vcpus:ram_mb[:disk_gb[:id]]) and ``flavor_extra_spec``.

    :raises Invalid: naming the line that is wrong.
    """
    specs: dict[str, dict[str, str]] = {}
    for line in spec_lines:
        name, sep, spec = line.strip().partition(":")
        key, eq, value = spec.partition("=")
        if not (sep and eq and name and key.strip()):
            raise exception.Invalid(
                reason=f"[api] flavor_extra_spec {line!r}: use <flavor name>:<key>=<value>"
            )
        specs.setdefault(name, {})[key.strip()] = value.strip()
    flavors = [_config_flavor(line, specs) for line in lines]
    unknown = set(specs) - {f.name for f in flavors}
    if unknown:
        raise exception.Invalid(
            reason=f"[api] flavor_extra_spec names unconfigured flavors: {sorted(unknown)}"
        )
    return flavors


def _config_flavor(line: str, specs: Mapping[str, Mapping[str, str]]) -> Flavor:
    fields = [f.strip() for f in line.strip().split(":")]
    try:
        if not 3 <= len(fields) <= 5:
            raise ValueError(line)
        name, vcpus, ram_mb = fields[0], int(fields[1]), int(fields[2])
        disk_gb = int(fields[3]) if len(fields) > 3 and fields[3] else 0
    except ValueError:
        raise exception.Invalid(
            reason=f"[api] flavor {line!r}: use name:vcpus:ram_mb[:disk_gb[:id]]"
        ) from None
    flavor_id = fields[4] if len(fields) > 4 and fields[4] else name
    flavor = Flavor(name, vcpus, ram_mb, disk_gb, flavor_id, dict(specs.get(name, {})))
    try:
        check_flavor_id(flavor_id)
        return check_flavor(flavor)
    except exception.Invalid as exc:
        raise exception.Invalid(reason=f"[api] flavor {line!r}: {exc}") from None


def check_counts(min_count: int, max_count: int) -> None:
    """A multi-create's counts, as Nova checks them.

    :raises Invalid: not an integer from 1 to :data:`MAX_COUNT`, or ``min_count`` above
        ``max_count``.
    """
    for field, value in (("min_count", min_count), ("max_count", max_count)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_COUNT:
            raise exception.Invalid(reason=f"{field} must be an integer from 1 to {MAX_COUNT}")
    if min_count > max_count:
        raise exception.Invalid(message="min_count must be <= max_count")


def _check_name(field: str, value: object) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise exception.Invalid(
            reason=f"{field} must be a string of 1 to {MAX_NAME_CHARS} characters"
        )


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


#: detail or not -> the rule of the list, and the rule of listing other projects
_LIST_RULES = {
    False: (servers_policy.INDEX, servers_policy.INDEX_ALL_TENANTS),
    True: (servers_policy.DETAIL, servers_policy.DETAIL_ALL_TENANTS),
}


def _filter_options(scheduler: SchedulerOptions) -> FilterOptions:
    return FilterOptions(
        limit_tenants_to_placement_aggregate=scheduler.limit_tenants_to_placement_aggregate,
        placement_aggregate_required_for_tenants=scheduler.placement_aggregate_required_for_tenants,
        enable_isolated_aggregate_filtering=scheduler.enable_isolated_aggregate_filtering,
    )
