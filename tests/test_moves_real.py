"""Moves end to end on real servers, as separate processes (docs/moves.rst).

The API under gunicorn, two ``qsched-agent`` processes of two fake nodes each whose
drivers keep what runs in a state file (so a killed agent comes back with its VMs),
the ledger a real Redis, the bus RabbitMQ or kombu's Redis transport. Every move goes
through HTTP as a client's, and leaves no trace on the host it left.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.virt.fake import read_state
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from tests.cloud import Cloud, transport_url
from tests.conftest import real_redis
from tests.helpers import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(240)]

USER, ADMIN = "u1:pmoves", "admin"
FLAVORS = {"api": {"flavor": ["small:1:1024:0", "medium:2:2048:0"]}}


class Moving:
    """A started cloud and what its agents' drivers run."""

    def __init__(self, cloud: Cloud, states: dict[int, Path]) -> None:
        self.cloud = cloud
        self.states = states

    def boot(self) -> str:
        status, body = self.cloud.boot(token=USER)
        assert status == 202, body
        uuid = body["server"]["id"]
        self.cloud.settle([uuid])
        assert self.cloud.state(uuid) == State.ACTIVE, self.cloud.tail_logs()
        return uuid

    def act(self, uuid: str, body: dict[str, Any], token: str = USER, version: str | None = None):
        path = f"/v2.1/servers/{uuid}/action"
        return self.cloud.request("POST", path, body, token, version)

    def show(self, uuid: str) -> dict[str, Any]:
        return self.cloud.request("GET", f"/v2.1/servers/{uuid}", token=ADMIN)[1]["server"]

    def wait_status(self, uuid: str, status: str) -> dict[str, Any]:
        moves = self.cloud.stores.migrations.of_instance
        assert wait_until(lambda: self.show(uuid)["status"] == status, 30), (
            self.show(uuid)["status"], moves(uuid), self.cloud.tail_logs())  # fmt: skip
        return self.show(uuid)

    def index(self, host: str) -> int:
        return next(i for i in range(self.cloud.agent_count) if self.cloud.host(i) == host)

    def runs_on(self, uuid: str) -> set[str]:
        """The hosts whose driver runs the server, from their state files."""
        return {self.cloud.host(i) for i, path in self.states.items()
                if path.exists() and uuid in read_state(path)}  # fmt: skip

    def settled(self, uuid: str) -> None:
        """The server on one host only, as the ledger has it, and the ledger whole."""
        record = self.cloud.stores.instances.get(uuid)
        assert record.migration is None
        assert wait_until(lambda: self.runs_on(uuid) == {record.host}, 15), self.runs_on(uuid)
        assert audit(self.cloud.stores).ok


@pytest.fixture(scope="module", params=["rabbitmq", "redis"])
def moving(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Moving]:
    directory = tmp_path_factory.mktemp(f"moves-{request.param}")
    ledger = real_redis()
    transport = transport_url(request.param)
    ledger.flushdb()
    cloud = Cloud(directory, transport, options=FLAVORS, timeout_s=30)
    states = {i: directory / f"agent{i}.state" for i in range(cloud.agent_count)}
    cloud.start(agent_options={i: {"fake_state_path": str(p)} for i, p in states.items()})
    cloud.stores.quota.set_limits("pmoves", instances=-1, cores=-1, ram_mb=-1)
    try:
        yield Moving(cloud, states)
    finally:
        cloud.shutdown()
        ledger.flushdb()


def test_resize_confirmed(moving: Moving) -> None:
    vm = moving.boot()
    source = moving.show(vm)["OS-EXT-SRV-ATTR:host"]
    assert moving.act(vm, {"resize": {"flavorRef": "medium"}})[0] == 202
    shown = moving.wait_status(vm, "VERIFY_RESIZE")
    assert shown["OS-EXT-SRV-ATTR:host"] != source and shown["flavor"]["id"] == "medium"
    assert moving.act(vm, {"confirmResize": None})[0] == 204
    assert wait_until(lambda: moving.cloud.stores.instances.get(vm).migration is None, 30)
    moving.settled(vm)
    assert moving.cloud.request("DELETE", f"/v2.1/servers/{vm}", token=USER)[0] == 204


def test_cold_migration_reverted(moving: Moving) -> None:
    vm = moving.boot()
    source = moving.show(vm)["OS-EXT-SRV-ATTR:host"]
    assert moving.act(vm, {"migrate": None}, ADMIN)[0] == 202
    moving.wait_status(vm, "VERIFY_RESIZE")
    assert moving.act(vm, {"revertResize": None})[0] == 202
    assert wait_until(lambda: moving.cloud.stores.instances.get(vm).migration is None, 30)
    assert moving.show(vm)["OS-EXT-SRV-ATTR:host"] == source
    moving.settled(vm)
    assert moving.cloud.request("DELETE", f"/v2.1/servers/{vm}", token=USER)[0] == 204


