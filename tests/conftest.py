"""Shared fixtures. Real servers: required under CI=true, skipped elsewhere when absent."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agents.service import ComputeAgent
from qsched import conf as qconf
from qsched.bus.kombu import KombuBus
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, LedgerOptions, SchedulerOptions
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.net import LOOPBACK, free_port
from qsched.stack.glance import GlanceFailed, GlanceServer
from qsched.stack.keystone import KeystoneFailed, KeystoneServer, User
from qsched.stack.redis_cluster import RedisClusterFailed, RedisClusterServers

#: The shared Redis databases of one test process: the ledger's, and kombu's Redis
#: transport's (tests/cloud.py, tests/bus/test_bus.py). Tests flush them, so each
#: pytest-xdist worker (``make test`` runs two) gets its own; the environment still wins.
WORKER_DATABASES = {"gw0": (9, 6), "gw1": (15, 14), "gw2": (13, 12)}
#: ``QSCHED_TEST_REDIS_SET=second``: other databases, for a test session run while
#: another runs on the same Redis (a ``make test`` while CI's runs), which would
#: otherwise flush each other's databases under their tests.
SECOND_WORKER_DATABASES = {"gw0": (5, 4), "gw1": (8, 7), "gw2": (3, 2)}
_SETS = {"first": WORKER_DATABASES, "second": SECOND_WORKER_DATABASES}
_SET = os.environ.get("QSCHED_TEST_REDIS_SET", "first")
if _SET not in _SETS:
    raise RuntimeError(f"QSCHED_TEST_REDIS_SET={_SET}: use one of {', '.join(_SETS)}")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if _WORKER not in _SETS[_SET]:
    raise RuntimeError(f"pytest-xdist worker {_WORKER}: the shared Redis has databases for "
                       f"{len(WORKER_DATABASES)} workers only; run with -n {len(WORKER_DATABASES)} "
                       "or fewer")  # fmt: skip
_LEDGER_DB, _BUS_DB = _SETS[_SET][_WORKER]
REDIS_URL = os.environ.get("QSCHED_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{_LEDGER_DB}")
BUS_REDIS_URL = os.environ.get("QSCHED_TEST_BUS_REDIS_URL", f"redis://127.0.0.1:6379/{_BUS_DB}")
IN_CI = os.environ.get("CI") == "true"


#: The longest test files, in seconds of one ``make test`` run with ``--junitxml`` on two
#: workers (December 2026). They are collected first, heaviest first, and make test
#: hands files to its workers in collection order: a long file that started last would
#: keep one worker busy while the others sit idle. A stale figure costs time, never a
#: result. The files of :data:`ONE_WORKER` count as one.
HEAVY_FILES = {
    "test_identity_real": 200, "test_bus.py": 111, "test_shared_contention.py": 94,
    "test_server_groups.py": 77, "test_bench.py": 71, "test_api_generated.py": 68,
    "test_aggregates.py": 59, "test_e2e_real.py": 59, "test_api_input.py": 39,
    "test_alternates.py": 35, "test_poison.py": 34, "test_api_samples.py": 31,
}  # fmt: skip

#: Files that share session fixtures too slow to start on every worker (a Keystone, and
#: a Glance in its catalog: about 40 s): one scope, so one worker runs them all.
ONE_WORKER = {
    "test_keystone_real.py": "test_identity_real",
    "test_glance_real.py": "test_identity_real",
    "test_openstack_clients_real.py": "test_identity_real",
}


def _scope(nodeid: str) -> str:
    """The file of a test, or the name of the :data:`ONE_WORKER` group it is in."""
    path = nodeid.split("::", 1)[0]
    return ONE_WORKER.get(path.rpartition("/")[2], path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The :data:`HEAVY_FILES` first, heaviest first; the order within a file is kept."""
    items.sort(key=lambda item: -HEAVY_FILES.get(_scope(item.nodeid).rpartition("/")[2], 0))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with :data:`ONE_WORKER`'s groups, in collection order."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False  # the order is pytest_collection_modifyitems'
    return Scheduling(config, log)


