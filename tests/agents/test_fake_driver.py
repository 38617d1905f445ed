"""agents.virt.fake: nodes, spawn and destroy, determinism, failure rate, fault hooks."""

from __future__ import annotations

import threading
import uuid

import pytest

from agents.virt.base import NodeNotFound, SpawnFailed, SpawnFenced, VirtDriver
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec, read_state
from qsched import exception
from qsched.flavors import Flavor
from qsched.scheduling.fit import fit_request
from qsched.scheduling.request import Refusal, Request

FLAVOR = Flavor("small", 1, 512)


def uuids(count: int, seed: int = 0) -> list[str]:
    return [str(uuid.UUID(int=seed * 1_000_000 + i + 1)) for i in range(count)]


def outcomes(driver: FakeDriver, instances: list[str], node: str) -> list[bool]:
    result = []
    for instance in instances:
        try:
            driver.spawn(instance, node, FLAVOR)
        except SpawnFailed:
            result.append(False)
        else:
            result.append(True)
    return result


def test_is_a_virt_driver() -> None:
    assert isinstance(FakeDriver(), VirtDriver)


def test_nodes_are_named_sorted_and_stable() -> None:
    driver = FakeDriver(12, host="h")
    nodes = driver.nodes()
    assert [n.name for n in nodes] == [f"h-{i:02d}" for i in range(12)]
    assert [n.root.uuid for n in nodes] == [n.root.uuid for n in FakeDriver(12, host="h").nodes()]
    assert len({n.root.uuid for n in nodes}) == 12
    assert nodes[0].root.uuid != FakeDriver(12, host="other").nodes()[0].root.uuid
    assert FakeDriver(0).nodes() == []


def test_node_inventory_traits_and_children() -> None:
    spec = FakeNodeSpec(
        vcpus=16,
        ram_mb=32768,
        disk_gb=0,
        cpu_allocation_ratio=4.0,
        traits=frozenset({"HW_CPU_X86_AVX2"}),
        children=(
            FakeChild("gpu0", {"VGPU": 4}, frozenset({"CUSTOM_FAST"})),
            FakeChild("gpu1", {"VGPU": 4}),
        ),
    )
    (node,) = FakeDriver(1, spec, host="h").nodes()
    root, gpu0, gpu1 = node.providers
    assert root.inventories["VCPU"].capacity == 64 and "DISK_GB" not in root.inventories
    assert root.inventories["MEMORY_MB"].total == 32768 and root.traits == {"HW_CPU_X86_AVX2"}
    assert gpu0.parent_uuid == root.uuid == gpu1.parent_uuid
    assert gpu0.name == "h-0_gpu0" and gpu0.inventories["VGPU"].total == 4
    assert gpu0.traits == {"CUSTOM_FAST"} and gpu1.traits == frozenset()


def test_node_info_view_fits_requests() -> None:
    spec = FakeNodeSpec(children=(FakeChild("gpu0", {"VGPU": 2}),))
    node = FakeDriver(1, spec).nodes()[0]
    view = node.view("az1", frozenset({"11111111-1111-1111-1111-111111111111"}))
    assert (
        view.availability_zone == "az1"
        and view.root.aggregates
        and not view.providers[1].aggregates
    )
    request = Request.from_flavor(Flavor("g", 2, 1024, extra_specs={"resources1:VGPU": "2"}))
    allocations = fit_request(view, request)
    assert not isinstance(allocations, Refusal)
    assert allocations[view.providers[1].uuid] == {"VGPU": 2}


def test_spawn_list_destroy() -> None:
    driver = FakeDriver(2)
    a, b = uuids(2)
    node0, node1 = (n.name for n in driver.nodes())
    driver.spawn(b, node0, FLAVOR)
    driver.spawn(a, node0, FLAVOR)
    driver.spawn(a, node0, FLAVOR)  # redelivered: idempotent
    assert driver.list_instances(node0) == sorted([a, b]) and driver.list_instances(node1) == []
    with pytest.raises(SpawnFailed, match="already running on node"):
        driver.spawn(a, node1, FLAVOR)
    assert driver.destroy(a, node1) is False
    assert driver.destroy(a, node0) is True and driver.destroy(a, node0) is False
    assert driver.list_instances(node0) == [b]
    driver.spawn(a, node1, FLAVOR)
    assert driver.list_instances(node1) == [a]


def test_unknown_node() -> None:
    driver = FakeDriver(1)
    with pytest.raises(SpawnFailed, match="no such node") as caught:
        driver.spawn(uuids(1)[0], "nope", FLAVOR)
    assert caught.value.node == "nope"  # type: ignore[attr-defined]
    with pytest.raises(NodeNotFound):
        driver.destroy(uuids(1)[0], "nope")
    with pytest.raises(NodeNotFound):
        driver.list_instances("nope")
    with pytest.raises(NodeNotFound):
        driver.node("nope")


@pytest.mark.parametrize(
    "kwargs",
    [{"node_count": -1}, {"spawn_delay_s": -0.1}, {"failure_rate": 1.5}, {"failure_rate": -0.1}],
)
def test_invalid_config(kwargs: dict[str, float]) -> None:
    with pytest.raises(exception.Invalid):
        FakeDriver(**kwargs)  # type: ignore[arg-type]


