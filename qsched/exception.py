"""Errors raised by qsched. Each kind of failure is its own type.

A conflict (anything a Placement client would see as HTTP 409) derives from
:class:`Conflict`; callers re-read and decide before retrying.
"""

from __future__ import annotations

from typing import Any


class QschedError(Exception):
    """Base class. ``msg_fmt`` is filled from the keyword arguments."""

    msg_fmt = "An unknown error occurred."

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        self.kwargs = kwargs
        for key, value in kwargs.items():
            setattr(self, key, value)
        super().__init__(message or self.msg_fmt.format(**kwargs))


class Invalid(QschedError):
    msg_fmt = "Invalid input: {reason}"


class InvalidUUID(Invalid):
    msg_fmt = "{what} {value!r} is not a UUID; pass a canonical UUID such as 8-4-4-4-12 hex."


class InvalidResourceClass(Invalid):
    msg_fmt = (
        "Unknown resource class {resource_class!r}: use a standard class (VCPU, MEMORY_MB, "
        "DISK_GB, ...) or a custom one named CUSTOM_[A-Z0-9_]+."
    )


class InvalidTrait(Invalid):
    msg_fmt = "Unknown trait {trait!r}: use a standard os-traits name or CUSTOM_[A-Z0-9_]+."


class InvalidInventory(Invalid):
    msg_fmt = "Invalid inventory for {resource_class} on provider {provider}: {reason}"


class InvalidAmount(Invalid):
    msg_fmt = "Invalid amount {amount!r} of {resource_class} on provider {provider}: {reason}"


class NotItsRequest(Invalid):
    """A message that disagrees with the record of its instance (another flavor's class,
    amounts or constraints, a deadline the record does not have): the record the front
    door wrote is the truth, so nothing is done and the message is dead-lettered."""

    msg_fmt = "Not the request of instance {instance}: {reason}"


class MarkerNotFound(Invalid):
    """A list's marker that names nothing the caller may see (400). Nova's words on the
    lists of servers, flavors and hypervisors; :class:`MarkerCouldNotBeFound` on those
    of keypairs and instance actions."""

    msg_fmt = "marker [{marker}] not found"


class MarkerCouldNotBeFound(MarkerNotFound):
    """:class:`MarkerNotFound` in the words of Nova's keypairs and instance actions."""

    msg_fmt = "Marker {marker} could not be found."


class NotFound(QschedError):
    msg_fmt = "Not found: {what}"


class ProviderNotFound(NotFound):
    msg_fmt = "No resource provider with UUID {provider}."


class InstanceNotFound(NotFound):
    msg_fmt = "Instance {instance} could not be found."


class FlavorNotFound(NotFound):
    msg_fmt = "Flavor {flavor} could not be found."


class Conflict(QschedError):
    msg_fmt = "Conflict: {reason}"


class BootsNotServedHere(Conflict):
    msg_fmt = (
        "This cell is one of several behind one front door ([cells]): the deployment's "
        "quota is held in the API keyspace, which a boot straight into the cell would not "
        "reserve. Boot through the front door: qsched-api with [cells] naming the cells, "
        "or qsched.cells.router.CellsCompute.boot_many."
    )


class ProviderExists(Conflict):
    msg_fmt = "A resource provider with {field} {value!r} already exists."


class FlavorExists(Conflict):
    msg_fmt = "Flavor with {field} {value} already exists."


class ProviderInUse(Conflict):
    msg_fmt = "Resource provider {provider} still has {reason}; remove them first."


class ProviderGenerationConflict(Conflict):
    msg_fmt = (
        "Resource provider {provider} generation conflict: sent {expected}, current "
        "{current}. Re-read the provider and retry."
    )


class ConsumerGenerationConflict(Conflict):
    msg_fmt = (
        "Consumer {consumer} generation conflict: sent {expected}, current {current}. "
        "Re-read its allocations and retry."
    )


class CapacityExceeded(Conflict):
    msg_fmt = (
        "Not enough {resource_class} on provider {provider}: requested {requested}, "
        "used {used} of capacity {capacity}."
    )


