"""A ledger that does not answer is an outage everywhere, never bad input.

Every public call of every store raises BackendUnavailable when Redis is gone
(the table below must name them all: a new method fails the coverage test until
it is added), and an agent gives back the requests it holds instead of
dead-lettering them.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from qsched import exception
from qsched.aggregates import Aggregate
from qsched.conf import LedgerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.agents import RedisAgents
from qsched.ledger.aggregates import RedisAggregates
from qsched.ledger.archiver import RedisArchive
from qsched.ledger.base import (
    Instance,
    Inventory,
    Keypair,
    ProviderSpec,
    ServerGroup,
    State,
    TaskState,
)
from qsched.ledger.cellmap import RedisCellMap, cell_map
from qsched.ledger.errors import unavailable
from qsched.ledger.flavors import RedisFlavors
from qsched.ledger.groups import RedisGroups
from qsched.ledger.instances import RedisInstances
from qsched.ledger.keypairs import RedisKeypairs
from qsched.ledger.placement import RedisLedger
from qsched.ledger.quota import RedisQuota
from qsched.ledger.redis import RedisBackend
from qsched.ledger.scan import RedisInspector
from qsched.scheduling.message import DeleteRequest
from qsched.stack import free_port
from tests.agents.test_convergence import freeze, start
from tests.helpers import wait_until
from tests.raw import redis_store

U = str(uuid.uuid4())
FLAVOR = Flavor("small", 1, 1024, 0)
RECORD = Instance(U, "p1", "u1", "vm", FLAVOR.to_dict(), State.BUILD)
SPEC = ProviderSpec(U, "n1", {"VCPU": Inventory(4)})
GROUP = ServerGroup(U, "g", "p1", "u1", "anti-affinity")
AGGREGATE = Aggregate(1, U, "a")

#: every public method of every store, called with arguments that pass its own checks
KEYPAIR = Keypair("u1", "kp", "ssh-rsa AAAA", "aa:bb")
CALLS: dict[str, Callable[[Stores], Any]] = {
    "RedisLedger.create_provider": lambda s: s.ledger.create_provider(U, "n1"),
    "RedisLedger.get_provider": lambda s: s.ledger.get_provider(U),
    "RedisLedger.find_provider": lambda s: s.ledger.find_provider("n1"),
    "RedisLedger.delete_provider": lambda s: s.ledger.delete_provider(U, 0),
    "RedisLedger.set_inventory": lambda s: s.ledger.set_inventory(U, 0, {"VCPU": Inventory(4)}),
    "RedisLedger.set_traits": lambda s: s.ledger.set_traits(U, 0, ["HW_CPU_X86_AVX2"]),
    "RedisLedger.set_aggregates": lambda s: s.ledger.set_aggregates(U, 0, [U]),
    "RedisLedger.register_providers": lambda s: s.ledger.register_providers([SPEC]),
    "RedisLedger.list_providers": lambda s: s.ledger.list_providers(),
    "RedisLedger.get_providers": lambda s: s.ledger.get_providers([U]),
    "RedisLedger.sharing_providers": lambda s: s.ledger.sharing_providers([U]),
    "RedisLedger.get_allocations": lambda s: s.ledger.get_allocations(U),
    "RedisLedger.provider_consumers": lambda s: s.ledger.provider_consumers(U),
    "RedisLedger.providers_consumers": lambda s: s.ledger.providers_consumers([U]),
    "RedisLedger.project_usages": lambda s: s.ledger.project_usages("p1"),
    "RedisLedger.hypervisors": lambda s: s.ledger.hypervisors(0, 10),
    "RedisLedger.hypervisor_ids": lambda s: s.ledger.hypervisor_ids([U]),
    "RedisLedger.hypervisor_uuid": lambda s: s.ledger.hypervisor_uuid(1),
    "RedisLedger.put_allocations": lambda s: s.ledger.put_allocations(
        U, {U: {"VCPU": 1}}, None, "p1", "u1"
    ),
    "RedisLedger.claim": lambda s: s.ledger.claim(U, {U: {"VCPU": 1}}, "h1", "n1"),
    "RedisLedger.release_unexplained": lambda s: s.ledger.release_unexplained(U, "h1", U),
    "RedisLedger.release": lambda s: s.ledger.release(U),
    "RedisLedger.held_claims": lambda s: s.ledger.held_claims("h1"),
    "RedisLedger.release_held": lambda s: s.ledger.release_held("h1", U),
    "RedisQuota.get_limits": lambda s: s.quota.get_limits("p1"),
    "RedisQuota.set_limits": lambda s: s.quota.set_limits("p1", instances=1),
    "RedisQuota.get_usage": lambda s: s.quota.get_usage("p1"),
    "RedisQuota.reserve": lambda s: s.quota.reserve("p1", U, 1, 1),
    "RedisQuota.release": lambda s: s.quota.release("p1", U),
    "RedisQuota.default_limits": lambda s: s.quota.default_limits(),
    "RedisQuota.limits": lambda s: s.quota.limits("p1"),
    "RedisQuota.update_default_limits": lambda s: s.quota.update_default_limits({"cores": 4}),
    "RedisQuota.in_use": lambda s: s.quota.in_use("p1"),
    "RedisQuota.update_limits": lambda s: s.quota.update_limits("p1", {"cores": 4}),
    "RedisQuota.clear_limits": lambda s: s.quota.clear_limits("p1"),
    "RedisInstances.create": lambda s: s.instances.create(RECORD, 1e12),
    "RedisInstances.get": lambda s: s.instances.get(U),
    "RedisInstances.newest": lambda s: s.instances.newest(10),
    "RedisInstances.deleted_since": lambda s: s.instances.deleted_since(0.0, "p1"),
    "RedisInstances.update": lambda s: s.instances.update(U, name="n"),
    "RedisInstances.start_action": lambda s: s.instances.start_action(U, "stop", "r", "u", "p"),
    "RedisInstances.step_action": lambda s: s.instances.step_action(
        U, "h1", TaskState.POWERING_OFF, TaskState.NONE
    ),
    "RedisInstances.acting": lambda s: s.instances.acting("h1"),
    "RedisInstances.forget_action": lambda s: s.instances.forget_action("h1", U),
    "RedisInstances.offload": lambda s: s.instances.offload(U, "h1", "e"),
    "RedisInstances.shelved_on": lambda s: s.instances.shelved_on("h1", 0.0),
    "RedisKeypairs.create": lambda s: s.keypairs.create(KEYPAIR),
    "RedisKeypairs.get": lambda s: s.keypairs.get("u1", "kp"),
    "RedisKeypairs.list_user": lambda s: s.keypairs.list_user("u1"),
    "RedisKeypairs.delete": lambda s: s.keypairs.delete("u1", "kp"),
    "RedisInstances.get_many": lambda s: s.instances.get_many([U]),
    "RedisInstances.placements": lambda s: s.instances.placements([U]),
    "RedisInstances.list_project": lambda s: s.instances.list_project("p1"),
    "RedisInstances.add_event": lambda s: s.instances.add_event(U, "x"),
    "RedisInstances.events": lambda s: s.instances.events(U),
    "RedisInstances.set_active": lambda s: s.instances.set_active(U, "h1", "n1"),
    "RedisInstances.requeue": lambda s: s.instances.requeue(U, "h1", "r"),
    "RedisInstances.set_error": lambda s: s.instances.set_error(U, "m", {}),
    "RedisInstances.set_lost": lambda s: s.instances.set_lost(U, "h", "n", "m", {}),
    "RedisInstances.delete": lambda s: s.instances.delete(U),
    "RedisInstances.mark_deleting": lambda s: s.instances.mark_deleting(U),
    "RedisInstances.deleting": lambda s: s.instances.deleting("h1"),
    "RedisInstances.building": lambda s: s.instances.building("h1"),
    "RedisInstances.expired": lambda s: s.instances.expired(1.0),
    "RedisInstances.forget_deadline": lambda s: s.instances.forget_deadline(U),
    "RedisInstances.abandon": lambda s: s.instances.abandon(U, "r"),
    "RedisInstances.outbox_take": lambda s: s.instances.outbox_take(1.0),
    "RedisInstances.outbox_done": lambda s: s.instances.outbox_done([(U, "1.0")]),
    "RedisInstances.unpublished": lambda s: s.instances.unpublished(),
    "RedisInstances.park": lambda s: s.instances.park(U, "h1", "r"),
    "RedisInstances.create_batch": lambda s: s.instances.create_batch([RECORD], 1, "r-1", 1e12),
    "RedisInstances.batches": lambda s: s.instances.batches(["r-1"]),
    "RedisGroups.create": lambda s: s.groups.create(GROUP),
    "RedisGroups.get": lambda s: s.groups.get(U),
    "RedisGroups.list_project": lambda s: s.groups.list_project("p1"),
    "RedisGroups.list_all": lambda s: s.groups.list_all(),
    "RedisGroups.delete": lambda s: s.groups.delete(U),
    "RedisGroups.hosts": lambda s: s.groups.hosts(U),
    "RedisGroups.members_on": lambda s: s.groups.members_on(U, "h1"),
    "RedisAggregates.create": lambda s: s.aggregates.create("a"),
    "RedisAggregates.put": lambda s: s.aggregates.put(AGGREGATE),
    "RedisAggregates.get": lambda s: s.aggregates.get(1),
    "RedisAggregates.list": lambda s: s.aggregates.list(),
    "RedisAggregates.last_id": lambda s: s.aggregates.last_id(),
    "RedisAggregates.version": lambda s: s.aggregates.version(),
    "RedisAggregates.update": lambda s: s.aggregates.update(1, {"name": "b"}),
    "RedisAggregates.set_metadata": lambda s: s.aggregates.set_metadata(1, {"k": "v"}),
    "RedisAggregates.add_host": lambda s: s.aggregates.add_host(1, "h1"),
    "RedisAggregates.remove_host": lambda s: s.aggregates.remove_host(1, "h1"),
    "RedisAggregates.host_aggregates": lambda s: s.aggregates.host_aggregates("h1"),
    "RedisAggregates.delete": lambda s: s.aggregates.delete(1),
    "RedisArchive.step": lambda s: s.archive.step(1.0, 10),
    "RedisArchive.staged": lambda s: s.archive.staged(),
    "RedisArchive.clear": lambda s: s.archive.clear([U]),
    "RedisArchive.deleted_count": lambda s: s.archive.deleted_count(),
    "RedisCellMap.join": lambda s: cell_map(s).join(),
    "RedisCellMap.ends": lambda s: cell_map(s).ends(10),
    "RedisCellMap.drop_ends": lambda s: cell_map(s).drop_ends(['["p1", "h"]']),
    "RedisCellMap.ends_waiting": lambda s: cell_map(s).ends_waiting(),
    "RedisCellMap.map": lambda s: cell_map(s).map([str(uuid.uuid4())], "cell1", "p1"),
    "RedisCellMap.hold": lambda s: cell_map(s).hold([str(uuid.uuid4())], "cell1", "p1", 1, 1, 1),
    "RedisCellMap.mapping": lambda s: cell_map(s).mapping(str(uuid.uuid4())),
    "RedisCellMap.unmap": lambda s: cell_map(s).unmap([str(uuid.uuid4())]),
    "RedisCellMap.confirm": lambda s: cell_map(s).confirm([str(uuid.uuid4())]),
    "RedisCellMap.pending_before": lambda s: cell_map(s).pending_before(0.0),
    "RedisCellMap.pending_count": lambda s: cell_map(s).pending_count(),
    "RedisCellMap.map_group": lambda s: cell_map(s).map_group(str(uuid.uuid4()), "cell1", "p1"),
    "RedisCellMap.group_mapping": lambda s: cell_map(s).group_mapping(str(uuid.uuid4())),
    "RedisCellMap.unmap_group": lambda s: cell_map(s).unmap_group(str(uuid.uuid4()), "p1"),
    "RedisCellMap.confirm_groups": lambda s: cell_map(s).confirm_groups([str(uuid.uuid4())]),
    "RedisCellMap.groups_pending_before": lambda s: cell_map(s).groups_pending_before(0.0),
    "RedisCellMap.counted_groups": lambda s: cell_map(s).counted_groups("p1"),
    "RedisCellMap.group_pending": lambda s: cell_map(s).group_pending(str(uuid.uuid4())),
    "RedisCellMap.groups_pending_count": lambda s: cell_map(s).groups_pending_count(),
    "RedisCellMap.group_mappings": lambda s: cell_map(s).group_mappings(),
    "RedisCellMap.group_mappings_of": lambda s: cell_map(s).group_mappings_of([U]),
    "RedisCellMap.adopt_group": lambda s: cell_map(s).adopt_group(U, "cell1", "p1"),
    "RedisCellMap.host_cell": lambda s: cell_map(s).host_cell("h1"),
    "RedisCellMap.map_host": lambda s: cell_map(s).map_host("h1", "cell1"),
    "RedisCellMap.node_cell": lambda s: cell_map(s).node_cell("n1"),
    "RedisCellMap.map_node": lambda s: cell_map(s).map_node("n1", "cell1"),
    "RedisCellMap.next_aggregate_id": lambda s: cell_map(s).next_aggregate_id(0),
    "RedisCellMap.host_cells": lambda s: cell_map(s).host_cells(["h1"]),
    "RedisCellMap.map_hosts": lambda s: cell_map(s).map_hosts(["h1"], "cell1"),
    "RedisCellMap.aggregate_seq": lambda s: cell_map(s).aggregate_seq(),
    "RedisCellMap.raise_aggregate_seq": lambda s: cell_map(s).raise_aggregate_seq(3),
    "RedisCellMap.lock_aggregate": lambda s: cell_map(s).lock_aggregate(1, "t", 1.0),
    "RedisCellMap.unlock_aggregate": lambda s: cell_map(s).unlock_aggregate(1, "t"),
    "RedisGroups.abandon": lambda s: s.groups.abandon(U),
    "RedisAgents.heartbeat": lambda s: s.agents.heartbeat("h1", 1.0, free={"VCPU": 4}),
    "RedisAgents.free": lambda s: s.agents.free(),
    "RedisAgents.alive": lambda s: s.agents.alive("h1"),
    "RedisAgents.last_seen": lambda s: s.agents.last_seen("h1"),
    "RedisAgents.forget": lambda s: s.agents.forget("h1"),
    "RedisAgents.list": lambda s: s.agents.list(),
    "RedisAgents.add_class": lambda s: s.agents.add_class("small", {}),
    "RedisAgents.classes": lambda s: s.agents.classes(),
    "RedisAgents.set_classes": lambda s: s.agents.set_classes("h1", ["small"]),
    "RedisAgents.class_consumers": lambda s: s.agents.class_consumers("small"),
    "RedisAgents.register_service": lambda s: s.agents.register_service("h1"),
    "RedisAgents.update_service": lambda s: s.agents.update_service("h1", disabled=True),
    "RedisAgents.service": lambda s: s.agents.service("h1"),
    "RedisAgents.service_host": lambda s: s.agents.service_host(U),
    "RedisAgents.services": lambda s: s.agents.services(),
    "RedisAgents.add_zone": lambda s: s.agents.add_zone("az1"),
    "RedisAgents.zones": lambda s: s.agents.zones(),
    "RedisAgents.has_zone": lambda s: s.agents.has_zone("az1"),
    "RedisAgents.zones_available": lambda s: s.agents.zones_available(["az1"]),
    "RedisFlavors.get": lambda s: s.flavors.get("small"),
    "RedisFlavors.get_stored": lambda s: s.flavors.get_stored("small"),
    "RedisFlavors.list": lambda s: s.flavors.list(),
    "RedisFlavors.create": lambda s: s.flavors.create(FLAVOR),
    "RedisFlavors.put": lambda s: s.flavors.put(FLAVOR),
    "RedisFlavors.update": lambda s: s.flavors.update("small", lambda f: f),
    "RedisFlavors.delete": lambda s: s.flavors.delete("small"),
    "RedisInspector.instance_records": lambda s: s.inspector.instance_records(),
    "RedisInspector.histories": lambda s: s.inspector.histories([U]),
    "RedisInspector.events_trimmed": lambda s: s.inspector.events_trimmed(U),
    "RedisInspector.deadline_index": lambda s: s.inspector.deadline_index(),
    "RedisInspector.waiting_count": lambda s: s.inspector.waiting_count(),
    "RedisInspector.consumers": lambda s: s.inspector.consumers(),
    "RedisInspector.project_usages": lambda s: s.inspector.project_usages(),
    "RedisInspector.quota_used": lambda s: s.inspector.quota_used(),
    "RedisInspector.quota_held": lambda s: s.inspector.quota_held(),
    "RedisInspector.provider_uuid": lambda s: s.inspector.provider_uuid("n1"),
    "RedisInspector.provider_count": lambda s: s.inspector.provider_count(),
    "RedisBackend.ping": lambda s: s.backend.ping(),
    "RedisBackend.is_empty": lambda s: s.backend.is_empty(),
    "RedisBackend.forget_cell": lambda s: s.backend.forget_cell(),
}
NO_IO = {"RedisLedger.default_inventory", "RedisQuota.default_args",
         "RedisQuota.configured_limits"}  # pure helpers  # fmt: skip
NEVER_RAISE = {
    "RedisBackend.close",
    "RedisBackend.command_stats",
    "RedisBackend.server_cpu_ms",
}  # no figures is no failure


STORES = (RedisLedger, RedisQuota, RedisInstances, RedisAgents, RedisFlavors, RedisInspector,
          RedisBackend, RedisGroups, RedisKeypairs, RedisCellMap, RedisAggregates,
          RedisArchive)  # fmt: skip


@pytest.fixture
def dead(conf) -> Stores:
    """Stores whose Redis refuses connections (nothing listens on the port)."""
    return open_stores(LedgerOptions.from_conf(conf), url=f"redis://127.0.0.1:{free_port()}/0")


def test_the_table_names_every_public_store_method() -> None:
    public = {
        f"{cls.__name__}.{name}"
        for cls in STORES
        for name, _ in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }
    assert public - NO_IO - NEVER_RAISE == set(CALLS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_store_call_reports_an_outage(dead: Stores, name: str) -> None:
    with pytest.raises(exception.BackendUnavailable):
        CALLS[name](dead)


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.ResponseError("NOREPLICAS Not enough good replicas to write."),
        redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
    ],
)
def test_replies_that_mean_not_now_are_outages(error: Exception) -> None:
    assert isinstance(unavailable(error), exception.BackendUnavailable)


def test_replies_that_mean_not_this_are_not_outages() -> None:
    assert unavailable(redis.ResponseError("WRONGTYPE Operation against a key")) is None


def test_an_agent_gives_back_a_delete_while_the_ledger_is_down(
    conf, stores, bus, api, agents
) -> None:
    """Dead-lettering it would lose the delete: it must come back once the ledger does."""
    conf.set_override("ledger_retry_max_s", 0.2, group="agent")
    agent = start(conf, stores, bus, "cn0")
    agents.append(agent)
    inst = api.boot(RequestContext.for_project("u1", "p1"), "vm", "small").uuid
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    node = stores.instances.mark_deleting(inst).node or ""  # as the API does, first
    live = redis_store(agent.stores).client
    redis_store(agent.stores).client = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    try:
        bus.publish_delete("cn0", DeleteRequest("req-1", inst, "cn0", node))
        assert wait_until(lambda: agent.counters["backend_down"] >= 2, 10)
    finally:
        redis_store(agent.stores).client = live
    assert wait_until(lambda: stores.instances.get(inst).state == State.DELETED, 10)
    assert bus.dead_letter_stats().ready == 0
    freeze(agent)


def test_the_figures_of_a_dead_server_are_none_not_a_failure(dead: Stores) -> None:
    """What NEVER_RAISE names: a harness reading figures from a ledger that is away
    gets none."""
    assert dead.backend.command_stats() == {}
    assert dead.backend.server_cpu_ms() == 0.0
    dead.backend.close()
