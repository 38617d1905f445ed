"""Rebuild through the agents (docs/moves.rst, "Rebuild"): on its own host, from a new
image, a stopped server staying stopped, a failed one ending ERROR with nothing held, an
image whose traits the host lacks refused, and Nova's answers over HTTP.

The front door and the agents run in one process (memory bus, fakeredis ledger and a
real Redis, as ``stores`` gives them).
"""

from __future__ import annotations

import pytest

from agents.service import ComputeAgent
from qsched.compute.api import ComputeAPI
from qsched.compute.server_actions import (
    ImageTraitsUnsatisfied,
    PreserveEphemeralNotServed,
    Rebuild,
    status,
)
from qsched.images.base import Image, ImageNotFound
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State, Usage
from qsched.scheduling.records import details
from tests.agents.test_agent import make_agent
from tests.api.test_api import IMAGE, fault
from tests.compute.test_moves import USER, booted, quiet, runs, status_of
from tests.compute.test_server_actions import act, get, http_server
from tests.helpers import wait_until
from tests.images.test_images import NEEDS_AVX, Catalog

NEW = Image("44444444-4444-4444-8444-444444444444")


@pytest.fixture
def one(conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]) -> ComputeAgent:
    agent = make_agent(conf, stores, bus, "cn0", nodes=1, vcpus=8, ram_mb=16384)
    agents.append(agent)
    api.cell.actions.images = Catalog(NEW, NEEDS_AVX)
    return agent


def rebuilt(stores: Stores, vm: str) -> bool:
    record = stores.instances.get(vm)
    return record.task_state.value == "" and details(record).image_ref == NEW.id


def test_a_rebuild_spawns_the_server_again_on_its_host_from_the_new_image(
    stores: Stores, api: ComputeAPI, one: ComputeAgent
) -> None:
    vm = booted(api, stores)
    host = stores.instances.get(vm).host
    api.actions.rebuild(USER, vm, NEW.id, Rebuild(name="again", metadata={"k": "v"},
                                                  server={"description": "fresh"}))  # fmt: skip
    assert wait_until(lambda: rebuilt(stores, vm) and status_of(stores, vm) == "ACTIVE", 10)
    record = stores.instances.get(vm)
    boot = details(record)
    assert (record.host, record.name, dict(boot.metadata)) == (host, "again", {"k": "v"})
    assert boot.server.description == "fresh" and one.driver.rebuilds[vm] == NEW.id
    assert runs(one, vm) and stores.migrations.of_instance(vm) == []
    _instance, actions = api.actions.list_actions(USER, vm)
    assert [a.action for a in actions] == ["rebuild", "create"]
    assert [(e.event, e.result) for e in actions[0].events] == [
        ("compute_rebuild_instance", "Success")]  # fmt: skip
    assert audit(stores).ok
    quiet([one])


def test_a_stopped_server_rebuilt_stays_stopped(
    stores: Stores, api: ComputeAPI, one: ComputeAgent
) -> None:
    vm = booted(api, stores)
    api.actions.stop(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHUTOFF", 10)
    api.actions.rebuild(USER, vm, NEW.id)
    assert wait_until(lambda: rebuilt(stores, vm), 10)
    assert status_of(stores, vm) == "SHUTOFF" and one.driver.rebuilds[vm] == NEW.id


def test_a_rebuild_that_fails_ends_the_server_in_error_holding_nothing(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    agent = make_agent(conf, stores, bus, "cn0", nodes=1, vcpus=8, ram_mb=16384)
    agents.append(agent)
    api.cell.actions.images = Catalog(NEW)
    vm = booted(api, stores)
    agent.driver.failure_rate = 1.0  # every spawn from now on fails
    api.actions.rebuild(USER, vm, NEW.id)
    assert wait_until(lambda: stores.instances.get(vm).state == State.ERROR, 10)
    record = stores.instances.get(vm)
    assert record.fault is not None and "could not be rebuilt" in record.fault["message"]
    # the record ends before the agent's index lets go of the claim
    assert wait_until(lambda: agent.index.totals()["VCPU"][0] == 0, 10)
    assert not runs(agent, vm)
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0) and audit(stores).ok


def test_an_image_whose_traits_its_host_lacks_is_refused_and_nothing_changes(
    stores: Stores, api: ComputeAPI, one: ComputeAgent
) -> None:
    vm = booted(api, stores)
    before = stores.instances.get(vm)
    with pytest.raises(ImageTraitsUnsatisfied):
        api.actions.rebuild(USER, vm, NEEDS_AVX.id)
    with pytest.raises(ImageNotFound):
        api.actions.rebuild(USER, vm, "55555555-5555-4555-8555-555555555555")
    with pytest.raises(PreserveEphemeralNotServed):
        api.actions.rebuild(USER, vm, NEW.id, Rebuild(preserve_ephemeral=True))
    after = stores.instances.get(vm)
    assert (after.extra, after.task_state, status(after)) == (before.extra, before.task_state,
                                                              "ACTIVE")  # fmt: skip


class TestRebuildHTTP:
    def test_nova_shapes_and_answers(self, client, stores, rbus) -> None:
        server = http_server(client, stores)
        body = {"rebuild": {"imageRef": IMAGE, "name": "vm2", "metadata": {"a": "b"}}}
        done = act(client, server, body)
        assert done.status_code == 202, done.text
        shown = done.json["server"]
        assert (shown["id"], shown["name"], shown["status"]) == (server, "vm2", "REBUILD")
        assert shown["metadata"] == {"a": "b"} and len(shown["adminPass"]) == 12  # generated
        assert [(h, m.action) for h, m in rbus.actions] == [("cn1", "rebuild")]
        full = act(client, server, body, version="2.75")
        assert "task_state rebuilding" in fault(full, 409, "conflictingRequest")
        view = get(client, f"/servers/{server}").json["server"]
        assert view["OS-EXT-STS:task_state"] == "rebuilding"
        fault(act(client, server, {"rebuild": {"name": "x"}}), 400, "badRequest")  # no image
        kept = {"rebuild": {"imageRef": IMAGE, "personality": [{"path": "/a", "contents": ""}]}}
        assert "personality" in fault(act(client, server, kept), 400, "badRequest")
        later = {"rebuild": {"imageRef": IMAGE, "personality": []}}
        fault(act(client, server, later, version="2.57"), 400, "badRequest")  # gone in 2.57
