"""``/healthcheck``: which part is down (ledger, bus) and why in a word, never where;
oslo.middleware's options and backends (disable by file, the detailed view).

The pure parts (the publish history, the probe cache, the failure words) need no
server. The endpoint runs on every transport: ``memory://`` always, RabbitMQ and
kombu's Redis transport marked ``real``; the Redis variant runs a redis-server of
its own, since emulating a broker that connects but cannot declare means
changing its settings.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
import redis
from amqp import exceptions as amqp_exceptions

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.api import health as api_health
from qsched.bus import base, health
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.bus.kombu.wire import CONNECT, DECLARE, PUBLISH, failure_category
from qsched.chaos.servers import ChaosError, RedisServer
from qsched.conf import APIOptions, LedgerOptions, SchedulerOptions
from qsched.ledger import Stores, open_stores
from qsched.stack.cleanup import forget_bus
from qsched.stack.config import ini_text
from tests.cloud import transport_url
from tests.compute.test_compute import configure
from tests.conftest import TEST_DURABILITY, require_server
from tests.raw import redis_store
from tests.test_logging import qsched_api

pytestmark = pytest.mark.timeout(60)

USER = {"X-Auth-Token": "alice:pa"}
IMAGE = "c9a4b3f2-3f4e-4bb5-9a55-0c1e62c1c0de"
QUICK = KombuOptions(connect_timeout_s=1.0, confirm_timeout_s=2.0)
CLASSES = ["m1.small", "m1.large", "g1.gpu"]  # the flavors tests.compute.test_compute configures
JSON = {"Accept": "application/json"}


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the publish history -------------------------------------------------------------------


def test_history_quiet_is_no_verdict() -> None:
    assert health.PublishHistory().verdict() is None


def test_history_down_while_publishes_fail_and_none_succeeds() -> None:
    clock = Clock()
    history = health.PublishHistory(window_s=10, clock=clock)
    history.failed("m1.small", base.DECLARE_FAILED)
    assert history.verdict() == base.DECLARE_FAILED
    clock.now += 9
    history.failed("m1.large", base.UNREACHABLE)
    assert history.verdict() == base.UNREACHABLE, "the latest failure says why"
    history.succeeded()
    assert history.verdict() is None


def test_history_failures_age_out() -> None:
    clock = Clock()
    history = health.PublishHistory(window_s=10, clock=clock)
    history.failed("m1.small", base.PUBLISH_FAILED)
    clock.now += 10.1
    assert history.verdict() is None


def test_history_a_success_within_the_window_keeps_it_up() -> None:
    clock = Clock()
    history = health.PublishHistory(window_s=10, clock=clock)
    history.succeeded()
    clock.now += 5
    history.failed("m1.small", base.PUBLISH_FAILED)
    assert history.verdict() is None
    clock.now += 5.1  # the success is out of the window, the failure is not
    assert history.verdict() == base.PUBLISH_FAILED


def test_history_one_refused_class_is_that_class_s_problem() -> None:
    clock = Clock()
    history = health.PublishHistory(window_s=10, clock=clock)
    for _ in range(5):
        history.failed("m1.small", base.REFUSED)
    assert history.verdict() is None
    history.failed("m1.large", base.REFUSED)
    assert history.verdict() == base.REFUSED, "two classes refused and nothing placed"
    clock.now += 10.1
    history.failed("g1.gpu", base.REFUSED)
    assert history.verdict() is None, "the others aged out"
    history.failed("m1.small", base.REFUSED)
    history.succeeded()
    assert history.verdict() is None


def test_history_is_bounded() -> None:
    history = health.PublishHistory()
    for i in range(1000):
        history.failed(f"class-{i}", base.REFUSED)
    assert len(history._refused) <= 2


# -- the probe cache -----------------------------------------------------------------------


class Probe:
    def __init__(self) -> None:
        self.calls = 0
        self.error: base.BusUnavailable | None = None

    def __call__(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error


def test_probe_cache_reuses_an_outcome_for_its_ttl() -> None:
    clock, probe = Clock(), Probe()
    cache = health.ProbeCache(probe, ttl_s=1.0, clock=clock)
    cache.check()
    probe.error = base.BusUnavailable("amqp://u:**@h//", "refused", base.UNREACHABLE)
    cache.check()
    assert probe.calls == 1
    clock.now += 1.0
    with pytest.raises(base.BusUnavailable) as first:
        cache.check()
    with pytest.raises(base.BusUnavailable) as second:
        cache.check()
    assert probe.calls == 2 and first.value is not second.value
    assert second.value.category == base.UNREACHABLE and second.value.reason == "refused"


def test_probe_cache_runs_one_probe_for_callers_that_come_together() -> None:
    release, started = threading.Event(), threading.Event()
    calls = []

    def slow_probe() -> None:
        calls.append(1)
        started.set()
        release.wait(5)

    cache = health.ProbeCache(slow_probe, ttl_s=60)
    threads = [threading.Thread(target=cache.check) for _ in range(8)]
    for thread in threads:
        thread.start()
    assert started.wait(5)
    release.set()
    for thread in threads:
        thread.join(5)
    assert calls == [1]


# -- what a failure means ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "exc", "category"),
    [
        (CONNECT, ConnectionRefusedError(111, "refused"), base.UNREACHABLE),
        (CONNECT, amqp_exceptions.AccessRefused("login refused"), base.UNREACHABLE),
        (DECLARE, amqp_exceptions.InternalError("INTERNAL_ERROR"), base.DECLARE_FAILED),  # 541
        (DECLARE, amqp_exceptions.PreconditionFailed("inequivalent arg"), base.REFUSED),  # 406
        (DECLARE, redis.ResponseError("OOM command not allowed"), base.DECLARE_FAILED),
        (PUBLISH, TimeoutError("no confirm"), base.PUBLISH_FAILED),
        (PUBLISH, amqp_exceptions.MessageNacked("nacked"), base.REFUSED),
        (PUBLISH, ConnectionResetError(104, "reset"), base.PUBLISH_FAILED),
        (PUBLISH, redis.ReadOnlyError("read only replica"), base.PUBLISH_FAILED),
    ],
)
def test_failure_category(step: str, exc: Exception, category: str) -> None:
    assert failure_category(step, exc) == category


@pytest.mark.parametrize(
    ("health_", "text", "status"),
    [
        ({"ledger": None, "bus": None}, "OK", "OK"),
        ({"ledger": None, "bus": "unreachable"}, "DOWN: bus (unreachable)", "DOWN"),
        ({"ledger": "timed out", "bus": "queue refused"},
         "DOWN: ledger (timed out), bus (queue refused)", "DOWN"),
    ],
)  # fmt: skip
def test_health_text_and_document(health_: dict[str, Any], text: str, status: str) -> None:
    assert api_health.health_text(health_) == text
    document = api_health.health_document([api_health.PartsResult(health_)])
    assert document["status"] == status
    assert len(document["reasons"]) == sum(1 for why in health_.values() if why)
    for part, why in health_.items():
        assert document["parts"][part] == (
            {"status": "DOWN", "reason": why} if why else {"status": "UP"}
        )


# -- the endpoint --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory) -> Iterator[RedisServer]:
    """A redis-server of this module: tests change its settings (never the shared one's)."""
    try:
        server = RedisServer(Path(tmp_path_factory.mktemp("redis")), "bus")
        server.start()
    except ChaosError as exc:
        require_server("redis-server", "a free port", exc, "install redis-server")
    yield server
    server.stop()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("rabbitmq", id="rabbitmq", marks=pytest.mark.real),
        pytest.param("redis", id="redis", marks=pytest.mark.real),
    ]
)
def transport(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "redis":
        return str(request.getfixturevalue("private_redis").url)
    return transport_url("rabbitmq")


class Api:
    """qsched-api on a fakeredis ledger and a bus of its own prefix, through falcon."""

    def __init__(self, conf, url: str) -> None:
        self.url = url
        self.stores: Stores = open_stores(
            LedgerOptions.from_conf(conf), url=f"fakeredis://health-{uuid.uuid4().hex}"
        )
        self.bus = KombuBus(url, prefix=f"qhealth-{uuid.uuid4().hex[:10]}", options=QUICK)
        configure(conf)  # the flavors of tests.compute.test_compute; [healthcheck] as conf says
        app = api_app.create_app(self.stores, self.bus, APIOptions.from_conf(conf),
                                 SchedulerOptions.from_conf(conf), conf=conf)  # fmt: skip
        self.client = falcon.testing.TestClient(app)

    def health(self, headers: dict[str, str] | None = None) -> falcon.testing.Result:
        return self.client.simulate_get("/healthcheck", headers=headers)

    def boot(self, flavor: str = "m1.small") -> int:
        body = {"server": {"name": "vm", "flavorRef": flavor, "imageRef": IMAGE}}
        return self.client.simulate_post("/v2.1/servers", json=body, headers=USER).status_code

    def expect(self, code: int, text: str) -> dict[str, Any]:
        """Check the text and the HEAD answers; return the JSON one."""
        result = self.health()
        assert (result.status_code, result.text) == (code, text)
        assert result.headers["content-type"].startswith("text/plain")
        assert result.headers["cache-control"] == "no-store"
        head = self.client.simulate_head("/healthcheck")
        assert (head.status_code, head.text) == (code, "")
        document = self.health(JSON)
        assert document.status_code == code
        assert document.headers["content-type"] == falcon.MEDIA_JSON
        found: dict[str, Any] = json.loads(document.text)
        return found

    def ledger_down(self) -> None:
        port = closed_port()
        url = f"redis://:secret@127.0.0.1:{port}/0"
        redis_store(self.stores).client = redis.Redis.from_url(url, socket_connect_timeout=1)

    def close(self) -> None:
        self.bus.close()
        if self.bus.wire.driver != "memory":
            forget_bus(self.url, self.bus.names.prefix, CLASSES, [])


@pytest.fixture
def api(conf, transport: str) -> Iterator[Api]:
    opened = Api(conf, transport)
    yield opened
    opened.close()


def test_both_up(api: Api) -> None:
    document = api.expect(200, "OK")
    assert document == {
        "status": "OK",
        "reasons": [],
        "parts": {"ledger": {"status": "UP"}, "bus": {"status": "UP"}},
    }
    assert api.boot() == 202


def test_ledger_down_only(api: Api) -> None:
    api.ledger_down()
    document = api.expect(503, "DOWN: ledger (unreachable)")
    assert document["parts"] == {
        "ledger": {"status": "DOWN", "reason": "unreachable"},
        "bus": {"status": "UP"},
    }
    assert document["reasons"] == ["ledger: unreachable"]


@pytest.mark.parametrize("scheme", ["amqp", "redis"])
def test_bus_down_only_at_a_closed_port_says_what_not_where(conf, scheme: str) -> None:
    port = closed_port()
    user = "guest:secret" if scheme == "amqp" else ":secret"
    api = Api(conf, f"{scheme}://{user}@127.0.0.1:{port}/{'/' if scheme == 'amqp' else '0'}")
    try:
        document = api.expect(503, "DOWN: bus (unreachable)")
        assert document["parts"]["ledger"] == {"status": "UP"}
        assert document["parts"]["bus"] == {"status": "DOWN", "reason": "unreachable"}
        for answer in (api.health().text, api.health(JSON).text):
            for secret in ("secret", "127.0.0.1", str(port), scheme):
                assert secret not in answer
        assert api.boot() == 503
        api.ledger_down()
        both = api.expect(503, "DOWN: ledger (unreachable), bus (unreachable)")
        assert both["reasons"] == ["ledger: unreachable", "bus: unreachable"]
    finally:
        api.bus.close()  # nothing to forget: the broker was never there


def test_bus_down_only_on_memory_when_connections_fail(conf, monkeypatch) -> None:
    api = Api(conf, "memory://")

    def refuse(heartbeat_s: int = 0) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(api.bus.wire, "connect", refuse)
    assert api.boot() == 503
    api.expect(503, "DOWN: bus (unreachable)")
    api.close()


def test_publishes_failing_while_the_probe_succeeds_on_memory(conf, monkeypatch) -> None:
    """RabbitMQ after its dead-letter supervisor died: connections fine, declares failing."""
    api = Api(conf, "memory://")
    api.expect(200, "OK")  # the probe's outcome is cached from here on

    def broken_broker(channel: Any, entity: Any) -> None:
        raise amqp_exceptions.InternalError("Queue.declare: (541) INTERNAL_ERROR")

    monkeypatch.setattr(api.bus.wire, "declare", broken_broker)
    assert api.boot() == 503
    api.bus.wire.probe()  # a probe still succeeds
    document = api.expect(503, "DOWN: bus (declares failing)")
    assert document["parts"]["bus"] == {"status": "DOWN", "reason": "declares failing"}
    monkeypatch.undo()
    assert api.boot() == 202
    api.expect(200, "OK")
    api.close()


@pytest.mark.real
def test_publishes_failing_while_the_probe_succeeds_on_redis(
    conf, private_redis: RedisServer
) -> None:
    """A Redis demoted to a read-only replica (a failover the bus was not told of) still
    answers the probe (PING, LLEN) and refuses every write a publish makes."""
    api = Api(conf, private_redis.url)
    server = redis.Redis.from_url(private_redis.url)
    try:
        api.expect(200, "OK")
        server.replicaof("127.0.0.1", str(closed_port()))
        assert api.boot("large-id") == 503
        api.bus.wire.probe()
        api.expect(503, "DOWN: bus (publishes failing)")
        server.replicaof("NO", "ONE")
        assert api.boot("large-id") == 202
        api.expect(200, "OK")
    finally:
        server.replicaof("NO", "ONE")
        api.close()


@pytest.mark.real
def test_publishes_failing_while_the_probe_succeeds_on_rabbitmq(conf) -> None:
    """Class queues declared elsewhere with other arguments: PRECONDITION_FAILED on each publish.

    One refused class stays that class's problem (its boots get 503, the API stays
    in the pool); two classes refused and nothing placed is the broker's.
    """
    api = Api(conf, transport_url("rabbitmq"))
    try:
        api.expect(200, "OK")
        with api.bus.wire.channel() as channel:
            for name in ("m1.small", "m1.large"):  # classic queues where qsched wants quorum
                channel.queue_declare(api.bus.names.boot_queue(name), durable=True)
        assert api.boot("m1.small") == 503
        api.bus.wire.probe()
        api.expect(200, "OK")
        assert api.boot("large-id") == 503
        document = api.expect(503, "DOWN: bus (queue refused)")
        assert document["reasons"] == ["bus: queue refused"]
        assert api.boot("g1.gpu") == 202
        api.expect(200, "OK")
    finally:
        api.close()


# -- oslo.middleware's options and backends ----------------------------------------------------


def healthcheck_conf(tmp_path: Path, **healthcheck: Any):
    """A configuration whose ``[healthcheck]`` section is ``healthcheck``, read from a file."""
    path = tmp_path / "qsched.conf"
    path.write_text(ini_text({"healthcheck": healthcheck,
                              "ledger": {"durability": TEST_DURABILITY}}))  # fmt: skip
    return qconf.load(config_files=[str(path)])


def test_touching_the_file_drains_the_node(tmp_path: Path) -> None:
    """oslo.middleware's disable_by_file: 503 while the file exists, whatever else is
    up; the API itself goes on serving (the load balancer is the one told)."""
    drain = tmp_path / "healthcheck_disable"
    conf = healthcheck_conf(tmp_path, backends="disable_by_file", disable_by_file_path=drain)
    api = Api(conf, "memory://")
    assert api.expect(200, "OK\nOK")["reasons"] == []
    drain.touch()
    document = api.expect(503, "OK\nDISABLED BY FILE")
    assert document == {
        "status": "DOWN",
        "reasons": ["DISABLED BY FILE"],
        "parts": {"ledger": {"status": "UP"}, "bus": {"status": "UP"}},
    }
    assert api.boot() == 202
    api.ledger_down()
    document = api.expect(503, "DOWN: ledger (unreachable)\nDISABLED BY FILE")
    assert document["reasons"] == ["ledger: unreachable", "DISABLED BY FILE"]
    drain.unlink()
    api.expect(503, "DOWN: ledger (unreachable)\nOK")
    api.close()


def test_the_detailed_view_names_each_part(tmp_path: Path) -> None:
    """``[healthcheck] detailed = true``: oslo.middleware's detailed document, where
    qsched's backend gives each part; still nothing of where they are."""
    api = Api(healthcheck_conf(tmp_path, detailed="true"), "memory://")
    api.ledger_down()
    document = api.expect(503, "DOWN: ledger (unreachable)")
    assert document["detailed"] is True
    assert document["reasons"] == [
        {"reason": "DOWN: ledger (unreachable)", "details": "ledger: unreachable; bus: up",
         "class": "PartsResult"}
    ]  # fmt: skip
    assert "secret" not in json.dumps(document["reasons"])
    page = api.health({"Accept": "text/html"})
    assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
    assert "ledger: unreachable; bus: up" in page.text
    api.close()


def test_a_caller_outside_the_allowed_source_ranges_finds_nothing(tmp_path: Path) -> None:
    """The callers are remote peers, which noauth2 serves only when told loudly."""
    conf = healthcheck_conf(tmp_path, allowed_source_ranges="10.0.0.0/8")
    conf.set_override("allow_noauth2_on_public_address", True, group="api")
    api = Api(conf, "memory://")
    outside = api.client.simulate_get("/healthcheck", remote_addr="192.0.2.7")
    assert outside.status_code == 404
    assert outside.json == {
        "itemNotFound": {"code": 404, "message": "The resource could not be found."}
    }
    inside = api.client.simulate_get("/healthcheck", remote_addr="10.1.2.3")
    assert (inside.status_code, inside.text) == (200, "OK")
    api.close()


@pytest.mark.slow
def test_qsched_api_reads_the_healthcheck_section_of_its_config(tmp_path: Path) -> None:
    drain = tmp_path / "healthcheck_disable"
    healthcheck = {"backends": "disable_by_file", "disable_by_file_path": str(drain)}
    with qsched_api(tmp_path, healthcheck=healthcheck) as api:
        assert api.call("GET", "/healthcheck")[0::2] == (200, b"OK\nOK")
        drain.touch()
        assert api.call("GET", "/healthcheck")[0::2] == (503, b"OK\nDISABLED BY FILE")
        assert api.call("HEAD", "/healthcheck")[0] == 503
