"""Provider trees end to end: the fake driver's tree from configuration, granular groups
and same_subtree in the fit, the shipped agent registering the tree, a boot through the
API landing on the right children, and ``qsched-admin providers`` showing the tree."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import falcon.testing
import pytest

from agents.main import build_agent
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec, check_children
from qsched import conf as qconf
from qsched import exception
from qsched.admin import queries
from qsched.api import app as api_app
from qsched.bus.kombu import KombuBus
from qsched.conf import APIOptions, SchedulerOptions
from qsched.flavors import GROUP_POLICY_REQUIRED, Flavor, request_groups
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.scheduling.fit import fit_request
from qsched.scheduling.request import Refusal, RefusalKind, Request
from qsched.scheduling.views import NodeView, ProviderView
from qsched.stack.cleanup import forget_bus
from tests.cloud import transport_url
from tests.conftest import TEST_DURABILITY
from tests.helpers import wait_until

TREE = [
    "numa0:VCPU=4,MEMORY_MB=4096",
    "numa1:VCPU=4,MEMORY_MB=4096",
    "gpu0@numa0:VGPU=1;CUSTOM_T4",
    "gpu1@numa1:VGPU=1;CUSTOM_A100",
]
#: 2 VCPUs and a GPU on the same NUMA node, the GPU an A100
NUMA_GPU = Flavor(
    "numa.gpu", 2, 1024, 0,
    extra_specs={"resources:VCPU": "0", "resources:MEMORY_MB": "0",
                 "resources1:VCPU": "2", "resources1:MEMORY_MB": "1024",
                 "resources2:VGPU": "1", "trait2:CUSTOM_A100": "required",
                 "same_subtree": "1,2", "group_policy": "none"},
)  # fmt: skip


def tree_node(host: str = "cn1") -> NodeView:
    spec = FakeNodeSpec(vcpus=0, ram_mb=0, disk_gb=0,
                        children=tuple(FakeChild.parse(line) for line in TREE))  # fmt: skip
    info = FakeDriver(1, spec, host=host).nodes()[0]
    return NodeView(info.name, tuple(
        ProviderView(p.uuid, p.name, p.inventories, traits=p.traits, parent_uuid=p.parent_uuid)
        for p in info.providers
    ))  # fmt: skip


def names_of(node: NodeView, allocations: dict) -> dict[str, dict[str, int]]:
    by_uuid = {p.uuid: p.name for p in node.providers}
    return {by_uuid[u]: a for u, a in allocations.items()}


def test_a_tree_from_configuration_lines() -> None:
    node = tree_node()
    assert [p.name for p in node.providers] == [
        "cn1-0", "cn1-0_numa0", "cn1-0_numa1", "cn1-0_gpu0", "cn1-0_gpu1",
    ]  # fmt: skip
    root, numa0, numa1, gpu0, gpu1 = node.providers
    assert root.inventories == {} and numa0.parent_uuid == root.uuid
    assert (gpu0.parent_uuid, gpu1.parent_uuid) == (numa0.uuid, numa1.uuid)
    assert gpu1.traits == {"CUSTOM_A100"}


@pytest.mark.parametrize(
    "line",
    ["numa0", "numa0:", "numa0:VCPU=0", "numa0:VCPU=x", "a b:VCPU=1", "gpu@:VGPU=1",
     "numa0:NOT_A_CLASS=1", "numa0:VCPU=1;not a trait"],
)  # fmt: skip
def test_a_bad_provider_line_is_refused_with_its_form(line: str) -> None:
    with pytest.raises(exception.Invalid):
        FakeChild.parse(line)


def test_parents_come_first_and_names_once() -> None:
    with pytest.raises(exception.Invalid, match="declare numa0 first"):
        check_children([FakeChild.parse("gpu0@numa0:VGPU=1"), FakeChild.parse("numa0:VCPU=1")])
    with pytest.raises(exception.Invalid, match="declared twice"):
        check_children([FakeChild.parse("a:VCPU=1"), FakeChild.parse("a:VCPU=2")])


def test_same_subtree_keeps_the_gpu_on_the_numa_node_of_the_cpus() -> None:
    node = tree_node()
    placed = fit_request(node, Request.from_flavor(NUMA_GPU))
    assert not isinstance(placed, Refusal)
    assert names_of(node, placed) == {
        "cn1-0_numa1": {"VCPU": 2, "MEMORY_MB": 1024}, "cn1-0_gpu1": {"VGPU": 1},
    }  # fmt: skip
    loose = Flavor("loose", 2, 1024, 0, {k: v for k, v in NUMA_GPU.extra_specs.items()
                                         if k != "same_subtree"})  # fmt: skip
    anywhere = fit_request(node, Request.from_flavor(loose))
    assert names_of(node, anywhere)["cn1-0_numa0"] == {"VCPU": 2, "MEMORY_MB": 1024}  # first fit


def test_same_subtree_refuses_when_the_subtree_is_full() -> None:
    node = tree_node()
    full = NodeView(node.name, tuple(
        ProviderView(p.uuid, p.name, p.inventories, {"VCPU": 4} if p.name.endswith("numa1")
                     else {}, p.traits, parent_uuid=p.parent_uuid)
        for p in node.providers
    ))  # fmt: skip
    refusal = fit_request(full, Request.from_flavor(NUMA_GPU))
    assert isinstance(refusal, Refusal) and refusal.kind == RefusalKind.COMBINATION
    assert "same_subtree=1,2 needs their providers under one of them" in refusal.reason


@pytest.mark.parametrize(
    ("specs", "words"),
    [({"resources1:VGPU": "1", "same_subtree": "1"}, "two or more"),
     ({"resources1:VGPU": "1", "same_subtree": "1,3"}, "does not have"),
     ({"resources1:VGPU": "1", "same_subtree": "a,b"}, "group numbers")],
)  # fmt: skip
def test_same_subtree_names_real_groups(specs: dict, words: str) -> None:
    with pytest.raises(exception.Invalid, match=words):
        request_groups(Flavor("f", 1, 512, 0, extra_specs=specs))


BROKERS = ["memory", pytest.param("rabbitmq", marks=pytest.mark.real)]


@contextlib.contextmanager
def shipped_agent(ledger_url: str, broker: str, tree: Sequence[str], **agent: Any) -> Iterator[
    falcon.testing.TestClient
]:  # fmt: skip
    """qsched-agent's build path (agents.main.build_agent) for host cn1 from an [agent]
    section with ``tree`` as its node_provider lines, started; the HTTP API in front of
    the same ledger and bus, as a test client."""
    prefix = f"tree{uuid.uuid4().hex[:8]}"
    url = "memory://" if broker == "memory" else transport_url("rabbitmq")
    conf = qconf.load()
    conf.set_override("durability", TEST_DURABILITY, group="ledger")
    settings = {"host": "cn1", "node_provider": list(tree), "class_poll_interval_s": 0.05}
    for name, value in {**settings, **agent}.items():
        conf.set_override(name, value, group="agent")
    conf.set_override("url", ledger_url, group="ledger")
    conf.set_override("transport_url", url)
    conf.set_override("prefix", prefix, group="bus")
    built = build_agent(qconf.Options.from_conf(conf))
    bus = KombuBus(url, prefix=prefix)
    built.start(ready_timeout_s=5)
    try:
        app = api_app.create_app(
            built.stores, bus, APIOptions.defaults(), SchedulerOptions.defaults()
        )
        yield falcon.testing.TestClient(app)
    finally:
        built.stop(timeout_s=5)
        bus.close()
        if broker == "rabbitmq":
            forget_bus(url, prefix, list(built.stores.agents.classes()), ["cn1"])


def boot(client: falcon.testing.TestClient, flavor: str) -> str:
    """POST /v2.1/servers as project pa; the new server's id."""
    body = {"server": {"name": "vm", "flavorRef": flavor, "imageRef": str(uuid.uuid4())}}
    answer = client.simulate_post("/v2.1/servers", json=body, headers={"X-Auth-Token": "u:pa"})
    assert answer.status_code == 202, answer.text
    return str(answer.json["server"]["id"])


