"""What an admin asks of a live migration under way (docs/moves.rst, "Live migration"):
``force_complete`` ends the copy now; an abort rolls it back wherever it is (waiting,
its destination preparing, being sent), the server staying on its source, nothing
held elsewhere, the migration ``cancelled``. Over HTTP, Nova's answers by microversion.
"""

from __future__ import annotations

import pytest

from agents.service import ComputeAgent
from qsched import exception
from qsched.compute.api import ComputeAPI
from qsched.compute.migrations import MigrationNotFoundForInstance
from qsched.compute.server_actions import status
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from tests.agents.test_agent import make_agent
from tests.api.test_api import ADMIN as ADMIN_HEADERS
from tests.api.test_api import fault
from tests.compute.test_moves import ADMIN, booted, runs
from tests.compute.test_server_actions import act, http_server
from tests.helpers import wait_until

SLOW_S = 3.0  # each spawn, receive and send of the fake drivers


@pytest.fixture
def slow(conf, stores: Stores, bus, agents: list[ComputeAgent]) -> dict[str, ComputeAgent]:
    agents += [make_agent(conf, stores, bus, f"cn{i}", nodes=1, vcpus=8, ram_mb=16384,
                          spawn_delay_s=SLOW_S) for i in range(2)]  # fmt: skip
    return {agent.host: agent for agent in agents}


def moving(api: ComputeAPI, stores: Stores, slow: dict[str, ComputeAgent]) -> tuple[str, str, str]:
    """A server live-migrating: its uuid, its source and its migration's integer id."""
    vm = booted(api, stores)
    source = stores.instances.get(vm).host or ""
    api.moves.live_migrate(ADMIN, vm)
    (move,) = stores.migrations.of_instance(vm)
    return vm, source, str(move.id)


def status_of_move(stores: Stores, vm: str) -> str:
    return stores.migrations.of_instance(vm)[0].status


def settled_back(stores: Stores, slow: dict[str, ComputeAgent], vm: str, source: str) -> None:
    """Cancelled: the server on its source only, nothing held on the other host."""
    assert wait_until(lambda: status_of_move(stores, vm) == "cancelled", 20)
    record = stores.instances.get(vm)
    assert (record.host, status(record), record.migration) == (source, "ACTIVE", None)
    other = next(agent for host, agent in slow.items() if host != source)
    other.reconciler.run_all()  # a copy there is its reconcile's to reap
    assert wait_until(lambda: not runs(other, vm), 10) and runs(slow[source], vm)
    assert other.index.totals()["VCPU"][0] == 0 and audit(stores).ok


def test_a_forced_live_migration_completes_without_its_copy_time(
    stores: Stores, api: ComputeAPI, slow: dict[str, ComputeAgent]
) -> None:
    vm, source, migration = moving(api, stores, slow)
    with pytest.raises(exception.InvalidMigrationState):
        api.moves.force_complete(ADMIN, vm, migration)  # not being sent yet
    assert wait_until(lambda: status_of_move(stores, vm) == "running", 20)
    api.moves.force_complete(ADMIN, vm, migration)
    assert wait_until(lambda: status_of_move(stores, vm) == "completed", 20)
    assert vm in slow[source].driver.forced and stores.instances.get(vm).host != source
    _instance, actions = api.actions.list_actions(ADMIN, vm)
    assert [(a.action, [e.result for e in a.events]) for a in actions[:2]] == [
        ("live_migration_force_complete", ["Success"]),
        ("live-migration", ["Success"]),
    ]
    assert audit(stores).ok


def test_an_abort_while_it_is_sent_rolls_it_back(
    stores: Stores, api: ComputeAPI, slow: dict[str, ComputeAgent]
) -> None:
    vm, source, migration = moving(api, stores, slow)
    assert wait_until(lambda: status_of_move(stores, vm) == "running", 20)
    api.moves.abort(ADMIN, vm, migration)
    settled_back(stores, slow, vm, source)
    assert vm not in slow[source].driver.live_migrations  # it never left
    _instance, actions = api.actions.list_actions(ADMIN, vm)
    assert [(e.event, e.result) for e in actions[0].events] == [
        ("compute_live_migration_abort", "Success")]  # fmt: skip


