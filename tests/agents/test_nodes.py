"""agents.nodes: the node index against a brute-force O(N) oracle."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.nodes import ClassChanges, NodeIndex
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec
from qsched import exception
from qsched.flavors import Constraints, Flavor
from qsched.ledger.base import Inventory
from qsched.scheduling.fit import fit_request, room
from qsched.scheduling.request import Refusal, Request
from qsched.scheduling.views import NodeView, ProviderView

SMALL = Flavor("small", 1, 512)
MEDIUM = Flavor("medium", 2, 2048, 20)
LARGE = Flavor("large", 8, 8192, 80)
GPU = Flavor("gpu", 2, 2048, extra_specs={"resources1:VGPU": "1"})
GPU2 = Flavor(
    "gpu2",
    2,
    2048,
    extra_specs={"resources1:VGPU": "2", "resources2:VGPU": "1", "group_policy": "isolate"},
)
AVX = Flavor("avx", 1, 512, extra_specs={"trait:HW_CPU_X86_AVX2": "required"})
CLASSES = {
    "small": Request.from_flavor(SMALL),
    "medium": Request.from_flavor(MEDIUM),
    "large": Request.from_flavor(LARGE),
    "gpu": Request.from_flavor(GPU),
    "gpu2": Request.from_flavor(GPU2),
    "avx": Request.from_flavor(AVX),
    "small+az2": Request.from_flavor(SMALL, Constraints(availability_zone="az2")),
}


def flat_node(name: str, vcpus: int = 8, ram_mb: int = 8192, zone: str = "az1") -> NodeView:
    inventories = {
        "VCPU": Inventory(vcpus),
        "MEMORY_MB": Inventory(ram_mb),
        "DISK_GB": Inventory(100),
    }
    traits = frozenset({"HW_CPU_X86_AVX2"}) if vcpus % 2 else frozenset()
    return NodeView(name, (ProviderView(f"{name}-rp", name, inventories, {}, traits),), zone)


def gpu_node(name: str, gpus: int = 2, vgpus: int = 2, zone: str = "az1") -> NodeView:
    spec = FakeNodeSpec(
        8, 8192, 100, children=tuple(FakeChild(f"g{i}", {"VGPU": vgpus}) for i in range(gpus))
    )
    info = FakeDriver(1, spec, host=name).nodes()[0]
    return NodeView(name, info.view(zone).providers, zone)


def make_index(policy: str = "pack", events: list[tuple[str, bool]] | None = None) -> NodeIndex:
    callback = None if events is None else (lambda name, fittable: events.append((name, fittable)))
    return NodeIndex(policy, on_change=callback)


def claim_pick(index: NodeIndex, name: str) -> tuple[str, dict[str, dict[str, int]]]:
    pick = index.pick(name)
    assert pick is not None
    index.claim(pick.node, pick.allocations)
    return pick.node, pick.allocations


# -- behaviour -------------------------------------------------------------------------------


def test_pack_fills_the_most_used_node_first() -> None:
    index = make_index()
    for i in range(4):
        index.add_node(flat_node(f"n{i}", vcpus=4))
    index.add_request("small", CLASSES["small"])
    nodes = [claim_pick(index, "small")[0] for _ in range(16)]
    assert [nodes[i * 4] for i in range(4)] == [nodes[i * 4 + 3] for i in range(4)]
    assert len(set(nodes)) == 4
    assert index.pick("small") is None and index.fittable() == frozenset()


def test_spread_picks_the_least_used_node() -> None:
    index = make_index("spread")
    for i in range(4):
        index.add_node(flat_node(f"n{i}", vcpus=4))
    index.add_request("small", CLASSES["small"])
    assert len({claim_pick(index, "small")[0] for _ in range(4)}) == 4


def test_pack_prefers_the_node_with_least_room_for_that_class() -> None:
    index = make_index()
    index.add_node(flat_node("big", vcpus=64, ram_mb=65536))
    index.add_node(flat_node("tight", vcpus=2, ram_mb=1024))
    index.add_request("small", CLASSES["small"])
    assert index.pick("small").node == "tight"  # type: ignore[union-attr]


def test_notifications_fire_exactly_at_transitions() -> None:
    events: list[tuple[str, bool]] = []
    index = make_index(events=events)
    index.add_node(flat_node("n0", vcpus=2, ram_mb=4096))
    assert index.add_request("medium", CLASSES["medium"]) == ClassChanges(frozenset({"medium"}))
    assert events == [("medium", True)]
    node, allocations = claim_pick(index, "medium")
    assert events == [("medium", True), ("medium", False)]
    assert not index.can_fit("medium")
    changes = index.release(node, allocations)
    assert changes == ClassChanges(frozenset({"medium"}), frozenset())
    assert events[-1] == ("medium", True)
    assert index.remove_node("n0") == ClassChanges(frozenset(), frozenset({"medium"}))
    assert index.add_node(flat_node("n0", vcpus=2, ram_mb=4096)).now_fittable == {"medium"}
    assert index.remove_class("medium").now_unfittable == {"medium"}
    assert index.remove_class("medium") == ClassChanges()
    assert [e for e in events if e[0] == "medium"] == [("medium", x) for x in (True, False) * 3]


def test_no_notification_without_transition() -> None:
    events: list[tuple[str, bool]] = []
    index = make_index(events=events)
    index.add_node(flat_node("n0"))
    index.add_node(flat_node("n1"))
    index.add_request("small", CLASSES["small"])
    changes = [index.claim(*claim_pick(index, "small")) for _ in range(3)]
    assert events == [("small", True)] and not any(changes)


def test_replacing_a_class_reevaluates_it() -> None:
    index = make_index()
    index.add_node(flat_node("n0", zone="az1"))
    index.add_request("c", CLASSES["small"])
    assert index.add_request("c", CLASSES["small"]) == ClassChanges()
    changes = index.add_request("c", CLASSES["small+az2"])
    assert changes.now_unfittable == {"c"} and index.request("c") == CLASSES["small+az2"]


def test_refresh_after_a_conflict() -> None:
    index = make_index()
    index.add_node(flat_node("n0", vcpus=2))
    index.add_request("small", CLASSES["small"])
    root = index.node("n0").root
    full = ProviderView(root.uuid, root.name, root.inventories, {"VCPU": 2}, root.traits)
    assert index.refresh("n0", [full]).now_unfittable == {"small"}
    assert index.pick("small") is None
    with pytest.raises(exception.ProviderNotFound):
        index.refresh("n0", [ProviderView("other", "x", {})])


def test_nested_nodes_and_isolate() -> None:
    index = make_index()
    index.add_node(gpu_node("g", gpus=2, vgpus=2))
    index.add_request("gpu2", CLASSES["gpu2"])
    node, allocations = claim_pick(index, "gpu2")
    assert node == "g" and len(allocations) == 3
    assert not index.can_fit("gpu2")


def test_errors() -> None:
    index = make_index()
    with pytest.raises(exception.Invalid):
        NodeIndex("random")
    with pytest.raises(exception.NotFound):
        index.pick("nope")
    with pytest.raises(exception.NotFound):
        index.claim("nope", {})
    with pytest.raises(exception.NotFound):
        index.remove_node("nope")
    index.add_node(flat_node("n0"))
    with pytest.raises(exception.ProviderNotFound):
        index.claim("n0", {"other": {"VCPU": 1}})
    assert not index.can_fit("nope") and "n0" in index and len(index) == 1


def test_pick_recovers_from_a_view_changed_behind_its_back() -> None:
    index = make_index()
    index.add_node(flat_node("n0", vcpus=2))
    index.add_node(flat_node("n1", vcpus=4))
    index.add_request("small", CLASSES["small"])
    # nobody should do this; the index must still not pick a full node
    object.__setattr__(index.node("n0").root, "free_by_rc", {"VCPU": 0})
    assert index.pick("small").node == "n1"  # type: ignore[union-attr]


def test_node_ids_are_reused() -> None:
    index = make_index()
    index.add_request("small", CLASSES["small"])
    for round_ in range(3):
        for i in range(10):
            index.add_node(flat_node(f"n{round_}-{i}"))
        for i in range(10):
            index.remove_node(f"n{round_}-{i}")
    assert len(index._views) == 10
    assert index.fittable() == frozenset()


# -- against a brute-force oracle ------------------------------------------------------------


def oracle_fittable(views: dict[str, NodeView], classes: dict[str, Request]) -> set[str]:
    return {
        name
        for name, request in classes.items()
        if any(not isinstance(fit_request(v, request), Refusal) for v in views.values())
    }


def oracle_best_room(views: dict[str, NodeView], request: Request, policy: str) -> int:
    rooms = [
        room(v, request) for v in views.values() if not isinstance(fit_request(v, request), Refusal)
    ]
    return min(rooms) if policy == "pack" else max(rooms)


NODE_MAKERS = [
    lambda n: flat_node(n, vcpus=2, ram_mb=2048),
    lambda n: flat_node(n, vcpus=3, ram_mb=8192),
    lambda n: flat_node(n, vcpus=8, ram_mb=16384, zone="az2"),
    lambda n: gpu_node(n, gpus=1, vgpus=2),
    lambda n: gpu_node(n, gpus=2, vgpus=2, zone="az2"),
]


class Harness:
    """Runs the same operations on the index and on plain views, and compares."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.events: list[tuple[str, bool]] = []
        self.index = make_index(policy, self.events)
        self.views: dict[str, NodeView] = {}
        self.classes: dict[str, Request] = {}
        self.claims: list[tuple[str, dict[str, dict[str, int]]]] = []
        self.counter = 0

    def apply(self, op: str, choice: int) -> None:
        before = oracle_fittable(self.views, self.classes)
        seen = len(self.events)
        changes = getattr(self, op)(choice)
        after = oracle_fittable(self.views, self.classes)
        assert self.index.fittable() == after
        if changes is not None:
            assert changes == ClassChanges(frozenset(after - before), frozenset(before - after))
        expected = [(n, True) for n in after - before] + [(n, False) for n in before - after]
        assert sorted(self.events[seen:]) == sorted(expected)
        for name, view in self.views.items():
            assert self.index.node(name) == view

    def add_node(self, choice: int) -> ClassChanges:
        name = f"n{self.counter}"
        self.counter += 1
        self.views[name] = NODE_MAKERS[choice % len(NODE_MAKERS)](name)
        return self.index.add_node(self.views[name])

    def remove_node(self, choice: int) -> ClassChanges | None:
        if not self.views:
            return None
        name = sorted(self.views)[choice % len(self.views)]
        del self.views[name]
        self.claims = [c for c in self.claims if c[0] != name]
        return self.index.remove_node(name)

    def add_class(self, choice: int) -> ClassChanges:
        name = sorted(CLASSES)[choice % len(CLASSES)]
        self.classes[name] = CLASSES[name]
        return self.index.add_request(name, CLASSES[name])

    def remove_class(self, choice: int) -> ClassChanges:
        name = sorted(CLASSES)[choice % len(CLASSES)]
        self.classes.pop(name, None)
        return self.index.remove_class(name)

    def pick_claim(self, choice: int) -> ClassChanges | None:
        if not self.classes:
            return None
        name = sorted(self.classes)[choice % len(self.classes)]
        pick = self.index.pick(name)
        if name not in oracle_fittable(self.views, self.classes):
            assert pick is None
            return None
        assert pick is not None
        view = self.views[pick.node]
        assert fit_request(view, self.classes[name]) == pick.allocations
        assert room(view, self.classes[name]) == oracle_best_room(
            self.views, self.classes[name], self.policy
        )
        self.views[pick.node] = view.adjusted(pick.allocations, 1)
        self.claims.append((pick.node, pick.allocations))
        return self.index.claim(pick.node, pick.allocations)

    def release(self, choice: int) -> ClassChanges | None:
        if not self.claims:
            return None
        node, allocations = self.claims.pop(choice % len(self.claims))
        self.views[node] = self.views[node].adjusted(allocations, -1)
        return self.index.release(node, allocations)

    def refresh(self, choice: int) -> ClassChanges | None:
        """The ledger says the root's VCPU usage is something else (another agent's claim)."""
        if not self.views:
            return None
        name = sorted(self.views)[choice % len(self.views)]
        root = self.views[name].root
        usages = {**root.usages, "VCPU": choice % (root.inventories["VCPU"].total + 1)}
        fresh = ProviderView(
            root.uuid, root.name, root.inventories, usages, root.traits, root.aggregates
        )
        self.views[name] = self.views[name].replaced([fresh])
        return self.index.refresh(name, [fresh])