def held_by_name(stores: Stores, server: str) -> dict[str, dict[str, int]]:
    names = {p.uuid: p.name for p in stores.ledger.list_providers()}
    return {names[u]: a for u, a in stores.ledger.get_allocations(server).allocations.items()}


@pytest.mark.parametrize("broker", BROKERS)
def test_the_shipped_agent_registers_the_tree_and_a_boot_lands_on_its_children(
    stores: Stores, ledger_url: str, broker: str
) -> None:
    """The boot goes through the HTTP API; admin shows the tree. On each ledger, on
    memory:// and on a real RabbitMQ."""
    stores.flavors.create(NUMA_GPU)
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    zero = {"node_vcpus": 0, "node_ram_mb": 0, "node_disk_gb": 0}
    with shipped_agent(ledger_url, broker, TREE, **zero) as client:
        server = boot(client, "numa.gpu")
        assert wait_until(lambda: stores.instances.get(server).state == State.ACTIVE, 15)
        assert held_by_name(stores, server) == {
            "cn1-0_numa1": {"VCPU": 2, "MEMORY_MB": 1024}, "cn1-0_gpu1": {"VGPU": 1},
        }  # fmt: skip
        rows = queries.provider_rows(stores, host="cn1")
        assert [(r["name"], r["depth"]) for r in rows] == [
            ("cn1-0", 0), ("cn1-0_numa0", 1), ("cn1-0_gpu0", 2), ("cn1-0_numa1", 1),
            ("cn1-0_gpu1", 2),
        ]  # fmt: skip