def test_live_migration(moving: Moving) -> None:
    vm = moving.boot()
    source = moving.show(vm)["OS-EXT-SRV-ATTR:host"]
    body = {"os-migrateLive": {"host": None, "block_migration": "auto"}}
    assert moving.act(vm, body, ADMIN, "2.25")[0] == 202
    assert wait_until(lambda: moving.show(vm)["OS-EXT-SRV-ATTR:host"] != source, 30)
    assert moving.wait_status(vm, "ACTIVE")["OS-EXT-STS:task_state"] is None
    moving.settled(vm)
    assert moving.cloud.request("DELETE", f"/v2.1/servers/{vm}", token=USER)[0] == 204


def test_shelve_offloads_and_unshelve_places_it_again(moving: Moving) -> None:
    vm = moving.boot()
    assert moving.act(vm, {"shelve": None})[0] == 202
    shown = moving.wait_status(vm, "SHELVED_OFFLOADED")  # shelved_offload_time 0: at once
    assert shown["OS-EXT-SRV-ATTR:host"] is None and shown["OS-EXT-STS:power_state"] == 0
    assert wait_until(lambda: moving.runs_on(vm) == set(), 15), moving.runs_on(vm)
    assert moving.cloud.stores.ledger.get_allocations(vm).allocations == {}
    assert audit(moving.cloud.stores).ok
    assert moving.act(vm, {"unshelve": None}, version="2.77")[0] == 202
    shown = moving.wait_status(vm, "ACTIVE")
    assert shown["OS-EXT-SRV-ATTR:host"] is not None and shown["OS-EXT-STS:power_state"] == 1
    assert wait_until(lambda: moving.cloud.stores.instances.get(vm).migration is None, 30)
    moving.settled(vm)
    actions = moving.cloud.request("GET", f"/v2.1/servers/{vm}/os-instance-actions",
                                   token=USER)[1]["instanceActions"]  # fmt: skip
    assert [a["action"] for a in actions] == ["unshelve", "shelve", "create"]
    assert moving.cloud.request("DELETE", f"/v2.1/servers/{vm}", token=USER)[0] == 204


def test_rebuild_from_another_image_on_its_own_host(moving: Moving) -> None:
    vm = moving.boot()
    host = moving.show(vm)["OS-EXT-SRV-ATTR:host"]
    image = "7c1a0b2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
    status, body = moving.act(vm, {"rebuild": {"imageRef": image, "name": "again"}})
    assert status == 202 and body["server"]["name"] == "again", body
    shown = moving.wait_status(vm, "ACTIVE")
    assert (shown["image"]["id"], shown["OS-EXT-SRV-ATTR:host"]) == (image, host)
    assert wait_until(lambda: moving.cloud.stores.instances.get(vm).task_state.value == "", 30)
    moving.settled(vm)
    assert moving.cloud.request("DELETE", f"/v2.1/servers/{vm}", token=USER)[0] == 204


def test_evacuate_after_its_agent_was_killed_then_back_leaves_no_trace(moving: Moving) -> None:
    cloud = moving.cloud
    vm = moving.boot()
    source = moving.show(vm)["OS-EXT-SRV-ATTR:host"]
    index = moving.index(source)
    cloud.kill_agent(index, signal.SIGKILL)
    services = cloud.request("GET", f"/v2.1/os-services?host={source}", token=ADMIN,
                             version="2.53")[1]["services"]  # fmt: skip
    service = f"/v2.1/os-services/{services[0]['id']}"
    down = cloud.request("PUT", service, {"forced_down": True}, ADMIN, "2.53")
    assert down[0] == 200, down
    status, body = moving.act(vm, {"evacuate": {}}, ADMIN, "2.68")
    assert status == 200, body
    assert wait_until(lambda: moving.show(vm)["OS-EXT-SRV-ATTR:host"] != source, 30)
    assert moving.wait_status(vm, "ACTIVE")["OS-EXT-STS:task_state"] is None
    (migration,) = cloud.stores.migrations.of_instance(vm)
    assert migration.status == "done"
    assert cloud.stores.ledger.held_claims(source) == {vm: migration.uuid}  # it may run there
    assert cloud.request("PUT", service, {"forced_down": False}, ADMIN, "2.53")[0] == 200
    cloud.start_agent(index, {"fake_state_path": str(moving.states[index])})
    # back, its agent reaps the old copy and lets go of what was held for it
    assert wait_until(lambda: cloud.stores.ledger.held_claims(source) == {}, 30), cloud.tail_logs()
    moving.settled(vm)
    assert cloud.request("DELETE", f"/v2.1/servers/{vm}", token=USER)[0] == 204
