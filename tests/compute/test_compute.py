"""The front door's domain (qsched.compute.api) without HTTP, on fakeredis and a real Redis."""

from __future__ import annotations

import threading
import time
import uuid

import falcon
import pytest

from qsched import exception
from qsched.api import app as api_app
from qsched.bus.base import BusUnavailable
from qsched.compute import boot as compute_module
from qsched.compute.api import ComputeAPI
from qsched.compute.boot import AvailabilityZoneNotAvailable, FlavorRefNotFound
from qsched.compute.flavor_catalog import FlavorExtraSpecNotFound, flavors_from_config
from qsched.conf import APIOptions, LedgerOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.exception import FlavorExists, FlavorNotFound
from qsched.flavors import Constraints, Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Inventory, State, TaskState, Usage
from qsched.scheduling.classes import class_name
from qsched.scheduling.message import ActionRequest, BootRequest, DeleteRequest
from qsched.scheduling.records import details
from qsched.scheduling.request import flavor_demand
from tests.raw import redis_store

FLAVORS = ["m1.small:1:2048:20", "m1.large:4:8192:40:large-id", "g1.gpu:2:4096"]
SPECS = ["g1.gpu:resources:CUSTOM_GPU=1", "g1.gpu:trait:CUSTOM_FAST=required"]
ALICE = RequestContext.for_project("alice", "pa")
BOB = RequestContext.for_project("bob", "pb")
ADMIN = RequestContext.for_project("admin", "admin", ("admin", "member", "reader"))


class RecordingBus:
    """A test double of the bus: records what is published, or fails like a broker that
    does not confirm."""

    def __init__(self) -> None:
        self.boots: list[BootRequest] = []
        self.deletes: list[tuple[str, DeleteRequest]] = []
        self.host_boots: list[tuple[str, BootRequest]] = []  # sent to one host's queue
        self.actions: list[tuple[str, ActionRequest]] = []  # server actions, per host
        self.fail = False
        self._lock = threading.Lock()

    def publish_boot(self, msg: BootRequest) -> None:
        self._check()
        with self._lock:
            self.boots.append(msg)

    def publish_delete(self, host: str, msg: DeleteRequest) -> None:
        self._check()
        with self._lock:
            self.deletes.append((host, msg))

    def publish_action(self, host: str, msg: ActionRequest) -> None:
        self._check()
        with self._lock:
            self.actions.append((host, msg))

    def publish_to_host(self, host: str, msg: BootRequest) -> None:
        self._check()
        with self._lock:
            self.host_boots.append((host, msg))

    def check_health(self) -> None:
        if self.fail:
            raise BusUnavailable("memory://", "no confirm within 5.0 s", "publishes failing")

    def _check(self) -> None:
        if self.fail:
            raise BusUnavailable(url="memory://", reason="no confirm within 5.0 s")


def make_app(conf, stores: Stores, bus, policy=None) -> falcon.App:
    """The WSGI app on ``stores`` and ``bus`` with the test flavors (:func:`configure`)."""
    configure(conf)
    return api_app.create_app(
        stores, bus, APIOptions.from_conf(conf), SchedulerOptions.from_conf(conf), policy
    )


def configure(conf) -> None:
    conf.set_override("flavor", FLAVORS, group="api")
    conf.set_override("flavor_extra_spec", SPECS, group="api")


@pytest.fixture
def bus() -> RecordingBus:
    """A bus that keeps what is published, for the test to read back."""
    return RecordingBus()


@pytest.fixture
def compute(conf, stores: Stores, bus: RecordingBus) -> ComputeAPI:
    configure(conf)
    api = ComputeAPI(stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf))
    api.seed_flavors()
    return api


def boot(compute: ComputeAPI, context: RequestContext = ALICE, flavor: str = "m1.small", **kw):
    return compute.boot(context, name="vm", flavor_ref=flavor, image_ref=str(uuid.uuid4()), **kw)


def place(stores: Stores, instance_uuid: str, host: str = "cn1", active: bool = True) -> str:
    """Claim the instance on a fresh provider of ``host``, as an agent would: what its
    flavor asks (the audit compares the two)."""
    rp = str(uuid.uuid4())
    stores.ledger.create_provider(rp, f"{host}-{rp[:8]}")
    stores.ledger.set_inventory(rp, 0, {"VCPU": Inventory(64), "MEMORY_MB": Inventory(65536),
                                        "DISK_GB": Inventory(10_000)})  # fmt: skip
    flavor = Flavor.from_dict(stores.instances.get(instance_uuid).flavor)
    demand = flavor_demand(flavor)
    stores.ledger.claim(instance_uuid, {rp: demand}, host, f"{host}-n1")
    if active:
        stores.instances.set_active(instance_uuid, host, f"{host}-n1")
    return rp