#: two GPUs of four VGPUs each under the root, which holds the node's CPUs and memory
TWO_GPUS = ["gpu0:VGPU=4;CUSTOM_T4", "gpu1:VGPU=4;CUSTOM_T4"]
TWO_GROUPS = {"resources1:VGPU": "1", "trait1:CUSTOM_T4": "required", "resources2:VGPU": "1"}


@pytest.mark.parametrize("broker", BROKERS)
def test_group_policy_through_the_api_and_the_shipped_agent(
    stores: Stores, ledger_url: str, broker: str
) -> None:
    """Two VGPU groups: ``isolate`` lands them on two different GPUs, ``none`` lets them
    share one (the fit takes the first that has room for both). Without a group_policy
    the boot is accepted and ends NoValidHost, as Nova's does when Placement refuses
    the query (400 with the message kept in the fault's details), nothing claimed."""
    for name, policy in (("gpu.isolate", "isolate"), ("gpu.none", "none"), ("gpu.bare", None)):
        specs = dict(TWO_GROUPS, **({"group_policy": policy} if policy else {}))
        stores.flavors.create(Flavor(name, 1, 512, 0, extra_specs=specs))
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    with shipped_agent(ledger_url, broker, TWO_GPUS) as client:
        isolated = boot(client, "gpu.isolate")
        assert wait_until(lambda: stores.instances.get(isolated).state == State.ACTIVE, 15)
        held = held_by_name(stores, isolated)
        assert {k: v for k, v in held.items() if k != "cn1-0"} == {
            "cn1-0_gpu0": {"VGPU": 1}, "cn1-0_gpu1": {"VGPU": 1},
        }  # fmt: skip
        shared = boot(client, "gpu.none")
        assert wait_until(lambda: stores.instances.get(shared).state == State.ACTIVE, 15)
        held = held_by_name(stores, shared)
        assert {k: v for k, v in held.items() if k != "cn1-0"} == {"cn1-0_gpu0": {"VGPU": 2}}
        bare = boot(client, "gpu.bare")
        record = stores.instances.get(bare)
        assert record.state == State.ERROR and record.host is None
        assert record.fault is not None and record.fault["message"].startswith("No valid host")
        assert record.fault["details"] == {"filter": "group_policy",
                                           "reason": GROUP_POLICY_REQUIRED}  # fmt: skip
        assert stores.ledger.get_allocations(bare).allocations == {}
        shown = client.simulate_get(f"/v2.1/servers/{bare}", headers={"X-Auth-Token": "u:pa"})
        assert shown.json["server"]["status"] == "ERROR"


def test_admin_providers_draws_the_tree() -> None:
    from qsched.admin.cli_ledger import tree_name

    assert tree_name({"name": "cn1-0_gpu0", "depth": 2}) == "    └ cn1-0_gpu0"
    assert tree_name({"name": "cn1-0_numa0", "depth": 1}) == "  └ cn1-0_numa0"
    assert tree_name({"name": "cn1-0", "depth": 0}) == "cn1-0"