OPS = st.sampled_from(
    ["add_node"] * 3
    + ["remove_node", "add_class", "remove_class", "refresh"]
    + ["pick_claim"] * 6
    + ["release"] * 3
)


@pytest.mark.parametrize("policy", ["pack", "spread"])
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(OPS, st.integers(0, 1000)), min_size=1, max_size=60))
def test_index_matches_the_oracle(policy: str, ops: list[tuple[str, int]]) -> None:
    harness = Harness(policy)
    for op, choice in ops:
        harness.apply(op, choice)


def test_long_random_run_matches_the_oracle() -> None:
    rng = random.Random(7)
    harness = Harness("pack")
    for name in CLASSES:
        harness.apply("add_class", sorted(CLASSES).index(name))
    for _ in range(40):
        harness.apply("add_node", rng.randrange(1000))
    weights = {"pick_claim": 8, "release": 4, "refresh": 1, "add_node": 1, "remove_node": 1}
    for _ in range(1500):
        op = rng.choices(list(weights), list(weights.values()))[0]
        harness.apply(op, rng.randrange(1000))


def test_threads_leave_the_index_consistent() -> None:
    index = make_index()
    for i in range(30):
        index.add_node(flat_node(f"n{i}", vcpus=2 + i % 3))
    for name in ("small", "medium", "large", "avx"):
        index.add_request(name, CLASSES[name])
    names = ["small", "medium", "large", "avx"]

    def work(seed: int) -> None:
        rng = random.Random(seed)
        held = []
        for _ in range(300):
            pick = index.pick(rng.choice(names))
            if pick is not None:
                index.claim(pick.node, pick.allocations)
                held.append(pick)
            if held and rng.random() < 0.45:
                done = held.pop(rng.randrange(len(held)))
                index.release(done.node, done.allocations)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    views = {f"n{i}": index.node(f"n{i}") for i in range(30)}
    requests = {name: CLASSES[name] for name in names}
    assert index.fittable() == oracle_fittable(views, requests)
    for name, request in requests.items():
        pick = index.pick(name)
        if pick is not None:
            best = oracle_best_room(views, request, "pack")
            assert room(views[pick.node], request) == best


def time_per_op(node_count: int, ops: int = 400, batches: int = 5) -> float:
    """The best of a few batches of pick + claim + release, in seconds per cycle."""
    index = make_index()
    for name in ("small", "medium", "large"):
        index.add_request(name, CLASSES[name])
    spec = FakeNodeSpec(32, 65536, 1000)
    for info in FakeDriver(node_count, spec).nodes():
        index.add_node(info.view())
    best = float("inf")
    for _ in range(batches):
        start = time.perf_counter()
        for i in range(ops):
            pick = index.pick(("small", "medium", "large")[i % 3])
            assert pick is not None
            index.claim(pick.node, pick.allocations)
            index.release(pick.node, pick.allocations)
        best = min(best, (time.perf_counter() - start) / ops)
    return best


def test_cost_per_request_does_not_grow_with_nodes() -> None:
    small, large = time_per_op(200), time_per_op(20_000)
    assert large < 5 * small, (small, large)