def nothing_held(stores: Stores, project: str = "pa") -> bool:
    return stores.quota.get_usage(project) == Usage(0, 0, 0) and audit(stores).ok


class TestBoot:
    def test_the_callers_global_request_id_travels_with_the_request(self, compute, bus) -> None:
        caller = RequestContext.for_project(
            "alice", "pa", global_request_id="req-0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2a"
        )
        inst = boot(compute, caller)
        assert bus.boots[-1].global_request_id == caller.global_request_id
        assert bus.boots[-1].request_id == caller.request_id != caller.global_request_id
        assert details(compute.cell.stores.instances.get(inst.uuid)).global_request_id == (
            caller.global_request_id
        )

    def test_records_reserves_and_publishes(self, compute, stores, bus, conf) -> None:
        before = time.time()
        inst = boot(compute, metadata={"k": "v"})
        assert (inst.state, inst.task_state, inst.project_id) == (State.BUILD, "scheduling", "pa")
        assert stores.quota.get_usage("pa") == Usage(1, 1, 2048)
        (msg,) = bus.boots
        assert (msg.instance_uuid, msg.scheduling_class, msg.request_id) == (
            inst.uuid,
            "m1.small",
            ALICE.request_id,
        )
        assert msg.max_attempts == conf.scheduler.max_attempts
        assert before + conf.scheduler.build_timeout_s <= msg.deadline
        assert msg.deadline == inst.deadline
        assert msg.flavor["ram_mb"] == 2048 and inst.extra["metadata"] == {"k": "v"}
        classes = stores.agents.classes()
        assert classes["m1.small"]["flavor"]["vcpus"] == 1
        assert classes["m1.small"]["constraints"]["availability_zone"] is None

    def test_a_class_is_published_with_every_boot(self, compute, stores, monkeypatch) -> None:
        calls = []
        monkeypatch.setattr(stores.agents, "add_class", lambda *a: calls.append(a))
        boot(compute)
        boot(compute, flavor="large-id")
        assert sorted(stores.agents.classes()) == ["m1.large", "m1.small"]
        assert calls == []  # in the create script: no round trip of its own
        flavor = compute.get_flavor("m1.small")
        compute.delete_flavor(ADMIN, "m1.small")  # drops its class
        compute.create_flavor(ADMIN, flavor)  # the same flavor again
        assert sorted(stores.agents.classes()) == ["m1.large"]
        boot(compute)
        assert stores.agents.classes()["m1.small"]["flavor"] == flavor.to_dict()

    def test_zone_makes_its_own_class(self, compute, stores, bus) -> None:
        stores.agents.add_zone("az1")
        boot(compute, availability_zone="az1")
        expected = class_name("m1.small", Constraints(availability_zone="az1"))
        assert bus.boots[0].scheduling_class == expected != "m1.small"
        assert bus.boots[0].availability_zone == "az1"
        assert stores.agents.classes()[expected]["constraints"]["availability_zone"] == "az1"

    def test_unknown_zone_costs_one_read_and_holds_nothing(
        self, compute, stores, bus, monkeypatch
    ) -> None:
        stores.agents.add_zone("az1")
        keys_before = sorted(redis_store(stores).client.keys("*"))
        reads = []
        real = stores.agents.has_zone
        monkeypatch.setattr(stores.agents, "has_zone", lambda z: reads.append(z) or real(z))
        monkeypatch.setattr(compute.cell.flavors, "get_stored", lambda i: reads.append(i))
        with pytest.raises(AvailabilityZoneNotAvailable) as err:
            boot(compute, availability_zone="az2")
        assert str(err.value) == "The requested availability zone is not available"
        assert isinstance(err.value, exception.Invalid)  # 400
        assert reads == ["az2"]
        assert nothing_held(stores) and stores.instances.list_project("pa") == []
        assert stores.agents.classes() == {} and bus.boots == []
        assert sorted(redis_store(stores).client.keys("*")) == keys_before

    def test_zones_are_read_until_known(
        self, compute, stores, bus, conf, ledger_url, monkeypatch
    ) -> None:
        reads = []
        real = stores.agents.has_zone
        monkeypatch.setattr(stores.agents, "has_zone", lambda z: reads.append(z) or real(z))
        with pytest.raises(AvailabilityZoneNotAvailable):
            boot(compute, availability_zone="az1")
        open_stores(LedgerOptions.from_conf(conf), url=ledger_url).agents.add_zone(
            "az1"
        )  # an agent starts elsewhere
        for _ in range(3):
            boot(compute, availability_zone="az1")
        assert reads == ["az1", "az1"]  # a refusal is not remembered; a known zone is
        assert [m.availability_zone for m in bus.boots] == ["az1"] * 3
        monkeypatch.setattr(compute_module, "_CACHE_SIZE", 1)
        open_stores(LedgerOptions.from_conf(conf), url=ledger_url).agents.add_zone("az2")
        boot(compute, availability_zone="az2")
        boot(compute, availability_zone="az1")
        assert reads == ["az1", "az1", "az2", "az1"]  # the memory stays bounded

    @pytest.mark.parametrize("ref", ["large-id", "http://x/v2.1/flavors/large-id"])
    def test_flavor_ref_is_an_id_or_a_link(self, compute, bus, ref) -> None:
        boot(compute, flavor=ref)
        assert bus.boots[0].flavor["name"] == "m1.large"

    def test_unknown_flavor(self, compute, stores, bus) -> None:
        with pytest.raises(FlavorRefNotFound, match="Flavor nope could not be found"):
            boot(compute, flavor="nope")
        assert isinstance(FlavorRefNotFound(flavor="x"), exception.Invalid)
        assert bus.boots == [] and stores.instances.list_project("pa") == []

    @pytest.mark.parametrize("bad", [{"name": ""}, {"name": "x" * 256}, {"availability_zone": ""}])
    def test_bad_names(self, compute, stores, bad) -> None:
        args = {"name": "vm", "flavor_ref": "m1.small", **bad}
        with pytest.raises(exception.Invalid):
            compute.boot(ALICE, **args)
        assert stores.quota.get_usage("pa") == Usage(0, 0, 0)

    def test_quota_exceeded_creates_nothing(self, compute, stores, bus) -> None:
        stores.quota.set_limits("pa", cores=4)
        boot(compute, flavor="large-id")
        with pytest.raises(exception.QuotaExceeded) as err:
            boot(compute, flavor="large-id")
        expected = "Quota exceeded for cores: Requested 4, but already used 4 of 4 cores"
        assert str(err.value) == expected
        assert len(bus.boots) == 1 and len(stores.instances.list_project("pa")) == 1
        assert stores.quota.get_usage("pa") == Usage(1, 4, 8192)

    def test_publish_failure_rolls_back(self, compute, stores, bus) -> None:
        bus.fail = True
        with pytest.raises(BusUnavailable):
            boot(compute)
        assert nothing_held(stores) and stores.instances.list_project("pa") == []
        assert bus.boots == []
        (uuid_,) = [
            u.decode().rsplit(":", 1)[-1]
            for u in redis_store(stores).client.keys(redis_store(stores).keys.instance("*"))
            if not u.decode().endswith(":events")
        ]
        assert stores.instances.get(uuid_).state == State.DELETED
        assert [e.event for e in stores.instances.events(uuid_)][-2:] == [
            "publish_failed",
            "deleted",
        ]
        with pytest.raises(exception.InstanceNotFound):
            compute.get(ALICE, uuid_)

    def test_any_failure_after_the_record_rolls_back(
        self, compute, stores, bus, monkeypatch
    ) -> None:
        def broken(*args):
            raise RuntimeError("a bug in the bus")

        monkeypatch.setattr(bus, "publish_boot", broken)
        with pytest.raises(RuntimeError):
            boot(compute)
        assert nothing_held(stores) and stores.instances.list_project("pa") == []

    def test_ledger_unreachable(self, conf, bus) -> None:
        configure(conf)
        down = open_stores(LedgerOptions.from_conf(conf), url="redis://127.0.0.1:1/0")
        with pytest.raises(exception.BackendUnavailable):
            boot(
                ComputeAPI(down, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf))
            )
        assert bus.boots == []


