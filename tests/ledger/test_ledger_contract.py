"""The ledger contract, run against fakeredis, a real Redis and a real Redis Cluster."""

from __future__ import annotations

import uuid

import pytest

from qsched import exception
from qsched.ledger import Stores, placement
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, Inventory, MapChange, ProviderSpec, State
from qsched.ledger.redis import canonical_json
from qsched.ledger.retry import claim as claim_with_retries
from tests.conftest import WITH_CLUSTER, backend_url
from tests.raw import redis_store

VCPU, RAM, DISK = "VCPU", "MEMORY_MB", "DISK_GB"


@pytest.fixture(params=WITH_CLUSTER)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """fakeredis, a real Redis, and a real three-master Redis Cluster."""
    return backend_url(request)


def new_uuid() -> str:
    return str(uuid.uuid4())


def make_provider(stores: Stores, vcpus: int = 4, ram_mb: int = 8192, **inv: Inventory) -> str:
    rp = new_uuid()
    stores.ledger.create_provider(rp, f"host-{rp[:8]}")
    inventories = {VCPU: Inventory(vcpus), RAM: Inventory(ram_mb), **inv}
    stores.ledger.set_inventory(rp, 0, inventories)
    return rp


def make_instance(stores: Stores, vcpus: int = 1, ram_mb: int = 512, project: str = "p1") -> str:
    uuid_ = new_uuid()
    flavor = {"name": "f", "vcpus": vcpus, "ram_mb": ram_mb}
    stores.instances.create(
        Instance(uuid_, project, "u1", "vm", flavor, State.BUILD), deadline=1e12
    )
    return uuid_


class TestProviders:
    def test_create_and_read(self, stores: Stores) -> None:
        rp = new_uuid()
        created = stores.ledger.create_provider(rp, "compute1")
        assert (created.generation, created.root_uuid) == (0, rp)
        got = stores.ledger.get_provider(rp)
        assert (got.name, got.generation, got.inventories, got.usages) == ("compute1", 0, {}, {})

    def test_names_and_uuids_are_unique(self, stores: Stores) -> None:
        rp = new_uuid()
        stores.ledger.create_provider(rp, "compute1")
        with pytest.raises(exception.ProviderExists, match="uuid"):
            stores.ledger.create_provider(rp, "compute2")
        with pytest.raises(exception.ProviderExists, match="name"):
            stores.ledger.create_provider(new_uuid(), "compute1")

    def test_nested_providers_share_the_root(self, stores: Stores) -> None:
        root, numa, gpu = new_uuid(), new_uuid(), new_uuid()
        stores.ledger.create_provider(root, "cn")
        stores.ledger.create_provider(numa, "cn-numa0", parent_uuid=root)
        child = stores.ledger.create_provider(gpu, "cn-numa0-gpu0", parent_uuid=numa)
        assert (child.parent_uuid, child.root_uuid) == (numa, root)
        with pytest.raises(exception.ProviderNotFound):
            stores.ledger.create_provider(new_uuid(), "orphan", parent_uuid=new_uuid())

    def test_malformed_uuid(self, stores: Stores) -> None:
        with pytest.raises(exception.InvalidUUID):
            stores.ledger.create_provider("not-a-uuid", "x")
        assert stores.ledger.list_providers() == []

    def test_unknown_provider(self, stores: Stores) -> None:
        with pytest.raises(exception.ProviderNotFound):
            stores.ledger.get_provider(new_uuid())
        with pytest.raises(exception.ProviderNotFound):
            stores.ledger.set_inventory(new_uuid(), 0, {VCPU: Inventory(1)})

    def test_stale_generation_is_a_conflict_with_the_current_one(self, stores: Stores) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.ProviderGenerationConflict) as err:
            stores.ledger.set_inventory(rp, 0, {VCPU: Inventory(8)})
        assert err.value.kwargs["current"] == 1
        assert stores.ledger.set_inventory(rp, 1, {VCPU: Inventory(8)}) == 2
        with pytest.raises(exception.ProviderGenerationConflict):
            stores.ledger.set_traits(rp, 1, ["HW_CPU_X86_AVX2"])

    def test_traits_and_aggregates(self, stores: Stores) -> None:
        rp = make_provider(stores)
        agg = new_uuid()
        gen = stores.ledger.set_traits(rp, 1, ["HW_CPU_X86_AVX2", "CUSTOM_FAST"])
        gen = stores.ledger.set_aggregates(rp, gen, [agg])
        got = stores.ledger.get_provider(rp)
        assert got.traits == {"HW_CPU_X86_AVX2", "CUSTOM_FAST"}
        assert got.aggregates == {agg} and got.generation == gen == 3
        with pytest.raises(exception.InvalidTrait):
            stores.ledger.set_traits(rp, gen, ["lower_case"])
        with pytest.raises(exception.InvalidUUID):
            stores.ledger.set_aggregates(rp, gen, ["agg1"])
        assert stores.ledger.get_provider(rp).generation == gen

    @pytest.mark.parametrize(
        "inventory, reason",
        [
            ({VCPU: Inventory(0)}, "total"),
            ({VCPU: Inventory(4, reserved=5)}, "reserved"),
            ({VCPU: Inventory(4, min_unit=3, max_unit=2)}, "min_unit"),
            ({VCPU: Inventory(4, step_size=0)}, "step_size"),
            ({VCPU: Inventory(4, allocation_ratio=0)}, "allocation_ratio"),
            ({VCPU: Inventory(4.5)}, "integers"),  # type: ignore[arg-type]
        ],
    )
    def test_bad_inventory_writes_nothing(self, stores: Stores, inventory, reason) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.InvalidInventory, match=reason):
            stores.ledger.set_inventory(rp, 1, inventory)
        got = stores.ledger.get_provider(rp)
        assert got.generation == 1 and got.inventories[VCPU].total == 4

    def test_unknown_resource_class(self, stores: Stores) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.InvalidResourceClass):
            stores.ledger.set_inventory(rp, 1, {"GPU": Inventory(1)})
        with pytest.raises(exception.InvalidResourceClass):
            stores.ledger.put_allocations(new_uuid(), {rp: {"GPU": 1}}, None, "p", "u")

    def test_capacity_uses_reserved_and_ratio(self, stores: Stores) -> None:
        assert Inventory(8, reserved=2, allocation_ratio=4.0).capacity == 24
        rp = make_provider(stores, vcpus=8)
        stores.ledger.set_inventory(rp, 1, {VCPU: Inventory(8, reserved=2, allocation_ratio=1.5)})
        stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 8}}, None, "p", "u")
        stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 1}}, None, "p", "u")  # 9 = 6 * 1.5
        with pytest.raises(exception.CapacityExceeded):
            stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 1}}, None, "p", "u")

    def test_inventory_cannot_drop_below_usage(self, stores: Stores) -> None:
        rp = make_provider(stores)
        stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 3}}, None, "p", "u")
        gen = stores.ledger.get_provider(rp).generation
        with pytest.raises(exception.InventoryInUse):
            stores.ledger.set_inventory(rp, gen, {VCPU: Inventory(2), RAM: Inventory(8192)})
        with pytest.raises(exception.InventoryInUse):
            stores.ledger.set_inventory(rp, gen, {RAM: Inventory(8192)})
        stores.ledger.set_inventory(rp, gen, {VCPU: Inventory(3), RAM: Inventory(1)})

    def test_delete_provider(self, stores: Stores) -> None:
        rp = make_provider(stores)
        consumer = new_uuid()
        gen = stores.ledger.put_allocations(consumer, {rp: {VCPU: 1}}, None, "p", "u")
        with pytest.raises(exception.ProviderInUse, match="allocations"):
            stores.ledger.delete_provider(rp, 2)
        stores.ledger.put_allocations(consumer, {}, gen, "p", "u")
        with pytest.raises(exception.ProviderGenerationConflict):
            stores.ledger.delete_provider(rp, 2)
        stores.ledger.delete_provider(rp, 3)
        with pytest.raises(exception.ProviderNotFound):
            stores.ledger.get_provider(rp)
        stores.ledger.create_provider(new_uuid(), f"host-{rp[:8]}")  # the name is free again


