"""Multi-create: Nova's min_count, max_count and return_reservation_id, placed all or none.

The API half runs on falcon's TestClient; the placement half with in-process agents
(tests/agents/test_server_groups.py's cells: ``memory://`` with fakeredis, and RabbitMQ with a
real Redis). A batch's spawns wait until every member holds its claim (kube-scheduler's
Permit); when one member cannot be placed, every member ends in ERROR NoValidHost and
none keeps a claim or ever spawned.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from qsched.admin import queries
from qsched.ledger.base import State, Usage
from qsched.recovery.reaper import NO_VALID_HOST
from tests.agents.test_server_groups import (  # noqa: F401  (narrow is a fixture)
    OWNER,
    SMALL,
    Cell,
    hosts_of,
    narrow,
)
from tests.api.test_api import USER, app, bus, client, fault, server_body
from tests.helpers import wait_until

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

# -- the API --


def post(client, **fields: Any) -> Any:
    return client.simulate_post("/v2.1/servers", json=server_body(**fields), headers=USER)


def test_max_count_servers_named_name_n(client, stores, bus) -> None:
    result = post(client, min_count=2, max_count="3")
    assert result.status_code == 202, result.text
    first = result.json["server"]["id"]
    names = sorted(stores.instances.get(m.instance_uuid).name for m in bus.boots)
    assert names == ["vm1-1", "vm1-2", "vm1-3"]
    assert first == bus.boots[0].instance_uuid  # Nova answers with the first server


def test_as_many_as_the_quota_allows_between_min_and_max(client, stores, bus) -> None:
    stores.quota.set_limits("pa", instances=3, cores=-1, ram_mb=-1)
    assert post(client, min_count=2, max_count=5).status_code == 202
    assert len(bus.boots) == 3 and stores.quota.get_usage("pa").instances == 3
    message = fault(post(client, min_count=1, max_count=2), 403, "forbidden")
    assert message == (
        "Quota exceeded for instances: Requested 1-2, but already used 3 of 3 instances"
    )


def test_fewer_than_min_count_holds_nothing(client, stores, bus) -> None:
    stores.quota.set_limits("pa", instances=3, cores=-1, ram_mb=-1)
    message = fault(post(client, min_count=4, max_count=5), 403, "forbidden")
    assert message.startswith("Quota exceeded for instances: Requested 4-5")
    assert bus.boots == [] and stores.quota.get_usage("pa") == Usage(0, 0, 0)


def test_a_lone_server_keeps_its_name(client, stores, bus) -> None:
    stores.quota.set_limits("pa", instances=1, cores=-1, ram_mb=-1)
    assert post(client, min_count=1, max_count=4).status_code == 202
    (boot,) = bus.boots
    assert stores.instances.get(boot.instance_uuid).name == "vm1"


def test_return_reservation_id_and_the_list_filter(client, stores, bus) -> None:
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    post(client)  # another create
    result = post(client, max_count=2, return_reservation_id=True)
    assert result.status_code == 202 and set(result.json) == {"reservation_id"}
    rid = result.json["reservation_id"]
    assert rid.startswith("r-") and len(rid) == 10
    listed = client.simulate_get(f"/v2.1/servers?reservation_id={rid}", headers=USER).json
    assert sorted(s["name"] for s in listed["servers"]) == ["vm1-1", "vm1-2"]
    one = post(client, return_reservation_id="false")  # Nova's booleans
    assert "server" in one.json


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"min_count": 3, "max_count": 2}, "min_count must be <= max_count"),
        ({"max_count": 0}, "at least 1"),
        ({"min_count": "two"}, "whole number"),
        ({"max_count": 1001}, "max_count must be an integer from 1 to 1000"),
    ],
)
def test_bad_counts_are_400s(client, bus, fields, words) -> None:
    assert words in fault(post(client, **fields), 400, "badRequest")
    assert bus.boots == []


# -- placed all or none --


def record_spawns(cell: Cell) -> list[tuple[str, float]]:
    """Every spawn the agents' drivers start, with when."""
    spawned: list[tuple[str, float]] = []
    lock = threading.Lock()
    for agent in cell.agents:
        spawn = agent.driver.spawn

        def hooked(
            uuid: str, node: str, flavor: Any, fence: Any = None, spawn: Any = spawn
        ) -> None:
            with lock:
                spawned.append((uuid, time.time()))
            spawn(uuid, node, flavor, fence)

        agent.driver.spawn = hooked  # type: ignore[method-assign]
    return spawned


