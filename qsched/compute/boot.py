"""Boot and multi-create in one cell, step by step (what
:meth:`qsched.compute.api.ComputeAPI.boot_many` has the cell it chose do for
``POST /servers``).

Check that a requested availability zone is one an agent registered (kept in memory
once seen; any other zone would make a scheduling class and a broker queue of its own,
so it is refused before anything is held), resolve the flavor (kept in memory after
the first HGET), reserve quota, record the instance BUILD and make sure agents know
its scheduling class (one Lua script, which also checks the flavor is still what was
kept), publish the boot request. If anything fails after the record exists, the
instance is ended DELETED, which returns its quota; the DELETED record stays as a
trace (its history says why, and GET gives 404 as for any deleted server). A request
the broker did take although it did not confirm meets a DELETED instance, and the
agent drops it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import secrets
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from qsched import exception
from qsched.bus.base import Publisher
from qsched.compute.aggregates import AggregateAPI, Route
from qsched.compute.host_rules import HostRequest, HostRules
from qsched.compute.keypairs import KeypairAPI
from qsched.compute.quotas import QuotaAPI
from qsched.compute.server_groups import ServerGroups
from qsched.conf import SchedulerOptions
from qsched.context import RequestContext
from qsched.exception import FlavorNotFound
from qsched.flavors import (
    GROUP_POLICY_WARNING,
    Constraints,
    Flavor,
    missing_group_policy,
    ref_id,
)
from qsched.images.base import Image, ImageService
from qsched.ledger import Stores
from qsched.ledger.base import (
    FlavorStore,
    HostRule,
    Instance,
    ServerGroup,
)
from qsched.metrics import APIMetrics
from qsched.policies import servers as servers_policy
from qsched.policy import Policy
from qsched.recovery.outbox import Abandoner, Confirmations
from qsched.recovery.reaper import NO_VALID_HOST
from qsched.scheduling.classes import SchedulingClass
from qsched.scheduling.message import BootRequest
from qsched.scheduling.records import (
    ServerFields,
    record_for,
)

LOG = logging.getLogger(__name__)

MAX_NAME_CHARS = 255


#: the most servers one create may ask for (each is a record of the same script)
MAX_COUNT = 1000


_CACHE_SIZE = 1024  # flavors, classes and zones kept in memory; emptied when full


class FlavorRefNotFound(exception.Invalid):
    """An unknown flavor in a boot request: the request is bad (400), not a missing URL."""

    msg_fmt = "Flavor {flavor} could not be found."


class AvailabilityZoneNotAvailable(exception.Invalid):
    """A zone no agent registered (400, Nova's words): each zone makes classes and queues."""

    msg_fmt = "The requested availability zone is not available"


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
    accept: Callable[Concatenate[Boot, P], Reservation],
) -> Callable[Concatenate[Boot, P], Reservation]:
    """Count the servers a create accepted, or why it was refused (:mod:`qsched.metrics`)."""

    @functools.wraps(accept)
    def counted(self: Boot, *args: P.args, **kwargs: P.kwargs) -> Reservation:
        try:
            found = accept(self, *args, **kwargs)
        except Exception as exc:
            self.metrics.boot_refused(exc)
            raise
        self.metrics.boots_accepted(len(found.instances))
        return found

    return counted


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


def check_name(field: str, value: object) -> None:
    """A server's name, as Nova checks it. :raises Invalid:"""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise exception.Invalid(
            reason=f"{field} must be a string of 1 to {MAX_NAME_CHARS} characters"
        )


class Boot:
    """The boot steps of a :class:`~qsched.compute.cell.Cell`, which holds what they use
    (a part of its class, kept apart to be read on its own)."""

    stores: Stores
    bus: Publisher
    metrics: APIMetrics
    policy: Policy
    images: ImageService
    flavors: FlavorStore
    scheduler: SchedulerOptions
    serves_boots: bool
    aggregates: AggregateAPI
    confirmations: Confirmations
    abandoner: Abandoner
    groups: ServerGroups
    quotas: QuotaAPI
    keypairs: KeypairAPI
    host_rules: HostRules
    _limits_elsewhere: bool
    _classes: dict[str, tuple[SchedulingClass, dict[str, Any]]]
    _flavor_cache: dict[str, tuple[Flavor, str]]
    _zones: set[str]

    if TYPE_CHECKING:  # the other parts of ComputeAPI

        def abandon(self, uuid: str, reason: str) -> None: ...

        def sees(self, context: RequestContext, flavor: Flavor) -> bool: ...

    @_counted
    def accept(
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
        """Accept servers into this cell: quota reserved, recorded BUILD, boot requests
        published (:meth:`qsched.compute.api.ComputeAPI.boot_many` says what the
        arguments ask).

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
        check_name("name", name)
        check_counts(min_count, max_count)
        if availability_zone is not None:
            check_name("availability_zone", availability_zone)
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
        if found is not None and not self.sees(context, found[0]):
            found = None  # a grant may be newer than what was kept: one more read
        if found is None:
            try:
                found = self.flavors.get_stored(flavor_id)
            except FlavorNotFound:
                raise FlavorRefNotFound(flavor=flavor_id) from None
            if len(self._flavor_cache) >= _CACHE_SIZE:
                self._flavor_cache.clear()
            self._flavor_cache[flavor_id] = found
        if not self.sees(context, found[0]):
            raise FlavorRefNotFound(flavor=flavor_id)
        return found

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
