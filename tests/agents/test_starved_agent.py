"""A starved agent (issue 31): silent past its heartbeat TTL, its work still going on.

Sixty agents in one process under full CPU let heartbeats pass their TTL while the
agents' spawns and VMs went on. The API then deletes a silent agent's instances
locally and a janitor takes its builds and deletes. Whatever a starved agent was
doing, two things must hold at every moment:

* no double spawn: no VM starts on one driver while another driver runs the same
  instance (:class:`Hypervisors` checks it where the fake driver starts the VM);
* no claim released under a running VM: every VM a driver runs has a claim on its
  node in the ledger, its instance's own or one held for its host (:class:`Claims`
  checks it all the time, in a thread of its own).

An agent is starved here by holding every thread of it at a gate (:class:`Starved`):
its heartbeats and periodic tasks, its consumer callback, and a spawn at the point
where its VM would start. That is a starved process's worst case, made
deterministic: nothing of it runs until it is fed. Its consumer stops taking boot
requests meanwhile, as a starved consumer's would stop reading, so that the request a
janitor publishes again goes to another agent.

Each test runs on the embedded default (fakeredis, ``memory://``) and on a real Redis
and RabbitMQ (``real``: required under CI=true, skipped elsewhere without them). The
last one stops a real agent process mid-spawn (SIGSTOP) behind a real API service and
its janitor, then lets it go on (SIGCONT).
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec, read_state
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.cells.housekeeping import start_periodic_tasks
from qsched.conf import AgentOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from qsched.periodic import Periodic
from tests.agents.test_alternates import forget
from tests.cloud import AMQP_URL, Cloud, require_rabbitmq, transport_url
from tests.conftest import real_redis
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(90)

USER = RequestContext.for_project("u1", "p1")
SPEC = FakeNodeSpec(vcpus=4, ram_mb=8192, disk_gb=0)
HOSTS = ("cn-a", "cn-b")
FAST = KombuOptions(connect_timeout_s=2.0, poll_interval_s=0.05, reconnect_max_delay_s=0.5)
#: Generous: every wait polls up to this long, and none is expected to take it.
SETTLE_S = 20.0


# -- the backends: the embedded default, then real servers --------------------------------


@pytest.fixture(params=["embedded", pytest.param("real", marks=pytest.mark.real)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ledger_url(backend: str, request: pytest.FixtureRequest) -> str:
    """fakeredis with the embedded bus, a real Redis (flushed) with RabbitMQ."""
    if backend == "embedded":
        return f"fakeredis://test-{uuid.uuid4().hex}"
    url: str = request.getfixturevalue("real_redis_url")
    return url


@pytest.fixture
def bus(backend: str) -> Iterator[KombuBus]:
    """``memory://``, or RabbitMQ under a prefix of this test's, deleted after."""
    url = "memory://" if backend == "embedded" else transport_url("rabbitmq")
    bus = KombuBus(url, prefix=f"starve{uuid.uuid4().hex[:10]}", options=FAST)
    yield bus
    forget(bus, HOSTS)


# -- what is watched ---------------------------------------------------------------------


class Hypervisors:
    """Every driver of a test: a VM started where another driver runs the instance
    is a double spawn, noted at the moment it starts."""

    def __init__(self) -> None:
        self.drivers: list[Watched] = []
        self.doubles: list[str] = []

    def starting(self, driver: Watched, instance: str) -> None:
        for other in self.drivers:
            if other is not driver and other.is_running(instance):
                self.doubles.append(f"{instance} started on {driver.host}, runs on {other.host}")


class Watched(FakeDriver):
    """A fake driver that tells :class:`Hypervisors` of each VM it starts."""

    def __init__(self, hypervisors: Hypervisors, host: str, hook: Callable[..., None]) -> None:
        super().__init__(1, SPEC, host=host, spawn_hook=hook)
        self.hypervisors = hypervisors
        hypervisors.drivers.append(self)

    def spawn(
        self, instance_uuid: str, node: str, flavor: Flavor, fence: Callable[[], bool] | None = None
    ) -> None:
        def starts() -> bool:  # asked under the driver's lock, right before the VM starts
            if fence is not None and not fence():
                return False
            self.hypervisors.starting(self, instance_uuid)
            return True

        super().spawn(instance_uuid, node, flavor, starts)


