"""Messages that disagree with the ledger: the record the front door wrote is the truth.

Anyone who can publish on the bus can write a well-formed boot or delete request. A
boot request that names a waiting instance with another flavor's class, flavor or
deadline, and a delete request for a server nobody asked to delete, are dead-lettered
with the reason, and nothing is claimed, spawned or destroyed: the instance is placed
with its own flavor when its own request comes, the server stays ACTIVE.

Every test runs on the embedded default (memory://, fakeredis) and on real servers
(RabbitMQ and Redis, marked ``real``: required under CI=true).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agents.service import ComputeAgent
from qsched.bus.base import DeadLetter
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State, TaskState
from qsched.scheduling.message import BootRequest, DeleteRequest
from qsched.stack.cleanup import forget_bus
from tests.agents.test_agent import make_agent
from tests.cloud import transport_url
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(90)

USER = RequestContext.for_project("u1", "p1")
SMALL = Flavor("small", 1, 1024, 0)  # as the api fixture (tests/conftest.py) makes them
HOST = "cn0"


def utc(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("rabbitmq", id="amqp", marks=pytest.mark.real),
    ]
)
def bus(request: pytest.FixtureRequest) -> Iterator[KombuBus]:
    """The embedded bus or RabbitMQ, under a prefix of this test's own."""
    url = "memory://" if request.param == "memory" else transport_url(request.param)
    options = KombuOptions(connect_timeout_s=2.0, poll_interval_s=0.05)
    bus = KombuBus(url, prefix=f"forged{uuid.uuid4().hex[:8]}", options=options)
    yield bus
    classes = sorted(bus.boot_classes())
    bus.close()
    if url != "memory://":
        assert not forget_bus(url, bus.names.prefix, classes, [HOST])


@dataclasses.dataclass
class Held:
    """The boot requests the front door made and did not publish (see :func:`boot_held`)."""

    requests: list[BootRequest] = dataclasses.field(default_factory=list)


def boot_held(api, bus: KombuBus, monkeypatch: pytest.MonkeyPatch, flavor: str) -> BootRequest:
    """Boot a server whose request the front door makes but does not publish: the test
    holds the instance's own request, so that only forged ones reach the agents first."""
    held = Held()
    monkeypatch.setattr(bus, "publish_boot", held.requests.append)
    booted = api.boot(USER, "held", flavor).uuid
    monkeypatch.undo()
    (request,) = held.requests
    assert request.instance_uuid == booted
    return request


def dead_letters(bus: KombuBus, letters: list[DeadLetter], count: int) -> bool:
    """Take the dead letters that came since into ``letters``; whether ``count`` did."""
    letters += bus.take_dead_letters()
    return len(letters) >= count


def waiting(stores: Stores, uuid_: str) -> bool:
    """Still BUILD without a host, holding nothing in the ledger."""
    inst = stores.instances.get(uuid_)
    held = stores.ledger.get_allocations(uuid_).allocations
    return inst.state == State.BUILD and inst.host is None and not held


def allocated(stores: Stores, uuid_: str) -> dict[str, int]:
    """What the instance holds, summed over its providers."""
    total: dict[str, int] = {}
    for amounts in stores.ledger.get_allocations(uuid_).allocations.values():
        for rc, amount in amounts.items():
            total[rc] = total.get(rc, 0) + amount
    return total


def start(conf, stores, bus, api, agents: list[ComputeAgent]) -> ComputeAgent:
    """One agent with room for the big flavor, consuming the small class already."""
    agent = make_agent(conf, stores, bus, HOST, nodes=1, vcpus=16, ram_mb=16384)
    agents.append(agent)
    warm = api.boot(USER, "warm", "small").uuid
    assert wait_until(lambda: stores.instances.get(warm).state == State.ACTIVE, 20)
    return agent


