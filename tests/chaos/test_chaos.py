"""The chaos harness: its checks must catch each broken invariant, and a short run works.

The checks are tested on an in-process fakeredis ledger with each invariant
broken on purpose. The smoke run starts a real stack on the Redis transport with
its own two ``redis-server`` processes (it restarts them, so it never touches a
shared server) and injects one fault of each kind for a few seconds.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from qsched.chaos import checks
from qsched.chaos import cli as chaos_cli
from qsched.chaos import report as report_module
from qsched.chaos.cli import main as chaos_main
from qsched.chaos.faults import KINDS, SERVER_KINDS, WINDOW, Fault, default_counts, make_plan
from qsched.chaos.load import Call
from qsched.chaos.report import table
from qsched.chaos.runner import ChaosRun, RunSettings
from qsched.chaos.stack import StackSpec
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import Instance, Inventory, MoveRequest, State, TaskState
from qsched.ledger.base.migrations import MIGRATION
from qsched.stack.rabbitmq import config_text
from tests.conftest import TEST_DURABILITY, require_server
from tests.helpers import failed_invariants
from tests.raw import redis_store

HOSTS = ["h0", "h1"]
FLAVOR = {"name": "small", "vcpus": 1, "ram_mb": 1024}


@pytest.fixture
def cloud() -> Stores:
    """Two hosts with one node each (named as the fake driver names them)."""
    stores = open_stores(
        LedgerOptions.defaults().replace(durability=TEST_DURABILITY),
        url=f"fakeredis://chaos-{uuid.uuid4().hex}",
    )
    for host in HOSTS:
        rp = str(uuid.uuid5(uuid.NAMESPACE_DNS, host))
        stores.ledger.create_provider(rp, f"{host}-0")
        stores.ledger.set_inventory(rp, 0, {"VCPU": Inventory(4), "MEMORY_MB": Inventory(8192)})
    return stores


def rp_of(host: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, host))


def boot(stores: Stores, name: str = "vm", host: str | None = "h0", active: bool = True) -> str:
    uuid_ = str(uuid.uuid4())
    stores.instances.create(
        Instance(uuid_, "p1", "u1", name, FLAVOR, State.BUILD), time.time() + 60
    )
    if host:
        stores.ledger.claim(uuid_, {rp_of(host): {"VCPU": 1, "MEMORY_MB": 1024}}, host, f"{host}-0")
        if active:
            stores.instances.set_active(uuid_, host, f"{host}-0")
    return uuid_


def accepted(*uuids: str) -> dict[str, Call]:
    return {u: Call("boot", f"vm-{u[:4]}", "p1", 0.0, 0.1, 202, u) for u in uuids}


def run_all(stores: Stores, accepted_: dict[str, Call], calls: list[Call] = ()) -> dict:
    snap = checks.take_snapshot(stores, HOSTS)
    return {
        "lost": checks.lost(snap, accepted_),
        "stuck": checks.stuck(snap, accepted_),
        "stranded": checks.stranded(
            snap, accepted_, checks.histories(stores, snap.records), [(0.0, time.time() + 60)]
        ),  # a crash, all along
        "lost_deletes": checks.lost_deletes(snap, [c for c in calls if c.kind == "delete"]),
        "duplicates": checks.duplicates(snap, checks.histories(stores, snap.records)),
        "overcommits": checks.overcommits(snap),
        "leaks": checks.leaks(snap),
        "accounting": checks.accounting(snap),
        "partial_state": checks.partial_state(snap, [c for c in calls if c.status == 503]),
    }


def broken(found: dict) -> set[str]:
    return {name for name, items in found.items() if items}


class TestChecks:
    def test_a_clean_ledger_passes_every_check(self, cloud: Stores) -> None:
        active, ended, failed = boot(cloud), boot(cloud, host="h1"), boot(cloud, host=None)
        cloud.instances.delete(ended)
        cloud.instances.add_event(failed, "refused", host="h0", reason="no room")
        cloud.instances.set_error(failed, "No valid host was found.", {"reason": "deadline"})
        deletes = [Call("delete", ended, "p1", 1.0, 1.1, 204, ended)]
        assert broken(run_all(cloud, accepted(active, ended, failed), deletes)) == set()
        assert checks.audit_findings(cloud)[1] == []

    def test_a_request_left_waiting_is_stuck(self, cloud: Stores) -> None:
        waiting, claimed = boot(cloud, host=None), boot(cloud, active=False)
        found = run_all(cloud, accepted(waiting, claimed))
        assert broken(found) == {"stuck"}
        assert {f["instance"] for f in found["stuck"]} == {waiting, claimed}

    def test_a_request_ended_by_its_deadline_untouched_is_stranded(self, cloud: Stores) -> None:
        """A claim a crash rolled back after its agent acked the request: nobody had it in
        hand again, and it ended by its deadline. One that agents refused is not."""
        untouched, refused = boot(cloud, host=None), boot(cloud, host=None)
        cloud.instances.add_event(refused, "refused", host="h0", reason="no room")
        for uuid_ in (untouched, refused):
            cloud.instances.set_error(uuid_, "No valid host was found.", {"reason": "deadline"})
        found = run_all(cloud, accepted(untouched, refused))
        assert broken(found) == {"stranded"}
        assert [f["instance"] for f in found["stranded"]] == [untouched]
        snap, history = checks.take_snapshot(cloud, HOSTS), checks.histories(cloud, [untouched])
        # no crash, or one over before it went waiting: held by the bus, for all we know
        assert checks.stranded(snap, accepted(untouched), history, []) == []
        assert checks.stranded(snap, accepted(untouched), history, [(0.0, 1.0)]) == []

    def test_an_accepted_request_without_a_record_is_lost(self, cloud: Stores) -> None:
        found = run_all(cloud, accepted(str(uuid.uuid4())))
        assert [f["problem"] for f in found["lost"]] == ["no record"]

    def test_allocations_on_two_hosts_are_a_duplicate(self, cloud: Stores) -> None:
        inst = boot(cloud)
        consumer = cloud.ledger.get_allocations(inst)
        both = {rp_of(h): {"VCPU": 1, "MEMORY_MB": 1024} for h in HOSTS}
        cloud.ledger.put_allocations(inst, both, consumer.generation, "p1", "u1")
        found = run_all(cloud, accepted(inst))
        problems = {f["problem"] for f in found["duplicates"]}
        assert "allocations on several hosts" in problems
        assert "held by a provider of another host" in problems
        assert "duplicates" in broken(found)

    def test_two_active_events_are_a_duplicate(self, cloud: Stores) -> None:
        inst = boot(cloud)
        cloud.instances.add_event(inst, "active", host="h1", node="h1-0")
        assert run_all(cloud, accepted(inst))["duplicates"] == [
            {"instance": inst, "problem": "2 ACTIVE events"}
        ]

    def test_a_claim_while_another_host_holds_it_is_a_duplicate(self, cloud: Stores) -> None:
        inst = boot(cloud, active=False)
        cloud.instances.add_event(inst, "claimed", host="h1", node="h1-0")
        cloud.instances.add_event(inst, "active", host="h1", node="h1-0")
        problems = [f["problem"] for f in run_all(cloud, {})["duplicates"]]
        assert problems == ["claimed by h1 while h0 held it"]

    def test_usage_over_capacity_is_an_overcommit(self, cloud: Stores) -> None:
        boot(cloud)
        store = redis_store(cloud)
        store.client.hincrby(store.keys.provider(rp_of("h0")), "u:VCPU", 4)
        found = run_all(cloud, {})
        assert [(f["resource_class"], f["usage"], f["capacity"]) for f in found["overcommits"]] == [
            ("VCPU", 5, 4)
        ]
        assert "usage counter differs from allocations" in {
            f["problem"] for f in found["accounting"]
        }

    def test_allocations_of_an_ended_instance_leak(self, cloud: Stores) -> None:
        inst = boot(cloud)
        redis_store(cloud).client.hset(redis_store(cloud).keys.instance(inst), "state", "ERROR")
        problems = {f["problem"] for f in run_all(cloud, {})["leaks"]}
        assert problems == {
            "allocations without a live instance",
            "quota held for an instance that is not live",
        }

    def test_quota_used_must_match_the_live_instances(self, cloud: Stores) -> None:
        boot(cloud)
        redis_store(cloud).client.hincrby(redis_store(cloud).keys.quota_used("p1"), "cores", 1)
        found = run_all(cloud, {})
        assert broken(found) == {"accounting"}
        assert found["accounting"][0]["used"]["cores"] == 2

    def test_a_move_that_did_not_end_is_a_finding_and_its_consumer_a_leak(
        self, cloud: Stores
    ) -> None:
        inst = boot(cloud)
        for host in HOSTS:
            cloud.agents.heartbeat(host, 60)
        move = MoveRequest(inst, str(uuid.uuid4()), MIGRATION, "req-1", "u1", "p1",
                           time.time() + 60)  # fmt: skip
        cloud.migrations.start(move)
        cloud.migrations.claim(move.uuid, {rp_of("h1"): {"VCPU": 1, "MEMORY_MB": 1024}}, "h1",
                               "h1-0")  # fmt: skip
        snap = checks.take_snapshot(cloud, HOSTS)
        (found,) = checks.unsettled_moves(cloud, snap.records)
        assert (found["migration"], found["status"]) == (move.uuid, "migrating")
        # the run's checks come after the moves settled: one left is a finding, and its
        # migration consumer, no instance's, a leak
        assert move.uuid in {f["instance"] for f in checks.leaks(snap)}
        cloud.migrations.finish(move.uuid, "h1")
        cloud.migrations.confirm(move.uuid, "ask")
        cloud.migrations.confirm(move.uuid, "done", "h0")
        assert checks.unsettled_moves(cloud, checks.read_records(cloud)) == []

    def test_active_without_allocations_is_a_mismatch(self, cloud: Stores) -> None:
        inst = boot(cloud)
        redis_store(cloud).client.delete(redis_store(cloud).keys.consumer(inst))
        problems = {f["problem"] for f in run_all(cloud, {})["accounting"]}
        assert "ACTIVE without allocations" in problems

    def test_an_offloaded_server_holds_nothing_and_must_not(self, cloud: Stores) -> None:
        inst = boot(cloud)
        cloud.instances.start_action(inst, "shelve", "req-1", "u1", "p1")
        cloud.instances.step_action(inst, "h0", TaskState.SHELVING,
                                    TaskState.SHELVING_OFFLOADING, "off", "", True)  # fmt: skip
        assert cloud.instances.offload(inst, "h0", "compute_shelve_offload_instance")
        assert broken(run_all(cloud, accepted(inst))) == set()
        rp = rp_of("h0")
        cloud.ledger.put_allocations(inst, {rp: {"VCPU": 1}}, None, "p1", "u1")
        problems = {f["problem"] for f in run_all(cloud, {})["accounting"]}
        assert "offloaded with allocations" in problems

    def test_a_503_must_leave_nothing(self, cloud: Stores) -> None:
        left = boot(cloud, name="refused-1", host=None)
        rolled_back = boot(cloud, name="refused-2", host=None)
        cloud.instances.delete(rolled_back)
        calls = [Call("boot", f"refused-{i}", "p1", 0.0, 0.1, 503) for i in (1, 2, 3)]
        found = run_all(cloud, {}, calls)["partial_state"]
        assert [(f["instance"], f["state"], f["quota_held"]) for f in found] == [
            (left, "BUILD", True)
        ]

    def test_a_204_delete_must_end_deleted(self, cloud: Stores) -> None:
        inst = boot(cloud)
        calls = [Call("delete", inst, "p1", 1.0, 1.1, 204, inst)]
        found = run_all(cloud, accepted(inst), calls)
        assert [f["instance"] for f in found["lost_deletes"]] == [inst]

    def test_a_drained_ledger_holds_nothing(self, cloud: Stores) -> None:
        inst = boot(cloud)
        assert {f["problem"] for f in checks.drained(checks.take_snapshot(cloud, HOSTS))} == {
            "not DELETED after the drain",
            "allocations left",
            "usage left",
            "quota used left",
        }
        cloud.instances.delete(inst)
        assert checks.drained(checks.take_snapshot(cloud, HOSTS)) == []

    def test_an_unanswered_boot_left_waiting_is_stuck(self, cloud: Stores) -> None:
        waiting = boot(cloud, name="no-answer", host=None)
        found = run_all(cloud, {})["stuck"]
        assert [(f["instance"], f["problem"]) for f in found] == [
            (waiting, "its boot got no answer and it is still waiting")
        ]

    def test_an_index_that_differs_from_the_ledger_is_a_mismatch(self, cloud: Stores) -> None:
        boot(cloud)
        snap = checks.take_snapshot(cloud, HOSTS)
        digests = checks.ledger_digests(snap)
        details = {"h0": {"index_digest": digests["h0"]}, "h1": {"index_digest": f"{0:016x}"}}
        assert checks.index_mismatches(snap, details) == []
        details["h1"] = {"index_digest": digests["h0"]}  # h1's agent thinks it holds h0's VM
        assert [f["host"] for f in checks.index_mismatches(snap, details)] == ["h1"]

    def test_vms_the_ledger_does_not_place_are_driver_mismatches(self, cloud: Stores) -> None:
        active, ended = boot(cloud), boot(cloud)
        cloud.instances.delete(ended)
        snap = checks.take_snapshot(cloud, HOSTS)
        assert checks.driver_mismatches(snap, {"h0": {active: "h0-0"}, "h1": {}}) == []
        found = checks.driver_mismatches(snap, {"h0": {ended: "h0-0"}, "h1": {active: "h1-0"}})
        assert {(f["instance"], f["problem"]) for f in found} == {
            (ended, "runs while the ledger does not place it here"),  # deleted, still running
            (active, "runs while the ledger does not place it here"),  # on the wrong host
            (active, "ACTIVE but its host's driver does not run it"),
        }

    def test_an_error_while_unpublished_held_quota_for_nothing(self, cloud: Stores) -> None:
        stranded, published = boot(cloud, host=None), boot(cloud, host=None)
        cloud.instances.outbox_done([(published, _score(cloud, published))])
        for uuid_ in (stranded, published):
            cloud.instances.set_error(uuid_, "No valid host was found.", {"reason": "deadline"})
        found = checks.unpublished(checks.histories(cloud, [stranded, published]))
        assert [f["instance"] for f in found] == [stranded]

    def test_quota_over_its_limit_at_any_sample_is_a_finding(self) -> None:
        limits = {"instances": 2, "cores": 4, "ram_mb": 8192}
        fine = {"p1": {"instances": 2, "cores": 4, "ram_mb": 4096}}
        over = {"p1": {"instances": 3, "cores": 4, "ram_mb": 4096}}
        assert checks.quota_exceeded([(1.0, fine)], limits) == []
        found = checks.quota_exceeded([(1.0, fine), (2.0, over)], limits)
        assert [(f["at"], f["over"]) for f in found] == [(2.0, {"instances": 3})]

    def test_poison_must_be_dead_lettered_once_and_valid_requests_never(
        self, cloud: Stores
    ) -> None:
        from qsched.bus.base import DeadLetter
        from qsched.scheduling.message import BootRequest

        inst = boot(cloud)
        valid = BootRequest.create(inst, "p1", "u1", _flavor()).encode()
        poison = [{"kind": "garbage", "queue": "q", "token": "t1"},
                  {"kind": "empty", "queue": "q", "token": None}]  # fmt: skip

        def letter(body: bytes) -> DeadLetter:
            return DeadLetter(body, "reason", "q", "boot.small", 1.0)

        records = checks.read_records(cloud)
        assert checks.dead_letter_findings([letter(b"x t1"), letter(b"")], poison, records) == []
        found = checks.dead_letter_findings(
            [letter(b"x t1"), letter(b"t1 again"), letter(valid)], poison, records
        )
        assert [f["problem"] for f in found] == [
            "empty bodies dead-lettered",
            "dead-lettered 2 times, not once",
            "a valid request was dead-lettered",
        ]

    def test_a_forged_message_may_be_dropped_but_never_obeyed(self, cloud: Stores) -> None:
        from qsched.bus.base import DeadLetter
        from qsched.scheduling.message import DeleteRequest

        placed, deleted, asked = boot(cloud), boot(cloud), boot(cloud)
        local, answered = boot(cloud, host="h1"), boot(cloud, host="h1")
        cloud.instances.delete(deleted)  # as an obeyed forged delete would leave it
        cloud.instances.mark_deleting(asked)
        cloud.instances.delete(asked)  # as a delete the API asked for leaves it
        # as the API leaves one whose agent's heartbeat expired (killed, or starved)
        cloud.instances.add_event(local, "local_delete", host="h1", reason="heartbeat")
        cloud.instances.delete(local, take_over=True)
        cloud.instances.delete(answered)  # no event of the API's, but it answered 204
        forged = DeleteRequest("t-delete", asked, "h0", "h0-0").encode()
        poison = [{"kind": "forged boot", "queue": "q", "token": "t-boot", "instance": placed},
                  {"kind": "forged delete", "queue": "q", "token": "t-delete",
                   "instance": asked},
                  {"kind": "forged delete", "queue": "q", "token": "t-gone",
                   "instance": deleted},
                  {"kind": "forged delete", "queue": "q", "token": "t-local",
                   "instance": local},
                  {"kind": "forged delete", "queue": "q", "token": "t-answered",
                   "instance": answered}]  # fmt: skip
        letter = DeadLetter(forged, "reason", "q", "host.h0", 1.0)
        records = checks.read_records(cloud)
        history = checks.histories(cloud, records)
        found = checks.dead_letter_findings([letter], poison, records, history, {answered})
        assert [(f["token"], f["problem"]) for f in found] == [
            ("t-gone", "a forged delete was obeyed: DELETED, never asked"),
        ]  # the forged boot was dropped (its instance ACTIVE), its claim the flavor's own
        history[placed][1]["detail"] = {rp_of("h0"): {"VCPU": 4, "MEMORY_MB": 1024}}
        found = checks.dead_letter_findings([letter], poison, records, history)
        assert found[0]["problem"] == "a forged boot was claimed: other amounts than its flavor"

    def test_claimed_by_reads_build_claims_of_one_host(self, cloud: Stores) -> None:
        building, _active = boot(cloud, active=False), boot(cloud)
        boot(cloud, host="h1", active=False)
        assert checks.claimed_by(cloud, "h0") == {building}


def _score(stores: Stores, uuid_: str) -> str:
    return f"{redis_store(stores).client.zscore(redis_store(stores).keys.outbox, uuid_):.6f}"


def _flavor():
    from qsched.flavors import Flavor

    return Flavor("small", 1, 1024, 0)


def test_the_fault_plan_is_seeded_and_inside_the_window() -> None:
    counts = {kind: 1 for kind in KINDS} | {"agent_kill": 3}
    plan = make_plan(100, counts, random.Random(7))
    assert plan == make_plan(100, counts, random.Random(7))
    assert sorted(f.kind for f in plan) == sorted(k for k in KINDS for _ in range(counts[k]))
    times = [f.at_s for f in plan]
    assert times == sorted(times)
    assert WINDOW[0] * 100 <= times[0] and times[-1] <= WINDOW[1] * 100


def test_a_cluster_run_loses_nodes_instead_of_restarting_the_broker() -> None:
    assert default_counts(240)["rabbit_node_loss"] == 0
    counts = default_counts(240, cluster=True)
    assert (counts["rabbit_node_loss"], counts["broker_restart"]) == (2, 0)
    plan = make_plan(100, counts, random.Random(3))
    assert sum(f.kind == "rabbit_node_loss" for f in plan) == 2


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["--rabbit-cluster", "2", "--transport", "oslo"], "give 3 or more"),
        (["--rabbit-cluster", "3"], "use --transport amqp, oslo or rabbit"),
        (["--node-losses", "1", "--transport", "oslo"], "add --rabbit-cluster 3"),
        (["--rabbit-cluster", "3", "--transport", "rabbit", "--broker-restarts", "1"],
         "use --node-losses"),
    ],
)  # fmt: skip
def test_cluster_options_it_cannot_honour_are_refused(args: list[str], refusal: str) -> None:
    result = CliRunner().invoke(chaos_cli.main, args)
    assert result.exit_code == 2, result.output
    assert refusal in result.output


def test_a_node_loss_counts_the_boots_sent_after_it_and_placed_while_it_lasted() -> None:
    fault = Fault("rabbit_node_loss", 5.0, "qs-0", started=100.0, restored=120.0,
                  detail={"outage_s": 6.0})  # fmt: skip
    calls = [Call("boot", "a", "p1", 99.0, 99.1, 202, "a"),  # sent before: a spawn under way
             Call("boot", "b", "p1", 101.0, 101.2, 202, "b"),
             Call("boot", "c", "p1", 102.0, 102.1, 202, "c"),
             Call("boot", "d", "p1", 103.0, 103.1, 503, None)]  # fmt: skip
    history = {u: [{"event": "active", "t": t}] for u, t in (("a", 100.5), ("b", 101.8),
                                                             ("c", 107.0))}  # fmt: skip
    figures = report_module.fault_figures(fault, calls, [100.5, 101.8, 107.0], history, 90.0)
    assert figures["placement_s"] == 0.5  # a's spawn: no sign of the bus
    assert figures["failover_s"] == 1.8
    assert figures["placed_while_down"] == 1  # c went ACTIVE after the node was started


def test_a_joining_node_finds_the_first_by_classic_peer_discovery() -> None:
    assert config_text("127.0.0.1:5999", []) == "listeners.tcp.1 = 127.0.0.1:5999\n"
    text = config_text("127.0.0.1:5999", ["qs-0@localhost"])
    assert "cluster_formation.peer_discovery_backend = classic_config\n" in text
    assert "cluster_formation.classic_config.nodes.1 = qs-0@localhost\n" in text


def short_run(transport: str, duration_s: float, tmp_path: Path) -> tuple[dict, dict]:
    """A chaos run on ``transport`` with every fault once, on a small stack; its report
    and the fault counts asked for."""
    spec = StackSpec(agents=3, nodes_per_agent=2, node_vcpus=4, node_ram_mb=8192,
                     spawn_delay_s=0.3, build_timeout_s=16, shutdown_timeout_s=5,
                     heartbeat_ttl_s=1, reconcile_interval_s=1, ledger_timeout_s=1)  # fmt: skip
    counts = {kind: 1 for kind in KINDS}
    settings = RunSettings(transport, duration_s=duration_s, rate=3, lifetime_s=3,
                           outage_s=1.5, stall_s=2, fault_counts=counts, spec=spec,
                           progress_every_s=60)  # fmt: skip
    return ChaosRun(settings, tmp_path, lambda line: None).execute(), counts


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(150)
def test_a_short_run_injects_every_fault_and_checks(tmp_path: Path) -> None:
    """Redis transport on servers of the run's own: nothing shared is restarted."""
    if shutil.which("redis-server") is None:
        require_server("redis-server", "PATH", FileNotFoundError("redis-server"),
                       "install it with: apt-get install redis-server")  # fmt: skip
    if shutil.which("gunicorn", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("gunicorn is missing from the virtual environment: run make install")
    report, counts = short_run("redis", 40, tmp_path)
    events = report["faults"]["events"]
    assert [e.get("error") for e in events] == [None] * len(KINDS), events
    assert report["faults"]["by_kind"] == counts
    # every part came back; poison is a burst of publishes, too quick to count on a figure
    assert all(e["back_after_s"] > 0 for e in events if e["kind"] != "poison"), events
    assert all(e["back_after_s"] >= 0 for e in events), events
    assert report["requests"]["accepted"] > 10
    assert report["quiescence"]["reached"]
    assert "lost" in table(report)
    moved = {k: n for k, n in report["moves_asked"].items() if k.endswith(":202")}
    assert sum(moved.values()) >= 5, report["moves_asked"]  # moves ran under the faults
    assert report["ok"], failed_invariants(report)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_a_short_oslo_run_injects_every_fault_and_checks(tmp_path: Path) -> None:
    """The oslo.messaging bus on a RabbitMQ node of the run's own (its broker restart
    touches no shared node), every fault once, the same checks as the other buses."""
    for command in ("redis-server", "rabbitmq-server"):
        if shutil.which(command) is None:
            require_server(command, "PATH", FileNotFoundError(command),
                           f"install it with: apt-get install {command}")  # fmt: skip
    report, counts = short_run("oslo", 30, tmp_path)
    events = report["faults"]["events"]
    assert [e.get("error") for e in events] == [None] * len(KINDS), events
    assert report["faults"]["by_kind"] == counts
    assert report["requests"]["accepted"] > 10
    assert report["quiescence"]["reached"]
    assert report["cleanup"]["broker_start_s"] < 60
    assert report["ok"], failed_invariants(report)


def test_a_sentinel_ledger_kills_its_master_instead_of_the_one_server_faults() -> None:
    counts = default_counts(240, "sentinel")
    assert counts["master_kill"] == 1
    assert [counts[kind] for kind in SERVER_KINDS] == [0] * len(SERVER_KINDS)
    assert default_counts(240)["machine_crash"] == 1 and "master_kill" not in default_counts(240)
    plan = make_plan(100, counts, random.Random(3))
    assert "master_kill" in [f.kind for f in plan]


@pytest.mark.parametrize("ledger", ["redis", "sentinel"])
def test_the_fault_counts_of_a_run_left_to_its_defaults(ledger: str) -> None:
    """qsched-chaos with no count given (make chaos) stopped at a KeyError once the
    Sentinel ledger's master_kill had joined the counts: one redis-server has none."""
    from qsched.chaos.cli import COUNT_OPTIONS, _counts

    options = {"duration_s": 240, "ledger": ledger, "rabbit_cluster": 0,
               **{option: None for option in COUNT_OPTIONS.values()}}  # fmt: skip
    counts = _counts(options)
    assert set(counts) == set(COUNT_OPTIONS)
    sentinel = ledger == "sentinel"
    assert (counts["master_kill"], counts["machine_crash"]) == (int(sentinel), int(not sentinel))


@pytest.mark.parametrize(("ledger", "expected"), [("redis", "product"), ("sentinel", "replica")])
def test_chaos_runs_the_products_default_durability(ledger: str, expected: str) -> None:
    """make chaos gives no --durability: a one-server ledger then runs [ledger]
    durability's shipped default, so what its machine crash may lose is the default's
    (nothing); a Sentinel set runs replica, the setting that covers a failover."""
    shipped = LedgerOptions.defaults().durability
    options = {"ledger": ledger, "durability": None, "master_kills": None,
               **dict.fromkeys(chaos_cli.SERVER_OPTIONS)}  # fmt: skip
    chaos_cli._check_ledger(options)
    assert options["durability"] == (shipped if expected == "product" else expected)
    assert StackSpec().durability == shipped
    assert report_module.MAY_LOSE[shipped] == frozenset()


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--ledger", "sentinel", "--crashes", "1"], "--crashes: those faults hit a one-server"),
        (["--ledger", "sentinel", "--stalls", "2"], "with --ledger sentinel use --master-kills"),
        (["--durability", "replica"], "--durability replica needs replicas"),
        (["--master-kills", "1"], "--master-kills needs --ledger sentinel"),
    ],
)
def test_chaos_refuses_faults_the_ledger_cannot_take(args: list[str], why: str) -> None:
    result = CliRunner().invoke(chaos_main, ["--transport", "redis", *args])
    assert result.exit_code == 2 and why in result.output, result.output