class Claims(threading.Thread):
    """Checks, again and again until stopped, that every VM a driver runs has a claim
    on its node: its instance's allocations, or a claim held for its host. A VM seen
    without one counts only if the driver still runs it after the ledger was read (a
    delete destroys the VM before the ledger ends the instance)."""

    def __init__(self, stores: Stores, drivers: list[Watched]) -> None:
        super().__init__(name="claims-watch", daemon=True)
        self.stores = stores
        self.drivers = drivers
        self.unclaimed: set[str] = set()
        self.checks = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.02):
            for driver in self.drivers:
                for node in driver.nodes():
                    for instance in driver.list_instances(node.name):
                        if not self._claimed(instance, driver.host, node.root.uuid) and (
                            instance in driver.list_instances(node.name)
                        ):
                            self.unclaimed.add(f"{instance} runs on {node.name} unclaimed")
            self.checks += 1

    def _claimed(self, instance: str, host: str, root: str) -> bool:
        if root in self.stores.ledger.get_allocations(instance).allocations:
            return True
        held = self.stores.ledger.held_claims(host).get(instance)
        return held is not None and root in self.stores.ledger.get_allocations(held).allocations

    def stop(self) -> list[str]:
        """Stop after one more full check; what it found."""
        seen = self.checks
        assert wait_until(lambda: self.checks > seen + 1, SETTLE_S)
        self._stop_event.set()
        self.join(5)
        return sorted(self.unclaimed)


class Starved:
    """Every thread of one agent held at a gate while starved (module docstring)."""

    def __init__(self) -> None:
        self.fed = threading.Event()
        self.fed.set()
        self.agent: ComputeAgent | None = None

    def gated(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wait_then(*args: Any, **kwargs: Any) -> Any:
            self.fed.wait(SETTLE_S * 3)
            return fn(*args, **kwargs)

        return wait_then

    def hold(self, agent: ComputeAgent) -> None:
        """Gate the agent's heartbeat, periodic tasks and consumer callback (before it
        starts: its tasks look them up then)."""
        self.agent = agent
        for name in ("heartbeat", "on_message", "reconcile_pass", "register_classes",
                     "sync_classes"):  # fmt: skip
            setattr(agent, name, self.gated(getattr(agent, name)))
        agent.deletes.finish = self.gated(agent.deletes.finish)  # type: ignore[method-assign]
        agent.permit.check = self.gated(agent.permit.check)  # type: ignore[method-assign]

    def starve(self) -> None:
        assert self.agent is not None
        self.agent.gate.enable(False)  # takes no more boot requests, as a starved consumer
        self.fed.clear()

    def feed(self) -> None:
        assert self.agent is not None
        self.fed.set()  # its next heartbeat says its service takes boots again


def start_agent(
    conf, stores: Stores, bus: KombuBus, host: str, driver: Watched, starved: Starved | None = None
) -> ComputeAgent:
    options = {"host": host, "heartbeat_interval_s": 0.1, "heartbeat_ttl_s": 1.5,
               "class_poll_interval_s": 0.05, "reconcile_interval_s": 0.5,
               "reap_interval_s": 0, "ledger_retry_max_s": 0.5}  # fmt: skip
    for name, value in options.items():
        conf.set_override(name, value, group="agent")
    agent = ComputeAgent(AgentOptions.from_conf(conf), stores, bus, driver)
    if starved is not None:
        starved.hold(agent)
    agent.start(ready_timeout_s=10)
    return agent


@pytest.fixture
def housekeeping(stores: Stores, bus: KombuBus) -> Iterator[list[Periodic]]:
    """The API service's janitor, quick: every 0.2 s, a grace of 0.5 s."""
    options = SchedulerOptions.defaults().replace(
        janitor_interval_s=0.2, janitor_grace_s=0.5, reap_interval_s=0, outbox_interval_s=0
    )
    tasks = start_periodic_tasks(options, stores, bus)
    yield tasks
    for task in tasks:
        task.stop()


@pytest.fixture
def watched(stores: Stores) -> Iterator[tuple[Hypervisors, Claims]]:
    hypervisors = Hypervisors()
    claims = Claims(stores, hypervisors.drivers)
    yield hypervisors, claims
    if claims.is_alive():
        claims.stop()


@pytest.fixture
def starved(agents: list[ComputeAgent]) -> Iterator[Starved]:
    """One agent to starve; fed before the agents stop, whatever the test did."""
    hungry = Starved()
    yield hungry
    hungry.fed.set()


def running(driver: FakeDriver) -> list[str]:
    return driver.list_instances(f"{driver.host}-0")


def silent(stores: Stores, host: str) -> Callable[[], bool]:
    return lambda: not stores.agents.alive(host)


# -- the tests ---------------------------------------------------------------------------


def test_a_build_taken_from_a_starved_agent_runs_once(
    conf, stores, bus, api, agents, starved, housekeeping, watched
) -> None:
    """Starved mid-spawn, before its VM starts: a janitor takes the build, another agent
    runs it; fed again, the starved agent starts nothing and lets its claim go. Before
    the lease, its VM started there too (a double spawn) and its node's claim was
    released under the spawn."""
    hypervisors, claims = watched
    reached, go = threading.Event(), threading.Event()

    def boots(instance: str, node: str) -> None:  # the spawn's last step before the VM
        reached.set()
        go.wait(SETTLE_S * 3)

    a = Watched(hypervisors, "cn-a", boots)
    agents.append(start_agent(conf, stores, bus, "cn-a", a, starved))
    inst = api.boot(USER, "vm", "small").uuid
    assert reached.wait(SETTLE_S)
    claims.start()
    starved.starve()
    assert wait_until(silent(stores, "cn-a"), SETTLE_S)
    b = Watched(hypervisors, "cn-b", lambda i, n: None)
    agents.append(start_agent(conf, stores, bus, "cn-b", b))
    assert wait_until(lambda: stores.instances.get(inst).host == "cn-b", SETTLE_S)
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, SETTLE_S)
    assert list(stores.ledger.held_claims("cn-a")) == [inst]  # cn-a's node: still taken
    starved.feed()  # its heartbeat first (as after a SIGCONT): its lease holds again...
    assert wait_until(lambda: stores.agents.alive("cn-a"), SETTLE_S)
    go.set()  # ...then the spawn goes on, to where its VM would start
    agent_a = agents[0]
    assert wait_until(lambda: not agent_a.builds, SETTLE_S)
    assert wait_until(lambda: stores.ledger.held_claims("cn-a") == {}, SETTLE_S)
    assert (running(a), running(b)) == ([], [inst])
    assert claims.stop() == [] and hypervisors.doubles == []
    assert agent_a.counters["spawn_fenced"] >= 1 and agent_a.counters["spawn_taken"] == 1
    assert wait_until(lambda: agent_a.index.totals()["VCPU"][0] == 0, SETTLE_S)
    report = audit(stores)
    assert report.ok, report.to_dict()


