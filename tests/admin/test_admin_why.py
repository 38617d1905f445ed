"""qsched-admin's pure parts: the diagnosis, the capacity view, the renderings. No server."""

from __future__ import annotations

import re
from typing import Any

from qsched.admin import capacity, views, why
from qsched.flavors import Flavor
from qsched.ledger.base import Event, Instance, Inventory, Provider, State, TaskState
from qsched.scheduling.request import Request

XLARGE = {"name": "m1.xlarge", "vcpus": 16, "ram_mb": 1024, "disk_gb": 0}


def provider(name: str, vcpus: int, used: int = 0, **kw) -> Provider:
    uuid = kw.pop("uuid", f"00000000-0000-0000-0000-{abs(hash(name)) % 10**12:012d}")
    inventories = {"VCPU": Inventory(vcpus), "MEMORY_MB": Inventory(65536)}
    return Provider(uuid, name, 1, inventories=inventories, usages={"VCPU": used}, **kw)


def nodes(*providers: Provider) -> list:
    by_host = capacity.nodes_by_host(providers)
    return [n for host in sorted(by_host) for n in by_host[host]]


def request(flavor: dict) -> Request:
    return Request.from_flavor(Flavor.from_dict(flavor))


def instance(state: State = State.BUILD, **kw: Any) -> Instance:
    fields: dict[str, Any] = {"created_at": 100.0, "deadline": 400.0,
                              "extra": {"scheduling_class": "m1.xlarge"}}  # fmt: skip
    fields.update(kw)
    return Instance("6a1c54d2-0a47-4e38-9e31-0e9d1f7b6c11", "p1", "u1", "vm", XLARGE, state,
                    **fields)  # fmt: skip


def test_host_of_reads_fake_driver_names() -> None:
    assert capacity.host_of("cn3-0") == "cn3"
    assert capacity.host_of("e2e1a2b-cn0-17") == "e2e1a2b-cn0"
    assert capacity.host_of("cn3-0_numa0") is None and capacity.host_of("cn3") is None


def test_children_go_with_their_root_and_odd_names_are_left_out() -> None:
    root = provider("cn0-0", 8, uuid="00000000-0000-0000-0000-000000000001")
    child = provider("cn0-0_gpu", 2, uuid="00000000-0000-0000-0000-000000000002",
                     parent_uuid=root.uuid, root_uuid=root.uuid)  # fmt: skip
    by_host = capacity.nodes_by_host([child, root, provider("storage", 4)])
    assert list(by_host) == ["cn0"]
    assert [p.name for p in by_host["cn0"][0].providers] == ["cn0-0", "cn0-0_gpu"]


def test_a_request_too_big_everywhere_names_the_largest_free() -> None:
    found = nodes(provider("cn1-0", 32, used=30), provider("cn3-0", 32, used=24))
    report = capacity.fit_report(found, request(XLARGE))
    assert report.fitting == []
    assert report.explain() == "no node has 16 VCPU free (largest free: 8 VCPU on cn3-0)"
    assert report.to_dict()["short"][0]["largest_free"] == {"amount": 8, "provider": "cn3-0"}


def test_a_missing_trait_is_counted_over_nodes() -> None:
    gpu = {**XLARGE, "vcpus": 1, "extra_specs": {"trait:CUSTOM_GPU": "required"}}
    report = capacity.fit_report(nodes(provider("cn0-0", 8), provider("cn1-0", 8)), request(gpu))
    assert report.explain() == (
        "cn0-0 is missing required trait CUSTOM_GPU (2 of 2 nodes); no live node could take it "
        "even empty: add nodes that can, or change it"
    )


def test_no_node_at_all() -> None:
    assert capacity.fit_report([], request(XLARGE)).explain() == "no live agent drives any node"


def test_waiting_with_nobody_consuming_and_no_room() -> None:
    report = capacity.fit_report(nodes(provider("cn3-0", 32, used=24)), request(XLARGE))
    live = why.Live("m1.xlarge", ["cn3"], [], report)
    events = [
        Event(100.0, "accepted", detail={"deadline": 400.0}),
        Event(101.0, "refused", "cn3", "cn3-0",
              {"reason": "not enough VCPU on cn3-0: 8 free of 16 needed", "kind": "capacity",
               "nodes": 1}),
    ]  # fmt: skip
    d = why.diagnose(instance(), events, now=160.0, max_attempts=3, live=live)
    assert d.outcome == "waiting"
    assert d.verdict == (
        "waiting for a host for 1m00s; refused by cn3 (not enough VCPU on cn3-0: 8 free of 16 "
        "needed); no live agent consumes class m1.xlarge: no node has 16 VCPU free (largest "
        "free: 8 VCPU on cn3-0); deadline in 4m00s"
    )
    text = why.render(d)
    assert "cn3 refused it: not enough VCPU on cn3-0: 8 free of 16 needed" in text
    assert re.search(r"nodes that fit it +0 of 1\n", text)


def test_waiting_without_live_agents_and_with_consumers() -> None:
    dead = why.diagnose(instance(), [], 200.0, 3, why.Live("m1.xlarge", [], [], None))
    assert "no agent is alive to take it" in dead.verdict
    busy = why.Live("m1.xlarge", ["cn0", "cn1"], ["cn0", "cn1"], None)
    assert (
        "2 live agents consume class m1.xlarge now (cn0, cn1)"
        in why.diagnose(instance(), [], 200.0, 3, busy).verdict
    )