class InventoryInUse(Conflict):
    msg_fmt = (
        "Inventory of {resource_class} on provider {provider} would drop below its usage "
        "({used} in use, new capacity {capacity}); release allocations first."
    )


class QuotaExceeded(QschedError):
    msg_fmt = (
        "Quota exceeded for {resource}: Requested {requested}, but already used {used} of "
        "{limit} {resource}"
    )


class QuotaBelowUsage(Invalid):
    """A new limit under what the project holds, without ``force`` (Nova's words)."""

    msg_fmt = (
        "Quota limit {limit} for {resource} must be greater than or equal to already used "
        "and reserved {minimum}."
    )


class InstanceNotWaiting(Conflict):
    msg_fmt = "Instance {instance} is not waiting to be placed (state {state}, host {host})."


class ComputeServiceInUse(Invalid):
    """An evacuation from a host whose compute service is up (Nova answers 400)."""

    msg_fmt = "Compute service of {host} is still in use."


class MigrationNotFound(NotFound):
    msg_fmt = "Migration {migration} could not be found."


class InvalidMigrationState(Invalid):
    """Nova's 400 for a live migration asked something its status does not allow."""

    msg_fmt = ("Migration {migration} state of instance {instance} is {state}. Cannot "
               "{method} while the migration is in this state.")  # fmt: skip


class MoveAborted(Conflict):
    """A live migration's destination says it is ready after an admin asked to abort it:
    it gives its claim back instead."""

    msg_fmt = "Migration {migration} was aborted."


class MoveNotUnderWay(Conflict):
    """A step of a move that the move is not at (another step, another host's, ended)."""

    msg_fmt = "Migration {migration} is {status}: {host} cannot take this step of it now."


class MoveTriedHost(Conflict):
    """A destination that could not take a move claims it again: a move never goes back."""

    msg_fmt = "Host {host} tried migration {migration} of instance {instance} already."


class AgentAlive(Conflict):
    """A take-over of a silent host's instance found its agent beating again."""

    msg_fmt = "The agent of host {host} is alive: its instances are not taken from it."


class InstanceInvalidState(Conflict):
    """A server action the instance's state refuses (Nova's 409 words)."""

    msg_fmt = "Cannot '{action}' instance {instance} while it is in {attr} {state}"


class InstanceNotReady(Conflict):
    """A server action on an instance no host holds yet (Nova's check_instance_host)."""

    msg_fmt = "Instance {instance} is not ready"


class ServiceNotFound(NotFound):
    msg_fmt = "Service {service_id} could not be found."


class HostBinaryNotFound(NotFound):
    msg_fmt = "Could not find binary {binary} on host {host}."


class ComputeHostNotFound(NotFound):
    msg_fmt = "Compute host {host} could not be found."


class ServiceDisabled(Conflict):
    """A claim by a host whose service is disabled or forced down: it takes no new boot."""

    msg_fmt = "Service of host {host} takes no new boots: {why}."


class TriedHost(Conflict):
    """A host that already held a request and gave it back may not claim it: another can."""

    msg_fmt = (
        "Host {host} already tried instance {instance} and {alternate} can take it: "
        "handed back ({handbacks} of {max_handbacks} hand-backs)."
    )


class InstanceExists(Conflict):
    msg_fmt = "Instance {instance} already exists."


class InstanceAbandoned(Conflict):
    """The front door told the client this boot failed (its outcome was unknown then)."""

    msg_fmt = "Instance {instance} was abandoned: its client was told the boot failed."


class FlavorChanged(Conflict):
    msg_fmt = "Flavor {flavor} changed while the server was being created; try again."


class ClaimRuleBroken(Conflict):
    """A claim's guard failed: the node no longer satisfies the request (its aggregates
    changed since the agent's view of it); the agent reads the node again."""

    msg_fmt = "Provider {provider} no longer satisfies the request: {reason}"


class BackendUnavailable(QschedError):
    """A service qsched depends on did not answer (503); ``service`` says which, in the
    words a caller may see (never where it is)."""

    msg_fmt = "{backend} at {url} is unreachable: {reason}"
    service = "the ledger"


