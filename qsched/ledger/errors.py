"""What a Redis error or a script's refusal means, as a qsched exception.

Every call of a store class decorated with :func:`maps_errors` turns a lost or
refusing Redis (connection refused or dropped, timeout, loading, read-only
replica, out of memory) into :class:`~qsched.exception.BackendUnavailable`, so
that no caller mistakes an outage for bad input. A script that refuses answers an
error code, which :data:`SCRIPT_ERRORS` turns into the exception the interfaces of
:mod:`qsched.ledger.base` name in their ``:raises:``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from qsched import aggregates, exception
from qsched.ledger import cluster

T = TypeVar("T")


def _error_map() -> dict[str, Callable[..., exception.QschedError]]:
    return {
        "provider_not_found": exception.ProviderNotFound,
        "provider_exists": exception.ProviderExists,
        "provider_in_use": exception.ProviderInUse,
        "provider_conflict": exception.ProviderGenerationConflict,
        "consumer_conflict": exception.ConsumerGenerationConflict,
        "capacity": exception.CapacityExceeded,
        "invalid_amount": exception.InvalidAmount,
        "inventory_in_use": exception.InventoryInUse,
        "quota": exception.QuotaExceeded,
        "quota_below_usage": exception.QuotaBelowUsage,
        "instance_not_found": exception.InstanceNotFound,
        "instance_exists": exception.InstanceExists,
        "flavor_changed": exception.FlavorChanged,
        "not_waiting": exception.InstanceNotWaiting,
        "agent_alive": exception.AgentAlive,
        "item_limit": exception.ItemLimitExceeded,
        "tried_host": exception.TriedHost,
        "move_tried_host": exception.MoveTriedHost,
        "migration_not_found": exception.MigrationNotFound,
        "not_moving": exception.MoveNotUnderWay,
        "move_aborted": exception.MoveAborted,
        "service_disabled": exception.ServiceDisabled,
        "service_not_found": exception.ComputeHostNotFound,
        "abandoned": exception.InstanceAbandoned,
        "rule_broken": exception.ClaimRuleBroken,
        "not_due": lambda **k: exception.NotItsRequest(
            instance=k["instance"],
            reason=f"its record's deadline, {_utc(float(k['deadline']))}, has not passed",
        ),
        "not_its_request": lambda **k: exception.NotItsRequest(
            instance=k["instance"],
            reason=f"the claim was placed for scheduling class {k['claimed']}, its record "
            f"was made for {k['recorded']}",
        ),
        "aggregate_not_found": aggregates.AggregateNotFound,
        "aggregate_name_exists": aggregates.AggregateNameExists,
        "aggregate_id_exists": lambda **k: exception.Conflict(
            reason=f"aggregate id {k['aggregate_id']} is taken"
        ),
        "aggregate_host_exists": aggregates.AggregateHostExists,
        "aggregate_host_not_found": aggregates.AggregateHostNotFound,
        "compute_host_not_found": exception.ComputeHostNotFound,
        "invalid_aggregate_action": aggregates.InvalidAggregateAction,
        "group_not_found": exception.GroupNotFound,
        "group_exists": lambda **k: exception.Conflict(reason=f"server group {k['group']} exists"),
        "group_abandoned": lambda **k: exception.Conflict(
            reason=f"server group {k['group']} was abandoned: its create was told it failed"
        ),
        "group_quota": exception.ServerGroupLimitExceeded,
        "group_members_quota": exception.GroupMemberLimitExceeded,
        "group_policy": exception.GroupPolicyRefused,
        "host_rule": exception.HostRuleRefused,
        "keypair_exists": lambda **k: exception.KeypairExists(key_name=k["name"]),
        "keypair_quota": exception.KeypairLimitExceeded,
        "batch_exists": lambda **k: exception.Conflict(reason=f"reservation {k['batch']} exists"),
    }


def _utc(epoch_s: float) -> str:
    """A time as an error message shows it: ISO 8601, UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


#: a script's error code -> the qsched exception it raises
SCRIPT_ERRORS = _error_map()


#: Redis replies that mean "not now" rather than "not this": the server is loading,
#: read-only (a replica, during a failover), out of memory, busy with a script, or
#: short of replicas for ``min-replicas-to-write``.
_UNAVAILABLE_REPLIES = ("LOADING", "READONLY", "OOM", "BUSY", "NOREPLICAS", "MASTERDOWN",
                        "CLUSTERDOWN", "TRYAGAIN")  # fmt: skip
#: and the classes redis-py parses some of them into (the prefix is gone from their text)
_UNAVAILABLE_ERRORS = (
    redis.ConnectionError,  # refused, dropped, loading (BusyLoadingError)
    redis.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ClusterDownError,  # and MasterDownError
    redis.exceptions.TryAgainError,
)


#: what a client may raise: redis-py's cluster client raises RedisClusterException,
#: no RedisError, when no node of the cluster answers
CLIENT_ERRORS = (redis.RedisError, cluster.RedisClusterException)


def unavailable(exc: BaseException) -> exception.BackendUnavailable | None:
    """The BackendUnavailable a Redis error means, or None if it is not an outage."""
    if isinstance(exc, exception.BackendUnavailable):
        return exc
    outage = (
        isinstance(exc, _UNAVAILABLE_ERRORS)
        or (isinstance(exc, redis.ResponseError) and str(exc).startswith(_UNAVAILABLE_REPLIES))
        or cluster.is_outage(exc)
    )
    if not outage:
        return None
    return exception.BackendUnavailable(backend="Redis", url="ledger", reason=exc)


def mapped(method: Callable[..., T]) -> Callable[..., T]:
    """``method`` with Redis outages raised as BackendUnavailable (see :func:`unavailable`)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return method(*args, **kwargs)
        except CLIENT_ERRORS as exc:
            down = unavailable(exc)
            if down is None:
                raise
            raise down from exc

    return call


C = TypeVar("C", bound=type)


def maps_errors(cls: C) -> C:
    """Class decorator: every public method of ``cls`` maps Redis outages (:func:`mapped`)."""
    for name, value in list(vars(cls).items()):
        if callable(value) and not name.startswith("_"):
            setattr(cls, name, mapped(value))
    return cls