def test_an_abort_while_its_destination_prepares_gives_the_claim_back(
    stores: Stores, api: ComputeAPI, slow: dict[str, ComputeAgent]
) -> None:
    vm, source, migration = moving(api, stores, slow)
    assert wait_until(lambda: status_of_move(stores, vm) == "preparing", 20)
    api.moves.abort(ADMIN, vm, migration)
    settled_back(stores, slow, vm, source)
    with pytest.raises(exception.InstanceInvalidState):
        api.moves.abort(ADMIN, vm, migration)  # ended: the server is not migrating


def test_what_is_asked_must_name_a_live_migration_of_the_server(
    stores: Stores, api: ComputeAPI, slow: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    with pytest.raises(MigrationNotFoundForInstance):
        api.moves.abort(ADMIN, vm, "12345")
    with pytest.raises(exception.Invalid):  # Nova's 400 for a force_complete
        api.moves.force_complete(ADMIN, vm, "12345")
    with pytest.raises(exception.Forbidden):
        api.moves.abort(USER_CONTEXT, vm, "1")


USER_CONTEXT = ADMIN.__class__.for_project("u1", "p1")


class TestAsksHTTP:
    def test_nova_shapes_and_answers(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        stores.agents.register_service("cn2", None)
        stores.agents.heartbeat("cn2", 3600)
        live = {"os-migrateLive": {"host": None, "block_migration": "auto"}}
        assert act(client, server, live, ADMIN_HEADERS, "2.25").status_code == 202
        (move,) = stores.migrations.of_instance(server)
        path = f"/v2.1/servers/{server}/migrations/{move.id}"

        def send(method: str, version: str, body=None):
            headers = {**ADMIN_HEADERS, "OpenStack-API-Version": f"compute {version}"}
            to = f"{path}/action" if method == "POST" else path
            return client.simulate_request(method, to, json=body, headers=headers)

        forced = {"force_complete": None}
        assert send("POST", "2.21", forced).status_code == 404  # Nova's route is 2.22's
        refused = fault(send("POST", "2.22", forced), 400, "badRequest")
        assert f"state of instance {server} is accepted" in refused  # not being sent
        fault(send("POST", "2.22", {"force_complete": {}}), 400, "badRequest")
        assert send("DELETE", "2.23").status_code == 404  # Nova's abort is 2.24's
        fault(send("DELETE", "2.24"), 400, "badRequest")  # waiting: from 2.65
        assert send("DELETE", "2.65").status_code == 202
        record = stores.instances.get(server)
        assert (status(record), record.migration) == ("ACTIVE", None)
        assert stores.migrations.get(move.uuid).status == "cancelled"
        fault(send("DELETE", "2.65"), 409, "conflictingRequest")  # not migrating now


def test_a_server_deleted_while_it_is_sent_ends_on_both_hosts(
    stores: Stores, api: ComputeAPI, slow: dict[str, ComputeAgent]
) -> None:
    """The delete goes to the host the record names (the source): no step of the move
    may change that while it runs, and the delete ends the move (a chaos run found a
    live migration's completion moving the server under its delete)."""
    vm, _source, _migration = moving(api, stores, slow)
    assert wait_until(lambda: status_of_move(stores, vm) == "running", 20)
    api.delete(USER_CONTEXT, vm)
    assert wait_until(lambda: stores.instances.get(vm).state.value == "DELETED", 20)
    assert status_of_move(stores, vm) in ("failed", "completed")
    # its delete request reached the host the record named, and was obeyed there
    assert [agent.counters["not_its_request"] for agent in slow.values()] == [0, 0]
    for agent in slow.values():
        agent.reconciler.run_all()  # the copy that came up elsewhere is reaped, its hold let go
    assert wait_until(lambda: not any(runs(agent, vm) for agent in slow.values()), 20)
    for agent in slow.values():
        agent.reconciler.run_all()
    assert all(agent.index.totals()["VCPU"][0] == 0 for agent in slow.values())
    assert all(stores.ledger.held_claims(host) == {} for host in slow) and audit(stores).ok