class TestShowAndList:
    def test_project_scoping(self, compute) -> None:
        inst = boot(compute)
        assert compute.get(ALICE, inst.uuid).uuid == inst.uuid
        assert compute.get(ADMIN, inst.uuid.upper()).uuid == inst.uuid
        with pytest.raises(exception.InstanceNotFound):
            compute.get(BOB, inst.uuid)
        assert compute.list(BOB) == []
        with pytest.raises(exception.Forbidden):  # project_id asks for all_tenants
            compute.list(BOB, project_id="pa")
        assert [i.uuid for i in compute.list(ADMIN, project_id="pa")] == [inst.uuid]

    @pytest.mark.parametrize("bad", ["nope", "", "1" * 36, "5f0e6c2a-1b3d-4e8f-9a7b-2c4d6e8f0a1c"])
    def test_not_found(self, compute, bad) -> None:
        with pytest.raises(exception.InstanceNotFound):
            compute.get(ALICE, bad)

    def test_newest_first_with_filters_and_pages(self, compute, stores) -> None:
        made = [boot(compute).uuid for _ in range(4)]
        stores.instances.set_error(made[1], "No valid host was found. ", {})
        listed = [i.uuid for i in compute.list(ALICE)]
        assert sorted(listed) == sorted(made)
        assert [i.uuid for i in compute.list(ALICE, status="error")] == [made[1]]
        first = compute.list(ALICE, limit=2)
        rest = compute.list(ALICE, marker=first[-1].uuid)
        assert [i.uuid for i in first + rest] == listed
        assert compute.list(ALICE, limit=0) == []
        with pytest.raises(exception.MarkerNotFound):
            compute.list(ALICE, marker=str(uuid.uuid4()))
        with pytest.raises(exception.Invalid):
            compute.list(ALICE, limit=-1)

    def test_max_limit(self, compute, conf) -> None:
        compute.max_limit = 2
        for _ in range(3):
            boot(compute)
        assert len(compute.list(ALICE)) == len(compute.list(ALICE, limit=10)) == 2


