"""The scheduling contract: class names and definitions, and boot request <-> record."""

from __future__ import annotations

import dataclasses
import json
import uuid as uuidlib

import pytest

from qsched import exception
from qsched.flavors import Constraints, Flavor
from qsched.ledger import Stores
from qsched.ledger.base import Inventory, Migration, State
from qsched.recovery import janitor
from qsched.resources import MEMORY_MB, VCPU
from qsched.scheduling.classes import SchedulingClass, class_name
from qsched.scheduling.message import BootRequest
from qsched.scheduling.records import (
    BootDetails,
    details,
    move_request_for,
    record_for,
    request_for,
)

FLAVOR = Flavor("m1.small", 1, 2048, 20, "small-id", {"trait:HW_CPU_X86_AVX2": "required"})
AGGREGATE = "6f9619ff-8b86-d011-b42d-00c04fc964ff"
CONSTRAINTS = Constraints(
    availability_zone="az1",
    required_traits=frozenset({"CUSTOM_IMAGE_B", "CUSTOM_IMAGE_A"}),
    forbidden_traits=frozenset({"CUSTOM_SLOW"}),
    member_of=frozenset({AGGREGATE}),
    member_of_any=(frozenset({"7f9619ff-8b86-d011-b42d-00c04fc964ff", AGGREGATE}),),
    forbidden_aggregates=frozenset({"8f9619ff-8b86-d011-b42d-00c04fc964ff"}),
)


class RecordingBus:
    def __init__(self) -> None:
        self.boots: list[BootRequest] = []

    def publish_boot(self, msg: BootRequest) -> None:
        self.boots.append(msg)


def a_request(**changes: object) -> BootRequest:
    request = BootRequest.create(
        str(uuidlib.uuid4()), "p1", "u1", FLAVOR, CONSTRAINTS, max_attempts=4,
        timeout_s=600, now=1_000.0, request_id="req-42",
    )  # fmt: skip
    return dataclasses.replace(request, **changes)


# -- the class --


def test_class_name() -> None:
    assert class_name("m1.small") == "m1.small"
    az = Constraints(availability_zone="az1")
    assert class_name("m1.small", az) == class_name("m1.small", az)
    assert class_name("m1.small", az).startswith("m1.small+")
    assert class_name("m1.small", az) != class_name("m1.small", Constraints(availability_zone="x"))
    traits = Constraints(required_traits=frozenset({"CUSTOM_B", "CUSTOM_A"}))
    same = Constraints(required_traits=frozenset({"CUSTOM_A", "CUSTOM_B"}))
    assert class_name("f", traits) == class_name("f", same)
    assert SchedulingClass(FLAVOR, CONSTRAINTS).name == a_request().scheduling_class


def test_class_definition_round_trip_through_json() -> None:
    made = SchedulingClass(FLAVOR, CONSTRAINTS)
    stored = json.loads(json.dumps(made.definition(), sort_keys=True))  # as the ledger keeps it
    assert SchedulingClass.from_definition(stored) == made
    plain = SchedulingClass(FLAVOR)
    assert SchedulingClass.from_definition(plain.definition()) == plain
    assert made.request().constraints == CONSTRAINTS


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"flavor": "m1.small"},
        {"flavor": {"name": "m1.small"}},
        {"flavor": FLAVOR.to_dict(), "constraints": {"required_traits": "CUSTOM_A"}},
        {"flavor": FLAVOR.to_dict(), "constraints": {"member_of": [1]}},
        {"flavor": FLAVOR.to_dict(), "constraints": {"member_of_any": ["a"]}},
        {"flavor": FLAVOR.to_dict(), "constraints": {"member_of_any": "ab"}},
        {"flavor": FLAVOR.to_dict(), "constraints": {"forbidden_aggregates": [2]}},
        {"flavor": FLAVOR.to_dict(), "constraints": {"availability_zone": 3}},
        {"flavor": {**FLAVOR.to_dict(), "extra_specs": {"trait:X": "maybe"}}},
    ],
)
def test_a_bad_definition_is_invalid(bad: dict) -> None:
    with pytest.raises(exception.Invalid):
        SchedulingClass.from_definition(bad)


# -- request <-> record --

#: one non-default value per field a request carries through its record
FIELD_VALUES = {
    "request_id": "req-other",
    "instance_uuid": "0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2a",
    "project_id": "p2",
    "user_id": "u2",
    "flavor": Flavor("m1.large", 4, 8192, 80, "large-id", {"resources:VGPU": "1"}).to_dict(),
    "scheduling_class": "m1.large+0123456789",
    "deadline": 5_000.5,
    "attempt": 3,
    "max_attempts": 7,
    "required_traits": ("CUSTOM_Z",),
    "forbidden_traits": ("CUSTOM_Y", "CUSTOM_YY"),
    "member_of": ("0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2b",),
    "member_of_any": (
        ("0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2c", "0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2d"),
        ("0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2e",),
    ),
    "forbidden_aggregates": ("0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2f",),
    "availability_zone": "az9",
    "tried_hosts": ("cn1", "cn2"),
    "global_request_id": "req-6f9619ff-8b86-d011-b42d-00c04fc964ff",
    "group": "0b0e8a5c-2f38-4d1e-9c35-6f1b0f4f1d2c",
    "group_policy": "soft-anti-affinity",
    "only_hosts": ("cn1", "cn2"),
    "never_hosts": ("cn9",),
    "requested_node": "cn1-0",
}


