"""Boots of Glance images through an API with ``[api] image_service = glance``.

A real Glance (``glance`` fixture: SQLite, file store) is in the real Keystone's
catalog as ``image``; the API runs in this process behind keystonemiddleware on
the port the catalog names for ``compute``, with compute agents in the same
process on an in-process ledger and bus. Every call goes through a keystoneauth
session, and the API looks each image up with the caller's own token, through
the catalog that came with it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from qsched import conf as qconf
from qsched.admin.cli import cli
from qsched.api import app as api_app
from qsched.api.wsgi import make_server
from qsched.bus.kombu import KombuBus
from qsched.images.glance import GlanceImages
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import State, Usage
from qsched.stack.config import ini_text
from tests.api.test_keystone_real import COMPUTE, keystone_conf
from tests.conftest import TEST_DURABILITY, GlanceCloud, KeystoneCloud
from tests.helpers import wait_until
from tests.images.test_images import AVX, _agent

pytestmark = pytest.mark.real

BUILD_TIMEOUT_S = 3


class GlanceAPI:
    """The API under test, its ledger and bus, and the clouds it lives in."""

    def __init__(
        self, keystone: KeystoneCloud, glance: GlanceCloud, stores: Stores, bus, admin_conf: Path
    ) -> None:
        self.keystone = keystone
        self.glance = glance
        self.stores = stores
        self.bus = bus
        self.admin_conf = admin_conf  # qsched-admin's view of the same ledger and bus

    def boot(self, user: str, image: str, flavor: str = "small", **headers: str) -> Any:
        """POST /servers as ``user`` with the fixture's image named ``image``; the answer."""
        session = self.keystone.server.session(self.keystone.users[user])
        body = {"server": {"name": image, "flavorRef": flavor, "imageRef": image}}
        body["server"]["imageRef"] = self.glance.images.get(image, image)
        return session.post(
            "/servers", json=body, endpoint_filter=COMPUTE, raise_exc=False, headers=headers
        )

    def booted(self, user: str, image: str) -> str:
        answer = self.boot(user, image)
        assert answer.status_code == 202, answer.text
        return str(answer.json()["server"]["id"])

    def nothing_held(self, user: str) -> bool:
        project = self.keystone.users[user].project_id
        return self.stores.quota.get_usage(project) == Usage(0, 0, 0)