def test_a_starved_agent_nobody_took_from_finishes_its_build(
    conf, stores, bus, api, agents, starved, watched
) -> None:
    """Starved mid-spawn past its TTL, but fed before any janitor took its build (none
    runs here): it starts the VM only once a heartbeat renewed its lease and the ledger
    says the claim is still its own, and the build ends ACTIVE there, placed once."""
    hypervisors, claims = watched
    reached, go = threading.Event(), threading.Event()

    def boots(instance: str, node: str) -> None:
        reached.set()
        go.wait(SETTLE_S * 3)

    a = Watched(hypervisors, "cn-a", boots)
    agent_a = start_agent(conf, stores, bus, "cn-a", a, starved)
    agents.append(agent_a)
    inst = api.boot(USER, "vm", "small").uuid
    assert reached.wait(SETTLE_S)
    claims.start()
    starved.starve()
    assert wait_until(silent(stores, "cn-a"), SETTLE_S)
    starved.feed()
    assert wait_until(lambda: stores.agents.alive("cn-a"), SETTLE_S)
    go.set()
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, SETTLE_S)
    record = stores.instances.get(inst)
    assert (record.host, record.attempts, running(a)) == ("cn-a", 0, [inst])
    assert agent_a.counters["spawn_fenced"] == 1 and agent_a.counters["spawn_taken"] == 0
    assert claims.stop() == [] and hypervisors.doubles == []
    report = audit(stores)
    assert report.ok, report.to_dict()


