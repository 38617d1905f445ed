"""Images at boot: min_ram and min_disk checked before anything is held, image traits
required of the host (through the scheduling class), unknown images refused.

``Catalog`` is an in-memory image service for these tests; tests/test_glance*.py
run the same boots against a real Glance.
"""

from __future__ import annotations

import pytest

from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched import exception
from qsched.admin import queries
from qsched.compute.api import ComputeAPI
from qsched.conf import AgentOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.images.base import (
    FlavorDiskTooSmall,
    FlavorMemoryTooSmall,
    Image,
    ImageNotFound,
    ImageService,
)
from qsched.ledger import Stores
from qsched.ledger.base import State, Usage
from tests.compute.test_compute import RecordingBus, bus, nothing_held
from tests.helpers import wait_until

__all__ = ["bus"]  # a fixture: tests.compute.test_compute's RecordingBus

ALICE = RequestContext.for_project("alice", "pa")
AVX = "HW_CPU_X86_AVX2"
PLAIN = Image("11111111-1111-4111-8111-111111111111")
NEEDS_AVX = Image("22222222-2222-4222-8222-222222222222", required_traits=frozenset({AVX}))
BIG = Image("33333333-3333-4333-8333-333333333333", min_ram_mb=8192, min_disk_gb=500)


class Catalog(ImageService):
    """Images in memory, each visible to the projects listed (None: public)."""

    def __init__(self, *images: Image, private: dict[str, str] | None = None) -> None:
        self.images = {image.id: image for image in images}
        self.private = private or {}  # image id -> the only project that sees it

    def get(self, context: RequestContext, image_id: str) -> Image:
        image = self.images.get(image_id)
        owner = self.private.get(image_id)
        if image is None or (owner is not None and owner != context.project_id):
            raise ImageNotFound(image=image_id)
        return image


def test_image_properties() -> None:
    props = {"trait:HW_CPU_X86_AVX2": "required", "trait:CUSTOM_X": "forbidden", "os": "linux"}
    image = Image.from_properties("i", 1024, 10, props)
    assert (image.min_ram_mb, image.min_disk_gb, image.required_traits) == (
        1024, 10, frozenset({AVX}),
    )  # fmt: skip
    with pytest.raises(exception.Invalid):
        Image.from_properties("i", 0, 0, {"trait:not a trait": "required"})


def test_the_flavor_must_fit_the_image() -> None:
    BIG.check_fits(Flavor("f", 2, 8192, 500))
    with pytest.raises(FlavorMemoryTooSmall, match="memory is too small"):
        BIG.check_fits(Flavor("f", 2, 4096, 500))
    with pytest.raises(FlavorDiskTooSmall, match="disk is too small"):
        BIG.check_fits(Flavor("f", 2, 8192, 20))
    BIG.check_fits(Flavor("f", 2, 8192, 0))  # no root disk: boots from a volume, as in Nova


@pytest.fixture
def images() -> Catalog:
    return Catalog(PLAIN, NEEDS_AVX, BIG, private={BIG.id: "pb"})


@pytest.fixture
def compute(stores: Stores, bus: RecordingBus, images: Catalog) -> ComputeAPI:
    scheduler = SchedulerOptions.defaults().replace(build_timeout_s=2)
    api = ComputeAPI(stores, bus, scheduler, images=images)
    api.cell.flavors.create(Flavor("small", 1, 1024, 10))
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    return api


def test_an_image_trait_becomes_a_constraint_of_the_class(compute, stores, bus) -> None:
    plain = compute.boot(ALICE, "vm", "small", PLAIN.id)
    avx = compute.boot(ALICE, "vm", "small", NEEDS_AVX.id)
    first, second = bus.boots
    assert first.scheduling_class == "small" and second.scheduling_class.startswith("small+")
    assert second.required_traits == (AVX,)
    definition = stores.agents.classes()[second.scheduling_class]
    assert definition["constraints"]["required_traits"] == [AVX]
    assert {plain.uuid, avx.uuid} == {b.instance_uuid for b in bus.boots}


@pytest.mark.parametrize(
    ("image", "error"),
    [(BIG.id, ImageNotFound), ("44444444-4444-4444-8444-444444444444", ImageNotFound)],
)
def test_an_image_the_caller_cannot_use_holds_nothing(compute, stores, bus, image, error) -> None:
    with pytest.raises(error):
        compute.boot(ALICE, "vm", "small", image)  # BIG is project pb's
    assert bus.boots == [] and nothing_held(stores)


def test_a_flavor_too_small_for_the_image_holds_nothing(compute, stores, bus) -> None:
    bob = RequestContext.for_project("bob", "pb")
    stores.quota.set_limits("pb", instances=-1, cores=-1, ram_mb=-1)
    with pytest.raises(FlavorMemoryTooSmall):
        compute.boot(bob, "vm", "small", BIG.id)
    assert bus.boots == [] and stores.quota.get_usage("pb") == Usage(0, 0, 0)


def test_an_image_trait_lands_only_where_the_trait_is(conf, stores, bus, images, agents) -> None:
    """With agents: the AVX boot goes to the AVX host; without one it ends NoValidHost."""
    from qsched.bus.kombu import KombuBus

    real_bus = KombuBus("memory://", prefix=f"img{id(stores):x}")
    api = ComputeAPI(stores, real_bus, SchedulerOptions.defaults().replace(build_timeout_s=3),
                     images=images)  # fmt: skip
    api.cell.flavors.create(Flavor("small", 1, 1024, 10))
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    plain_host = _agent(stores, real_bus, "cn-plain", frozenset())
    agents.append(plain_host)
    orphan = api.boot(ALICE, "vm", "small", NEEDS_AVX.id).uuid
    assert wait_until(lambda: stores.instances.get(orphan).state == State.ERROR, 15)
    why = queries.diagnose(stores, orphan, now=0.0, max_attempts=3)
    assert f"missing required trait {AVX}" in why.verdict, why.verdict  # server why says so
    avx_host = _agent(stores, real_bus, "cn-avx", frozenset({AVX}))
    agents.append(avx_host)
    placed = api.boot(ALICE, "vm", "small", NEEDS_AVX.id).uuid
    assert wait_until(lambda: stores.instances.get(placed).state == State.ACTIVE, 15)
    assert stores.instances.get(placed).host == "cn-avx"


def _agent(stores: Stores, bus, host: str, traits: frozenset[str]):
    from agents.service import ComputeAgent

    options = AgentOptions.defaults().replace(
        host=host, class_poll_interval_s=0.05, heartbeat_interval_s=0.2
    )
    spec = FakeNodeSpec(vcpus=4, ram_mb=8192, disk_gb=100, traits=traits)
    agent = ComputeAgent(options, stores, bus, FakeDriver(1, spec, host=host))
    agent.start(ready_timeout_s=5)
    return agent