class TestAllocations:
    def test_write_read_release(self, stores: Stores) -> None:
        rp1, rp2 = make_provider(stores), make_provider(stores)
        consumer = new_uuid()
        allocs = {rp1: {VCPU: 2, RAM: 1024}, rp2: {VCPU: 1}}
        assert stores.ledger.put_allocations(consumer, allocs, None, "p1", "u1") == 1
        got = stores.ledger.get_allocations(consumer)
        assert (got.generation, got.project_id, got.allocations) == (1, "p1", allocs)
        assert stores.ledger.get_provider(rp1).usages == {VCPU: 2, RAM: 1024}
        assert stores.ledger.project_usages("p1") == {VCPU: 3, RAM: 1024}
        assert stores.ledger.provider_consumers(rp2) == {consumer}
        assert stores.ledger.put_allocations(consumer, {}, 1, "p1", "u1") is None
        assert stores.ledger.get_allocations(consumer).generation is None
        assert stores.ledger.project_usages("p1") == {}
        assert stores.ledger.provider_consumers(rp2) == set()

    def test_batched_reads_match_single_ones(self, stores: Stores, monkeypatch) -> None:
        """Providers and their consumers read a few per script call (providers_read.lua,
        providers_consumers.lua, also behind get_provider) give each one's records; a
        provider that is not there is left out."""
        monkeypatch.setattr(placement, "_READ_CHUNK", 2)
        providers = [make_provider(stores) for _ in range(5)]
        generation = stores.ledger.set_traits(providers[0], 1, ["CUSTOM_A", "HW_CPU_X86_AVX2"])
        stores.ledger.set_aggregates(providers[0], generation, [new_uuid()])
        consumers = [new_uuid() for _ in range(3)]
        for i, consumer in enumerate(consumers):
            stores.ledger.put_allocations(consumer, {providers[i]: {VCPU: 1}}, None, "p", "u")
        found = stores.ledger.providers_consumers(providers)
        assert found == {rp: stores.ledger.provider_consumers(rp) for rp in providers}
        assert [len(found[rp]) for rp in providers] == [1, 1, 1, 0, 0]
        assert stores.ledger.providers_consumers([]) == {}
        gone = new_uuid()
        read = stores.ledger.get_providers([*providers[:3], gone, *providers[3:]])
        assert list(read) == providers
        assert all(read[rp] == stores.ledger.get_provider(rp) for rp in providers)
        assert [read[rp].usages for rp in providers] == [{VCPU: 1}] * 3 + [{}] * 2
        assert {read[rp].inventories[RAM].total for rp in providers} == {8192}
        assert read[providers[4]].name == f"host-{providers[4][:8]}"
        assert read[providers[0]].traits == {"CUSTOM_A", "HW_CPU_X86_AVX2"}
        assert len(read[providers[0]].aggregates) == 1 and not read[providers[1]].traits

    def test_the_server_tells_its_cpu_or_nothing(self, stores: Stores, ledger_url: str) -> None:
        """A real Redis's CPU so far grows as it works; the embedded one says 0."""
        before = stores.backend.server_cpu_ms()
        if ledger_url.startswith("fakeredis"):
            assert before == 0.0
            return
        assert before > 0
        missing = [new_uuid() for _ in range(2000)]
        for _ in range(50):  # the kernel may count CPU time in ticks of a few ms
            stores.ledger.get_providers(missing)
            if stores.backend.server_cpu_ms() > before:
                return
        pytest.fail(f"the server's CPU stayed at {before} ms over 100,000 provider reads")

    def test_consumer_generation(self, stores: Stores) -> None:
        rp = make_provider(stores)
        consumer = new_uuid()
        stores.ledger.put_allocations(consumer, {rp: {VCPU: 1}}, None, "p", "u")
        with pytest.raises(exception.ConsumerGenerationConflict) as err:
            stores.ledger.put_allocations(consumer, {rp: {VCPU: 2}}, None, "p", "u")
        assert err.value.kwargs["current"] == 1
        with pytest.raises(exception.ConsumerGenerationConflict):
            stores.ledger.put_allocations(consumer, {rp: {VCPU: 2}}, 7, "p", "u")
        assert stores.ledger.put_allocations(consumer, {rp: {VCPU: 2}}, 1, "p", "u") == 2
        assert stores.ledger.get_provider(rp).usages[VCPU] == 2

    def test_provider_generations_are_checked_when_given(self, stores: Stores) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.ProviderGenerationConflict) as err:
            stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 1}}, None, "p", "u", {rp: 0})
        assert err.value.kwargs["current"] == 1
        stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 1}}, None, "p", "u", {rp: 1})

    def test_every_provider_touched_bumps_once(self, stores: Stores) -> None:
        rp1, rp2, rp3 = (make_provider(stores) for _ in range(3))
        consumer = new_uuid()
        first, second = {rp1: {VCPU: 1}, rp2: {VCPU: 1}}, {rp2: {VCPU: 2}, rp3: {VCPU: 1}}
        gen = stores.ledger.put_allocations(consumer, first, None, "p", "u")
        stores.ledger.put_allocations(consumer, second, gen, "p", "u")
        gens = [stores.ledger.get_provider(rp).generation for rp in (rp1, rp2, rp3)]
        assert gens == [3, 3, 2]

    def test_all_or_nothing_across_providers(self, stores: Stores) -> None:
        rp1, rp2 = make_provider(stores, vcpus=4), make_provider(stores, vcpus=2)
        stores.ledger.put_allocations(new_uuid(), {rp2: {VCPU: 1}}, None, "p", "u")
        consumer, allocs = new_uuid(), {rp1: {VCPU: 2}, rp2: {VCPU: 2}}
        with pytest.raises(exception.CapacityExceeded) as err:
            stores.ledger.put_allocations(consumer, allocs, None, "p", "u")
        assert err.value.kwargs["provider"] == rp2
        assert err.value.kwargs["resource_class"] == VCPU
        assert (err.value.requested, err.value.used, err.value.capacity) == (2, 1, 2)
        assert stores.ledger.get_provider(rp1).usages == {}
        assert stores.ledger.get_provider(rp1).generation == 1
        assert stores.ledger.get_allocations(consumer).generation is None

    @pytest.mark.parametrize("amount", [0, -1, 1.5, True, "2", 2**40])
    def test_bad_amounts(self, stores: Stores, amount) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.InvalidAmount):
            stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: amount}}, None, "p", "u")
        assert stores.ledger.get_provider(rp).generation == 1

    @pytest.mark.parametrize(
        "amount, ok", [(1, False), (2, True), (3, False), (6, True), (8, False)]
    )
    def test_min_max_step(self, stores: Stores, amount: int, ok: bool) -> None:
        rp = make_provider(stores, CUSTOM_GPU=Inventory(8, min_unit=2, max_unit=6, step_size=2))
        write = lambda: stores.ledger.put_allocations(  # noqa: E731
            new_uuid(), {rp: {"CUSTOM_GPU": amount}}, None, "p", "u"
        )
        if ok:
            write()
        else:
            with pytest.raises(exception.InvalidAmount, match="steps of 2"):
                write()

    def test_class_without_inventory(self, stores: Stores) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.InvalidAmount, match="no inventory of DISK_GB"):
            stores.ledger.put_allocations(new_uuid(), {rp: {DISK: 1}}, None, "p", "u")

    def test_malformed_input(self, stores: Stores) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.InvalidUUID):
            stores.ledger.put_allocations("bad", {rp: {VCPU: 1}}, None, "p", "u")
        with pytest.raises(exception.InvalidUUID):
            stores.ledger.put_allocations(new_uuid(), {"bad": {VCPU: 1}}, None, "p", "u")
        with pytest.raises(exception.ProviderNotFound):
            stores.ledger.put_allocations(new_uuid(), {new_uuid(): {VCPU: 1}}, None, "p", "u")
        with pytest.raises(exception.Invalid):
            stores.ledger.put_allocations(new_uuid(), {rp: {}}, None, "p", "u")
        assert stores.ledger.get_provider(rp).usages == {}