class TestDelete:
    def test_not_placed(self, compute, stores, bus) -> None:
        inst = boot(compute)
        assert compute.delete(ALICE, inst.uuid).state == State.DELETED
        assert nothing_held(stores) and bus.deletes == []
        with pytest.raises(exception.InstanceNotFound):
            compute.delete(ALICE, inst.uuid)

    def test_placed_on_a_live_host(self, compute, stores, bus) -> None:
        inst = boot(compute)
        place(stores, inst.uuid, "cn1")
        stores.agents.heartbeat("cn1", ttl_s=60)
        after = compute.delete(ALICE, inst.uuid)
        assert (after.state, after.task_state) == (State.ACTIVE, TaskState.DELETING)
        ((host, msg),) = bus.deletes
        assert (host, msg.host, msg.node, msg.instance_uuid) == ("cn1", "cn1", "cn1-n1", inst.uuid)
        assert msg.request_id == ALICE.request_id
        assert stores.quota.get_usage("pa").instances == 1  # the agent releases it
        compute.delete(ALICE, inst.uuid)  # a retry asks again
        assert len(bus.deletes) == 2

    def test_claimed_but_not_active(self, compute, stores, bus) -> None:
        inst = boot(compute)
        place(stores, inst.uuid, "cn1", active=False)
        stores.agents.heartbeat("cn1", ttl_s=60)
        assert compute.delete(ALICE, inst.uuid).task_state == TaskState.DELETING
        assert [h for h, _ in bus.deletes] == ["cn1"]

    def test_placed_on_a_dead_host(self, compute, stores, bus) -> None:
        inst = boot(compute)
        rp = place(stores, inst.uuid, "cn2")
        assert compute.delete(ALICE, inst.uuid).state == State.DELETED
        assert bus.deletes == [] and nothing_held(stores)  # the user has the quota back
        assert "local_delete" in [e.event for e in stores.instances.events(inst.uuid)]
        # its VM may still run on cn2: the claim stays there until its agent reaps it
        assert stores.ledger.get_provider(rp).usages == {"VCPU": 1, "MEMORY_MB": 2048,
                                                         "DISK_GB": 20}  # fmt: skip
        assert list(stores.ledger.held_claims("cn2")) == [inst.uuid]
        stores.instances.delete(inst.uuid, destroyed_on="cn2")
        assert stores.ledger.get_provider(rp).usages == {"VCPU": 0, "MEMORY_MB": 0, "DISK_GB": 0}

    def test_a_host_that_beats_again_is_asked_to_delete(self, compute, stores, bus) -> None:
        """Silent when the API looked, beating when the ledger would take its claim: the
        ledger refuses the local delete, and the API asks the host instead."""
        inst = boot(compute)
        place(stores, inst.uuid, "cn2")
        stores.agents.heartbeat("cn2", ttl_s=60)
        looks: list[str] = []
        alive = stores.agents.alive

        def first_silent(host: str) -> bool:  # it beat again right after the first look
            looks.append(host)
            return len(looks) > 1 and alive(host)

        stores.agents.alive = first_silent  # type: ignore[method-assign]
        after = compute.delete(ALICE, inst.uuid)
        assert (after.state, after.task_state) == (State.ACTIVE, TaskState.DELETING)
        assert [h for h, _ in bus.deletes] == ["cn2"] and looks == ["cn2", "cn2"]
        assert stores.ledger.held_claims("cn2") == {}

    def test_bus_down_keeps_it_deleting_and_a_retry_publishes(self, compute, stores, bus) -> None:
        inst = boot(compute)
        place(stores, inst.uuid, "cn1")
        stores.agents.heartbeat("cn1", ttl_s=60)
        bus.fail = True
        with pytest.raises(BusUnavailable):
            compute.delete(ALICE, inst.uuid)
        assert stores.instances.get(inst.uuid).task_state == TaskState.DELETING
        bus.fail = False
        compute.delete(ALICE, inst.uuid)
        assert len(bus.deletes) == 1

    def test_error_instance(self, compute, stores) -> None:
        inst = boot(compute)
        stores.instances.set_error(inst.uuid, "No valid host was found. ", {})
        assert compute.delete(ALICE, inst.uuid).state == State.DELETED
        assert nothing_held(stores)

    def test_other_project(self, compute, stores) -> None:
        inst = boot(compute)
        with pytest.raises(exception.InstanceNotFound):
            compute.delete(BOB, inst.uuid)
        assert stores.instances.get(inst.uuid).state == State.BUILD

    def test_mark_deleting_needs_a_host(self, compute, stores) -> None:
        inst = boot(compute)
        with pytest.raises(exception.InstanceNotWaiting):
            stores.instances.mark_deleting(inst.uuid)
        with pytest.raises(exception.InstanceNotFound):
            stores.instances.mark_deleting(str(uuid.uuid4()))