def test_failure_rate_zero_and_one() -> None:
    node = "fake-0"
    assert all(outcomes(FakeDriver(1, failure_rate=0.0), uuids(200), node))
    never = FakeDriver(1, failure_rate=1.0)
    assert not any(outcomes(never, uuids(200), node))
    assert never.list_instances(node) == []


def test_failure_rate_is_respected() -> None:
    results = outcomes(FakeDriver(1, failure_rate=0.3, seed=1), uuids(4000), "fake-0")
    failed = results.count(False) / len(results)
    assert 0.25 < failed < 0.35


def test_failures_are_deterministic_and_independent_of_order() -> None:
    instances = uuids(300)
    first = outcomes(FakeDriver(1, failure_rate=0.5, seed=3), instances, "fake-0")
    again = outcomes(FakeDriver(1, failure_rate=0.5, seed=3), instances, "fake-0")
    backwards = outcomes(FakeDriver(1, failure_rate=0.5, seed=3), instances[::-1], "fake-0")
    other_seed = outcomes(FakeDriver(1, failure_rate=0.5, seed=4), instances, "fake-0")
    assert first == again == backwards[::-1]
    assert first != other_seed


def test_a_retry_after_a_failure_rolls_again() -> None:
    driver = FakeDriver(1, failure_rate=0.5, seed=5)
    instance = next(
        i for i, ok in zip(uuids(50), outcomes(driver, uuids(50), "fake-0"), strict=True) if not ok
    )
    attempts = 1
    while not outcomes(driver, [instance], "fake-0")[0]:
        attempts += 1
    assert attempts < 50 and driver.list_instances("fake-0").count(instance) == 1


def test_spawn_delay_uses_the_clock() -> None:
    slept: list[float] = []
    driver = FakeDriver(1, spawn_delay_s=2.5, sleep=slept.append)
    driver.spawn(uuids(1)[0], "fake-0", FLAVOR)
    assert slept == [2.5]
    FakeDriver(1, sleep=slept.append).spawn(uuids(1)[0], "fake-0", FLAVOR)
    assert slept == [2.5]


def test_a_fence_that_says_no_starts_nothing(tmp_path) -> None:
    """Asked after the delay and the hook, right before the VM starts."""
    asked: list[str] = []
    state = tmp_path / "vms"
    driver = FakeDriver(1, spawn_hook=lambda i, n: asked.append("hook"), state_path=state)
    instance = uuids(1)[0]
    with pytest.raises(SpawnFenced):
        driver.spawn(instance, "fake-0", FLAVOR, fence=lambda: bool(asked.append("fence")))
    assert asked == ["hook", "fence"]
    assert driver.list_instances("fake-0") == [] and read_state(state) == {}
    driver.spawn(instance, "fake-0", FLAVOR, fence=lambda: True)
    assert driver.list_instances("fake-0") == [instance]
    driver.spawn(instance, "fake-0", FLAVOR, fence=lambda: False)  # running: nothing to start
    assert driver.list_instances("fake-0") == [instance]


def test_hook_that_raises_leaves_nothing_behind() -> None:
    def hook(instance_uuid: str, node: str) -> None:
        raise SpawnFailed(instance=instance_uuid, node=node, reason="hypervisor on fire")

    driver = FakeDriver(1, spawn_hook=hook)
    with pytest.raises(SpawnFailed, match="hypervisor on fire"):
        driver.spawn(uuids(1)[0], "fake-0", FLAVOR)
    assert driver.list_instances("fake-0") == []
    driver.spawn_hook = None
    driver.spawn(uuids(1)[0], "fake-0", FLAVOR)
    assert driver.list_instances("fake-0") == uuids(1)


def test_hook_that_blocks_holds_the_spawn_in_flight() -> None:
    entered = threading.Event()
    release = threading.Event()

    def hook(instance_uuid: str, node: str) -> None:
        entered.set()
        assert release.wait(10)

    driver = FakeDriver(1, spawn_hook=hook)
    thread = threading.Thread(target=driver.spawn, args=(uuids(1)[0], "fake-0", FLAVOR))
    thread.start()
    assert entered.wait(10)
    assert driver.list_instances("fake-0") == []
    release.set()
    thread.join(10)
    assert driver.list_instances("fake-0") == uuids(1)


def test_concurrent_spawns_and_destroys() -> None:
    driver = FakeDriver(4, spawn_delay_s=0.001)
    nodes = [n.name for n in driver.nodes()]
    instances = uuids(400)

    def work(worker: int) -> None:
        for i, instance in enumerate(instances[worker::8]):
            node = nodes[(worker + i) % 4]
            driver.spawn(instance, node, FLAVOR)
            if i % 3 == 0:
                assert driver.destroy(instance, node)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    listed = [i for node in nodes for i in driver.list_instances(node)]
    expected = [inst for w in range(8) for i, inst in enumerate(instances[w::8]) if i % 3]
    assert sorted(listed) == sorted(expected)