def require_server(name: str, url: str, error: Exception, how: str) -> None:
    """Fail in CI, skip elsewhere: a missing server is a broken CI, not a laptop's fault."""
    message = f"{name} not reachable at {url} ({error}); {how}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def real_redis(url: str = REDIS_URL) -> redis.Redis:
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        require_server("Redis", url, exc, "start it with: redis-server --port 6379")
    return client


@pytest.fixture
def real_redis_url() -> Iterator[str]:
    """A real Redis database, flushed before and after the test."""
    client = real_redis()
    client.flushdb()
    yield REDIS_URL
    client.flushdb()


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.real)])
def ledger_url(request: pytest.FixtureRequest) -> str:
    """Every ledger backend: an in-process fakeredis, then a real Redis."""
    return backend_url(request)


#: ``ledger_url``'s backends and a Redis Cluster, for the suites that run on all three
#: (a module's own ``ledger_url`` fixture with these params and :func:`backend_url`)
WITH_CLUSTER = ["fakeredis", pytest.param("redis", marks=pytest.mark.real),
                pytest.param("cluster", marks=pytest.mark.real)]  # fmt: skip


def backend_url(request: pytest.FixtureRequest) -> str:
    """The ledger URL of the backend ``request.param`` names (its server flushed before
    and after the test by the fixture it comes from)."""
    if request.param == "fakeredis":
        return f"fakeredis://test-{uuid.uuid4().hex}"
    fixture = {"redis": "real_redis_url", "cluster": "cluster_url"}[request.param]
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A real Redis Cluster of three masters on loopback for the session (about 2 s:
    Redis holds a new master's state at fail for two seconds before it turns ok).

    Skipped with the reason where redis-server is missing; a failure under CI=true.
    """
    servers = RedisClusterServers(Path(tmp_path_factory.mktemp("redis-cluster")))
    try:
        servers.start()
    except (RedisClusterFailed, OSError) as exc:
        require_server("Redis Cluster", servers.url, exc, "apt-get install redis-server")
    yield servers
    servers.stop()


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterServers) -> Iterator[str]:
    """The session's Redis Cluster, every master flushed before and after the test."""
    redis_cluster.flush()
    yield redis_cluster.url
    redis_cluster.flush()


#: ``[ledger] durability`` of the tests' ledgers: fakeredis keeps nothing and the shared
#: Redis runs ``appendonly no``, so a test says ``async``, a fixture's choice, where the
#: default (``disk``) would be refused. tests/ledger/test_durability.py checks the others on
#: redis-servers of its own.
TEST_DURABILITY = "async"
#: the ``[ledger]`` line a test's config file adds for it
DURABILITY_LINE = f"durability = {TEST_DURABILITY}\n"


@pytest.fixture
def conf():
    """The shipped options, but ``[ledger] durability`` (:data:`TEST_DURABILITY`)."""
    loaded = qconf.load()
    loaded.set_override("durability", TEST_DURABILITY, group="ledger")
    return loaded


@pytest.fixture
def stores(conf, ledger_url: str) -> Stores:
    return open_stores(LedgerOptions.from_conf(conf), url=ledger_url)


@pytest.fixture
def bus() -> Iterator[KombuBus]:
    """An in-process bus under a prefix of its own."""
    bus = KombuBus("memory://", prefix=f"t{uuid.uuid4().hex[:10]}")
    yield bus
    bus.close()


@pytest.fixture
def api(conf, stores: Stores, bus: KombuBus) -> ComputeAPI:
    """The front door with flavors small (1 VCPU) and big (8), project p1 unlimited."""
    conf.set_override("build_timeout_s", 30, group="scheduler")
    compute = ComputeAPI(stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf))
    for flavor in (Flavor("small", 1, 1024, 0), Flavor("big", 8, 8192, 0)):
        compute.cell.flavors.create(flavor)
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    return compute