class TestFlavors:
    def test_seeded_from_config(self, compute) -> None:
        assert [f.id for f in compute.list_flavors()] == ["g1.gpu", "large-id", "m1.small"]
        gpu = compute.get_flavor("g1.gpu")
        assert gpu.extra_specs == {"resources:CUSTOM_GPU": "1", "trait:CUSTOM_FAST": "required"}
        assert compute.seed_flavors()  # again: nothing changes
        with pytest.raises(FlavorNotFound):
            compute.get_flavor("m1.tiny")

    def test_create_is_admin_only_and_unique(self, compute) -> None:
        tiny = Flavor("m1.tiny", 1, 512)
        with pytest.raises(exception.Forbidden):
            compute.create_flavor(ALICE, tiny)
        made = compute.create_flavor(ADMIN, tiny)
        assert uuid.UUID(made.id) and compute.get_flavor(made.id).name == "m1.tiny"
        with pytest.raises(FlavorExists, match=r"name m1\.tiny"):
            compute.create_flavor(ADMIN, tiny)
        with pytest.raises(FlavorExists, match=r"ID m1\.small"):
            compute.create_flavor(ADMIN, Flavor("other", 1, 512, id="m1.small"))
        with pytest.raises(exception.Invalid):
            compute.create_flavor(ADMIN, Flavor("bad", 1, 512, extra_specs={"trait:X": "maybe"}))

    def test_delete_drops_its_classes(self, compute, stores) -> None:
        stores.agents.add_zone("az1")
        boot(compute)
        boot(compute, availability_zone="az1")
        boot(compute, flavor="large-id")
        with pytest.raises(exception.Forbidden):
            compute.delete_flavor(ALICE, "m1.small")
        compute.delete_flavor(ADMIN, "m1.small")
        assert list(stores.agents.classes()) == ["m1.large"]
        with pytest.raises(FlavorNotFound):
            compute.delete_flavor(ADMIN, "m1.small")

    def test_extra_specs(self, compute) -> None:
        with pytest.raises(exception.Forbidden):
            compute.set_flavor_extra_specs(ALICE, "m1.small", {"trait:CUSTOM_A": "required"})
        changed = compute.set_flavor_extra_specs(ADMIN, "m1.small", {"trait:CUSTOM_A": "required"})
        assert changed.extra_specs == {"trait:CUSTOM_A": "required"}
        with pytest.raises(exception.Invalid):
            compute.set_flavor_extra_specs(ADMIN, "m1.small", {"resources:VCPU": "-1"})
        assert compute.get_flavor("m1.small").extra_specs == {"trait:CUSTOM_A": "required"}
        compute.delete_flavor_extra_spec(ADMIN, "m1.small", "trait:CUSTOM_A")
        with pytest.raises(FlavorExtraSpecNotFound):
            compute.delete_flavor_extra_spec(ADMIN, "m1.small", "trait:CUSTOM_A")
        with pytest.raises(FlavorNotFound):
            compute.set_flavor_extra_specs(ADMIN, "nope", {})

    def test_changed_flavor_republishes_its_class(self, compute, stores, bus) -> None:
        boot(compute)
        compute.set_flavor_extra_specs(ADMIN, "m1.small", {"trait:CUSTOM_A": "required"})
        boot(compute)
        specs = stores.agents.classes()["m1.small"]["flavor"]["extra_specs"]
        assert specs == {"trait:CUSTOM_A": "required"}
        assert bus.boots[-1].flavor["extra_specs"] == specs

    def test_flavors_are_read_once_and_changes_elsewhere_are_seen(
        self, compute, stores, bus, conf, monkeypatch
    ) -> None:
        reads = []
        real = compute.cell.flavors.get_stored
        monkeypatch.setattr(
            compute.cell.flavors, "get_stored", lambda i: reads.append(i) or real(i)
        )
        for _ in range(3):
            boot(compute)
        assert reads == ["m1.small"]
        # another API process changes the flavor, then deletes it
        other = ComputeAPI(stores, RecordingBus(), api=APIOptions.from_conf(conf))
        other.set_flavor_extra_specs(ADMIN, "m1.small", {"trait:CUSTOM_A": "required"})
        changed = boot(compute)
        assert changed.flavor["extra_specs"] == {"trait:CUSTOM_A": "required"}
        assert bus.boots[-1].flavor["extra_specs"] == {"trait:CUSTOM_A": "required"}
        assert reads == ["m1.small"] * 2
        other.delete_flavor(ADMIN, "m1.small")
        with pytest.raises(FlavorRefNotFound):
            boot(compute)
        assert len(bus.boots) == 4 and stores.quota.get_usage("pa") == Usage(4, 4, 4 * 2048)

    def test_config_change_rewrites(self, compute, stores, bus) -> None:
        changed = APIOptions.defaults().replace(flavor=("m1.small:2:2048:20",))
        ComputeAPI(stores, bus, api=changed).seed_flavors()  # a restart with a new config
        assert compute.get_flavor("m1.small").vcpus == 2

    def test_config_name_taken(self, compute, stores, bus) -> None:
        taken = APIOptions.defaults().replace(flavor=("m1.small:1:2048:20:another-id",))
        with pytest.raises(FlavorExists):
            ComputeAPI(stores, bus, api=taken).seed_flavors()