def test_what_a_starved_agent_runs_keeps_its_claims_until_its_vms_are_gone(
    conf, stores, bus, api, agents, starved, housekeeping, watched
) -> None:
    """Starved with two VMs running: one deleted while it was still alive (its delete
    request waits in its queue, then a janitor ends it), one deleted once it was
    silent (the API deletes it locally). Both end DELETED at once for the user, and
    their claims stay on its node until, fed again, it destroys their VMs. Before,
    both claims were released while the VMs ran (issue 31's '1 instances running
    while deleted (1 reaped)' was one of those, reaped)."""
    hypervisors, claims = watched
    a = Watched(hypervisors, "cn-a", lambda i, n: None)
    agent_a = start_agent(conf, stores, bus, "cn-a", a, starved)
    agents.append(agent_a)
    asked, local = (api.boot(USER, name, "small").uuid for name in ("asked", "local"))
    assert wait_until(lambda: sorted(running(a)) == sorted([asked, local]), SETTLE_S)
    assert wait_until(lambda: not agent_a.builds, SETTLE_S)
    claims.start()
    starved.starve()
    api.delete(USER, asked)  # alive still, or just silent: either way, never unclaimed
    assert wait_until(silent(stores, "cn-a"), SETTLE_S)
    assert api.delete(USER, local).state == State.DELETED  # deleted locally
    assert wait_until(lambda: stores.instances.get(asked).state == State.DELETED, SETTLE_S)
    assert sorted(stores.ledger.held_claims("cn-a")) == sorted([asked, local])
    assert sorted(running(a)) == sorted([asked, local])  # starved: nothing destroyed yet
    assert stores.quota.get_usage("p1").instances == 0  # the user has the quota back
    starved.feed()
    assert wait_until(lambda: running(a) == [], SETTLE_S)
    assert wait_until(lambda: stores.ledger.held_claims("cn-a") == {}, SETTLE_S)
    assert claims.stop() == [] and hypervisors.doubles == []
    assert wait_until(lambda: agent_a.index.totals()["VCPU"][0] == 0, SETTLE_S)
    report = audit(stores)
    assert report.ok, report.to_dict()


# -- a real agent process, stopped ------------------------------------------------------


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    """An API service (its janitor every 0.5 s, a grace of 1 s) and agent processes on
    a real Redis (flushed) and RabbitMQ; heartbeats every 0.5 s, a TTL of 3 s."""
    require_rabbitmq()
    ledger = real_redis()
    ledger.flushdb()
    options = {"scheduler": {"janitor_interval_s": 0.5, "janitor_grace_s": 1.0}}
    cloud = Cloud(tmp_path, AMQP_URL, options=options, agents=0, timeout_s=60)
    yield cloud
    for index in list(cloud.agents):
        cloud.signal_agent(index, signal.SIGCONT)
    cloud.shutdown()
    ledger.flushdb()


@pytest.mark.real
@pytest.mark.slow
def test_a_stopped_agent_process_does_not_spawn_what_was_placed_again(
    cloud: Cloud, tmp_path: Path
) -> None:
    """SIGSTOP in the middle of a spawn's boot delay, past the TTL and the janitor's
    grace: the build is placed again; SIGCONT: the stopped agent finds its lease over,
    starts no VM and lets its claim go. Its VMs file (which records every VM it
    starts) never names the instance. Before, it started it: two VMs, one instance."""
    vms = [tmp_path / f"cn{i}.vms" for i in range(2)]
    cloud.start(api=True)
    cloud.start_agent(0, {"spawn_delay_s": 6, "fake_state_path": str(vms[0])})
    cloud.wait_ready(timeout_s=30)
    inst = cloud.boot()[1]["server"]["id"]
    stopped, other = cloud.host(0), cloud.host(1)
    assert wait_until(lambda: cloud.stores.instances.building(stopped) == {inst}, SETTLE_S)
    cloud.signal_agent(0, signal.SIGSTOP)
    cloud.start_agent(1, {"fake_state_path": str(vms[1])})
    assert wait_until(lambda: list(cloud.stores.ledger.held_claims(stopped)) == [inst], 30)
    cloud.signal_agent(0, signal.SIGCONT)
    assert wait_until(lambda: cloud.stores.ledger.held_claims(stopped) == {}, 30)
    cloud.settle([inst], timeout_s=30)
    record = cloud.stores.instances.get(inst)
    assert (record.state, record.host) == (State.ACTIVE, other), cloud.tail_logs()
    assert (read_state(vms[0]), list(read_state(vms[1]))) == ({}, [inst])
    assert not vms[0].exists() or inst not in vms[0].read_text()  # not even for a while
    report = audit(cloud.stores)
    assert report.ok, report.to_dict()
