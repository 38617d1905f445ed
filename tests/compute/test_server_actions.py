"""Server actions (stop, start, reboot) through the host's agent, and instance actions.

The domain and the agent run in one process (memory bus, fakeredis ledger); the
HTTP shapes by microversion go through falcon's TestClient on a recording bus.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from typing import Any

import pytest

from agents.actions import ActionStep
from agents.virt.fake import FakeDriver, read_state
from qsched import conf as qconf
from qsched import exception
from qsched.bus.base import BusUnavailable
from qsched.compute.api import ComputeAPI
from qsched.compute.server_actions import ActionFilter, AgentDown, ServerActions, actions_of
from qsched.conf import APIOptions, SchedulerOptions
from qsched.conf.policy import policy_enforcer
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Inventory, State, TaskState, Usage
from qsched.notifications import updates
from qsched.notifications.base import RecordingNotifier
from qsched.policy import Policy
from qsched.scheduling.message import ActionRequest, PoisonMessage, decode
from tests.agents.test_agent import make_agent, settled
from tests.api.test_api import ADMIN, IMAGE, OTHER, USER, fault
from tests.compute.test_compute import RecordingBus, place
from tests.helpers import RecordingDelivery, wait_until
from tests.samples import SAMPLES, mismatches, needs_samples, samples_dir, shape

ALICE = RequestContext.for_project("u1", "p1")
BOB = RequestContext.for_project("u2", "p2")


def actions_for(api: ComputeAPI) -> ServerActions:
    return ServerActions(api.cell.stores, api.cell.bus, api.policy)


def booted(api: ComputeAPI, stores: Stores, name: str = "vm") -> str:
    uuid_ = api.boot(ALICE, name, "small").uuid
    assert wait_until(lambda: settled(stores, [uuid_]), timeout_s=10)
    assert stores.instances.get(uuid_).state == State.ACTIVE
    return uuid_


def idle(stores: Stores, uuid_: str) -> bool:
    return stores.instances.get(uuid_).task_state == TaskState.NONE


class TestThroughTheAgent:
    def test_stop_start_and_reboots(self, conf, stores, bus, api, agents) -> None:
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        driver: FakeDriver = agents[0].driver
        actions = actions_for(api)
        vm = booted(api, stores)
        actions.stop(ALICE, vm)
        assert wait_until(lambda: idle(stores, vm), timeout_s=5)
        record = stores.instances.get(vm)
        assert record.stopped and record.state == State.ACTIVE and record.host == "cn0"
        assert not driver.is_running(vm) and vm in driver.list_instances("cn0-0")
        assert stores.quota.get_usage("p1") == Usage(1, 1, 1024)  # it keeps what it holds
        actions.start(ALICE, vm)
        assert wait_until(lambda: idle(stores, vm), timeout_s=5)
        assert not stores.instances.get(vm).stopped and driver.is_running(vm)
        actions.reboot(ALICE, vm, hard=False)
        assert wait_until(lambda: driver.reboots.get(vm) == 1 and idle(stores, vm), 5)
        actions.stop(ALICE, vm)
        assert wait_until(lambda: idle(stores, vm), timeout_s=5)
        actions.reboot(ALICE, vm, hard=True)  # a hard reboot starts a stopped server
        assert wait_until(lambda: driver.reboots.get(vm) == 2 and idle(stores, vm), 5)
        assert not stores.instances.get(vm).stopped and driver.is_running(vm)
        names = [e.event for e in stores.instances.events(vm)]
        assert names.count("compute_stop_instance") == 2
        assert names.count("compute_reboot_instance") == 2

    def test_a_stopped_server_is_deleted_and_returns_its_quota(
        self, conf, stores, bus, api, agents
    ) -> None:
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        vm = booted(api, stores)
        actions_for(api).stop(ALICE, vm)
        assert wait_until(lambda: idle(stores, vm), timeout_s=5)
        api.delete(ALICE, vm)
        assert wait_until(lambda: stores.instances.get(vm).state == State.DELETED, 5)
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
        assert audit(stores).ok
        assert agents[0].driver.list_instances("cn0-0") == []

    def test_reconcile_leaves_a_stopped_server_stopped(self, conf, stores, bus, api, agents):
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        vm = booted(api, stores)
        actions_for(api).stop(ALICE, vm)
        assert wait_until(lambda: idle(stores, vm), timeout_s=5)
        report = agents[0].reconciler.run_all()
        assert not report.found_anything(), report.to_dict()
        assert stores.instances.get(vm).stopped
        assert not agents[0].driver.is_running(vm)

    def test_a_stop_racing_a_delete_ends_deleted(self, conf, stores, bus, api, agents) -> None:
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        actions = actions_for(api)
        vms = [booted(api, stores, f"vm{i}") for i in range(4)]
        errors: list[Exception] = []

        def stop(vm: str) -> None:
            try:
                actions.stop(ALICE, vm)
            except exception.Conflict as exc:  # the delete came first: 409, as Nova's
                errors.append(exc)

        for vm in vms:
            thread = threading.Thread(target=stop, args=(vm,))
            thread.start()
            api.delete(ALICE, vm)
            thread.join()
        gone = lambda: all(stores.instances.get(v).state == State.DELETED for v in vms)  # noqa: E731
        assert wait_until(gone, timeout_s=10)
        assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
        assert audit(stores).ok
        assert agents[0].driver.list_instances("cn0-0") == []
        assert all("task_state deleting" in str(e) for e in errors), errors

    def test_an_action_whose_agent_is_down_is_refused(self, conf, stores, bus, api, agents):
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        vm = booted(api, stores)
        agents.pop().stop(timeout_s=5)  # its heartbeat is gone
        with pytest.raises(AgentDown) as refused:
            actions_for(api).stop(ALICE, vm)
        assert str(refused.value) == (
            f"Cannot 'stop' instance {vm}: the compute service of its host is down"
        )
        assert idle(stores, vm) and not stores.instances.get(vm).stopped


class TestLostRequests:
    """An action whose request never reaches the agent: its sweep does it."""

    def test_the_sweep_does_an_action_whose_request_was_lost(
        self, conf, stores, bus, api, agents
    ) -> None:
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        vm = booted(api, stores)
        # the API died between the ledger and the broker
        stores.instances.start_action(vm, "stop", "req-lost", "u1", "p1")
        assert stores.instances.acting("cn0") == [vm]
        assert agents[0].actions.finish_stuck(started_before=0.0) == 0  # not old enough
        assert agents[0].actions.finish_stuck() == 1
        record = stores.instances.get(vm)
        assert record.stopped and record.task_state == TaskState.NONE
        assert not agents[0].driver.is_running(vm)
        assert stores.instances.acting("cn0") == []
        _inst, found = actions_for(api).list_actions(ALICE, vm)
        (stop,) = [a for a in found if a.request_id == "req-lost"]
        assert stop.action == "stop" and stop.events[0].result == "Success"

    def test_the_sweep_forgets_what_moved_on(self, conf, stores, bus, api, agents) -> None:
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        vm = booted(api, stores)
        stores.instances.start_action(vm, "reboot_soft", "req-1", "u1", "p1")
        assert not stores.instances.forget_action("cn0", vm)  # it is under way: kept
        api.delete(ALICE, vm)
        assert wait_until(lambda: stores.instances.get(vm).state == State.DELETED, 5)
        assert agents[0].actions.finish_stuck() == 0
        assert stores.instances.acting("cn0") == []
        assert agents[0].driver.reboots.get(vm) is None


class TestStates:
    """Nova's state rules, on a placed record (no agent: nothing settles the actions)."""

    @pytest.fixture
    def vm(self, stores, api) -> str:
        uuid_ = api.boot(ALICE, "vm", "small").uuid
        place(stores, uuid_, "cn1")
        stores.agents.heartbeat("cn1", 3600)
        return uuid_

    def test_wrong_states_are_409_in_novas_words(self, api, stores, vm) -> None:
        actions = actions_for(api)
        with pytest.raises(exception.InstanceInvalidState) as refused:
            actions.start(ALICE, vm)
        assert str(refused.value) == f"Cannot 'start' instance {vm} while it is in vm_state active"
        actions.stop(ALICE, vm)
        assert stores.instances.get(vm).task_state == TaskState.POWERING_OFF
        for act, name in ((actions.stop, "stop"), (actions.start, "start")):
            with pytest.raises(exception.InstanceInvalidState) as refused:
                act(ALICE, vm)
            assert str(refused.value) == (
                f"Cannot '{name}' instance {vm} while it is in "
                + ("task_state powering-off" if name == "stop" else "vm_state active")
            )
        with pytest.raises(exception.InstanceInvalidState, match="task_state powering-off"):
            actions.reboot(ALICE, vm, hard=True)

    def test_a_building_server_is_not_ready_or_building(self, api, stores) -> None:
        waiting = api.boot(ALICE, "vm", "small").uuid
        with pytest.raises(exception.InstanceNotReady, match=f"Instance {waiting} is not ready"):
            actions_for(api).stop(ALICE, waiting)
        claimed = api.boot(ALICE, "vm2", "small").uuid
        place(stores, claimed, "cn1", active=False)
        stores.agents.heartbeat("cn1", 3600)
        with pytest.raises(exception.InstanceInvalidState, match="vm_state building"):
            actions_for(api).reboot(ALICE, claimed, hard=False)

    def test_hard_reboot_takes_over_a_soft_one(self, api, stores, vm) -> None:
        actions = actions_for(api)
        actions.reboot(ALICE, vm, hard=False)
        with pytest.raises(exception.InstanceInvalidState, match="task_state rebooting"):
            actions.reboot(ALICE, vm, hard=False)
        actions.reboot(ALICE, vm, hard=True)
        assert stores.instances.get(vm).task_state == TaskState.REBOOTING_HARD
        assert [m.action for _h, m in api.cell.bus.actions] == ["reboot_soft", "reboot_hard"]

    def test_two_stops_at_once_never_both_go(self, api, stores, vm) -> None:
        actions = actions_for(api)
        outcomes: list[str] = []
        barrier = threading.Barrier(8)

        def stop() -> None:
            barrier.wait()
            try:
                actions.stop(ALICE, vm)
                outcomes.append("stopped")
            except exception.InstanceInvalidState:
                outcomes.append("refused")

        threads = [threading.Thread(target=stop) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["refused"] * 7 + ["stopped"]
        assert len(api.cell.bus.actions) == 1

    def test_another_projects_server_is_not_found(self, api, vm) -> None:
        with pytest.raises(exception.InstanceNotFound):
            actions_for(api).stop(BOB, vm)

    def test_a_publish_that_fails_undoes_the_task_state(self, api, stores, vm) -> None:
        api.cell.bus.fail = True
        with pytest.raises(BusUnavailable):
            actions_for(api).stop(ALICE, vm)
        assert idle(stores, vm) and not stores.instances.get(vm).stopped
        (stop,) = [a for a in actions_of(stores.instances.get(vm), stores.instances.events(vm))
                   if a.action == "stop"]  # fmt: skip
        assert stop.message == "Error" and stop.events[0].result == "Error"

    def test_a_policy_file_overrides_the_rule(self, stores, vm, tmp_path) -> None:
        rules = tmp_path / "policy.yaml"
        rules.write_text('"os_compute_api:servers:stop": "!"\n')
        config = tmp_path / "qsched.conf"
        config.write_text(f"[oslo_policy]\npolicy_file = {rules}\n")
        policy = Policy(policy_enforcer(qconf.load([], [str(config)])))
        actions = ServerActions(stores, RecordingBus(), policy)
        with pytest.raises(exception.Forbidden):
            actions.stop(ALICE, vm)
        assert idle(stores, vm)

    @pytest.fixture
    def api(self, conf, stores) -> ComputeAPI:
        """The front door on a recording bus, so published actions can be read."""
        compute = ComputeAPI(stores, RecordingBus(), SchedulerOptions.from_conf(conf),
                             APIOptions.from_conf(conf))  # fmt: skip
        compute.cell.flavors.create(Flavor("small", 1, 1024, 0))
        stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        return compute


class TestAgentStep:
    """The agent's step alone, on a placed record and a fake driver."""

    @pytest.fixture
    def placed(self, stores, api) -> tuple[str, FakeDriver]:
        uuid_ = api.boot(ALICE, "vm", "small").uuid
        driver = FakeDriver(1, host="cn1")
        node = "cn1-0"
        driver.spawn(uuid_, node, api.get_flavor("small"))
        rp = driver.node(node).root.uuid
        stores.ledger.create_provider(rp, node)
        stores.ledger.set_inventory(rp, 0, {"VCPU": Inventory(8), "MEMORY_MB": Inventory(8192)})
        stores.ledger.claim(uuid_, {rp: {"VCPU": 1, "MEMORY_MB": 1024}}, "cn1", node)
        stores.instances.set_active(uuid_, "cn1", node)
        return uuid_, driver

    def step(self, stores, driver) -> ActionStep:
        return ActionStep(stores, driver, "cn1", Counter())

    def start(self, stores, uuid_: str, action: str) -> ActionRequest:
        host, node = stores.instances.start_action(uuid_, action, "req-1", "u1", "p1")
        return ActionRequest("req-1", uuid_, host, node, action)

    def test_a_driver_failure_settles_in_error(self, stores, placed) -> None:
        vm, driver = placed
        msg = self.start(stores, vm, "stop")
        driver.destroy(vm, "cn1-0")  # the hypervisor lost it
        assert self.step(stores, driver).run(msg) == "failed"
        record = stores.instances.get(vm)
        assert record.task_state == TaskState.NONE and not record.stopped
        (event,) = [e for e in stores.instances.events(vm) if e.event == "compute_stop_instance"]
        assert event.detail["result"] == "Error" and "could not be found" in event.detail["message"]

    def test_each_action_is_told_once_with_novas_names_and_states(self, stores, placed):
        """``.start`` and ``.end`` of each action, from the settle's atomic step: a
        second delivery of a settled request sends nothing more."""
        vm, driver = placed
        recorder = RecordingNotifier()
        step = ActionStep(stores, driver, "cn1", Counter(), recorder)
        for action in ("stop", "start", "reboot_hard"):
            msg = self.start(stores, vm, action)
            assert step.run(msg) == "done"
            assert step.run(msg) == "dropped"
        told = [(event, p["nova_object.data"]) for _prio, event, p in recorder.sent]
        assert [e for e, _ in told] == [
            "instance.power_off.start", "instance.power_off.end",
            "instance.power_on.start", "instance.power_on.end",
            "instance.reboot.start", "instance.reboot.end",
        ]  # fmt: skip
        states = [(d["state"], d["task_state"], d["power_state"]) for _, d in told]
        assert states == [
            ("active", "powering-off", "running"), ("stopped", None, "shutdown"),
            ("stopped", "powering-on", "shutdown"), ("active", None, "running"),
            ("active", "reboot_started_hard", "running"), ("active", None, "running"),
        ]  # fmt: skip
        assert {p["nova_object.name"] for _, _, p in recorder.sent} == {"InstanceActionPayload"}
        assert all(d["uuid"] == vm and d["host"] == "cn1" and d["request_id"] == "req-1"
                   for _, d in told)  # fmt: skip

    @pytest.mark.parametrize("mode", [updates.VM_STATE, updates.VM_AND_TASK_STATE])
    def test_each_actions_state_changes_are_told_as_instance_updates(self, stores, placed, mode):
        vm, driver = placed
        recorder = RecordingNotifier()
        step = ActionStep(stores, driver, "cn1", Counter(),
                          updates.StateChangeNotifier(recorder, mode))  # fmt: skip
        for action in ("stop", "start", "reboot_soft"):
            assert step.run(self.start(stores, vm, action)) == "done"
        changes = []
        for _prio, event, payload in recorder.sent:
            if event == "instance.update":
                told = payload["nova_object.data"]["state_update"]["nova_object.data"]
                changes.append((told["old_state"], told["state"], told["old_task_state"],
                                told["new_task_state"]))  # fmt: skip
        if mode == updates.VM_STATE:  # only the vm_state changes, with the current task
            assert changes == [("active", "stopped", None, None),
                               ("stopped", "active", None, None)]  # fmt: skip
        else:
            assert changes == [
                ("active", "active", None, "powering-off"),
                ("active", "stopped", "powering-off", None),
                ("stopped", "stopped", None, "powering-on"),
                ("stopped", "active", "powering-on", None),
                ("active", "active", None, "reboot_started"),
                ("active", "active", "reboot_started", None),
            ]  # fmt: skip

    def test_a_failed_reboot_tells_its_fault_and_a_failed_stop_no_end(self, stores, placed):
        vm, driver = placed
        recorder = RecordingNotifier()
        step = ActionStep(stores, driver, "cn1", Counter(), recorder)
        driver.destroy(vm, "cn1-0")  # the hypervisor lost it
        assert step.run(self.start(stores, vm, "reboot_soft")) == "failed"
        assert step.run(self.start(stores, vm, "stop")) == "failed"
        told = [(prio, event) for prio, event, _ in recorder.sent]
        assert told == [("INFO", "instance.reboot.start"), ("ERROR", "instance.reboot.error"),
                        ("INFO", "instance.power_off.start")]  # fmt: skip
        fault = recorder.sent[1][2]["nova_object.data"]["fault"]["nova_object.data"]
        assert "could not be found" in fault["exception_message"]
        assert fault["exception"] and fault["module_name"] == "agents.virt.fake"

    def test_a_redelivered_reboot_finishes(self, stores, placed) -> None:
        vm, driver = placed
        msg = self.start(stores, vm, "reboot_soft")
        assert stores.instances.step_action(vm, "cn1", TaskState.REBOOTING,
                                            TaskState.REBOOT_STARTED)  # fmt: skip
        assert self.step(stores, driver).run(msg) == "done"  # as after a crash there
        assert idle(stores, vm) and driver.reboots[vm] == 1
        assert self.step(stores, driver).run(msg) == "dropped"  # once more: nothing to do
        assert driver.reboots[vm] == 1

    def test_an_action_a_delete_took_over_is_dropped(self, stores, placed) -> None:
        vm, driver = placed
        msg = self.start(stores, vm, "stop")
        stores.instances.mark_deleting(vm)
        assert self.step(stores, driver).run(msg) == "dropped"
        assert driver.is_running(vm)
        assert stores.instances.get(vm).task_state == TaskState.DELETING

    def test_an_action_for_another_host_is_dead_lettered(self, conf, stores, bus, agents):
        agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
        msg = ActionRequest("req-1", str(uuid.uuid4()), "cn9", "cn9-0", "stop")
        delivery = RecordingDelivery()
        agents[0].on_message(msg.encode(), delivery)
        ((how, reason),) = delivery.settled
        assert how == "reject" and "for host cn9" in reason


def test_action_requests_round_trip_and_refuse_bad_fields() -> None:
    msg = ActionRequest("req-1", str(uuid.uuid4()), "cn1", "cn1-0", "reboot_hard")
    assert decode(msg.encode()) == msg
    for bad in ("", "pause", None):
        wire = ActionRequest("req-1", msg.instance_uuid, "cn1", "cn1-0", bad)
        with pytest.raises(PoisonMessage, match="field 'action' must be one of"):
            decode(wire.encode())


# -- HTTP ---------------------------------------------------------------------------------


def http_server(client, stores: Stores, host: str = "cn1") -> str:
    body = {"server": {"name": "vm1", "flavorRef": "m1.small", "imageRef": IMAGE}}
    result = client.simulate_post("/v2.1/servers", json=body, headers=USER)
    assert result.status_code == 202, result.text
    uuid_ = result.json["server"]["id"]
    place(stores, uuid_, host)
    stores.agents.heartbeat(host, 3600)
    return uuid_


def act(client, server: str, body: Any, headers=USER, version: str | None = None):
    headers = {**headers, **({"OpenStack-API-Version": f"compute {version}"} if version else {})}
    return client.simulate_post(f"/v2.1/servers/{server}/action", json=body, headers=headers)


def get(client, path: str, headers=USER, version: str | None = None, query: str | None = None):
    headers = {**headers, **({"OpenStack-API-Version": f"compute {version}"} if version else {})}
    return client.simulate_get(f"/v2.1{path}", headers=headers, query_string=query)


def settle(stores: Stores, server: str, expect: TaskState, power: str) -> None:
    """Do what the host's agent does when its driver is done."""
    assert stores.instances.step_action(
        server, "cn1", expect, TaskState.NONE, power, "compute_stop_instance",
        request_id=_last_request(stores, server), result="Success", start=None, message=None,
    )  # fmt: skip


def _last_request(stores: Stores, server: str) -> str:
    return [e for e in stores.instances.events(server) if e.event == "action"][-1].detail[
        "request_id"
    ]


class TestHTTP:
    def test_stop_is_202_with_no_body_and_shows_in_the_server(self, client, stores, rbus):
        server = http_server(client, stores)
        result = act(client, server, {"os-stop": None})
        assert result.status_code == 202 and result.content == b""
        ((host, msg),) = rbus.actions
        assert (host, msg.action, msg.instance_uuid) == ("cn1", "stop", server)
        view = get(client, f"/servers/{server}").json["server"]
        assert (view["status"], view["OS-EXT-STS:task_state"]) == ("ACTIVE", "powering-off")
        settle(stores, server, TaskState.POWERING_OFF, "off")
        view = get(client, f"/servers/{server}").json["server"]
        assert view["status"] == "SHUTOFF" and view["OS-EXT-STS:vm_state"] == "stopped"
        assert view["OS-EXT-STS:power_state"] == 4 and view["OS-EXT-STS:task_state"] is None
        message = fault(act(client, server, {"os-stop": {}}), 409, "conflictingRequest")
        assert message == f"Cannot 'stop' instance {server} while it is in vm_state stopped"

    def test_reboot_statuses(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        assert act(client, server, {"reboot": {"type": "soft"}}).status_code == 202
        assert get(client, f"/servers/{server}").json["server"]["status"] == "REBOOT"
        assert act(client, server, {"reboot": {"type": "HARD"}}).status_code == 202
        view = get(client, f"/servers/{server}").json["server"]
        assert (view["status"], view["OS-EXT-STS:task_state"]) == ("HARD_REBOOT", "rebooting_hard")
        assert [m.action for _h, m in rbus.actions] == ["reboot_soft", "reboot_hard"]

    @pytest.mark.parametrize(
        ("body", "words"),
        [
            ({"pause": None}, "There is no such action: pause. qsched serves the server actions "
                              "os-stop, os-start, reboot, resize, confirmResize, revertResize, "
                              "migrate, evacuate, os-migrateLive, shelve, shelveOffload, "
                              "unshelve, rebuild."),
            ({"resize": {}}, "Invalid input for field/attribute resize"),
            ({"confirmResize": {}}, "Invalid input for field/attribute confirmResize"),
            ({"os-stop": None, "os-start": None}, "Name one action per request"),
            ({"reboot": {"type": "WARM"}}, "Invalid input for field/attribute reboot/type"),
            ({"reboot": {}}, "Invalid input for field/attribute reboot"),
            ({"reboot": {"type": "HARD", "force": True}}, "Invalid input for field/attribute"),
            ({}, "naming one of"),
            ([], "naming one of"),
        ],
    )  # fmt: skip
    def test_bad_bodies_are_400(self, client, stores, rbus, body, words) -> None:
        server = http_server(client, stores)
        assert words in fault(act(client, server, body), 400, "badRequest")
        assert rbus.actions == [] and idle(stores, server)

    def test_unknown_and_others_servers_are_404(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        fault(act(client, server, {"os-stop": None}, headers=OTHER), 404, "itemNotFound")
        fault(act(client, str(uuid.uuid4()), {"os-stop": None}), 404, "itemNotFound")
        fault(act(client, "not-a-uuid", {"os-stop": None}), 404, "itemNotFound")
        assert act(client, server, {"os-stop": None}, headers=ADMIN).status_code == 202

    def test_a_reader_may_not_stop(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        reader = {**USER, "X-Roles": "reader"}
        fault(act(client, server, {"os-stop": None}, headers=reader), 403, "forbidden")
        assert get(client, f"/servers/{server}/os-instance-actions", reader).status_code == 200

    def test_instance_actions_by_microversion(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        act(client, server, {"os-stop": None})
        settle(stores, server, TaskState.POWERING_OFF, "off")
        listed = get(client, f"/servers/{server}/os-instance-actions").json["instanceActions"]
        assert [a["action"] for a in listed] == ["stop", "create"]
        assert set(listed[0]) == {"action", "instance_uuid", "request_id", "user_id",
                                  "project_id", "start_time", "message"}  # fmt: skip
        assert listed[0]["user_id"] == "alice" and listed[0]["project_id"] == "pa"
        stop = listed[0]["request_id"]
        path = f"/servers/{server}/os-instance-actions/{stop}"
        assert "events" not in get(client, path, version="2.50").json["instanceAction"]
        (event,) = get(client, path, version="2.51").json["instanceAction"]["events"]
        assert event["event"] == "compute_stop_instance" and event["result"] == "Success"
        assert "traceback" not in event and "hostId" not in event
        (event,) = get(client, path, version="2.62").json["instanceAction"]["events"]
        assert len(event["hostId"]) == 56 and "host" not in event
        (event,) = get(client, path, ADMIN, version="2.62").json["instanceAction"]["events"]
        assert event["host"] == "cn1" and event["traceback"] is None
        (event,) = get(client, path, ADMIN).json["instanceAction"]["events"]  # admins: 2.1 too
        assert "host" not in event
        assert "updated_at" in get(client, path, version="2.58").json["instanceAction"]
        fault(get(client, f"/servers/{server}/os-instance-actions/req-nope"), 404, "itemNotFound")

    def test_paging_and_windows_from_2_58(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        act(client, server, {"os-stop": None})
        actions = f"/servers/{server}/os-instance-actions"
        page = get(client, actions, version="2.58", query="limit=1").json
        (newest,) = page["instanceActions"]
        assert newest["action"] == "stop" and "updated_at" in newest
        assert f"marker={newest['request_id']}" in page["links"][0]["href"]
        rest = get(client, actions, version="2.58", query=f"marker={newest['request_id']}").json
        assert [a["action"] for a in rest["instanceActions"]] == ["create"]
        later = get(client, actions, version="2.58", query="changes-since=2999-01-01T00:00:00Z")
        assert later.json["instanceActions"] == []
        before = "changes-before=2999-01-01T00:00:00Z"
        assert len(get(client, actions, version="2.66", query=before).json["instanceActions"]) == 2
        for version, query, words in (
            ("2.1", "limit=1", "none before microversion 2.58"),
            ("2.58", "changes-before=2000-01-01T00:00:00Z", "only limit, marker, changes-since"),
            ("2.58", "marker=req-nope", "Marker req-nope could not be found."),
            ("2.58", "changes-since=yesterday", "is not a 'date-time'"),
            ("2.58", "limit=-1", "limit"),
            ("2.66", "changes-since=2001-01-01T00:00:00Z&changes-before=2000-01-01T00:00:00Z",
             "changes-since must be less than or equal to changes-before"),
        ):  # fmt: skip
            result = get(client, actions, version=version, query=query)
            assert words in fault(result, 400, "badRequest"), (version, query)

    def test_a_deleted_servers_actions_from_2_21(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        stores.agents.forget("cn1")  # its agent is down: deleted here at once
        assert client.simulate_delete(f"/v2.1/servers/{server}", headers=USER).status_code == 204
        actions = f"/servers/{server}/os-instance-actions"
        fault(get(client, actions, version="2.20"), 404, "itemNotFound")
        listed = get(client, actions, version="2.21").json["instanceActions"]
        assert [a["action"] for a in listed] == ["delete", "create"]
        delete = listed[0]["request_id"]
        shown = get(client, f"{actions}/{delete}", version="2.51").json["instanceAction"]
        assert [(e["event"], e["result"]) for e in shown["events"]] == [
            ("compute_terminate_instance", "Success")
        ]

    def test_the_create_action_follows_the_build(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        actions = f"/servers/{server}/os-instance-actions"
        (create,) = get(client, actions).json["instanceActions"]
        shown = get(client, f"{actions}/{create['request_id']}", version="2.51").json
        events = {e["event"]: e["result"] for e in shown["instanceAction"]["events"]}
        assert events == {"conductor_schedule_and_build_instances": "Success",
                          "compute__do_build_and_run_instance": "Success"}  # fmt: skip


def test_filters_page_newest_first(stores, api) -> None:
    vm = api.boot(ALICE, "vm", "small").uuid
    actions = ServerActions(stores, RecordingBus(), api.policy, max_limit=1)
    _inst, found = actions.list_actions(ALICE, vm, filters=ActionFilter(limit=5))
    assert [a.action for a in found] == ["create"]  # max_limit caps the page


# -- Nova's api_samples (the nova package ships them) ---------------------------------------


#: the sample directories of os-instance-actions up to 2.79, and their microversion
SAMPLE_VERSIONS = [("", "2.1"), ("v2.21", "2.21"), ("v2.51", "2.51"), ("v2.58", "2.58"),
                   ("v2.62", "2.62"), ("v2.66", "2.66")]  # fmt: skip


def sample(*parts: str) -> Any:
    """A sample template as :func:`tests.samples.shape` reads it."""
    return shape(samples_dir().joinpath(*parts).read_text())


def same_shape(ours: Any, theirs: Any) -> None:
    """Every key of the sample, no other, each value of the sample's type, every list
    the sample fills filled and each item like the sample's."""
    assert mismatches(ours, theirs, exact=True) == []


@needs_samples
@pytest.mark.parametrize("action", ["os-stop", "os-start"])
def test_novas_stop_and_start_requests_are_taken(client, stores, rbus, action) -> None:
    server = http_server(client, stores)
    if action == "os-start":
        act(client, server, {"os-stop": None})
        settle(stores, server, TaskState.POWERING_OFF, "off")
    body = json.loads(
        SAMPLES.joinpath("servers", "server-action-stop.json.tpl")
        .read_text()
        .replace("%(action)s", action)
    )
    assert act(client, server, body).status_code == 202


@needs_samples
@pytest.mark.parametrize("kind", ["HARD", "SOFT"])
def test_novas_reboot_request_is_taken(client, stores, rbus, kind) -> None:
    server = http_server(client, stores)
    text = SAMPLES.joinpath("servers", "server-action-reboot.json.tpl").read_text()
    assert act(client, server, json.loads(text.replace("%(type)s", kind))).status_code == 202


@needs_samples
@pytest.mark.parametrize(("directory", "version"), SAMPLE_VERSIONS)
def test_instance_actions_answer_as_novas_samples(client, stores, rbus, directory, version):
    server = http_server(client, stores)
    act(client, server, {"os-stop": None})
    settle(stores, server, TaskState.POWERING_OFF, "off")
    actions = f"/servers/{server}/os-instance-actions"
    listed = get(client, actions, version=version).json
    same_shape(
        listed, sample("os-instance-actions", directory, "instance-actions-list-resp.json.tpl")
    )
    stop = listed["instanceActions"][0]["request_id"]
    shown = get(client, f"{actions}/{stop}", ADMIN, version=version).json
    same_shape(shown, sample("os-instance-actions", directory, "instance-action-get-resp.json.tpl"))
    non_admin = (
        SAMPLES / "os-instance-actions" / directory / "instance-action-get-non-admin-resp.json.tpl"
    )
    if non_admin.exists():
        mine = get(client, f"{actions}/{stop}", version=version).json
        same_shape(mine, sample("os-instance-actions", directory, non_admin.name))
    if tuple(map(int, version.split("."))) >= (2, 58):
        page = get(client, actions, version=version, query="limit=1").json
        same_shape(page, sample("os-instance-actions", directory,
                                "instance-actions-list-with-limit-resp.json.tpl"))  # fmt: skip


def test_the_fake_driver_keeps_the_power_in_its_state_file(tmp_path) -> None:
    state = tmp_path / "vms"
    driver = FakeDriver(1, host="cn1", state_path=state)
    flavor = Flavor("small", 1, 1024, 0)
    off, on = str(uuid.uuid4()), str(uuid.uuid4())
    for vm in (off, on):
        driver.spawn(vm, "cn1-0", flavor)
        driver.power_off(vm, "cn1-0")
    driver.power_on(on, "cn1-0")
    with pytest.raises(exception.Invalid, match="is off"):
        driver.reboot(off, "cn1-0", hard=False)  # no guest runs to restart itself
    with pytest.raises(exception.InstanceNotFound):
        driver.power_off(str(uuid.uuid4()), "cn1-0")
    driver.close()
    assert read_state(state) == {off: "cn1-0", on: "cn1-0"}  # the power lines are skipped
    again = FakeDriver(1, host="cn1", state_path=state)  # the agent restarted
    assert not again.is_running(off) and again.is_running(on)
    again.close()
    third = FakeDriver(1, host="cn1", state_path=state)  # compacted, still off
    assert not third.is_running(off)
    third.destroy(off, "cn1-0")
    third.close()
    assert read_state(state) == {on: "cn1-0"}


def test_the_status_filter_finds_stopped_and_rebooting_servers(client, stores, rbus) -> None:
    stopped, rebooting = http_server(client, stores), http_server(client, stores)
    act(client, stopped, {"os-stop": None})
    settle(stores, stopped, TaskState.POWERING_OFF, "off")
    act(client, rebooting, {"reboot": {"type": "SOFT"}})

    def found(status: str) -> set[str]:
        result = get(client, "/servers", query=f"status={status}")
        return {s["id"] for s in result.json["servers"]}

    assert found("SHUTOFF") == {stopped}
    assert found("REBOOT") == {rebooting}
    assert found("ACTIVE") == {rebooting}  # as Nova's: ACTIVE is the vm_state, any task
    assert found("HARD_REBOOT") == set()