def test_placed_after_a_conflict_and_a_failed_spawn() -> None:
    events = [
        Event(100.0, "accepted"),
        Event(100.1, "conflict", "cn0", "cn0-0", {"reason": "generation conflict."}),
        Event(100.2, "claimed", "cn0", "cn0-1", {"rp": {"VCPU": 16, "MEMORY_MB": 1024}}),
        Event(100.3, "requeued", "cn0", None, {"reason": "fake failure", "attempts": 1}),
        Event(100.5, "active", "cn1", "cn1-0"),
    ]
    placed = instance(State.ACTIVE, host="cn1", node="cn1-0", launched_at=100.5, attempts=1)
    d = why.diagnose(placed, events, 200.0, 3)
    assert d.verdict == "placed on cn1 (cn1-0) 0.5s after it was accepted, after 1 conflict, " \
        "1 failed spawn"  # fmt: skip
    texts = [step["text"] for step in d.history]
    assert texts[2] == "cn0 claimed cn0-1: 1024 MEMORY_MB, 16 VCPU"
    assert texts[3] == "spawn failed on cn0: fake failure; rescheduled (1 attempt(s) used)"


def test_tried_hosts_and_hand_backs() -> None:
    events = [
        Event(100.0, "accepted"),
        Event(100.1, "claimed", "cn0", "cn0-0", {"rp": {"VCPU": 16}}),
        Event(100.2, "requeued", "cn0", None, {"reason": "fake failure", "attempts": 1}),
        Event(100.3, "handed_back", None, None, {}),  # a record written without details
        Event(
            100.4,
            "handed_back",
            "cn0",
            None,
            {"alternate": "cn1", "handbacks": 2, "max_handbacks": 10},
        ),
        Event(100.5, "claimed", "cn1", "cn1-0", {"rp": {"VCPU": 16}}),
        Event(100.6, "active", "cn1", "cn1-0"),
    ]
    extra = {"request_id": "req-1", "scheduling_class": "m1.xlarge", "max_attempts": 3}
    placed = instance(State.ACTIVE, host="cn1", node="cn1-0", launched_at=100.6, attempts=1,
                      tried_hosts=("cn0",), handbacks=2, extra=extra)  # fmt: skip
    d = why.diagnose(placed, events, 200.0, 3)
    assert d.verdict.endswith("after 1 failed spawn, 2 hand-backs")
    assert d.history[4]["text"] == (
        "cn0 handed it back: it had failed it before and cn1 has room for class m1.xlarge "
        "(hand-back 2 of 10)"
    )
    assert "handed it back" in d.history[3]["text"]
    assert not d.history[5]["text"].endswith(")")  # cn1 never failed it
    assert (d.to_dict()["tried_hosts"], d.to_dict()["handbacks"]) == (["cn0"], 2)
    assert d.to_dict()["hand_backs"][1]["alternate"] == "cn1"
    assert re.search(r"tried hosts\s+cn0 \(handed back 2 times\)", why.render(d))


def test_a_claim_by_a_host_that_failed_it_says_so() -> None:
    events = [
        Event(100.0, "accepted"),
        Event(100.1, "claimed", "cn0", "cn0-0", {"rp": {"VCPU": 16}}),
        Event(100.2, "requeued", "cn0", None, {"reason": "fake failure", "attempts": 1}),
        Event(100.3, "claimed", "cn0", "cn0-1", {"rp": {"VCPU": 16}}),
    ]
    d = why.diagnose(instance(host="cn0", node="cn0-1", tried_hosts=("cn0",)), events, 200.0, 3)
    assert d.history[1]["text"] == "cn0 claimed cn0-0: 16 VCPU"
    assert d.history[3]["text"] == (
        "cn0 claimed cn0-1: 16 VCPU (again: it had failed it, and no other host had room or the "
        "hand-backs were used up)"
    )
    assert re.search(r"tried hosts\s+cn0\n", why.render(d))
    assert re.search(r"tried hosts\s+none", why.render(why.diagnose(instance(), [], 200.0, 3)))


def test_never_published() -> None:
    events = [Event(100.0, "accepted"), Event(100.1, "publish_failed", detail={"reason": "down"})]
    d = why.diagnose(instance(State.DELETED), events, 200.0, 3)
    assert d.outcome == "deleted" and d.verdict == "never published: down; ended DELETED"


def test_being_deleted_and_deleted() -> None:
    active = [Event(100.0, "accepted"), Event(100.5, "active", "cn0", "cn0-3")]
    deleting = instance(State.ACTIVE, host="cn0", node="cn0-3", task_state=TaskState.DELETING)
    assert why.diagnose(deleting, active, 200.0, 3).outcome == "deleting"
    gone = why.diagnose(instance(State.DELETED), active, 200.0, 3)
    assert gone.verdict == "deleted after it ran on cn0 (cn0-3)"


def test_table_csv_and_durations() -> None:
    rows: list[dict[str, Any]] = [
        {"name": "a", "n": 1, "tags": ["x", "y"]},
        {"name": "bbb", "n": None, "tags": []},
    ]
    columns = [views.Column("name", "name"), views.number("n", "n"), views.Column("tags", "tags")]
    assert views.table(rows, columns) == "NAME  N  TAGS\na     1  x,y\nbbb   -  -"
    assert views.to_csv(rows, columns) == "name,n,tags\na,1,x y\nbbb,,"
    assert [views.age(s) for s in (4.25, 192, 7380, 90000, None)] == [
        "4.2s", "3m12s", "2h03m", "1d01h", "-",
    ]  # fmt: skip
