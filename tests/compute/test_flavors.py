"""Flavor and extra-spec parsing, scheduling classes, name checks (no servers)."""

from __future__ import annotations

import pytest

from qsched import exception
from qsched.bus.base import check_class
from qsched.flavors import (
    GROUP_POLICY_REQUIRED,
    Flavor,
    check_flavor,
    missing_group_policy,
    request_groups,
)
from qsched.resources import check_resource_class, check_trait, check_uuid


def groups(**specs: str):
    return request_groups(Flavor("f1", 2, 4096, 20, extra_specs=specs))


def test_plain_flavor_is_one_group() -> None:
    (group,) = groups()
    assert group.suffix == "" and group.resources == {"VCPU": 2, "MEMORY_MB": 4096, "DISK_GB": 20}


def test_overrides_granular_groups_and_traits() -> None:
    found = groups(
        **{
            "resources:VCPU": "0",
            "resources:PCPU": "2",
            "resources1:VGPU": "1",
            "trait1:CUSTOM_FAST": "required",
            "trait:CUSTOM_SLOW": "forbidden",
            "trait:HW_CPU_X86_AVX2": "required",
            "hw:cpu_policy": "dedicated",
        }
    )
    assert [g.suffix for g in found] == ["", "1"]
    assert found[0].resources == {"PCPU": 2, "MEMORY_MB": 4096, "DISK_GB": 20}
    assert found[0].required_traits == {"HW_CPU_X86_AVX2"}
    assert found[0].forbidden_traits == {"CUSTOM_SLOW"}
    assert found[1].resources == {"VGPU": 1} and found[1].required_traits == {"CUSTOM_FAST"}


@pytest.mark.parametrize(
    "specs",
    [
        {"resources:VCPU": "-1"},
        {"resources:VCPU": "two"},
        {"resources:GPU": "1"},
        {"trait:CUSTOM_X": "preferred"},
        {"trait:lowercase": "required"},
        {"trait2:CUSTOM_X": "required"},
        {"group_policy": "sometimes"},
    ],
)
def test_bad_extra_specs(specs) -> None:
    with pytest.raises(exception.Invalid):
        groups(**specs)


@pytest.mark.parametrize(
    "flavor",
    [
        Flavor("", 1, 1),
        Flavor("x" * 256, 1, 1),
        Flavor(" leading", 1, 1),
        Flavor("trailing\t", 1, 1),
        Flavor("bell\x07", 1, 1),
        Flavor("ok", 0, 1),
        Flavor("ok", 1, 0),
        Flavor("ok", 1, 1, -1),
        Flavor("ok", True, 1),  # type: ignore[arg-type]
        Flavor("ok", 1, 1, swap_mb=-1),
        Flavor("ok", 1, 1, ephemeral_gb=2**31),
        Flavor("ok", 1, 1, rxtx_factor=0.0),
        Flavor("ok", 1, 1, description="x" * 65536),
    ],
)
def test_bad_flavors(flavor) -> None:
    with pytest.raises(exception.Invalid):
        check_flavor(flavor)


def test_round_trip() -> None:
    flavor = Flavor("m1.small", 1, 2048, 20, "2", {"trait:CUSTOM_X": "required"})
    assert Flavor.from_dict(flavor.to_dict()) == flavor
    with_disks = Flavor("m1.disks", 1, 2048, 20, "3", swap_mb=512, ephemeral_gb=5)
    assert Flavor.from_dict(with_disks.to_dict()) == with_disks
    assert "swap_mb" not in flavor.to_dict()  # older forms stay as they were


def test_nova_names_and_their_classes() -> None:
    """Nova allows spaces and any printable character; the class is queue-safe anyway."""
    for name in ("my flavor", "größe", "x" * 255, "a+b", "m1.small"):
        flavor = check_flavor(Flavor(name, 1, 1))
        key = flavor.class_key
        check_class(key)
        check_class(f"{key}+0123456789")  # with constraints too
    assert Flavor("m1.small", 1, 1).class_key == "m1.small"
    # distinct names never share a class; a name used as it is is at most 64 long
    assert Flavor("a b", 1, 1).class_key != Flavor("a_b", 1, 1).class_key
    assert len(Flavor("a b", 1, 1).class_key) > 64


def test_swap_and_ephemeral_count_into_disk() -> None:
    """Nova's placement request: root + ephemeral + swap in GiB, rounded up."""
    (group,) = request_groups(Flavor("f", 1, 512, 10, swap_mb=1025, ephemeral_gb=3))
    assert group.resources["DISK_GB"] == 10 + 3 + 2
    (only_swap,) = request_groups(Flavor("f", 1, 512, 0, swap_mb=1))
    assert only_swap.resources["DISK_GB"] == 1


def test_names() -> None:
    assert check_resource_class("CUSTOM_GPU_A100") == "CUSTOM_GPU_A100"
    assert check_trait("COMPUTE_STATUS_DISABLED") == "COMPUTE_STATUS_DISABLED"
    upper = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    assert check_uuid(upper) == upper.lower()  # keys never depend on the spelling
    for bad_uuid in ("6f9619ff8b86d011b42d00c04fc964ff", "{6f9619ff-8b86-d011-b42d-00c04fc964ff}"):
        with pytest.raises(exception.InvalidUUID):
            check_uuid(bad_uuid)
    for bad in ("", "CUSTOM_", "custom_x", None, 5):
        with pytest.raises(exception.InvalidResourceClass):
            check_resource_class(bad)


@pytest.mark.parametrize(
    ("specs", "refused"),
    [({"resources1:VGPU": "1", "resources2:VGPU": "1"}, True),
     ({"resources1:VGPU": "1", "resources2:VGPU": "1", "group_policy": "none"}, False),
     ({"resources1:VGPU": "1", "resources2:VGPU": "1", "group_policy": "isolate"}, False),
     ({"resources1:VGPU": "1"}, False),
     ({}, False)],
)  # fmt: skip
def test_two_granular_groups_need_a_group_policy(specs: dict, refused: bool) -> None:
    found = missing_group_policy(Flavor("f", 1, 512, 0, extra_specs=specs))
    assert found == (GROUP_POLICY_REQUIRED if refused else None)
