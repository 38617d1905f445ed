"""Shelve, shelveOffload and unshelve through the agents (docs/moves.rst, "Shelve"): what
each leaves in the ledger, the drivers and the quota, and Nova's answers over HTTP.

The front door and the agents run in one process (memory bus, fakeredis ledger and a
real Redis, as ``stores`` gives them).
"""

from __future__ import annotations

import pytest

from agents.service import ComputeAgent
from qsched import exception
from qsched.compute.api import ComputeAPI
from qsched.compute.moves import UnshelveInstanceInvalidState, UnshelveToZoneNotServed
from qsched.compute.server_actions import power_state, status, vm_state
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Usage
from qsched.recovery.reaper import reap_expired_moves
from tests.agents.test_agent import make_agent
from tests.api.test_api import ADMIN as ADMIN_HEADERS
from tests.api.test_api import fault
from tests.compute.test_moves import ADMIN, USER, booted, quiet, runs, status_of
from tests.compute.test_server_actions import act, get, http_server
from tests.helpers import wait_until


def cluster(conf, stores, bus, agents, offload_s: int = 0, count: int = 2) -> dict:
    conf.set_override("shelved_offload_time", offload_s)
    agents += [make_agent(conf, stores, bus, f"cn{i}", nodes=1, vcpus=8, ram_mb=16384)
               for i in range(count)]  # fmt: skip
    return {agent.host: agent for agent in agents}


def used(agents: dict[str, ComputeAgent]) -> int:
    return sum(agent.index.totals()["VCPU"][0] for agent in agents.values())


def test_a_shelve_offloads_at_once_and_an_unshelve_places_it_again(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    hosts = cluster(conf, stores, bus, agents)
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    api.actions.shelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED_OFFLOADED", timeout_s=10)
    record = stores.instances.get(vm)
    assert (record.host, record.node, record.task_state.value) == (None, None, "")
    assert (vm_state(record, "active"), power_state(record)) == ("shelved_offloaded", 0)
    assert not any(runs(agent, vm) for agent in hosts.values()) and used(hosts) == 0
    assert stores.ledger.get_allocations(vm).allocations == {}
    assert stores.quota.get_usage("p1") == Usage(1, 1, 1024)  # kept, as Nova counts it
    assert audit(stores).ok
    quiet(list(hosts.values()))
    with pytest.raises(exception.InstanceInvalidState):
        api.actions.stop(USER, vm)
    with pytest.raises(exception.InstanceInvalidState):
        api.moves.migrate(ADMIN, vm)

    api.moves.unshelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "ACTIVE", timeout_s=10)
    record = stores.instances.get(vm)
    assert record.host in hosts and runs(hosts[record.host], vm) and used(hosts) == 1
    assert (vm_state(record, "active"), power_state(record)) == ("active", 1)
    assert record.migration is None and not record.shelved
    assert stores.quota.get_usage("p1") == Usage(1, 1, 1024)
    assert stores.migrations.of_instance(vm)[0].status == "completed"
    assert api.migrations.list(ADMIN) == []  # Nova lists no migration for an unshelve
    _instance, actions = api.actions.list_actions(ADMIN, vm)  # newest first
    assert [a.action for a in actions] == ["unshelve", "shelve", "create"]
    assert [(e.event, e.result) for e in actions[0].events] == [
        ("conductor_unshelve_instance", "Success"),
        ("compute_unshelve_instance", "Success"),
    ]
    assert [(e.event, e.result, e.host) for e in actions[1].events] == [
        ("compute_shelve_instance", "Success", source)]  # fmt: skip
    assert audit(stores).ok
    quiet(list(hosts.values()))