class TestClaim:
    def test_claim_marks_the_instance(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.ledger.claim(inst, {rp: {VCPU: 1, RAM: 512}}, "h1", "n1")
        record = stores.instances.get(inst)
        assert (record.host, record.node, record.task_state) == ("h1", "n1", "spawning")
        assert [e.event for e in stores.instances.events(inst)] == ["accepted", "claimed"]

    def test_redelivered_claim_places_once(self, stores: Stores) -> None:
        rp1, rp2, inst = make_provider(stores), make_provider(stores), make_instance(stores)
        allocs = {rp1: {VCPU: 1}}
        first = stores.ledger.claim(inst, allocs, "h1", "n1")
        again = stores.ledger.claim(inst, allocs, "h1", "n1")  # a redelivery
        assert (again.generation, first.already, again.already) == (first.generation, False, True)
        with pytest.raises(exception.InstanceNotWaiting):
            stores.ledger.claim(inst, {rp2: {VCPU: 1}}, "h2", "n2")
        assert stores.ledger.get_provider(rp1).usages == {VCPU: 1}
        assert stores.ledger.get_provider(rp2).usages == {}

    def test_only_waiting_instances(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        with pytest.raises(exception.InstanceNotFound):
            stores.ledger.claim(new_uuid(), {rp: {VCPU: 1}}, "h1", "n1")
        stores.instances.delete(inst)
        with pytest.raises(exception.InstanceNotWaiting):
            stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        assert stores.ledger.get_provider(rp).usages == {}

    def test_release_leaves_active_instances_alone(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        stores.instances.set_active(inst, "h1", "n1")
        assert not stores.ledger.release(inst)
        assert not stores.ledger.release(inst, host="h1")
        assert stores.ledger.get_provider(rp).usages == {VCPU: 1}
        assert stores.instances.get(inst).host == "h1"

    def test_allocations_without_a_claim_are_taken_over(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.ledger.put_allocations(inst, {rp: {VCPU: 2}}, None, "p1", "u1")
        with pytest.raises(exception.ConsumerGenerationConflict) as err:
            stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        assert (err.value.expected, err.value.current) == (None, 1)
        result = claim_with_retries(stores.ledger, inst, {rp: {VCPU: 1}}, "h1", "n1")
        assert result.conflicts == 1 and not result.already
        assert stores.instances.get(inst).host == "h1"
        assert stores.ledger.get_provider(rp).usages == {VCPU: 1}

    def test_consumer_conflict_on_a_missing_consumer(self, stores: Stores) -> None:
        rp = make_provider(stores)
        with pytest.raises(exception.ConsumerGenerationConflict) as err:
            stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 1}}, 3, "p", "u")
        assert (err.value.expected, err.value.current) == (3, None)

    def test_release_makes_it_waiting_again(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        assert not stores.ledger.release(inst, host="h2")
        assert stores.ledger.release(inst, host="h1", reason="spawn failed")
        assert not stores.ledger.release(inst)
        assert stores.ledger.get_provider(rp).usages == {VCPU: 0}
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h2", "n2")
        assert stores.instances.get(inst).host == "h2"


class TestTheRecordIsTheTruth:
    """A claim and an end that a message asked for check the record, not the message."""

    def classed_instance(self, stores: Stores, name: str = "big", legacy: bool = False) -> str:
        """A waiting instance of class ``name``: in its record's ``class`` field, or
        (``legacy``) only in its ``extra``, as a record made before that field was."""
        uuid_ = new_uuid()
        flavor = {"name": name, "vcpus": 8, "ram_mb": 8192}
        extra = {"scheduling_class": name}
        record = Instance(uuid_, "p1", "u1", "vm", flavor, State.BUILD, extra=extra)
        scheduling_class = None if legacy else (name, {"flavor": flavor, "constraints": {}})
        stores.instances.create(record, deadline=1e12, scheduling_class=scheduling_class)
        return uuid_

    @pytest.mark.parametrize("legacy", [False, True], ids=["class", "extra"])
    def test_a_claim_for_another_class_is_refused_and_writes_nothing(
        self, stores: Stores, legacy: bool
    ) -> None:
        rp = make_provider(stores, vcpus=16, ram_mb=16384)
        inst = self.classed_instance(stores, legacy=legacy)
        with pytest.raises(
            exception.NotItsRequest, match="class small, its record was made for big"
        ):
            stores.ledger.claim(inst, {rp: {VCPU: 1, RAM: 1024}}, "h1", "n1",
                                scheduling_class="small")  # fmt: skip
        record = stores.instances.get(inst)
        assert (record.state, record.host, record.task_state) == (State.BUILD, None, "scheduling")
        assert stores.ledger.get_provider(rp).usages == {}
        assert stores.ledger.get_allocations(inst).allocations == {}
        assert [e.event for e in stores.instances.events(inst)] == ["accepted"]
        stores.ledger.claim(inst, {rp: {VCPU: 8, RAM: 8192}}, "h1", "n1", scheduling_class="big")
        assert stores.ledger.get_provider(rp).usages == {VCPU: 8, RAM: 8192}

    def test_a_record_without_a_class_and_a_claim_without_one_are_not_checked(
        self, stores: Stores
    ) -> None:
        rp = make_provider(stores)
        bare = make_instance(stores)  # no front door's record (a bench's loader, a test)
        stores.ledger.claim(bare, {rp: {VCPU: 1}}, "h1", "n1", scheduling_class="small")
        classed = self.classed_instance(stores, "small")
        stores.ledger.claim(classed, {rp: {VCPU: 1}}, "h1", "n1")  # no class given
        assert stores.ledger.get_provider(rp).usages == {VCPU: 2}

    def test_an_end_asked_by_a_deadline_waits_for_the_records(self, stores: Stores) -> None:
        inst = make_instance(stores)  # its deadline: 1e12
        with pytest.raises(exception.NotItsRequest, match="deadline, 33658-09-27T01:46:40Z, has"):
            stores.instances.set_error(inst, "No valid host", {}, due_only=True)
        assert stores.instances.get(inst).state == State.BUILD
        assert stores.instances.set_error(inst, "No valid host", {})  # the reaper's own

    def test_a_lost_vm_ends_only_its_active_record_on_that_node(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        lost = ("h1", "n1", "The VM was lost", {"reason": "lost"})
        assert not stores.instances.set_lost(inst, *lost)  # BUILD: its spawn may run
        stores.instances.set_active(inst, "h1", "n1")
        assert not stores.instances.set_lost(inst, "h1", "n2", *lost[2:])  # another node
        assert not stores.instances.set_lost(inst, "h2", "n1", *lost[2:])  # another host
        stores.instances.mark_deleting(inst)
        assert not stores.instances.set_lost(inst, *lost)  # its delete is under way
        assert stores.instances.get(inst).state == State.ACTIVE
        other = make_instance(stores)
        stores.ledger.claim(other, {rp: {VCPU: 1}}, "h1", "n1")
        stores.instances.set_active(other, "h1", "n1")
        assert stores.instances.set_lost(other, *lost)
        assert not stores.instances.set_lost(other, *lost)  # once
        record = stores.instances.get(other)
        assert (record.state, record.host, record.quota) == (State.ERROR, "h1", None)
        assert record.fault is not None and record.fault["message"] == "The VM was lost"
        assert record.fault["details"] == {"reason": "lost"}
        assert stores.ledger.get_allocations(other).allocations == {}
        assert stores.ledger.get_provider(rp).usages == {VCPU: 1}  # the other's only


class TestHeldClaims:
    """A claim taken from a silent host stays on its providers until its agent lets go."""

    def claimed(self, stores: Stores, host: str = "h1") -> tuple[str, str]:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.ledger.claim(inst, {rp: {VCPU: 1, RAM: 512}}, host, "n1")
        return rp, inst

    def test_a_take_over_holds_the_claim_and_frees_the_instance(self, stores: Stores) -> None:
        rp, inst = self.claimed(stores)
        record = stores.instances.requeue(inst, "h1", "h1 is down", True, take_over=True)
        assert (record.state, record.host, record.attempts) == (State.BUILD, None, 1)
        held = stores.ledger.held_claims("h1")
        assert list(held) == [inst]
        assert stores.ledger.provider_consumers(rp) == {held[inst]}
        assert stores.ledger.get_provider(rp).usages == {VCPU: 1, RAM: 512}  # still taken
        assert stores.ledger.get_allocations(inst).generation is None  # free to claim again
        other = make_provider(stores)
        stores.ledger.claim(inst, {other: {VCPU: 1}}, "h2", "n2")
        assert not stores.ledger.release_unexplained(held[inst], "h1", rp)  # held: explained
        assert audit(stores).ok, audit(stores).to_dict()
        assert stores.ledger.release_held("h1", inst)
        assert not stores.ledger.release_held("h1", inst)  # idempotent
        assert stores.ledger.get_provider(rp).usages == {VCPU: 0, RAM: 0}
        assert stores.ledger.held_claims("h1") == {}
        assert stores.instances.get(inst).host == "h2"

    def test_a_take_over_is_refused_while_the_agent_beats(self, stores: Stores) -> None:
        rp, inst = self.claimed(stores)
        stores.agents.register_service("h1")
        stores.agents.heartbeat("h1", ttl_s=60)
        with pytest.raises(exception.AgentAlive):
            stores.instances.requeue(inst, "h1", "h1 is down", True, take_over=True)
        with pytest.raises(exception.AgentAlive):
            stores.instances.delete(inst, take_over=True)
        assert stores.instances.get(inst).host == "h1"
        assert stores.ledger.get_allocations(inst).allocations == {rp: {VCPU: 1, RAM: 512}}
        stores.agents.update_service("h1", forced_down=True)  # an operator says it is down
        assert stores.instances.delete(inst, take_over=True).state == State.DELETED
        assert list(stores.ledger.held_claims("h1")) == [inst]

    def test_a_local_delete_holds_until_the_host_destroys_it(self, stores: Stores) -> None:
        rp, inst = self.claimed(stores)
        stores.instances.set_active(inst, "h1", "n1")
        assert stores.instances.delete(inst, take_over=True).state == State.DELETED
        assert stores.quota.get_usage("p1").instances == 0  # the user has it back
        assert stores.ledger.get_provider(rp).usages == {VCPU: 1, RAM: 512}
        stores.instances.delete(inst, destroyed_on="h1")  # the agent destroyed its VM
        assert stores.ledger.get_provider(rp).usages == {VCPU: 0, RAM: 0}
        assert stores.ledger.held_claims("h1") == {}

    def test_a_claim_taken_twice_from_a_host_is_held_once(self, stores: Stores) -> None:
        rp, inst = self.claimed(stores)
        stores.instances.requeue(inst, "h1", "h1 is down", True, take_over=True)
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")  # back, and claimed it again
        stores.instances.requeue(inst, "h1", "h1 is down", True, take_over=True)
        held = stores.ledger.held_claims("h1")
        assert stores.ledger.get_allocations(held[inst]).allocations == {rp: {VCPU: 2, RAM: 512}}
        assert stores.ledger.release_held("h1", inst)
        assert stores.ledger.get_provider(rp).usages == {VCPU: 0, RAM: 0}

    def test_without_a_take_over_the_claim_is_released(self, stores: Stores) -> None:
        rp, inst = self.claimed(stores)
        stores.instances.requeue(inst, "h1", "spawn failed")
        assert stores.ledger.get_provider(rp).usages == {VCPU: 0, RAM: 0}
        assert stores.ledger.held_claims("h1") == {}


#: an instance's extra with what a JSON decoder would not give back as it was: empty
#: lists and maps, a number past 14 digits, a lone surrogate kept from before the API
#: refused them, escapes, and brackets and quotes inside strings
EXTRA = {
    "metadata": {"a": "1", "role": "web\ud800"},
    "server": {"description": None, "tags": []},
    "required_traits": [], "member_of_any": [[], ["x"]], "specs": {}, "big": 2**70,
    "text": 'Z\u00fcrich \U0001f600 a\\b "[]{}" / ,:', "ratio": 0.1, "on": True,
}  # fmt: skip


def make_server(stores: Stores, extra: dict | None = None) -> str:
    uuid_ = new_uuid()
    flavor = {"name": "f", "vcpus": 1, "ram_mb": 512}
    record = Instance(uuid_, "p1", "u1", "vm", flavor, State.BUILD, extra=extra or EXTRA)
    stores.instances.create(record, deadline=1e12)
    return uuid_


def stored_extra(stores: Stores, uuid_: str) -> str:
    store = redis_store(stores)
    return store.client.hget(store.keys.instance(uuid_), "extra").decode()


class TestUpdate:
    def test_only_the_named_items_change_and_the_rest_stays_as_written(self, stores) -> None:
        server = make_server(stores)
        before = stores.instances.get(server)
        changes = {"metadata": MapChange({"b": "2", "role": "db"}, removed=("a", "absent")),
                   "server": MapChange({"description": "mine"})}  # fmt: skip
        after = stores.instances.update(server, "renamed", changes)
        want = {**EXTRA, "metadata": {"b": "2", "role": "db"},
                "server": {"description": "mine", "tags": []}}  # fmt: skip
        assert (after.name, after.extra) == ("renamed", want)
        assert stored_extra(stores, server) == canonical_json(want)
        assert after.updated_at >= before.updated_at and after.state == State.BUILD

    def test_a_kept_surrogate_survives_a_change_of_its_map(self, stores) -> None:
        server = make_server(stores)
        after = stores.instances.update(server, extra={"metadata": MapChange({"b": "2"})})
        assert after.extra["metadata"] == {"a": "1", "b": "2", "role": "web\ud800"}

    def test_replace_and_a_map_the_record_lacks(self, stores) -> None:
        server = make_server(stores, {"metadata": None})
        changes = {"metadata": MapChange({"a": "1"}), "server": MapChange({"x": [1, {}]})}
        assert stores.instances.update(server, extra=changes).extra == {
            "metadata": {"a": "1"}, "server": {"x": [1, {}]}
        }  # fmt: skip
        emptied = stores.instances.update(server, extra={"metadata": MapChange(replace=True)})
        assert emptied.extra == {"metadata": {}, "server": {"x": [1, {}]}}
        assert stores.instances.update(server, name="n").extra == emptied.extra

    def test_a_map_over_its_limit_writes_nothing(self, stores) -> None:
        server = make_server(stores)
        before = stores.instances.get(server)
        over = {"metadata": MapChange({"b": "2", "c": "3"}, removed=("a",), limit=2),
                "server": MapChange({"description": "mine"})}  # fmt: skip
        with pytest.raises(exception.ItemLimitExceeded) as refused:
            stores.instances.update(server, "renamed", over)
        assert (refused.value.kwargs["items"], refused.value.kwargs["limit"]) == (3, 2)
        assert stores.instances.get(server) == before
        within = {"metadata": MapChange({"b": "2"}, removed=("a",), limit=2)}
        assert len(stores.instances.update(server, extra=within).extra["metadata"]) == 2
        whole = {"metadata": MapChange({"x": "1"}, replace=True, limit=1)}
        assert stores.instances.update(server, extra=whole).extra["metadata"] == {"x": "1"}

    def test_deleted_or_unknown_is_not_found(self, stores) -> None:
        server = make_server(stores)
        stores.instances.delete(server)
        for uuid_ in (server, new_uuid()):
            with pytest.raises(exception.InstanceNotFound):
                stores.instances.update(uuid_, name="x")
        assert stores.instances.get(server).name == "vm"


class TestMaintenance:
    """A disabled or forced-down service takes no new boot, atomically in the claim."""

    @pytest.mark.parametrize(
        "change, why",
        [({"disabled": True, "disabled_reason": "new disks"}, "disabled: new disks"),
         ({"disabled": True}, "disabled"),
         ({"forced_down": True}, "forced down")],
    )  # fmt: skip
    def test_the_claim_refuses_it(self, stores: Stores, change, why) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.agents.register_service("h1")
        stores.agents.update_service("h1", **change)
        with pytest.raises(exception.ServiceDisabled) as err:
            stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        assert err.value.kwargs == {"host": "h1", "why": why}
        assert stores.instances.get(inst).host is None
        assert stores.ledger.get_provider(rp).usages == {}
        stores.agents.update_service("h1", disabled=False, forced_down=False)
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        assert stores.instances.get(inst).host == "h1"

    def test_a_claim_it_holds_is_still_its_own(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.agents.register_service("h1")
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1")
        stores.agents.update_service("h1", disabled=True)
        assert stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h1", "n1").already  # a redelivery
        stores.instances.set_active(inst, "h1", "n1")  # what it runs it keeps
        assert stores.instances.get(inst).state == State.ACTIVE


def failed_once(stores: Stores, host: str = "h-bad", cls: str = "small") -> tuple[str, str]:
    """A provider and an instance of class ``cls`` whose claim ``host`` gave back."""
    rp, inst = make_provider(stores), new_uuid()
    flavor = {"name": cls, "vcpus": 1, "ram_mb": 512}
    extra = {"request_id": "req-1", "scheduling_class": cls, "max_attempts": 3}
    record = Instance(inst, "p1", "u1", "vm", flavor, State.BUILD, extra=extra)
    stores.instances.create(record, deadline=1e12)
    stores.ledger.claim(inst, {rp: {VCPU: 1}}, host, "n1")
    assert stores.instances.requeue(inst, host, "spawn failed").tried_hosts == (host,)
    return rp, inst


def consumer_of(stores: Stores, host: str, *classes: str) -> None:
    """``host`` is alive and has room for ``classes``."""
    stores.agents.heartbeat(host, 60)
    stores.agents.set_classes(host, classes)


class TestAlternates:
    """A host in tried_hosts gives way to a live consumer of the class that is not."""

    def test_a_tried_host_hands_back_while_another_consumes_the_class(self, stores: Stores) -> None:
        rp, inst = failed_once(stores)
        consumer_of(stores, "h-good", "small")
        with pytest.raises(exception.TriedHost) as err:
            stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1")
        assert err.value.kwargs["alternate"] == "h-good"
        assert (err.value.kwargs["handbacks"], err.value.kwargs["max_handbacks"]) == (1, 10)
        record = stores.instances.get(inst)
        assert (record.host, record.handbacks, record.attempts) == (None, 1, 1)
        assert stores.ledger.get_provider(rp).usages == {VCPU: 0}
        last = stores.instances.events(inst)[-1]
        assert (last.event, last.host) == ("handed_back", "h-bad")
        assert last.detail["alternate"] == "h-good"
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-good", "n2")
        assert stores.instances.get(inst).host == "h-good"

    @pytest.mark.parametrize(
        "others",
        [(), (("h-good", "large"),), (("h-bad", "small"),)],
        ids=["no-other-agent", "other-class", "only-the-tried-host"],
    )
    def test_a_tried_host_claims_when_nobody_else_could(self, stores: Stores, others) -> None:
        rp, inst = failed_once(stores)
        for host, cls in others:
            consumer_of(stores, host, cls)
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1")
        record = stores.instances.get(inst)
        assert (record.host, record.handbacks) == ("h-bad", 0)

    def test_a_host_that_also_failed_it_is_no_alternate(self, stores: Stores) -> None:
        rp, inst = failed_once(stores, "h-a")
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-b", "n2")
        assert stores.instances.requeue(inst, "h-b", "spawn failed").tried_hosts == ("h-a", "h-b")
        consumer_of(stores, "h-b", "small")
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-a", "n1")  # h-b tried it too
        assert stores.instances.get(inst).host == "h-a"

    def test_a_consumer_whose_heartbeat_expired_is_dropped(self, stores: Stores) -> None:
        rp, inst = failed_once(stores)
        consumer_of(stores, "h-gone", "small")
        stores.agents.forget("h-gone")  # its heartbeat is gone, its registration stayed
        assert stores.agents.class_consumers("small") == {"h-gone"}
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1")
        assert stores.instances.get(inst).host == "h-bad"
        assert stores.agents.class_consumers("small") == set()

    def test_hand_backs_are_bounded(self, stores: Stores) -> None:
        rp, inst = failed_once(stores)
        consumer_of(stores, "h-good", "small")
        for n in (1, 2):
            with pytest.raises(exception.TriedHost) as err:
                stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1", max_handbacks=2)
            assert err.value.kwargs["handbacks"] == n
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1", max_handbacks=2)
        record = stores.instances.get(inst)
        assert (record.host, record.handbacks) == ("h-bad", 2)

    def test_no_hand_backs_when_the_limit_is_zero(self, stores: Stores) -> None:
        rp, inst = failed_once(stores)
        consumer_of(stores, "h-good", "small")
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1", max_handbacks=0)
        assert stores.instances.get(inst).host == "h-bad"
        with pytest.raises(exception.Invalid):
            stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1", max_handbacks=-1)

    def test_client_driven_retries_do_not_retry_a_hand_back(self, stores: Stores) -> None:
        rp, inst = failed_once(stores)
        consumer_of(stores, "h-good", "small")
        with pytest.raises(exception.TriedHost):
            claim_with_retries(stores.ledger, inst, {rp: {VCPU: 1}}, "h-bad", "n1")
        assert stores.instances.get(inst).handbacks == 1

    def test_a_disabled_service_is_no_alternate(self, stores: Stores) -> None:
        rp, inst = failed_once(stores)
        consumer_of(stores, "h-good", "small")
        stores.agents.register_service("h-good")
        stores.agents.update_service("h-good", disabled=True, disabled_reason="maintenance")
        stores.ledger.claim(inst, {rp: {VCPU: 1}}, "h-bad", "n1")
        assert stores.instances.get(inst).host == "h-bad"

    def test_set_classes_replaces_what_the_agent_said(self, stores: Stores) -> None:
        stores.agents.set_classes("h1", ["small", "large"])
        stores.agents.set_classes("h2", ["small"])
        stores.agents.set_classes("h1", ["large", "tiny"])
        consumers = {c: stores.agents.class_consumers(c) for c in ("small", "large", "tiny")}
        assert consumers == {"small": {"h2"}, "large": {"h1"}, "tiny": {"h1"}}
        stores.agents.set_classes("h1", [])
        assert stores.agents.class_consumers("large") == set()


class TestClientDrivenRetry:
    def test_stale_provider_generation_is_reread(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 1}}, None, "p", "u")  # gen 1 -> 2
        seen: list[exception.Conflict] = []
        result = claim_with_retries(
            stores.ledger, inst, {rp: {VCPU: 1}}, "h1", "n1", {rp: 1}, on_conflict=seen.append
        )
        assert result.conflicts == 1 and isinstance(seen[0], exception.ProviderGenerationConflict)
        assert stores.ledger.get_provider(rp).usages[VCPU] == 2

    def test_no_retry_when_it_no_longer_fits(self, stores: Stores) -> None:
        rp, inst = make_provider(stores, vcpus=1), make_instance(stores)
        stores.ledger.put_allocations(new_uuid(), {rp: {VCPU: 1}}, None, "p", "u")
        with pytest.raises(exception.CapacityExceeded):
            claim_with_retries(stores.ledger, inst, {rp: {VCPU: 1}}, "h1", "n1", {rp: 1})

    def test_what_is_already_true_is_not_redone(self, stores: Stores) -> None:
        rp, inst = make_provider(stores), make_instance(stores)
        allocs = {rp: {VCPU: 1}}
        first = claim_with_retries(stores.ledger, inst, allocs, "h1", "n1")
        again = claim_with_retries(stores.ledger, inst, allocs, "h1", "n1")
        assert again.generation == first.generation and again.already
        assert stores.ledger.get_provider(rp).usages[VCPU] == 1


class TestRegisterProviders:
    def specs(self, n: int = 3, vcpus: int = 4, traits=frozenset()) -> list[ProviderSpec]:
        return [
            ProviderSpec(str(uuid.UUID(int=i + 1)), f"cn-{i}",
                         {VCPU: Inventory(vcpus), RAM: Inventory(8192)}, frozenset(traits))
            for i in range(n)
        ]  # fmt: skip

    def test_create_then_idempotent(self, stores: Stores) -> None:
        first = stores.ledger.register_providers(self.specs())
        assert [p.generation for p in first] == [1, 1, 1]
        again = stores.ledger.register_providers(self.specs())
        assert [p.generation for p in again] == [1, 1, 1]
        read = stores.ledger.get_provider(first[0].uuid)
        assert (read.name, read.inventories, read.generation) == ("cn-0", again[0].inventories, 1)
        assert again[0] == read

    def test_changes_bump_once_and_keep_usages(self, stores: Stores) -> None:
        (rp,) = stores.ledger.register_providers(self.specs(1))
        stores.ledger.put_allocations(new_uuid(), {rp.uuid: {VCPU: 2}}, None, "p", "u")
        (changed,) = stores.ledger.register_providers(
            self.specs(1, vcpus=8, traits={"CUSTOM_FAST"})
        )
        assert changed.generation == 3 and changed.usages == {VCPU: 2}
        assert changed.traits == {"CUSTOM_FAST"} and changed.inventories[VCPU].total == 8
        with pytest.raises(exception.InventoryInUse):
            stores.ledger.register_providers(self.specs(1, vcpus=1))
        assert stores.ledger.get_provider(rp.uuid).generation == 3

    def test_nested_and_bad_batches_write_nothing(self, stores: Stores) -> None:
        root, child = new_uuid(), new_uuid()
        specs = [
            ProviderSpec(root, "cn", {VCPU: Inventory(4)}),
            ProviderSpec(child, "cn_gpu0", {"VGPU": Inventory(2)}, parent_uuid=root),
        ]
        registered = stores.ledger.register_providers(specs)
        assert registered[1].root_uuid == root and registered[1].parent_uuid == root
        taken = ProviderSpec(new_uuid(), "cn", {VCPU: Inventory(4)})
        orphan = ProviderSpec(new_uuid(), "orphan", {VCPU: Inventory(4)}, parent_uuid=new_uuid())
        bad_rc = ProviderSpec(new_uuid(), "bad", {"GPU": Inventory(4)})
        for batch, error in (
            ([self.specs(1)[0], taken], exception.ProviderExists),
            ([self.specs(1)[0], orphan], exception.ProviderNotFound),
            ([self.specs(1)[0], bad_rc], exception.InvalidResourceClass),
        ):
            with pytest.raises(error):
                stores.ledger.register_providers(batch)
            assert len(stores.ledger.list_providers()) == 2
