"""The Glance client without a Glance: where it looks, what it says when it cannot.

Boots of real Glance images (traits, min_ram, visibility) are tests/images/test_glance_real.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import falcon.testing
import pytest

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.api import auth
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.images.base import OpaqueImages
from qsched.images.glance import GlanceImages, ImageServiceUnavailable, _root
from qsched.ledger import Stores
from qsched.net import LOOPBACK, free_port
from qsched.stack.config import ini_text
from tests.compute.test_compute import RecordingBus, nothing_held

IMAGE = str(uuid.uuid4())
COMPUTE_ONLY = [{"type": "compute", "name": "qsched", "endpoints": [
    {"region": "RegionOne", "publicURL": "http://compute.example.com/v2.1"}]}]  # fmt: skip


def glance_conf(tmp_path: Path, **glance: object) -> qconf.cfg.ConfigOpts:
    path = tmp_path / "qsched.conf"
    sections = {"api": {"auth_strategy": "keystone", "image_service": "glance"}, "glance": glance}
    path.write_text(ini_text(sections))
    return qconf.load(config_files=[str(path)])


def caller(catalog: list[dict[str, object]] | None = None) -> RequestContext:
    return RequestContext.for_project(
        "alice", "pa", auth_token="a-token", catalog_json=json.dumps(catalog or COMPUTE_ONLY)
    )


def test_the_glance_section_configures_the_adapter(tmp_path: Path) -> None:
    conf = glance_conf(
        tmp_path, endpoint_override="https://images.example.com", region_name="r2",
        valid_interfaces="internal", timeout=3, connect_retries=4,
    )  # fmt: skip
    images = api_app.image_service(qconf.Options.from_conf(conf).api, conf)
    assert isinstance(images, GlanceImages)
    adapter = images.adapter
    assert (adapter.service_type, adapter.endpoint_override, adapter.region_name) == (
        "image", "https://images.example.com", "r2",
    )  # fmt: skip
    assert (adapter.interface, adapter.session.timeout, adapter.connect_retries) == (
        ["internal"], 3.0, 4,
    )  # fmt: skip


def test_the_shipped_defaults_wait_ten_seconds_and_look_in_the_catalog() -> None:
    conf = qconf.load()
    assert conf.glance.service_type == "image"
    assert conf.glance.valid_interfaces == ["internal", "public"]
    assert conf.glance.timeout == 10 and conf.glance.endpoint_override is None
    assert "version" not in conf.glance  # Glance v2 is the only one qsched speaks
    assert isinstance(api_app.image_service(APIOptions.defaults(), conf), OpaqueImages)


def test_glance_without_keystone_is_refused_before_anything_opens() -> None:
    options = APIOptions.defaults().replace(image_service="glance")
    with pytest.raises(auth.GlanceNeedsKeystone, match="Set auth_strategy = keystone"):
        auth.refuse_bad_options(options, ["127.0.0.1"])
    auth.refuse_bad_options(options.replace(auth_strategy="keystone"), ["0.0.0.0"])


def conf_file(tmp_path: Path, **sections: dict[str, object]) -> str:
    path = tmp_path / "qsched.conf"
    path.write_text(ini_text(sections))
    return str(path)


def test_a_configured_glance_section_turns_lookups_on(tmp_path: Path) -> None:
    """[api] image_service unset: a [glance] with any option set means Glance, as the
    issue has it; without one the ids stay opaque."""
    configured = conf_file(
        tmp_path, api={"auth_strategy": "keystone"}, glance={"region_name": "r2"}
    )
    conf = qconf.load(config_files=[configured])
    assert APIOptions.from_conf(conf).image_service == "glance"
    images = api_app.image_service(APIOptions.from_conf(conf), conf)
    assert isinstance(images, GlanceImages) and images.adapter.region_name == "r2"
    api_app.check_bind(["0.0.0.0:8774"], [configured])
    bare = qconf.load(config_files=[conf_file(tmp_path, api={"auth_strategy": "keystone"})])
    assert APIOptions.from_conf(bare).image_service == "opaque"


def test_a_configured_glance_section_under_noauth2_is_refused(tmp_path: Path) -> None:
    configured = conf_file(tmp_path, glance={"endpoint_override": "http://glance:9292"})
    with pytest.raises(auth.GlanceNeedsKeystone, match="Set auth_strategy = keystone"):
        api_app.check_bind(["127.0.0.1:8774"], [configured])


def test_glance_options_that_image_service_opaque_would_ignore_are_refused(
    tmp_path: Path,
) -> None:
    """Explicitly opaque with [glance] set: qsched-api and gunicorn's master refuse to
    start, naming the options and the fix, before anything is opened."""
    configured = conf_file(
        tmp_path, api={"auth_strategy": "keystone", "image_service": "opaque"},
        glance={"region_name": "r2", "timeout": 5},
    )  # fmt: skip
    expected = (
        r"refusing \[api\] image_service = opaque with \[glance\] region_name, timeout set: "
        r"no image would be looked up in Glance\. Remove image_service = opaque"
    )
    with pytest.raises(auth.GlanceUnused, match=expected):
        api_app.check_bind(["127.0.0.1:8774"], [configured])
    conf = qconf.load(config_files=[configured], service=True)
    with pytest.raises(auth.GlanceUnused):
        api_app.serve(conf, lambda bus: pytest.fail("a bus was opened"), ["127.0.0.1"])


@pytest.fixture
def compute_on(stores: Stores):
    def make(images: GlanceImages) -> tuple[ComputeAPI, RecordingBus]:
        bus = RecordingBus()
        api = ComputeAPI(stores, bus, images=images)
        api.cell.flavors.create(Flavor("small", 1, 1024, 10))
        stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
        return api, bus

    return make


def test_a_glance_that_does_not_answer_is_503_and_holds_nothing(
    tmp_path: Path, stores: Stores, compute_on
) -> None:
    closed = f"http://{LOOPBACK}:{free_port()}"
    conf = glance_conf(tmp_path, endpoint_override=closed, connect_retries=0)
    compute, bus = compute_on(api_app.image_service(qconf.Options.from_conf(conf).api, conf))
    with pytest.raises(ImageServiceUnavailable, match=r"Image service at .* is unavailable"):
        compute.boot(caller(), "vm", "small", IMAGE)
    assert bus.boots == [] and nothing_held(stores)


def test_a_catalog_without_glance_is_503_with_the_fix(
    tmp_path: Path, stores: Stores, compute_on
) -> None:
    conf = glance_conf(tmp_path)
    compute, bus = compute_on(api_app.image_service(qconf.Options.from_conf(conf).api, conf))
    with pytest.raises(ImageServiceUnavailable, match="set \\[glance\\] endpoint_override"):
        compute.boot(caller(), "vm", "small", IMAGE)
    assert bus.boots == [] and nothing_held(stores)
    compute.boot(caller(), "vm", "small", "")  # no image: a boot from a volume, no lookup


def test_the_api_says_which_service_is_down_and_not_where(tmp_path: Path, stores: Stores) -> None:
    closed = f"http://{LOOPBACK}:{free_port()}"
    conf = glance_conf(tmp_path, endpoint_override=closed, connect_retries=0)
    options = qconf.Options.from_conf(conf)
    app = api_app.create_app(
        stores, RecordingBus(), options.api.replace(auth_strategy="noauth2"),
        images=api_app.image_service(options.api, conf),
    )  # fmt: skip
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    stores.flavors.create(Flavor("small", 1, 1024, 10))
    body = {"server": {"name": "vm", "flavorRef": "small", "imageRef": IMAGE}}
    answer = falcon.testing.TestClient(app).simulate_post(
        "/v2.1/servers", json=body, headers={"X-Auth-Token": "alice:pa"}
    )
    assert answer.status_code == 503
    message = answer.json["serviceUnavailable"]["message"]
    assert "the image service did not answer" in message and closed not in message
    assert answer.headers["Retry-After"] == "5"


@pytest.mark.parametrize(
    ("endpoint", "root"),
    [("http://g:9292", "http://g:9292"), ("http://g:9292/", "http://g:9292"),
     ("http://g/image/v2", "http://g/image"), ("http://g/v2.1/", "http://g"),
     ("http://g/v2x", "http://g/v2x")],
)  # fmt: skip
def test_the_image_endpoint_is_glances_root(endpoint: str, root: str) -> None:
    assert _root(endpoint) == root


def test_the_context_reads_the_catalog_only_when_asked() -> None:
    assert caller().service_catalog == COMPUTE_ONLY
    for bad in (None, "", "not json", '{"a": 1}', "[1, 2]"):
        assert RequestContext.for_project("a", "p", catalog_json=bad).service_catalog == []