@pytest.fixture(scope="module")
def glance_api(
    keystone: KeystoneCloud, glance: GlanceCloud, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GlanceAPI]:
    path = keystone_conf(
        keystone, tmp_path_factory.mktemp("glance-api"), image_service="glance",
        flavor=["small:1:512:10"],
    )  # fmt: skip
    conf = qconf.load(config_files=[str(path)])
    conf.set_override("build_timeout_s", BUILD_TIMEOUT_S, group="scheduler")
    options = qconf.Options.from_conf(conf)
    ledger_url, prefix = f"fakeredis://gl-{uuid.uuid4().hex}", f"gl{uuid.uuid4().hex[:8]}"
    stores = open_stores(options.ledger, options.quota, url=ledger_url)
    bus = KombuBus("memory://", prefix=prefix)
    admin_conf = path.parent / "admin.conf"
    admin_conf.write_text(
        ini_text(
            {
                "DEFAULT": {"transport_url": "memory://"},
                "bus": {"prefix": prefix},
                "ledger": {"url": ledger_url, "durability": TEST_DURABILITY},
                "scheduler": {"build_timeout_s": BUILD_TIMEOUT_S},
            }
        )
    )
    images = api_app.image_service(options.api, conf)
    assert isinstance(images, GlanceImages)
    app = api_app.create_app(stores, bus, options.api, options.scheduler, images=images)
    server = make_server(api_app.authenticated(app, options.api, conf), port=keystone.api_port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for user in ("member_a", "member_b"):
        project = keystone.users[user].project_id
        stores.quota.set_limits(project, instances=-1, cores=-1, ram_mb=-1)
    try:
        yield GlanceAPI(keystone, glance, stores, bus, admin_conf)
    finally:
        server.shutdown()
        server.server_close()
        bus.close()


def test_an_image_trait_lands_only_on_a_host_with_the_trait(glance_api, agents) -> None:
    """No host with AVX2: NoValidHost at the deadline, and ``server why`` names the image's
    trait; once one registers, the next boot of the image lands there and nowhere else."""
    stores, bus = glance_api.stores, glance_api.bus
    agents.append(_agent(stores, bus, "cn-plain", frozenset()))
    plain = glance_api.booted("member_a", "plain")
    orphan = glance_api.booted("member_a", "avx")
    assert wait_until(lambda: stores.instances.get(plain).state == State.ACTIVE, 15)
    assert wait_until(lambda: stores.instances.get(orphan).state == State.ERROR, 15)
    ended = stores.instances.get(orphan)
    assert ended.fault is not None  # Nova's NoValidHost, with the reason Nova's scheduler gives
    assert ended.fault["message"] == (
        "No valid host was found. There are not enough hosts available."
    )
    assert ended.fault["details"]["reason"] == "deadline"
    assert ended.deadline is not None
    assert ended.deadline - ended.created_at == pytest.approx(BUILD_TIMEOUT_S, abs=0.5)
    assert ended.updated_at >= ended.deadline  # its deadline ended it, not a refusal
    why = CliRunner().invoke(cli, ["--config-file", str(glance_api.admin_conf), "server",
                                   "why", orphan])  # fmt: skip
    assert why.exit_code == 0, (why.output, why.exception)
    assert f"missing required trait {AVX}" in why.output, why.output
    agents.append(_agent(stores, bus, "cn-avx", frozenset({AVX})))
    placed = [glance_api.booted("member_a", "avx") for _ in range(3)]
    for uuid_ in placed:
        assert wait_until(lambda u=uuid_: stores.instances.get(u).state == State.ACTIVE, 15)
        assert stores.instances.get(uuid_).host == "cn-avx"


def test_an_image_needing_more_memory_than_the_flavor_is_400_before_anything_is_held(
    glance_api,
) -> None:
    answer = glance_api.boot("member_b", "big")  # min_ram 8192 MB, flavor 512 MB
    assert answer.status_code == 400, answer.text
    assert answer.json()["badRequest"]["message"] == (
        "Flavor's memory is too small for requested image."
    )
    assert glance_api.nothing_held("member_b")


def test_a_private_image_of_another_project_is_refused(glance_api) -> None:
    image = glance_api.glance.images["private_b"]
    answer = glance_api.boot("member_a", "private_b")
    assert answer.status_code == 400, answer.text
    assert answer.json()["badRequest"]["message"] == f"Image {image} could not be found."
    assert glance_api.boot("member_b", "private_b").status_code == 202  # its owner may


def test_an_unknown_or_unfinished_image_is_refused(glance_api) -> None:
    unknown = str(uuid.uuid4())
    answer = glance_api.boot("member_a", unknown)
    assert answer.status_code == 400 and f"Image {unknown} could not be found." in answer.text
    queued = glance_api.glance.images["queued"]
    answer = glance_api.boot("member_a", "queued")
    assert answer.status_code == 400, answer.text
    assert answer.json()["badRequest"]["message"] == f"Image {queued} is not active."


def test_the_lookup_carries_the_callers_token_and_the_global_request_id(glance_api) -> None:
    """Glance saw the caller's own token (its user and project) and the global request id."""
    global_id = f"req-{uuid.uuid4()}"
    answer = glance_api.boot("member_a", "plain", **{"X-OpenStack-Request-ID": global_id})
    assert answer.status_code == 202, answer.text
    user = glance_api.keystone.users["member_a"]
    image = glance_api.glance.images["plain"]

    def lines() -> list[str]:
        return [line for line in glance_api.glance.server.requests() if global_id in line]

    # gunicorn writes a request's access-log line once its answer is sent: on a loaded
    # machine, after the boot that asked has answered
    assert wait_until(lines, timeout_s=10)
    assert lines() == [
        f"GET /v2/images/{image} 200 global={global_id} user={user.id} project={user.project_id}"
    ]
