"""Moves through the agents (docs/moves.rst): cold migration and resize, confirmed or
reverted, a destination that fails, and what each leaves in the ledger and drivers.

The front door and the agents run in one process (memory bus, fakeredis ledger and a
real Redis, as ``stores`` gives them).
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from agents.service import ComputeAgent
from qsched import exception
from qsched.compute.api import ComputeAPI
from qsched.compute.server_actions import status
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State, Usage
from qsched.recovery import janitor
from qsched.recovery.reaper import confirm_unconfirmed, reap_expired_moves
from tests.agents.test_agent import make_agent, settled
from tests.api.test_api import ADMIN as ADMIN_HEADERS
from tests.api.test_api import fault
from tests.compute.test_server_actions import act, get, http_server
from tests.helpers import wait_until

USER = RequestContext.for_project("u1", "p1")
ADMIN = RequestContext.for_project("a1", "p1", roles=("admin", "member", "reader"))


def booted(api: ComputeAPI, stores: Stores, flavor: str = "small") -> str:
    uuid = api.boot(USER, "vm", flavor).uuid
    assert wait_until(lambda: settled(stores, [uuid]), timeout_s=10)
    assert stores.instances.get(uuid).state == State.ACTIVE
    return uuid


def status_of(stores: Stores, uuid: str) -> str:
    return status(stores.instances.get(uuid))


def runs(agent: ComputeAgent, uuid: str) -> bool:
    return any(uuid in agent.driver.list_instances(n) for n in agent.index.names(0)[0])


def quiet(agents: list[ComputeAgent]) -> None:
    """Every agent's reconcile finds nothing to fix: each end of a move is explained."""
    for agent in agents:
        report = agent.reconciler.run_all()
        assert not report.found_anything(), report.to_dict()


