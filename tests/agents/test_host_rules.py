"""Host rules: ``same_host``, ``different_host`` and 2.74's host and node, held by the claim.

The rule is made once, when the create is accepted (:mod:`qsched.compute.host_rules`), kept in
the record, and checked by the claim script (``allocate.lua``) in the step that takes
the resources: the ledger tests below call the claim straight, as agents would, and
the cell tests boot through real agents on kombu's ``memory://`` with fakeredis and on
RabbitMQ with a real Redis. One test publishes a request stripped of its rule, as an
older front door would have: only the claim keeps it there.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections import Counter

import pytest

from qsched import exception
from qsched.admin import queries
from qsched.compute.host_rules import MAX_NAMED_SERVERS, HostRequest, RequestedHostNotFound
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import HostRule, Instance, State
from qsched.recovery.reaper import NO_VALID_HOST
from qsched.scheduling.message import BootRequest, decode
from qsched.scheduling.records import record_for, request_for
from tests.agents.test_server_groups import OWNER, SMALL, Cell, hosts_of, narrow  # noqa: F401
from tests.ledger.test_group_ledger import claim
from tests.ledger.test_ledger_contract import make_provider, new_uuid
from tests.raw import redis_store

ADMIN = RequestContext.for_project("sg-admin", "sg-project", roles=("admin", "member", "reader"))

# -- the rule as a value --


def test_a_rule_sorts_its_hosts_and_reads_back() -> None:
    rule = HostRule(("cn2", "cn1", "cn2"), ("cn9",), "cn1-node")
    assert rule.only == ("cn1", "cn2") and rule == HostRule(("cn1", "cn2"), ("cn9",), "cn1-node")
    assert HostRule.from_dict(json.loads(json.dumps(rule.to_dict()))) == rule
    assert not HostRule() and HostRule(never=("a",))
    assert rule.refuses("cn3") == "not one of the hosts it may run on (cn1, cn2)"
    assert HostRule(never=("cn9",)).refuses("cn9") == "one of the hosts it must not run on"
    assert rule.refuses("cn1", "other") == "not the node cn1-node it was asked to run on"
    assert rule.refuses("cn1", "cn1-node") is None
    assert [rule.next_host(h) for h in ("", "cn1", "cn2")] == ["cn1", "cn2", None]


def test_the_rule_travels_in_the_request_and_survives_a_rebuild_from_the_record() -> None:
    """The janitor and a restarting agent publish what request_for rebuilds: the rule
    must come back whole, or a requeued request would lose it."""
    rule = HostRule(("cn1",), ("cn2", "cn3"), "cn1")
    request = BootRequest.create(new_uuid(), "p1", "u1", SMALL, hosts=rule, now=100.0)
    assert decode(request.encode()) == request and request.host_rule() == rule
    record = record_for(request, "vm")
    assert record.hosts == rule
    rebuilt = request_for(record, now=100.0)
    assert rebuilt.host_rule() == rule
    assert dataclasses.replace(rebuilt, published_at=request.published_at) == request
    assert BootRequest.create(new_uuid(), "p1", "u1", SMALL).host_rule() is None


# -- the claim holds it --


def rule_member(stores: Stores, rule: HostRule | None) -> str:
    uuid_ = new_uuid()
    flavor = {"name": "f", "vcpus": 1, "ram_mb": 512}
    record = Instance(uuid_, "p1", "u1", "vm", flavor, State.BUILD, hosts=rule)
    stores.instances.create(record, deadline=1e12)
    return uuid_


@pytest.fixture
def hosts(stores: Stores) -> dict[str, str]:
    return {f"cn{i}": make_provider(stores, vcpus=8, ram_mb=8192) for i in range(3)}


def test_the_claim_refuses_a_host_the_rule_does_not_allow(stores, hosts) -> None:
    stores.agents.heartbeat("cn2", ttl_s=60)
    only = rule_member(stores, HostRule(only=("cn1", "cn2")))
    with pytest.raises(exception.HostRuleRefused) as refused:
        claim(stores, only, "cn0", hosts["cn0"])
    assert str(refused.value) == "cn0 is not one of the hosts the server may run on (cn1, cn2)"
    # the first host of the rule whose agent lives: where the agent forwards it
    assert refused.value.kwargs["holder"] == "cn2" and refused.value.kwargs["refusals"] == 1
    assert stores.ledger.get_allocations(only).generation is None  # nothing taken
    claim(stores, only, "cn1", hosts["cn1"])
    assert stores.instances.get(only).host == "cn1"

    never = rule_member(stores, HostRule(never=("cn0",)))
    with pytest.raises(exception.HostRuleRefused, match="must not share a host"):
        claim(stores, never, "cn0", hosts["cn0"])
    claim(stores, never, "cn2", hosts["cn2"])


def test_the_claim_refuses_another_node_of_the_host(stores, hosts) -> None:
    asked = rule_member(stores, HostRule(only=("cn0",), node="cn0-1"))
    with pytest.raises(exception.HostRuleRefused) as refused:
        claim(stores, asked, "cn0", hosts["cn0"])  # the helper claims node cn0-0
    assert refused.value.kwargs["rule"] == "node"
    stores.ledger.claim(asked, {hosts["cn0"]: {"VCPU": 1}}, "cn0", "cn0-1")


def test_a_hand_back_names_only_an_alternate_the_rule_allows(stores, hosts) -> None:
    """A host that tried the request hands it back only to a host of the rule."""
    for host in hosts:
        stores.agents.heartbeat(host, ttl_s=60)
    uuid_ = rule_member(stores, HostRule(only=("cn0", "cn1")))
    claim(stores, uuid_, "cn0", hosts["cn0"])
    stores.instances.requeue(uuid_, "cn0", "spawn failed")
    stores.ledger.release(uuid_, "cn0")
    with pytest.raises(exception.TriedHost) as handed:
        stores.ledger.claim(uuid_, {hosts["cn0"]: {"VCPU": 1}}, "cn0", "cn0-0", max_handbacks=3)
    assert handed.value.kwargs["alternate"] == "cn1"
    alone = rule_member(stores, HostRule(only=("cn0",)))
    claim(stores, alone, "cn0", hosts["cn0"])
    stores.instances.requeue(alone, "cn0", "spawn failed")
    stores.ledger.release(alone, "cn0")
    # no other host may take it: cn0 claims it again rather than hand it to nobody
    stores.ledger.claim(alone, {hosts["cn0"]: {"VCPU": 1}}, "cn0", "cn0-0", max_handbacks=3)


def test_the_audit_finds_a_server_its_rule_forbids(stores, hosts) -> None:
    uuid_ = rule_member(stores, HostRule(only=("cn0",)))
    claim(stores, uuid_, "cn0", hosts["cn0"])
    assert audit(stores).ok
    raw = redis_store(stores)  # as if a claim had not checked the rule
    rule = HostRule(never=("cn0",))
    raw.client.hset(raw.keys.instance(uuid_), "hosts", json.dumps(rule.to_dict()))
    (found,) = audit(stores).host_rule_mismatches
    assert found["instance"] == uuid_ and found["broken"] == "one of the hosts it must not run on"


# -- the front door makes it --


def boot(cell: Cell, name: str, context: RequestContext = OWNER, **hosts) -> str:
    found = cell.api.boot_many(context, name, SMALL.name, hosts=HostRequest(**hosts))
    return found.instances[0].uuid


def test_same_host_lands_with_its_server_and_ends_at_once_when_that_host_is_full(
    narrow: Cell,  # noqa: F811
) -> None:
    first = boot(narrow, "a")
    host = narrow.settle([first])[first].host
    second = boot(narrow, "b", same_host=(first,))
    record = narrow.settle([second])[second]
    assert record.host == host and record.hosts == HostRule(only=(host,))
    # sent to that host's own queue: claimed at its first delivery
    assert [e.event for e in narrow.stores.instances.events(second)][:2] == ["accepted", "claimed"]
    third = boot(narrow, "c", same_host=(first, second))  # the host is full (2 VCPUs)
    ended = narrow.settle([third], timeout_s=15)[third]
    assert (ended.state, ended.fault["message"]) == (State.ERROR, NO_VALID_HOST)
    assert ended.fault["details"]["reason"] == "host rule"
    assert all(e.host in (None, host) for e in narrow.stores.instances.events(third))
    narrow.delete_all([first, second, third])


def test_same_host_of_servers_on_no_host_ends_at_once(narrow: Cell) -> None:  # noqa: F811
    other_project = RequestContext.for_project("someone", "elsewhere")
    narrow.stores.quota.set_limits("elsewhere", instances=-1, cores=-1, ram_mb=-1)
    theirs = boot(narrow, "theirs", other_project)
    narrow.settle([theirs])
    # unknown, and another project's (a member may not learn where it runs)
    for named in ((str(uuid.uuid4()),), (theirs,)):
        ended = narrow.settle([boot(narrow, "lost", same_host=named)])
        (record,) = ended.values()
        assert record.state == State.ERROR
        assert record.fault["details"] == {
            "filter": "host rule", "reason": "no server of same_host is on a host"
        }  # fmt: skip
    narrow.api.delete(other_project, theirs)


def test_different_host_never_lands_on_its_servers_host(narrow: Cell) -> None:  # noqa: F811
    """Four boots at once fill the other two hosts; a fifth waits for its deadline
    rather than take the room left beside the server it must avoid."""
    first = boot(narrow, "a")
    host = narrow.settle([first])[first].host
    apart = [boot(narrow, f"d{i}", different_host=(first,)) for i in range(4)]
    records = narrow.settle(apart)
    assert Counter(r.state for r in records.values()) == {State.ACTIVE: 4}
    assert host not in hosts_of(records) and len(hosts_of(records)) == 2
    narrow.api.cell.scheduler = narrow.api.cell.scheduler.replace(build_timeout_s=3)
    try:
        fifth = boot(narrow, "d5", different_host=(first,))
    finally:
        narrow.api.cell.scheduler = narrow.api.cell.scheduler.replace(build_timeout_s=60)
    ended = narrow.settle([fifth], timeout_s=30)[fifth]
    assert (ended.state, ended.host) == (State.ERROR, None)
    events = narrow.stores.instances.events(fifth)
    refused = [e for e in events if e.detail.get("kind") == "host_rule"]
    assert refused and {e.host for e in refused} == {host}
    why = queries.diagnose(narrow.stores, fifth, now=0.0, max_attempts=3)
    assert "must not share a host with (different_host)" in why.verdict, why.verdict
    narrow.delete_all([first, fifth, *apart])


def test_the_claim_keeps_a_rule_the_request_lost(narrow: Cell) -> None:  # noqa: F811
    """A request published without its rule (an older front door): the claim still
    refuses other hosts, and the agent forwards it to the host of the rule."""
    first = boot(narrow, "a")
    host = narrow.settle([first])[first].host
    narrow.api.cell.bus, real_bus = _Stripping(narrow.bus), narrow.api.cell.bus
    try:
        second = boot(narrow, "b", same_host=(first,))
    finally:
        narrow.api.cell.bus = real_bus
    record = narrow.settle([second])[second]
    assert record.state == State.ACTIVE and record.host == host
    narrow.delete_all([first, second])


class _Stripping:
    """A bus that publishes every boot request to its class queue without its host rule."""

    def __init__(self, bus) -> None:
        self.bus = bus

    def publish_boot(self, request: BootRequest) -> None:
        self.bus.publish_boot(_bare(request))

    def publish_to_host(self, host: str, request: BootRequest) -> None:
        self.bus.publish_boot(_bare(request))

    def __getattr__(self, name: str):
        return getattr(self.bus, name)


def _bare(request: BootRequest) -> BootRequest:
    return dataclasses.replace(request, only_hosts=(), never_hosts=(), requested_node=None)


def test_an_admin_boots_on_a_host_or_a_node_and_a_full_one_ends_at_once(narrow: Cell) -> None:  # noqa: F811
    target = narrow.agents[1].host
    (node,) = narrow.agents[1].index.names()[0]  # the fake driver's one node: <host>-0
    placed = [boot(narrow, "h", ADMIN, host=target), boot(narrow, "n", ADMIN, node=node)]
    records = narrow.settle(placed)
    assert {(r.host, r.node) for r in records.values()} == {(target, node)}
    assert records[placed[1]].hosts == HostRule(only=(target,), node=node)
    full = boot(narrow, "h3", ADMIN, host=target)
    ended = narrow.settle([full], timeout_s=15)[full]
    assert (ended.state, ended.fault["details"]["reason"]) == (State.ERROR, "host rule")
    narrow.delete_all([*placed, full])


def test_a_requested_destination_is_checked_before_anything_is_held(narrow: Cell) -> None:  # noqa: F811
    with pytest.raises(exception.Forbidden, match="requested_destination"):
        boot(narrow, "x", OWNER, host=narrow.agents[0].host)
    with pytest.raises(RequestedHostNotFound, match="Compute host nowhere could not be found"):
        boot(narrow, "x", ADMIN, host="nowhere")
    with pytest.raises(RequestedHostNotFound, match="Compute host nonode could not be found"):
        boot(narrow, "x", ADMIN, node="nonode")
    too_many = tuple(str(uuid.uuid4()) for _ in range(MAX_NAMED_SERVERS + 1))
    with pytest.raises(exception.Invalid, match="at most 1000 may be named"):
        boot(narrow, "x", different_host=too_many)
    assert narrow.stores.quota.get_usage(OWNER.project_id).instances == 0
