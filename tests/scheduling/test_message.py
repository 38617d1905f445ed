"""The message contract: round trips, forward compatibility, and every kind of poison."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import uuid
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qsched import exception
from qsched.flavors import Constraints, Flavor
from qsched.scheduling.message import (
    MAX_MESSAGE_BYTES,
    BootRequest,
    DeleteRequest,
    MoveStep,
    PoisonMessage,
    UnsupportedVersion,
    decode,
)

pytestmark = pytest.mark.timeout(30)

FLAVOR = Flavor("m1.small", 2, 4096, 20, extra_specs={"trait:HW_CPU_X86_AVX2": "required"})
AGGREGATE = "5d6f1c2e-8a43-4b7e-9a51-0c4b2f6e7d81"


def boot(tried: bool = False) -> BootRequest:
    constraints = Constraints(
        availability_zone="az1",
        required_traits=frozenset({"CUSTOM_FAST"}),
        forbidden_traits=frozenset({"CUSTOM_SLOW"}),
        member_of=frozenset({AGGREGATE}),
    )
    message = BootRequest.create(
        str(uuid.uuid4()), "project-1", "user-1", FLAVOR, constraints, now=1_800_000_000.0
    )
    return message.next_attempt("host-1", now=1_800_000_001.0) if tried else message


def delete() -> DeleteRequest:
    return DeleteRequest("req-1", str(uuid.uuid4()), host="host-1", node="node-1")


def wire(message: BootRequest | DeleteRequest) -> dict[str, Any]:
    return msgpack.unpackb(message.encode())


def pack(data: Any) -> bytes:
    return msgpack.packb(data, use_bin_type=True)


def poison_reason(data: Any) -> str:
    with pytest.raises(PoisonMessage) as info:
        decode(data)
    assert isinstance(info.value, exception.Invalid)
    assert len(str(info.value)) < 400, "a reason goes into a header: keep it short"
    return str(info.value.reason)


class TestRoundTrip:
    def test_boot(self) -> None:
        message = boot(tried=True)
        decoded = decode(message.encode())
        assert decoded == message
        assert isinstance(decoded, BootRequest)
        assert decoded.tried_hosts == ("host-1",)
        assert decoded.member_of == (AGGREGATE,)
        assert decoded.flavor == FLAVOR.to_dict()
        assert decoded.extra == {}

    def test_delete(self) -> None:
        message = delete()
        assert decode(message.encode()) == message
        assert DeleteRequest.decode(message.encode()) == message

    def test_kind_checked_by_class_decode(self) -> None:
        with pytest.raises(PoisonMessage, match="expected a boot message, got delete"):
            BootRequest.decode(delete().encode())

    def test_wire_has_kind_and_version(self) -> None:
        data = wire(boot())
        assert data["kind"] == "boot"
        # 1.1: global_request_id; 1.2: aggregate groups, group; 1.3: host rules; 1.4: moves
        assert data["version"] == "1.4"

    def test_a_move_round_trips_and_a_1_3_request_is_a_boot(self) -> None:
        move = dataclasses.replace(boot(), migration=str(uuid.uuid4()), source_host="cn1")
        decoded = decode(move.encode())
        assert decoded == move and isinstance(decoded, BootRequest) and decoded.moves
        data = wire(boot())
        data["version"] = "1.3"
        del data["migration"], data["source_host"]
        old = decode(msgpack.packb(data, use_bin_type=True))
        assert isinstance(old, BootRequest) and not old.moves

    def test_a_move_step_round_trips_and_refuses_an_unknown_step(self) -> None:
        step = MoveStep("req-1", str(uuid.uuid4()), "cn1", "cn1-0", str(uuid.uuid4()), "confirm")
        assert decode(step.encode()) == step
        data = wire(step)
        data["step"] = "abort"
        with pytest.raises(PoisonMessage, match="'step' must be one of confirm, revert, live"):
            decode(msgpack.packb(data, use_bin_type=True))

    def test_a_1_0_request_reads_with_no_global_request_id(self) -> None:
        data = wire(boot())
        data["version"] = "1.0"
        del data["global_request_id"]
        old = decode(msgpack.packb(data, use_bin_type=True))
        assert isinstance(old, BootRequest) and old.global_request_id is None

    def test_a_1_1_request_reads_with_no_aggregate_groups(self) -> None:
        data = wire(boot())
        data["version"] = "1.1"
        del data["member_of_any"], data["forbidden_aggregates"], data["group"], data["group_policy"]
        old = decode(msgpack.packb(data, use_bin_type=True))
        assert isinstance(old, BootRequest)
        assert (old.member_of_any, old.forbidden_aggregates) == ((), ())

    def test_aggregate_groups_must_be_lists_of_uuids(self) -> None:
        for bad in (["a"], [[1]], "x", [["not-a-uuid"]]):
            data = wire(boot())
            data["member_of_any"] = bad
            with pytest.raises(PoisonMessage, match="member_of_any"):
                decode(msgpack.packb(data, use_bin_type=True))

    def test_a_1_1_request_reads_with_no_group(self) -> None:
        data = wire(boot())
        data["version"] = "1.1"
        del data["group"], data["group_policy"]
        old = decode(msgpack.packb(data, use_bin_type=True))
        assert isinstance(old, BootRequest) and (old.group, old.group_policy) == (None, None)

    def test_accepts_bytearray_and_memoryview(self) -> None:
        data = boot().encode()
        assert decode(bytearray(data)) == decode(memoryview(data)) == decode(data)


class TestBootRequest:
    def test_create_plain_flavor_is_its_own_class(self) -> None:
        message = BootRequest.create(str(uuid.uuid4()), "p", "u", FLAVOR, now=100.0, timeout_s=5)
        assert message.scheduling_class == "m1.small"
        assert (message.attempt, message.deadline, message.published_at) == (1, 105.0, 100.0)
        assert message.request_id.startswith("req-")

    def test_create_with_constraints_adds_a_hash(self) -> None:
        message = boot()
        assert message.scheduling_class.startswith("m1.small+")
        assert message.constraints().availability_zone == "az1"
        assert message.to_flavor().to_dict() == FLAVOR.to_dict()

    def test_next_attempt(self) -> None:
        first = boot()
        second = first.next_attempt("host-1", now=5.0).next_attempt("host-1", now=6.0)
        assert second.attempt == 3
        assert second.tried_hosts == ("host-1",)
        assert second.published_at == 6.0
        assert second.request_id == first.request_id
        assert first.attempt == 1, "frozen: the original is untouched"

    def test_requeued_is_no_attempt_and_tries_no_host(self) -> None:
        tried = boot(tried=True)
        again = tried.requeued(now=7.0)
        assert (again.attempt, again.tried_hosts, again.published_at) == (2, ("host-1",), 7.0)
        assert again == dataclasses.replace(tried, published_at=7.0)

    def test_attempts_and_deadline(self) -> None:
        message = boot()
        assert message.attempts_left == 2
        assert not message.expired(now=message.deadline - 1)
        assert message.expired(now=message.deadline)


class TestVersions:
    def test_newer_minor_extra_fields_kept_not_rejected(self) -> None:
        data = wire(boot()) | {"version": "1.7", "priority": 5, "hints": {"a": [1]}}
        decoded = decode(pack(data))
        assert decoded.version == "1.7"
        assert decoded.extra == {"priority": 5, "hints": {"a": [1]}}
        assert msgpack.unpackb(decoded.encode()) == data, "an older reader writes them back"

    def test_older_minor_without_optional_fields(self) -> None:
        data = wire(boot())
        for name in ("required_traits", "forbidden_traits", "member_of", "tried_hosts"):
            del data[name]
        del data["availability_zone"]
        decoded = decode(pack(data))
        assert isinstance(decoded, BootRequest)
        assert decoded.member_of == () and decoded.availability_zone is None

    @pytest.mark.parametrize("version", ["2.0", "0.9", "10.1"])
    def test_other_major_unsupported(self, version: str) -> None:
        with pytest.raises(UnsupportedVersion) as info:
            decode(pack(wire(boot()) | {"version": version}))
        assert info.value.version == version
        assert "reads 1.x" in info.value.reason

    @pytest.mark.parametrize("version", [None, 1, 1.0, "1", "v1.0", "1.0\n", "1.0.0", ""])
    def test_malformed_version(self, version: Any) -> None:
        data = wire(boot())
        data["version"] = version
        assert "version" in poison_reason(pack(data))

    def test_missing_version(self) -> None:
        data = wire(boot())
        del data["version"]
        assert "version" in poison_reason(pack(data))


BAD_BOOT_FIELDS = [
    ("group", "not-a-uuid"),
    ("group", 7),
    ("group_policy", "legacy"),
    ("group_policy", ["affinity"]),
    ("request_id", ""),
    ("request_id", 7),
    ("request_id", "x" * 256),
    ("instance_uuid", "not-a-uuid"),
    ("instance_uuid", "5D6F1C2E-8A43-4B7E-9A51-0C4B2F6E7D81"),
    ("instance_uuid", "5d6f1c2e8a434b7e9a510c4b2f6e7d81"),
    ("instance_uuid", AGGREGATE + "\n"),
    ("project_id", None),
    ("user_id", b"user"),
    ("flavor", "m1.small"),
    ("flavor", {"name": "m1", "vcpus": 1, "ram_mb": 1}),
    ("flavor", {"name": "m1", "vcpus": 0, "ram_mb": 1, "disk_gb": 0}),
    ("flavor", {"name": "m1", "vcpus": True, "ram_mb": 1, "disk_gb": 0}),
    ("flavor", {"name": "", "vcpus": 1, "ram_mb": 1, "disk_gb": 0}),
    ("flavor", {"name": "m1", "vcpus": 1, "ram_mb": 1, "disk_gb": 0, "extra_specs": {"a": 1}}),
    ("flavor", {"name": "m1", "vcpus": 1, "ram_mb": 1, "disk_gb": 0, "extra_specs": []}),
    ("scheduling_class", ""),
    ("attempt", 0),
    ("attempt", -1),
    ("attempt", True),
    ("attempt", 1.0),
    ("attempt", 2**40),
    ("max_attempts", "3"),
    ("deadline", math.nan),
    ("deadline", math.inf),
    ("deadline", -1.0),
    ("deadline", "soon"),
    ("published_at", None),
    ("required_traits", "CUSTOM_FAST"),
    ("required_traits", [1]),
    ("forbidden_traits", [""]),
    ("member_of", ["not-a-uuid"]),
    ("member_of", [AGGREGATE.upper()]),
    ("member_of", AGGREGATE),
    ("availability_zone", 3),
    ("tried_hosts", ["h"] * 1025),
    ("tried_hosts", {"h": 1}),
]


class TestPoison:
    @pytest.mark.parametrize(("field", "value"), BAD_BOOT_FIELDS)
    def test_wrongly_typed_field(self, field: str, value: Any) -> None:
        data = wire(boot())
        data[field] = value
        reason = poison_reason(pack(data))
        assert reason.startswith(f"field {field!r} must be")

    @pytest.mark.parametrize(
        "field",
        [
            "request_id",
            "instance_uuid",
            "project_id",
            "user_id",
            "flavor",
            "scheduling_class",
            "attempt",
            "max_attempts",
            "deadline",
            "published_at",
        ],
    )
    def test_missing_required_field(self, field: str) -> None:
        data = wire(boot())
        del data[field]
        assert poison_reason(pack(data)) == f"field {field!r} is missing"

    @pytest.mark.parametrize("field", ["host", "node", "instance_uuid"])
    def test_delete_fields(self, field: str) -> None:
        data = wire(delete())
        data[field] = ""
        assert field in poison_reason(pack(data))

    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            ("a string", "not bytes"),
            (None, "not bytes"),
            (12, "not bytes"),
            (b"", "not msgpack"),
            (b"\xc1", "not msgpack"),
            (b"\x81\xa4kind", "not msgpack"),  # truncated map
            (pack({"kind": "boot"}) + b"\x00", "not msgpack"),  # trailing bytes
            (b"\xa3\xff\xfe\xfd", "not msgpack"),  # invalid UTF-8 in a string
            (pack({1: "int key"}), "not msgpack"),
            (pack([1, 2]), "must be a msgpack map"),
            (pack("boot"), "must be a msgpack map"),
            (pack({}), "unknown message kind None"),
            (pack({"kind": "reboot", "version": "1.0"}), "unknown message kind 'reboot'"),
            (pack({"kind": ["boot"]}), "unknown message kind"),
            (b"\x91" * 5000 + b"\xc0", "not msgpack"),  # nested too deep
            (b"\x00" * (MAX_MESSAGE_BYTES + 1), "over"),
        ],
    )
    def test_not_a_message(self, data: Any, expected: str) -> None:
        assert expected in poison_reason(data)

    def test_reason_truncates_huge_values(self) -> None:
        data = wire(boot())
        data["attempt"] = "x" * 10_000
        assert len(poison_reason(pack(data))) < 200


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decodes_or_poison(data: Any) -> None:
    """Anything but a message or PoisonMessage fails the test."""
    with contextlib.suppress(PoisonMessage):
        decode(data)


class TestFuzz:
    @FUZZ
    @given(st.binary(max_size=300))
    def test_random_bytes(self, data: bytes) -> None:
        decodes_or_poison(data)

    @FUZZ
    @given(msgpack_values)
    def test_random_msgpack(self, value: Any) -> None:
        decodes_or_poison(pack(value))

    @FUZZ
    @given(st.sampled_from(sorted(wire(boot()))), msgpack_values)
    def test_one_field_replaced(self, field: str, value: Any) -> None:
        data = wire(boot())
        data[field] = value
        decodes_or_poison(pack(data))

    @FUZZ
    @given(st.binary(min_size=1, max_size=8), st.integers(min_value=0))
    def test_corrupted_valid_message(self, noise: bytes, at: int) -> None:
        data = bytearray(boot(tried=True).encode())
        at %= len(data)
        data[at : at + len(noise)] = noise
        decodes_or_poison(bytes(data))
