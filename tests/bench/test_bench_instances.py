"""The instances scenario and its bulk loader, in a tiny form so that they cannot rot.

The loader runs on fakeredis and a real Redis (``stores``); the scenario end to end on
the embedded default (a few hundred instances, no server), and, on real servers, with
its agent restart and its memory figures.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from qsched.bench import cli
from qsched.bench.instances import per_item
from qsched.ledger import Stores, bulk
from qsched.ledger.audit import audit
from qsched.ledger.base import Inventory, State
from qsched.ledger.embedded import is_embedded
from tests.cloud import AMQP_URL, require_rabbitmq
from tests.conftest import REDIS_URL, real_redis
from tests.raw import redis_store

FLAVOR = {"name": "bench.medium", "vcpus": 2, "ram_mb": 4096, "disk_gb": 20}


def make_nodes(stores: Stores, count: int) -> list[bulk.Node]:
    nodes = []
    for i in range(count):
        rp = str(uuid.uuid4())
        stores.ledger.create_provider(rp, f"h{i}-0")
        inventory = {"VCPU": Inventory(64), "MEMORY_MB": Inventory(262144),
                     "DISK_GB": Inventory(2000)}  # fmt: skip
        stores.ledger.set_inventory(rp, 0, inventory)
        nodes.append(bulk.Node(f"h{i}", f"h{i}-0", rp))
    return nodes


def test_the_preload_writes_what_the_real_flow_writes(stores: Stores) -> None:
    nodes = make_nodes(stores, 3)
    done = bulk.preload(stores, nodes, FLAVOR, live=7, past=5, chunk=4, extra={"image": "i1"})
    assert (len(done.live), len(done.past)) == (7, 5)
    records = stores.instances.get_many(done.live + done.past)
    assert {records[u].state for u in done.live} == {State.ACTIVE}
    assert {records[u].state for u in done.past} == {State.DELETED}
    assert records[done.live[0]].extra == {"image": "i1", "scheduling_class": "bench.medium"}
    assert [e.event for e in stores.instances.events(done.past[0])] == [
        "accepted", "claimed", "active", "deleted"
    ]  # fmt: skip
    # round robin over the nodes, with the allocations, usages and quota of the claims
    held = stores.ledger.providers_consumers([n.provider for n in nodes])
    assert sorted(len(held[n.provider]) for n in nodes) == [2, 2, 3]
    assert stores.ledger.get_provider(nodes[0].provider).usages["VCPU"] == 6
    assert stores.quota.get_usage("bench-preload").instances == 7
    report = audit(stores)
    assert report.ok and report.instances == {"ACTIVE": 7, "DELETED": 5}


def test_a_preload_that_does_not_fit_says_so(stores: Stores) -> None:
    (node,) = make_nodes(stores, 1)
    with pytest.raises(Exception, match="Not enough VCPU"):
        bulk.preload(stores, [node], FLAVOR, live=200, past=0)


def test_memory_is_measured_on_redis_only(stores: Stores) -> None:
    done = bulk.preload(stores, make_nodes(stores, 2), FLAVOR, live=3, past=2)
    found = bulk.record_memory(stores, done.live, [])
    if is_embedded(redis_store(stores).client):
        assert found is None and bulk.used_memory(stores) is None
        return
    assert found is not None and (bulk.used_memory(stores) or 0) > 0
    record = found["instance record"]
    assert record["items"] == record["keys"] == 3 and record["bytes_per_item"] > 100
    assert found["allocations (consumer)"]["keys"] == 3
    past = bulk.record_memory(stores, done.past, [])
    assert past is not None and past["allocations (consumer)"]["keys"] == 0


def test_bytes_per_item_are_differences_of_used_memory() -> None:
    memory = {"before": 1000, "hosts": 3000, "live": 7000, "past": 8000}
    assert per_item(memory, 10, 4, 2) == {"host": 200.0, "live_instance": 1000.0,
                                          "past_instance": 500.0}  # fmt: skip
    assert per_item({"before": None, "hosts": 5}, 10, 0, 0) == {
        "host": None, "live_instance": None, "past_instance": None,
    }  # fmt: skip


ARGS = ["--scenario", "instances", "--instances-hosts", "8", "--preload", "300", "--agents",
        "2", "--rate", "40", "--duration-s", "0.25"]  # fmt: skip


def _run(args: list[str], out: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli.main, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(out.read_text())
    assert found["failures"] == []
    empty, loaded = found["instances"]
    assert (empty["preloaded"], loaded["preloaded"]) == (0, 300)
    for entry in (empty, loaded):
        assert entry["audit"]["ok"]
        assert entry["boots"]["active"] == entry["boots"]["accepted"] == 10
        assert entry["deletes"]["deleted"] == entry["deletes"]["deletes"] == 10
        assert entry["deletes"]["delete_to_deleted_ms"]["count"] == 10
    # the 150 past ones and the 10 deleted by the run are archived, none held
    assert loaded["archive"]["archived"] == 160 and loaded["archive"]["left"] == 0
    assert loaded["audit"]["instances"]["DELETED"] == 160
    assert "Instances (library path" in result.output
    return found


def test_the_scenario_on_the_embedded_default(tmp_path: Path) -> None:
    found = _run(["--embedded", *ARGS], tmp_path / "bench.json")
    loaded = found["instances"][1]
    assert loaded["agent_restart"] is None and loaded["keys_live"] is None  # not measured
    assert loaded["per_item_bytes"] == {"host": None, "live_instance": None,
                                        "past_instance": None}  # fmt: skip


@pytest.mark.real
@pytest.mark.slow
def test_the_scenario_on_real_servers(tmp_path: Path) -> None:
    real_redis()
    require_rabbitmq()
    found = _run([*ARGS, "--bus", "rabbitmq", "--amqp-url", AMQP_URL, "--ledger-url",
                  REDIS_URL], tmp_path / "bench.json")  # fmt: skip
    empty, loaded = found["instances"]
    for entry in (empty, loaded):
        assert entry["agent_restart"]["hosts"] == 8 and entry["memory"]["hosts"] > 0
    assert loaded["keys_live"]["instance record"]["keys"] == 150
    assert loaded["keys_live"]["allocations (consumer)"]["keys"] == 150
    assert loaded["keys_past"]["allocations (consumer)"]["keys"] == 0
    assert loaded["memory"]["archived"] is not None