def test_a_server_kept_on_its_host_unshelves_there_and_an_admin_offloads_it(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    hosts = cluster(conf, stores, bus, agents, offload_s=-1)  # never on its own
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    assert source is not None
    api.actions.shelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED", timeout_s=10)
    record = stores.instances.get(vm)
    assert record.host == source and power_state(record) == 4 and used(hosts) == 1
    assert hosts[source].driver.list_instances(record.node or "") == [vm]
    with pytest.raises(UnshelveInstanceInvalidState):  # zone or host: offloaded ones only
        api.moves.unshelve(ADMIN, vm, host=source)
    api.moves.unshelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "ACTIVE", timeout_s=10)
    assert stores.instances.get(vm).host == source and stores.migrations.of_instance(vm) == []

    api.actions.shelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED", timeout_s=10)
    with pytest.raises(exception.Forbidden):
        api.actions.shelve_offload(USER, vm)  # an admin's
    api.actions.shelve_offload(ADMIN, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED_OFFLOADED", timeout_s=10)
    assert not runs(hosts[source], vm) and used(hosts) == 0 and audit(stores).ok
    with pytest.raises(exception.InstanceInvalidState):
        api.actions.shelve_offload(ADMIN, vm)  # offloaded already
    quiet(list(hosts.values()))


def test_a_server_shelved_long_enough_is_offloaded_by_its_agent(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    hosts = cluster(conf, stores, bus, agents, offload_s=3600, count=1)
    (agent,) = hosts.values()
    vm = booted(api, stores)
    api.actions.shelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED", timeout_s=10)
    assert agent.actions.offload_due() == 0  # not an hour yet
    shelved_at = stores.instances.events(vm)[-1].time
    assert agent.actions.offload_due(shelved_at + 3601) == 1
    assert status_of(stores, vm) == "SHELVED_OFFLOADED" and used(hosts) == 0
    assert agent.actions.offload_due(shelved_at + 7200) == 0  # nothing shelved there now
    assert audit(stores).ok


def test_an_unshelve_to_a_named_host_goes_there_and_one_no_host_takes_stays_offloaded(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    hosts = cluster(conf, stores, bus, agents)
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    other = next(h for h in hosts if h != source)
    api.actions.shelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED_OFFLOADED", timeout_s=10)
    with pytest.raises(exception.Forbidden):
        api.moves.unshelve(USER, vm, host=other)  # unshelve_to_host: admins
    with pytest.raises(UnshelveToZoneNotServed):
        api.moves.unshelve(USER, vm, zone="elsewhere")
    api.moves.unshelve(ADMIN, vm, host=other)
    assert wait_until(lambda: status_of(stores, vm) == "ACTIVE", timeout_s=10)
    assert stores.instances.get(vm).host == other and runs(hosts[other], vm)

    api.actions.shelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED_OFFLOADED", timeout_s=10)
    for host in hosts:  # no host takes new work: the move finds no destination
        stores.agents.update_service(host, disabled=True)
    api.moves.unshelve(USER, vm)
    move = stores.instances.get(vm).migration
    assert move is not None and status_of(stores, vm) == "SHELVED_OFFLOADED"
    reap_expired_moves(stores, now=stores.migrations.get(move).deadline + 1)
    record = stores.instances.get(vm)
    assert (status(record), record.migration, record.host) == ("SHELVED_OFFLOADED", None, None)
    assert stores.migrations.get(move).status == "failed" and used(hosts) == 0
    assert stores.quota.get_usage("p1") == Usage(1, 1, 1024) and audit(stores).ok


def test_a_server_deleted_while_offloaded_or_unshelving_leaves_nothing(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    hosts = cluster(conf, stores, bus, agents)
    vms = [booted(api, stores) for _ in range(2)]
    for vm in vms:
        api.actions.shelve(USER, vm)
    assert wait_until(lambda: all(status_of(stores, vm) == "SHELVED_OFFLOADED" for vm in vms),
                      timeout_s=10)  # fmt: skip
    api.delete(USER, vms[0])
    api.moves.unshelve(USER, vms[1])
    api.delete(USER, vms[1])  # wherever its unshelve got to
    assert wait_until(lambda: all(stores.instances.get(vm).state.value == "DELETED"
                                  for vm in vms), timeout_s=10)  # fmt: skip
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
    for agent in hosts.values():
        agent.reconciler.run_all()
    assert wait_until(lambda: used(hosts) == 0 and audit(stores).ok, timeout_s=10)
    assert not any(runs(agent, vm) for agent in hosts.values() for vm in vms)


class TestShelveHTTP:
    def test_nova_shapes_and_answers(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        assert act(client, server, {"shelve": None}).status_code == 202
        assert [(h, m.action) for h, m in rbus.actions] == [("cn1", "shelve")]
        view = get(client, f"/servers/{server}").json["server"]
        assert (view["status"], view["OS-EXT-STS:task_state"]) == ("ACTIVE", "shelving")
        again = act(client, server, {"shelve": None})
        assert "task_state shelving" in fault(again, 409, "conflictingRequest")
        fault(act(client, server, {"shelveOffload": None}), 403, "forbidden")  # admins
        fault(act(client, server, {"unshelve": {}}, version="2.77"), 400, "badRequest")
        fault(act(client, server, {"unshelve": {"host": "cn1"}}, version="2.79"), 400,
              "badRequest")  # a host is 2.91's, which qsched does not serve yet  # fmt: skip
        asked = {"unshelve": {"availability_zone": "az1"}}
        refused = act(client, server, asked, ADMIN_HEADERS, "2.77")
        assert "must be SHELVED_OFFLOADED" in fault(refused, 409, "conflictingRequest")
        fault(act(client, server, {"unshelve": None}), 409, "conflictingRequest")  # shelving