def test_every_field_of_a_request_is_covered() -> None:
    fields = {name for name, _check, _required in BootRequest.FIELDS}
    # published when rebuilt; a move's fields come from its migration record
    # (test_a_move_request_is_its_boots_with_the_migrations_flavor_and_class)
    assert fields - set(FIELD_VALUES) == {"version", "published_at", "migration", "source_host"}


def test_a_move_request_is_its_boots_with_the_migrations_flavor_and_class() -> None:
    request = a_request(**FIELD_VALUES)
    record = dataclasses.replace(record_for(request, "vm"), state=State.ACTIVE, host="cn1")
    big = {"name": "big", "vcpus": 8, "ram_mb": 8192, "disk_gb": 0, "extra_specs": {}}
    migration = Migration(
        7, str(uuidlib.uuid4()), record.uuid, "resize", "pre-migrating", "cn1", "cn1-0", None,
        None, "p1", "u1", dict(record.flavor), big, 1.0, 1.0, request_id="req-move",
        new_class="big", max_attempts=5, tried=("cn2",), deadline=2e9,
    )  # fmt: skip
    moved = move_request_for(record, migration, now=10.0)
    assert (moved.migration, moved.source_host) == (migration.uuid, "cn1")
    assert (moved.flavor, moved.scheduling_class, moved.request_id) == (big, "big", "req-move")
    assert (moved.attempt, moved.max_attempts, moved.tried_hosts, moved.deadline) == (
        1, 5, ("cn2",), 2e9)  # fmt: skip
    assert moved.constraints() == request.constraints() and moved.group == request.group
    assert moved.host_rule() == request.host_rule()


@pytest.mark.parametrize("field", sorted(FIELD_VALUES))
def test_a_request_survives_its_record(field: str) -> None:
    request = a_request(**{field: FIELD_VALUES[field]})
    assert getattr(request, field) != getattr(a_request(), field)  # a value that tells
    record = record_for(request, "vm", "image-1", {"role": "web"})
    rebuilt = request_for(record, now=request.published_at)
    assert getattr(rebuilt, field) == getattr(request, field)
    assert rebuilt == request


def test_what_only_the_api_shows_is_kept_too() -> None:
    record = record_for(a_request(), "vm", "image-1", {"role": "web"}, "r-0a1b2c3d")
    boot = details(record)
    assert (boot.image_ref, dict(boot.metadata)) == ("image-1", {"role": "web"})
    assert boot.reservation_id == "r-0a1b2c3d"
    assert boot.constraints == CONSTRAINTS
    assert BootDetails.from_extra(json.loads(json.dumps(boot.to_extra()))) == boot


def test_a_record_no_front_door_made_is_refused_not_guessed() -> None:
    record = record_for(a_request(), "vm")
    bare = dataclasses.replace(record, extra={"image_ref": "x"})
    with pytest.raises(exception.Invalid, match="not the record of a boot request"):
        request_for(bare)


def test_records_made_before_the_constraints_were_kept_still_read() -> None:
    old = {"request_id": "req-1", "scheduling_class": "m1.small", "max_attempts": 3,
           "availability_zone": None, "image_ref": "", "metadata": {}}  # fmt: skip
    assert BootDetails.from_extra(old).constraints == Constraints()


def test_the_ledger_keeps_every_field_of_a_new_request(stores: Stores) -> None:
    request = a_request(deadline=1e12)
    stores.instances.create(record_for(request, "vm", "image-1"), request.deadline)
    rebuilt = request_for(stores.instances.get(request.instance_uuid), request.published_at)
    assert rebuilt == request


def test_a_janitor_requeue_keeps_every_constraint(stores: Stores) -> None:
    """A dead agent's claim goes back on the bus asking for exactly what the boot asked."""
    node = str(uuidlib.uuid4())
    stores.ledger.create_provider(node, "cn-dead-0")
    stores.ledger.set_inventory(node, 0, {VCPU: Inventory(8), MEMORY_MB: Inventory(16384)})
    request = a_request(deadline=1e12)
    stores.instances.create(record_for(request, "vm", "image-1"), request.deadline)
    allocations = {node: {VCPU: 1, MEMORY_MB: 2048}}
    stores.ledger.claim(request.instance_uuid, allocations, "cn-dead", "cn-dead-0")
    stores.agents.heartbeat("cn-dead", 10)
    stores.agents.forget("cn-dead")  # its heartbeat is gone: the agent is dead
    bus = RecordingBus()
    report = janitor.run(stores, bus)  # type: ignore[arg-type]
    assert report.requeued == [request.instance_uuid]
    (again,) = bus.boots
    assert again.constraints() == CONSTRAINTS
    assert (again.attempt, again.tried_hosts) == (2, ("cn-dead",))
    expected = dataclasses.replace(
        request, attempt=2, tried_hosts=("cn-dead",), published_at=again.published_at
    )
    assert again == expected
    record = stores.instances.get(request.instance_uuid)
    assert (record.state, record.host, record.tried_hosts) == (State.BUILD, None, ("cn-dead",))