def test_a_forged_boot_is_dead_lettered_and_its_instance_placed_with_its_own_flavor(
    conf, stores, bus, api, agents, monkeypatch
) -> None:
    """The independent check's case: a waiting instance of a big flavor, and a boot
    request for it on the small flavor's queue with the small flavor in it. It was
    claimed and went ACTIVE holding one VCPU; now the claim refuses it."""
    agent = start(conf, stores, bus, api, agents)
    spawned: dict[str, Flavor] = {}
    spawn = agent.driver.spawn

    def spawn_noting(instance_uuid: str, node: str, flavor: Flavor, **kwargs: Any) -> None:
        spawned[instance_uuid] = flavor
        spawn(instance_uuid, node, flavor, **kwargs)

    agent.driver.spawn = spawn_noting  # type: ignore[method-assign]
    own = boot_held(api, bus, monkeypatch, "big")
    forged = [
        # the small flavor's class, flavor and amounts: refused by the claim script
        dataclasses.replace(own, scheduling_class="small", flavor=SMALL.to_dict()),
        # its own class with the small flavor in it: refused before the claim
        dataclasses.replace(own, flavor=SMALL.to_dict()),
        # a deadline its record does not have: it must not end the instance in ERROR
        dataclasses.replace(own, deadline=time.time() - 1),
    ]
    letters: list[DeadLetter] = []
    for n, message in enumerate(forged, start=1):
        bus.publish_boot(message)
        assert wait_until(lambda n=n: dead_letters(bus, letters, n), 20), letters
        assert waiting(stores, own.instance_uuid), stores.instances.get(own.instance_uuid)
    reasons = [letter.reason for letter in letters]
    prefix = f"Not the request of instance {own.instance_uuid}: "
    assert reasons == [
        prefix + "the claim was placed for scheduling class small, its record was made for big",
        prefix + "its flavor is not the one its record was made with",
        prefix + f"its record's deadline, {utc(own.deadline)}, has not passed",
    ]
    assert agent.counters["not_its_request"] == 3
    bus.publish_boot(own)  # its own request
    assert wait_until(lambda: stores.instances.get(own.instance_uuid).state == State.ACTIVE, 20)
    assert allocated(stores, own.instance_uuid) == {"VCPU": 8, "MEMORY_MB": 8192}
    assert (spawned[own.instance_uuid].vcpus, spawned[own.instance_uuid].ram_mb) == (8, 8192)
    report = audit(stores)
    assert report.ok, report.to_dict()


def test_a_forged_delete_is_dead_lettered_and_the_server_stays_active(
    conf, stores, bus, api, agents
) -> None:
    """A delete request for an ACTIVE server nobody asked to delete destroyed its VM and
    ended it DELETED; now the agent reads the record first."""
    agent = start(conf, stores, bus, api, agents)
    target = api.boot(USER, "target", "small").uuid
    assert wait_until(lambda: stores.instances.get(target).state == State.ACTIVE, 20)
    inst = stores.instances.get(target)
    node = inst.node or ""
    forged = [
        DeleteRequest(f"req-{uuid.uuid4()}", target, HOST, node),  # nobody asked
        DeleteRequest(f"req-{uuid.uuid4()}", target, HOST, "cn0-elsewhere"),  # not its node
    ]
    letters: list[DeadLetter] = []
    for n, message in enumerate(forged, start=1):
        bus.publish_delete(HOST, message)
        assert wait_until(lambda n=n: dead_letters(bus, letters, n), 20), letters
    assert [letter.reason for letter in letters] == [
        f"the ledger records no delete of {target}: it is ACTIVE with task_state none",
        f"a delete of {target} for host {HOST}, node cn0-elsewhere reached {HOST}, but its "
        f"record places it on {HOST}, node {node}",
    ]
    after = stores.instances.get(target)
    assert (after.state, after.task_state, after.host) == (State.ACTIVE, TaskState.NONE, HOST)
    assert target in agent.driver.list_instances(node)
    assert allocated(stores, target) == {"VCPU": 1, "MEMORY_MB": 1024}
    api.delete(USER, target)  # a delete the API asked for is done
    assert wait_until(lambda: stores.instances.get(target).state == State.DELETED, 20)
    assert target not in agent.driver.list_instances(node)
    assert agent.counters["not_its_request"] == 2
    report = audit(stores)
    assert report.ok, report.to_dict()