class Forbidden(QschedError):
    """A policy rule refused the caller (403, Nova's words); ``action`` names the rule."""

    msg_fmt = "Policy doesn't allow {action} to be performed."


# -- server groups --


class GroupNotFound(NotFound):
    msg_fmt = "Instance group {group} could not be found."


class ItemLimitExceeded(QuotaExceeded):
    """A change would leave a map of a record (a server's metadata) with more items than
    the limit the caller gave; the caller words it as its API does."""

    msg_fmt = "Quota exceeded: {name} would hold {items} items, more than {limit}."


class ServerGroupLimitExceeded(QuotaExceeded):
    """The project holds ``[quota] server_groups`` groups already (Nova's words)."""

    msg_fmt = "Quota exceeded, too many server groups."


class GroupMemberLimitExceeded(QuotaExceeded):
    """The group holds ``[quota] server_group_members`` servers already (Nova's words)."""

    msg_fmt = "Quota exceeded, too many servers in group"


class KeypairLimitExceeded(QuotaExceeded):
    """The user holds ``[quota] key_pairs`` keypairs already (Nova's words)."""

    msg_fmt = "Quota exceeded, too many key pairs."


class KeypairExists(Conflict):
    msg_fmt = "Key pair '{key_name}' already exists."


class KeypairNotFound(NotFound):
    msg_fmt = "Keypair {name} not found for user {user_id}"


class InvalidKeypair(Invalid):
    msg_fmt = "Keypair data is invalid: {reason}"


class PlacementRuleRefused(Conflict):
    """A claim on ``host`` would break a hard placement rule of the instance, kept in its
    record: its server group's policy, or its host rule. ``holder``, when given, is a
    host the rule allows, for the agent to forward the request to; ``refusals`` counts
    the claims refused so far (the agents park a request at every few)."""


class HostRuleRefused(PlacementRuleRefused):
    """A claim on ``host`` would break the instance's host rule
    (:class:`~qsched.ledger.records.HostRule`): ``rule`` is ``only`` (not one of the hosts
    ``only`` lists), ``never`` (a host it must not run on) or ``node`` (not the
    ``requested_node``)."""

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        super().__init__(message or _host_rule_text(kwargs), **kwargs)


def _host_rule_text(k: dict[str, Any]) -> str:
    host, rule = k.get("host"), k.get("rule")
    if rule == "only":
        hosts = ", ".join(k.get("only") or ())
        return f"{host} is not one of the hosts the server may run on ({hosts})"
    if rule == "never":
        return f"{host} runs a server this one must not share a host with (different_host)"
    if rule == "own":
        return (
            f"{host} is the server's own host: a move goes to another host (a resize "
            f"stays only with [compute] allow_resize_to_same_host)"
        )
    if rule == "hosts":
        return f"{host} breaks the host rule the server was booted with (same_host, different_host)"
    return f"node {k.get('node')} of {host} is not the node {k.get('requested_node')} asked for"


class GroupPolicyRefused(PlacementRuleRefused):
    """A claim on ``host`` would break the policy of the instance's server group.

    ``policy`` is ``affinity`` (``holder`` is the host the group is on) or
    ``anti-affinity`` (``members`` of the group are on ``host`` already, the rule
    allows ``max_server_per_host``); or, with ``soft`` true, a soft policy that
    prefers another host (``passes``: how many times it was passed on so far).
    """

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        super().__init__(message or _group_refusal_text(kwargs), **kwargs)


def _group_refusal_text(k: dict[str, Any]) -> str:
    policy, group, host, members = k.get("policy"), k.get("group"), k.get("host"), k.get("members")
    servers = f"{members} server{'' if members == 1 else 's'}"
    if k.get("soft"):
        if policy == "soft-affinity":
            return f"soft-affinity group {group} is on {k.get('holder')}, not {host}: tried there"
        return f"soft-anti-affinity group {group} has {servers} on {host}: another host first"
    if policy == "affinity":
        return f"affinity group {group} is on {k.get('holder')}, not {host}"
    return (
        f"anti-affinity group {group} already has {servers} on {host} "
        f"(max_server_per_host {k.get('max_server_per_host')})"
    )