def claimed_at(cell: Cell, uuids: list[str]) -> list[float]:
    return [e.time for u in uuids for e in cell.stores.instances.events(u) if e.event == "claimed"]


@pytest.fixture
def short(narrow: Cell) -> Iterator[Cell]:  # noqa: F811
    """The narrow cell (3 hosts of 2 VCPUs) with a 3 s build deadline."""
    narrow.api.cell.scheduler = narrow.api.cell.scheduler.replace(build_timeout_s=3)
    yield narrow


def test_spawns_wait_until_every_member_holds_its_claim(narrow: Cell) -> None:  # noqa: F811
    spawned = record_spawns(narrow)
    made = narrow.api.boot_many(OWNER, "vm", SMALL.name, min_count=6, max_count=6).instances
    uuids = [m.uuid for m in made]
    records = narrow.settle(uuids)
    assert Counter(r.state for r in records.values()) == {State.ACTIVE: 6}
    assert {r.batch for r in records.values()} == {made[0].batch}
    assert max(claimed_at(narrow, uuids)) <= min(t for _u, t in spawned)  # Permit
    narrow.delete_all(uuids)


def test_a_batch_that_cannot_be_whole_ends_in_error_with_no_claim(short: Cell) -> None:
    """8 members on room for 6: the 6 claimed wait, and when the 2 others meet their
    deadline all 8 end NoValidHost; none spawned, nothing is held."""
    spawned = record_spawns(short)
    made = short.api.boot_many(OWNER, "vm", SMALL.name, min_count=8, max_count=8).instances
    uuids = [m.uuid for m in made]
    assert len(uuids) == 8
    records = short.settle(uuids, timeout_s=30)
    assert Counter(r.state for r in records.values()) == {State.ERROR: 8}
    assert {r.fault["message"] for r in records.values()} == {NO_VALID_HOST}
    reasons = Counter(r.fault["details"]["reason"] for r in records.values())
    assert reasons["batch"] >= 6  # ended with the first member that met its deadline
    assert len(claimed_at(short, uuids)) >= 6  # they did hold claims, and gave them back
    assert spawned == []
    assert all(short.stores.ledger.get_allocations(u).generation is None for u in uuids)
    assert short.stores.quota.get_usage(OWNER.project_id) == Usage(0, 0, 0)
    idle = lambda: all(not len(a.permit) and not len(a.builds) for a in short.agents)  # noqa: E731
    assert wait_until(idle, 5)  # each agent let its waiting builds go at its next poll
    why = queries.diagnose(short.stores, uuids[0], now=0.0, max_attempts=3)
    assert (
        f"placed all or none with the other members of multi-create {made[0].batch}"
        in (why.verdict)
        or "Nobody placed it before its deadline" in why.verdict
    )
    later = short.api.boot_many(OWNER, "ok", SMALL.name, min_count=6, max_count=6).instances
    assert {r.state for r in short.settle([m.uuid for m in later]).values()} == {State.ACTIVE}
    short.delete_all([m.uuid for m in later])


def test_an_anti_affinity_group_booted_as_one_multi_create_spreads_in_one_step(
    narrow: Cell,  # noqa: F811
) -> None:
    group = narrow.group("anti-affinity")
    spawned = record_spawns(narrow)
    made = narrow.api.boot_many(OWNER, "vm", SMALL.name, group=group.uuid, min_count=3,
                                max_count=3).instances  # fmt: skip
    uuids = [m.uuid for m in made]
    records = narrow.settle(uuids)
    assert len(hosts_of(records)) == 3 and max(hosts_of(records).values()) == 1
    assert max(claimed_at(narrow, uuids)) <= min(t for _u, t in spawned)
    narrow.delete_all(uuids)


def test_an_affinity_batch_its_host_cannot_hold_ends_whole(narrow: Cell) -> None:  # noqa: F811
    """3 members of an affinity group on hosts of 2 VCPUs: the host the group lands on
    ends the third NoValidHost at once, and the batch with it."""
    group = narrow.group("affinity")
    spawned = record_spawns(narrow)
    made = narrow.api.boot_many(OWNER, "vm", SMALL.name, group=group.uuid, min_count=3,
                                max_count=3).instances  # fmt: skip
    uuids = [m.uuid for m in made]
    records = narrow.settle(uuids, timeout_s=20)
    assert Counter(r.state for r in records.values()) == {State.ERROR: 3}
    assert spawned == [] and narrow.stores.groups.hosts(group.uuid) == {}