def test_a_cold_migration_confirmed_leaves_the_server_on_its_new_host_only(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    assert source is not None
    dest = next(h for h in two if h != source)
    api.moves.migrate(ADMIN, vm)
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", timeout_s=10)
    record = stores.instances.get(vm)
    assert record.host == dest and record.migration is not None
    assert runs(two[source], vm) and runs(two[dest], vm)  # the source's copy waits
    assert audit(stores).ok
    quiet(list(two.values()))
    api.moves.confirm(USER, vm)
    assert wait_until(lambda: stores.instances.get(vm).migration is None, timeout_s=10)
    assert status_of(stores, vm) == "ACTIVE" and not runs(two[source], vm)
    assert runs(two[dest], vm)
    (migration,) = stores.migrations.of_instance(vm)
    assert (migration.status, migration.dest_compute) == ("confirmed", dest)
    assert two[source].index.totals()["VCPU"][0] == 0
    _instance, actions = api.actions.list_actions(ADMIN, vm)  # newest first
    assert [a.action for a in actions] == ["confirmResize", "migrate", "create"]
    assert [(e.event, e.result) for e in actions[0].events] == [
        ("compute_confirm_resize", "Success")]  # fmt: skip
    assert [(e.event, e.result, e.host) for e in actions[1].events] == [
        ("compute_prep_resize", "Success", dest),
        ("compute_finish_resize", "Success", dest),
    ]
    assert audit(stores).ok
    quiet(list(two.values()))


def test_a_resize_reverted_puts_the_server_back_as_it_was(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    api.moves.resize(USER, vm, "big")
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", timeout_s=10)
    record = stores.instances.get(vm)
    assert record.flavor["name"] == "big" and record.host != source
    assert stores.quota.get_usage("p1") == Usage(1, 8, 8192)  # the larger flavor's
    api.moves.revert(USER, vm)
    assert wait_until(lambda: stores.instances.get(vm).migration is None, timeout_s=10)
    record = stores.instances.get(vm)
    assert (record.host, record.flavor["name"], status(record)) == (source, "small", "ACTIVE")
    assert stores.quota.get_usage("p1") == Usage(1, 1, 1024)
    dest = next(h for h in two if h != source)
    assert not runs(two[dest], vm) and two[dest].index.totals()["VCPU"][0] == 0
    assert audit(stores).ok
    quiet(list(two.values()))


def test_a_resize_needs_another_flavor_and_a_move_a_placed_server(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    with pytest.raises(exception.Invalid, match="must change flavor"):
        api.moves.resize(USER, vm, "small")
    with pytest.raises(exception.Invalid, match="Unable to locate requested flavor"):
        api.moves.resize(USER, vm, "nope")
    with pytest.raises(exception.Forbidden):
        api.moves.migrate(USER, vm)  # an admin's call
    with pytest.raises(exception.InstanceInvalidState):
        api.moves.confirm(USER, vm)  # nothing waits for a confirm


def test_a_destination_that_fails_is_not_tried_again_and_the_server_stays(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
    vm = booted(api, stores)
    agents.append(make_agent(conf, stores, bus, "cn1", nodes=1, failure_rate=1.0))
    api.moves.migrate(ADMIN, vm)
    assert wait_until(lambda: stores.instances.get(vm).migration is None, timeout_s=15)
    (migration,) = stores.migrations.of_instance(vm)
    assert migration.status == "error" and migration.tried == ("cn1",)
    record = stores.instances.get(vm)
    assert (record.state, record.host, status(record)) == (State.ACTIVE, "cn0", "ACTIVE")
    assert agents[1].index.totals()["VCPU"][0] == 0 and audit(stores).ok


def test_a_resize_in_place_holds_the_larger_flavor_and_confirms_at_once(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    api.cell.moves.scheduler = dataclasses.replace(
        api.cell.moves.scheduler, allow_resize_to_same_host=True
    )
    # room for both: the agent fits a class by what its node has free, its own server's
    # share not counted back (the ledger's claim of a resize in place holds the larger)
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1, vcpus=16, ram_mb=16384))
    vm = booted(api, stores)
    api.moves.resize(USER, vm, "big")
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", timeout_s=10)
    assert stores.instances.get(vm).host == "cn0" and runs(agents[0], vm)
    assert agents[0].index.totals()["VCPU"][0] == 8  # the larger flavor, never both
    api.moves.confirm(USER, vm)  # one copy: nothing to destroy, confirmed at once
    assert stores.instances.get(vm).migration is None and runs(agents[0], vm)
    assert audit(stores).ok
    # the confirm changed the node behind the agent's back: its next pass reads it again
    assert agents[0].reconciler.run_all().refreshed == ["cn0-0"]
    assert agents[0].index.totals()["VCPU"][0] == 8
    quiet(agents)


def test_a_server_deleted_while_it_waits_for_a_confirm_leaves_nothing_behind(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    api.moves.migrate(ADMIN, vm)
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", timeout_s=10)
    api.delete(USER, vm)
    assert wait_until(lambda: stores.instances.get(vm).state == State.DELETED, timeout_s=10)
    # the source's copy is left to its agent's reconcile, which releases what is held
    two[source].reconciler.run_all()  # reaps the copy
    two[source].reconciler.run_all()  # its held claim goes once its VM is gone
    assert not any(runs(agent, vm) for agent in two.values())
    assert all(agent.index.totals()["VCPU"][0] == 0 for agent in two.values())
    assert stores.ledger.held_claims(source) == {} and audit(stores).ok


def test_an_agent_that_lost_a_move_step_takes_it_when_it_sweeps(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    api.moves.migrate(ADMIN, vm)
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", timeout_s=10)
    migration = stores.instances.get(vm).migration
    stores.migrations.confirm(migration, "ask")  # as the API does; its message is lost
    assert two[source].moves.finish_stuck() == 1
    assert stores.migrations.get(migration).status == "confirmed"
    assert not runs(two[source], vm) and audit(stores).ok


def test_a_move_no_destination_took_ends_at_its_deadline(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    stores.agents.register_service("cn9", None)  # a host that beats but consumes nothing
    stores.agents.heartbeat("cn9", 3600)
    move = api.cell.moves.migrate(ADMIN, vm, host="cn9")  # waits on its queue
    assert reap_expired_moves(stores, now=time.time() + 3600) == 1
    assert stores.migrations.get(move.uuid).status == "error"
    record = stores.instances.get(vm)
    assert (status(record), record.migration) == ("ACTIVE", None)


def test_a_claim_no_build_holds_is_given_back_when_the_destination_sweeps(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    """A destination that died while the server came up: its next run finds the claim
    with no build and gives it back; with no other host, the move ends."""
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    dest = next(h for h in two if h != source)
    api.moves.migrate(ADMIN, vm, host=dest)
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", timeout_s=10)
    api.moves.revert(USER, vm)
    assert wait_until(lambda: stores.instances.get(vm).migration is None, timeout_s=10)
    # a second move, claimed for dest as by a run of its agent that then died
    move = stores.migrations.start(api.cell.moves._move(ADMIN, stores.instances.get(vm),
                                                         "migration"))  # fmt: skip
    node = two[dest].index.node(f"{dest}-0")
    stores.migrations.claim(move.uuid, {node.root.uuid: {"VCPU": 1, "MEMORY_MB": 1024}},
                            dest, f"{dest}-0")  # fmt: skip
    assert two[dest].moves.finish_stuck() == 1
    assert wait_until(lambda: stores.migrations.get(move.uuid).final, timeout_s=10)
    assert stores.migrations.get(move.uuid).status == "error"  # no other host took it
    record = stores.instances.get(vm)
    assert (record.host, status(record)) == (source, "ACTIVE") and audit(stores).ok


class TestHTTP:
    def test_resize_confirm_and_their_answers(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        assert act(client, server, {"resize": {"flavorRef": "large-id"}}).status_code == 202
        (request,) = [m for m in rbus.boots if m.moves]
        assert (request.migration, request.source_host) == (
            stores.instances.get(server).migration,
            "cn1",
        )
        assert request.scheduling_class == "m1.large" and request.flavor["vcpus"] == 4
        view = get(client, f"/servers/{server}").json["server"]
        assert (view["status"], view["OS-EXT-STS:task_state"]) == ("RESIZE", "resize_prep")
        refused = fault(act(client, server, {"resize": {"flavorRef": "large-id"}}), 409,
                        "conflictingRequest")  # fmt: skip
        assert refused == f"Cannot 'resize' instance {server} while it is in task_state resize_prep"
        message = fault(act(client, server, {"confirmResize": None}), 409, "conflictingRequest")
        assert message == f"Cannot 'confirmResize' instance {server} while it is in vm_state active"

    def test_bad_resizes_are_400(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        same = fault(act(client, server, {"resize": {"flavorRef": "m1.small"}}), 400, "badRequest")
        assert same == "When resizing, instances must change flavor!"
        nope = fault(act(client, server, {"resize": {"flavorRef": "nope"}}), 400, "badRequest")
        assert nope == "Unable to locate requested flavor."
        assert not any(m.moves for m in rbus.boots)

    def test_migrate_is_an_admins_and_names_a_host_from_2_56(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        fault(act(client, server, {"migrate": None}), 403, "forbidden")
        body = {"migrate": {"host": "cn2"}}
        fault(act(client, server, body, ADMIN_HEADERS, "2.55"), 400, "badRequest")
        same = act(client, server, {"migrate": {"host": "cn1"}}, ADMIN_HEADERS, "2.56")
        assert (
            fault(same, 400, "badRequest") == "Cannot migrate to the host where the server exists."
        )
        stores.agents.register_service("cn2", None)
        down = fault(act(client, server, body, ADMIN_HEADERS, "2.56"), 400, "badRequest")
        assert down == "Compute service of cn2 is unavailable at this time."  # no heartbeat
        stores.agents.heartbeat("cn2", 3600)
        assert act(client, server, body, ADMIN_HEADERS, "2.56").status_code == 202
        ((host, request),) = rbus.host_boots
        assert host == "cn2" and request.migration is not None


def test_an_evacuation_rebuilds_the_server_and_its_host_back_lets_go(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    assert source is not None
    dest = next(h for h in two if h != source)
    with pytest.raises(exception.ComputeServiceInUse):
        api.moves.evacuate(ADMIN, vm)  # its host is up
    stores.agents.update_service(source, forced_down=True)
    api.moves.evacuate(ADMIN, vm)
    assert wait_until(lambda: stores.instances.get(vm).host == dest, timeout_s=10)
    (migration,) = stores.migrations.of_instance(vm)
    assert migration.status == "done" and runs(two[dest], vm)
    assert stores.ledger.held_claims(source) == {vm: migration.uuid}  # its VM may run there
    assert audit(stores).ok
    stores.agents.update_service(source, forced_down=False)  # back: it lets go
    two[source].reconciler.run_all()
    two[source].reconciler.run_all()
    assert not runs(two[source], vm) and stores.ledger.held_claims(source) == {}
    assert two[source].index.totals()["VCPU"][0] == 0 and audit(stores).ok


class TestEvacuateHTTP:
    def test_shapes_by_microversion(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        fault(act(client, server, {"evacuate": {}}, version="2.68"), 403, "forbidden")  # admins
        older = {"evacuate": {"host": "cn2"}}  # onSharedStorage is required up to 2.13
        fault(act(client, server, older, ADMIN_HEADERS, "2.13"), 400, "badRequest")
        forced = {"evacuate": {"force": True}}  # force is 2.29 to 2.67's
        fault(act(client, server, forced, ADMIN_HEADERS, "2.68"), 400, "badRequest")
        up = fault(act(client, server, {"evacuate": {}}, ADMIN_HEADERS, "2.68"), 400,
                   "badRequest")  # fmt: skip
        assert up == "Compute service of cn1 is still in use."
        stores.agents.register_service("cn1", None)
        stores.agents.update_service("cn1", forced_down=True)
        same = act(client, server, {"evacuate": {"host": "cn1"}}, ADMIN_HEADERS, "2.68")
        assert fault(same, 400, "badRequest") == "The target host can't be the same one."
        done = act(client, server, {"evacuate": {}}, ADMIN_HEADERS, "2.68")
        assert done.status_code == 200 and done.content == b""
        (request,) = [m for m in rbus.boots if m.moves]
        assert request.source_host == "cn1"
        view = get(client, f"/servers/{server}", ADMIN_HEADERS).json["server"]
        assert (view["status"], view["OS-EXT-STS:task_state"]) == ("REBUILD", "rebuilding")


def test_a_live_migration_sends_the_server_without_a_confirm(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    assert source is not None
    dest = next(h for h in two if h != source)
    api.moves.live_migrate(ADMIN, vm, block_migration=True)
    assert wait_until(lambda: stores.instances.get(vm).migration is None, timeout_s=10)
    record = stores.instances.get(vm)
    assert (record.host, status(record)) == (dest, "ACTIVE")
    (migration,) = stores.migrations.of_instance(vm)
    assert (migration.status, migration.kind) == ("completed", "live-migration")
    assert two[source].driver.live_migrations[vm] == (dest, True)
    assert not runs(two[source], vm) and runs(two[dest], vm)
    assert two[source].index.totals()["VCPU"][0] == 0 and audit(stores).ok
    quiet(list(two.values()))


def test_a_live_migration_its_source_cannot_send_leaves_the_server_where_it_was(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
    vm = booted(api, stores)
    agents[0].driver.failure_rate = 1.0  # its sends fail from now on
    agents.append(make_agent(conf, stores, bus, "cn1", nodes=1))
    api.moves.live_migrate(ADMIN, vm)
    assert wait_until(lambda: stores.instances.get(vm).migration is None, timeout_s=10)
    (migration,) = stores.migrations.of_instance(vm)
    assert migration.status == "failed"
    record = stores.instances.get(vm)
    assert (record.host, status(record)) == ("cn0", "ACTIVE") and runs(agents[0], vm)
    agents[1].reconciler.run_all()  # the destination's copy, left to its reconcile, goes
    assert not runs(agents[1], vm) and agents[1].index.totals()["VCPU"][0] == 0
    assert audit(stores).ok


class TestLiveMigrateHTTP:
    def test_shapes_by_microversion(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        auto = {"os-migrateLive": {"host": None, "block_migration": "auto"}}
        fault(act(client, server, auto, version="2.25"), 403, "forbidden")  # admins'
        fault(act(client, server, auto, ADMIN_HEADERS, "2.24"), 400, "badRequest")
        older = {"os-migrateLive": {"host": None, "block_migration": False,
                                    "disk_over_commit": False}}  # fmt: skip
        fault(act(client, server, older, ADMIN_HEADERS, "2.25"), 400, "badRequest")
        to_self = {"os-migrateLive": {"host": "cn1", "block_migration": "auto"}}
        message = fault(act(client, server, to_self, ADMIN_HEADERS, "2.25"), 400, "badRequest")
        assert message == f"Unable to migrate instance ({server}) to current host (cn1)."
        assert act(client, server, auto, ADMIN_HEADERS, "2.25").status_code == 202
        (request,) = [m for m in rbus.boots if m.moves]
        assert stores.migrations.get(request.migration).block_migration is None
        view = get(client, f"/servers/{server}", ADMIN_HEADERS).json["server"]
        assert (view["status"], view["OS-EXT-STS:task_state"]) == ("MIGRATING", "migrating")


def test_a_destination_down_mid_move_is_taken_over_and_lets_go_when_it_is_done(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
    vm = booted(api, stores)
    agents.append(make_agent(conf, stores, bus, "cn1", nodes=1, spawn_delay_s=3.0))
    move = api.cell.moves.migrate(ADMIN, vm)
    assert wait_until(lambda: stores.migrations.get(move.uuid).status == "migrating", 10)
    stores.agents.update_service("cn1", forced_down=True)  # silent to the janitor
    report = janitor.run(stores, bus, grace_s=0.0)
    assert report.moves == [move.uuid]
    # the move waits again, cn1 tried; cn1's side held for it while its VM may come up
    assert stores.migrations.get(move.uuid).tried == ("cn1",)
    assert list(stores.ledger.held_claims("cn1")) == [vm]
    assert wait_until(lambda: stores.migrations.get(move.uuid).final, timeout_s=10)
    record = stores.instances.get(vm)  # no other host: it ended, the server where it was
    assert (record.host, status(record)) == ("cn0", "ACTIVE")
    # its spawn done, cn1 finds the move gone: its copy goes, and what it held
    assert wait_until(lambda: stores.ledger.held_claims("cn1") == {}, timeout_s=15)
    assert not runs(agents[1], vm) and audit(stores).ok


def test_a_move_past_the_resize_confirm_window_is_confirmed(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    vm = booted(api, stores)
    source = stores.instances.get(vm).host
    move = api.cell.moves.migrate(ADMIN, vm)
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", timeout_s=10)
    assert confirm_unconfirmed(stores, window_s=3600) == 0  # not waited long enough
    assert confirm_unconfirmed(stores, window_s=0, now=time.time() + 1) == 1
    assert stores.migrations.get(move.uuid).status == "confirming"
    assert two[source].moves.finish_stuck() == 1  # its source's sweep takes the step
    assert stores.migrations.get(move.uuid).status == "confirmed"
    assert not runs(two[source], vm) and audit(stores).ok