class TestConfigParsing:
    def test_good(self) -> None:
        small, gpu = flavors_from_config(
            ["m1.small:1:2048", " g1:2:4096:10:7 "], ["g1:trait:CUSTOM_X = required"]
        )
        assert (small.id, small.disk_gb, small.extra_specs) == ("m1.small", 0, {})
        assert (gpu.id, gpu.disk_gb, gpu.extra_specs) == ("7", 10, {"trait:CUSTOM_X": "required"})

    @pytest.mark.parametrize(
        "lines, specs, match",
        [
            (["m1"], [], "name:vcpus:ram_mb"),
            (["m1:one:2048"], [], "name:vcpus:ram_mb"),
            (["m1:1:2:3:4:5"], [], "name:vcpus:ram_mb"),
            (["m1:0:2048"], [], "vcpus"),
            (["bad/name:1:2"], [], "flavor id"),
            (["m1:1:2"], ["m1:trait:CUSTOM_X"], "<key>=<value>"),
            (["m1:1:2"], ["m2:trait:CUSTOM_X=required"], "unconfigured"),
            (["m1:1:2"], ["m1:trait:CUSTOM_X=sometimes"], "required or forbidden"),
        ],
    )
    def test_bad(self, lines, specs, match) -> None:
        with pytest.raises(exception.Invalid, match=match):
            flavors_from_config(lines, specs)