@pytest.fixture
def agents() -> Iterator[list[ComputeAgent]]:
    """Agents a test starts; stopped at the end."""
    running: list[ComputeAgent] = []
    yield running
    for agent in running:
        agent.stop(timeout_s=5)


@dataclasses.dataclass(frozen=True)
class KeystoneCloud:
    """A real Keystone whose catalog sends ``compute`` to ``api_url``, with its users.

    Projects ``pa`` and ``pb``; ``member_a``/``reader_a`` hold member/reader on pa,
    ``member_b`` member on pb, ``service`` the service role on ``service`` (the API's
    own user for auth_token). ``started_s``: how long the fixture took.
    """

    server: KeystoneServer
    api_port: int
    users: dict[str, User]
    started_s: float

    @property
    def api_url(self) -> str:
        return f"http://{LOOPBACK}:{self.api_port}/v2.1"


@pytest.fixture(scope="session")
def keystone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeystoneCloud]:
    """A real Keystone on SQLite for the whole session (about 15 s to set up).

    Skipped with the reason where it cannot start (the ``test`` extra not installed);
    a failure under CI=true.
    """
    started = time.monotonic()
    server = KeystoneServer(Path(tmp_path_factory.mktemp("keystone")))
    # ``token_urlsafe`` draws a leading "-" once in 64, which keystone-manage once took
    # for an option: every session's admin password has one, so each run checks it.
    server.admin = dataclasses.replace(server.admin, password="-" + server.admin.password)
    try:
        server.start()
    except (KeystoneFailed, OSError, subprocess.SubprocessError) as exc:
        require_server("Keystone", server.url, exc, "install it: pip install -e '.[test]'")
    try:
        api_port = free_port()
        server.register_service("compute", "qsched", f"http://{LOOPBACK}:{api_port}/v2.1")
        users = {
            "member_a": server.create_user("member_a", "pa", ("member",)),
            "reader_a": server.create_user("reader_a", "pa", ("reader",)),
            "member_b": server.create_user("member_b", "pb", ("member",)),
            "service": server.create_user("qsched", "service", ("service",)),
            "admin": server.admin,
        }
        yield KeystoneCloud(server, api_port, users, time.monotonic() - started)
    finally:
        server.stop()


#: The images of the ``glance`` fixture: name -> (owner, visibility, upload, fields).
GLANCE_IMAGES = {
    "plain": ("admin", "public", True, {}),
    "avx": ("admin", "public", True, {"trait:HW_CPU_X86_AVX2": "required"}),
    "big": ("admin", "public", True, {"min_ram": 8192, "min_disk": 40}),
    "private_b": ("member_b", "private", True, {}),
    "queued": ("admin", "public", False, {}),
}


@dataclasses.dataclass(frozen=True)
class GlanceCloud:
    """A real Glance in ``keystone``'s catalog (service type ``image``), with the images
    of :data:`GLANCE_IMAGES` by name; ``started_s``: how long the fixture took."""

    server: GlanceServer
    images: dict[str, str]
    started_s: float


@pytest.fixture(scope="session")
def glance(
    keystone: KeystoneCloud, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GlanceCloud]:
    """A real Glance on SQLite and a file store for the whole session (about 6 s).

    Skipped with the reason where it cannot start; a failure under CI=true.
    """
    started = time.monotonic()
    service = keystone.server.create_user("glance", "service", ("service",))
    server = GlanceServer(Path(tmp_path_factory.mktemp("glance")), keystone.server.url, service)
    try:
        server.start()
    except (GlanceFailed, OSError, subprocess.SubprocessError) as exc:
        require_server("Glance", server.url, exc, "install it: pip install -e '.[test]'")
    try:
        keystone.server.register_service("image", "glance", server.url)
        images = {}
        for name, (owner, visibility, upload, fields) in GLANCE_IMAGES.items():
            session = keystone.server.session(keystone.users[owner])
            image = server.create_image(session, name, visibility, upload, **fields)
            images[name] = image["id"]
        yield GlanceCloud(server, images, time.monotonic() - started)
    finally:
        server.stop()
