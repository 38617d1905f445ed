"""The shipped deploy files work: the systemd units start what they name, the broker
policy script gives every queue its one policy, and the sdist carries them.

The units are read as systemd would run them, with ``/etc/qsched/<file>`` taken from
``deploy/<file>`` (the file a deployment starts from) or an empty file of the test's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import types
import uuid
import wsgiref.util
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from gunicorn import util as gunicorn_util
from gunicorn.app.wsgiapp import WSGIApplication

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.bus import base as bus_base
from qsched.bus.kombu import KombuBus
from qsched.conf import LedgerOptions
from qsched.flavors import Constraints, Flavor
from qsched.ledger import open_stores
from qsched.ledger.durability import DISK_SETTINGS
from qsched.ledger.server import unreachable, wait_for
from qsched.net import free_port
from qsched.scheduling.classes import class_name
from qsched.stack.config import ini_text
from tests.cloud import AMQP_URL, require_rabbitmq
from tests.conftest import TEST_DURABILITY, require_server
from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
API_UNIT = DEPLOY / "systemd/qsched-api.service"
AGENT_UNIT = DEPLOY / "systemd/qsched-agent@.service"
POLICIES = DEPLOY / "rabbitmq-policies.sh"
LEDGER_REDIS = DEPLOY / "redis-ledger.conf"
#: Where the units expect the virtual environment qsched is installed in (its bin/).
UNIT_BINDIR = Path("/opt/qsched/bin")
ETC = "/etc/qsched/"
BINDIR = Path(sys.executable).parent


def unit_lines(unit: Path, key: str) -> list[str]:
    """The values of ``key=`` in a unit file, in order."""
    lines = unit.read_text().splitlines()
    return [line.split("=", 1)[1] for line in lines if line.startswith(f"{key}=")]


def exec_start(unit: Path, instance: str = "1") -> list[str]:
    """The unit's one ExecStart command, split as systemd splits it, ``%i`` filled in."""
    (command,) = unit_lines(unit, "ExecStart")
    return shlex.split(command.replace("%i", instance))


def installed(argv0: str) -> Path:
    """The command a unit runs, from this test's virtual environment."""
    path = Path(argv0)
    assert path.parent == UNIT_BINDIR, f"{argv0}: the units run from {UNIT_BINDIR}"
    assert (BINDIR / path.name).exists(), f"{path.name} is not installed with qsched"
    return BINDIR / path.name


def local(arg: str, tmp_path: Path) -> str:
    """``/etc/qsched/<file>``: ``deploy/<file>`` when qsched ships it, else an empty file."""
    if not arg.startswith(ETC):
        return arg
    name = arg[len(ETC) :]
    if (DEPLOY / name).exists():
        return str(DEPLOY / name)
    (tmp_path / name).touch()
    return str(tmp_path / name)


def embedded_conf(tmp_path: Path) -> Path:
    """The embedded ledger and the memory:// bus, noauth2, and no periodic task to stop."""
    path = tmp_path / "embedded.conf"
    sections = {
        "DEFAULT": {"transport_url": "memory://"},
        "ledger": {"url": f"fakeredis://deploy-{uuid.uuid4().hex}", "durability": TEST_DURABILITY},
        "scheduler": {"reap_interval_s": 0, "janitor_interval_s": 0, "outbox_interval_s": 0},
    }
    path.write_text(ini_text(sections))
    return path


def get_root(application: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """``GET /`` through a WSGI callable: its status and JSON body."""
    environ: dict[str, Any] = {"REQUEST_METHOD": "GET", "PATH_INFO": "/"}
    wsgiref.util.setup_testing_defaults(environ)
    answered: list[str] = []

    def start_response(status: str, headers: list[Any], exc_info: Any = None) -> None:
        answered.append(status)

    body = b"".join(application(environ, start_response))
    return answered[0], json.loads(body)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[object]]:
    """``QSCHED_CONFIG`` on :func:`embedded_conf`, and a fresh ``wsgi_app``: the
    applications ``load_app`` builds are recorded here."""
    made: list[object] = []
    load_app = api_app.load_app

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(load_app(*args, **kwargs))
        return made[-1]

    monkeypatch.setenv(api_app.CONFIG_ENV, str(embedded_conf(tmp_path)))
    monkeypatch.setattr(api_app, "load_app", counted)
    monkeypatch.setattr(api_app, "wsgi_app", api_app.LazyApp(counted))
    yield made


# -- the API unit --


def test_the_api_unit_reads_the_config_file_the_app_does() -> None:
    (setting,) = unit_lines(API_UNIT, "Environment")
    assert setting.split("=", 1) == [api_app.CONFIG_ENV, f"{ETC}qsched.conf"]


def test_the_api_unit_loads_in_gunicorn_and_answers(
    builds: list[object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """gunicorn parses the unit's command line, reads deploy/gunicorn.conf.py and imports
    the app; a worker's start hook builds the app the spec names, which then answers."""
    argv = exec_start(API_UNIT)
    assert installed(argv[0]).name == "gunicorn"
    monkeypatch.delenv("GUNICORN_CMD_ARGS", raising=False)
    monkeypatch.setattr(sys, "argv", ["gunicorn", *(local(a, tmp_path) for a in argv[1:])])
    monkeypatch.setattr(sys, "path", list(sys.path))  # gunicorn adds its chdir
    server = WSGIApplication("%(prog)s [OPTIONS] [APP_MODULE]", prog="gunicorn")
    assert server.cfg.post_worker_init.__code__.co_filename == str(DEPLOY / "gunicorn.conf.py")
    # The hooks as the master and a worker call them, on a loopback bind (noauth2 here);
    # the metrics directory is this test's, so the hook's choice does not outlive it.
    (tmp_path / "metrics").mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    loopback = types.SimpleNamespace(cfg=types.SimpleNamespace(bind=["127.0.0.1:8774"]))
    server.cfg.on_starting(loopback)
    application = server.load()  # gunicorn.util.import_app(the unit's app spec)
    assert builds == []  # the master imports; only a worker builds
    server.cfg.post_worker_init(loopback)
    assert len(builds) == 1
    status, document = get_root(application)
    assert status == "200 OK"
    assert [v["id"] for v in document["versions"]] == ["v2.0", "v2.1"]
    assert len(builds) == 1, "the start hook built another app than the one gunicorn serves"


@pytest.mark.parametrize("spec", ["qsched.api.app:wsgi_app", "qsched.api.app:load_app()"])
def test_the_documented_app_specs_load_and_answer(builds: list[object], spec: str) -> None:
    """The lazy app and the factory that qsched.api.app's docstring names."""
    status, document = get_root(gunicorn_util.import_app(spec))
    assert status == "200 OK"
    assert document["versions"][1]["id"] == "v2.1"
    assert len(builds) == 1


# -- the agent unit --


def test_the_agent_unit_runs_the_installed_agent_with_options_it_has(tmp_path: Path) -> None:
    argv = exec_start(AGENT_UNIT, instance="compute-001")
    command = installed(argv[0])
    scripts = metadata.distribution("qsched").entry_points.select(group="console_scripts")
    assert command.name in scripts.names
    args = [local(a, tmp_path) for a in argv[1:]]
    assert (tmp_path / "agent-compute-001.conf").exists()
    done = subprocess.run(
        [str(command), *args, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    options = {a for a in args if a.startswith("-")}
    assert options and all(option in done.stdout for option in options)


# -- the broker policies --


def rabbitmqctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stderr}"
    return done.stdout


def listed(*args: str) -> list[dict[str, Any]]:
    """A ``rabbitmqctl list_*`` command's rows (``--formatter json``)."""
    return list(json.loads(rabbitmqctl(*args, "--formatter", "json") or "[]"))


@pytest.fixture
def vhost() -> Iterator[str]:
    """A throwaway vhost of the local RabbitMQ that the test user may use, deleted after."""
    require_rabbitmq()
    if shutil.which("rabbitmqctl") is None:
        require_server("rabbitmqctl", "PATH", FileNotFoundError("rabbitmqctl"), "install it")
    name = f"qsched-deploy-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", name)
    try:
        user = urlsplit(AMQP_URL).username or "guest"
        rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
        yield name
    finally:
        rabbitmqctl("delete_vhost", name)


#: The kinds of boot queue qsched declares: a scheduling class of each (qsched.bus.base).
CLASSES = {
    "flavor class": "m1.small",
    "flavor class of a name no queue may hold": Flavor("m1 small+ é", 1, 512).class_key,
    "class with constraints": class_name(
        "m1.small", Constraints(required_traits=frozenset({"HW_CPU_X86_AVX2"}))
    ),
}
HOST = "compute-001.example.com"


def queue_names(names: bus_base.Names) -> dict[str, str]:
    """Every kind of queue qsched declares, and a name of that kind."""
    boot = {kind: names.boot_queue(c) for kind, c in CLASSES.items()}
    return {**boot, "host": names.host_queue(HOST), "dead letters": names.dead_queue}


def declare(url: str, prefix: str) -> None:
    """Declare the queues of :func:`queue_names` as qsched does (the dead letters too)."""
    bus = KombuBus(url, prefix)
    try:
        entities = [bus.wire.boot_entity(c) for c in CLASSES.values()]
        with bus.wire.channel() as channel:
            for entity in [*entities, bus.wire.host_entity(HOST)]:
                bus.wire.declare(channel, entity)
    finally:
        bus.close()


@pytest.mark.real
@pytest.mark.timeout(240)
def test_the_policy_script_gives_every_queue_one_policy_with_its_dead_letters(
    vhost: str,
) -> None:
    env = {**os.environ, "VHOST": "/not-this-one", "RABBITMQCTL": "rabbitmqctl -q"}
    done = subprocess.run(
        ["sh", str(POLICIES), "-p", vhost], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    policies = listed("list_policies", "-p", vhost)
    for policy in policies:
        assert policy["apply-to"] == "queues"
        if isinstance(policy["definition"], str):  # 3.x gives the JSON text
            policy["definition"] = json.loads(policy["definition"])

    bus = qconf.load_options().bus
    names = bus_base.Names(bus.prefix)
    dead_letters = {
        "dead-letter-exchange": names.dead_exchange,
        "dead-letter-routing-key": bus_base.DEAD_ROUTING_KEY,
    }
    expected: dict[str, str] = {}
    for kind, queue in queue_names(names).items():
        matching = [p for p in policies if re.search(p["pattern"], queue)]
        if kind == "dead letters":  # a dead-letter exchange there would loop
            assert matching == [], f"{queue}: {matching}"
            expected[queue] = ""
            continue
        assert len(matching) == 1, f"{kind} {queue}: {[p['name'] for p in matching]}"
        (policy,) = matching
        definition = policy["definition"]
        assert dead_letters.items() <= definition.items(), f"{kind}: {definition}"
        if kind != "host":
            assert definition["delivery-limit"] == bus.delivery_limit
            assert definition["dead-letter-strategy"] == "at-least-once"
            assert definition["overflow"] == "reject-publish"
        assert ("expires" in definition) == (kind == "class with constraints")
        expected[queue] = policy["name"]

    # The broker's own word: the queues qsched declares carry the policy named above.
    url = urlunsplit(urlsplit(AMQP_URL)._replace(path=f"/{vhost}"))
    declare(url, names.prefix)
    applied = {q["name"]: q["policy"] for q in listed("list_queues", "-p", vhost, "name", "policy")}
    assert applied == expected


# -- packaging --


def test_the_sdist_carries_the_licence_deploy_and_docs(tmp_path: Path) -> None:
    """Built by setuptools' own backend (what ``python -m build --sdist`` calls), from a
    copy of the tree, so the checkout's egg-info is left alone."""
    tree = tmp_path / "tree"
    skip = shutil.ignore_patterns(".*", "*.egg-info", "__pycache__", "build", "dist", "tests")
    shutil.copytree(ROOT, tree, ignore=skip)
    build = "from setuptools import build_meta; print(build_meta.build_sdist('../dist'))"
    done = subprocess.run(
        [sys.executable, "-c", build], cwd=tree, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    (sdist,) = (tmp_path / "dist").glob("qsched-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    shipped = {
        str(path.relative_to(ROOT))
        for folder in ("deploy", "docs")
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {"LICENSE", "README.rst", "qsched/ledger/lua/lib.lua"} <= members
    assert shipped and shipped <= members, sorted(shipped - members)
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_the_ledger_redis_recipe_sets_what_the_default_durability_checks() -> None:
    """deploy/redis-ledger.conf, which the refusal of a Redis without an AOF names."""
    lines = [line.split(None, 1) for line in LEDGER_REDIS.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    assert dict(lines) == DISK_SETTINGS and len(lines) == len(DISK_SETTINGS)


@pytest.mark.real
def test_a_redis_started_with_the_recipe_opens_with_the_shipped_options(tmp_path: Path) -> None:
    """redis-server reading deploy/redis-ledger.conf: the shipped [ledger] options
    (durability disk) open on it and write."""
    if shutil.which("redis-server") is None:
        require_server("redis-server", "PATH", FileNotFoundError("redis-server"),
                       "apt-get install redis-server")  # fmt: skip
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = subprocess.Popen(
        ["redis-server", str(LEDGER_REDIS), "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(tmp_path), "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_for(lambda: unreachable(url) is None, 15), "redis-server did not answer"
        stores = open_stores(LedgerOptions.defaults(), url=url)
        stores.quota.set_limits("p1", instances=3)
        assert stores.quota.get_limits("p1").instances == 3
        stores.backend.close()
    finally:
        proc.terminate()
        proc.wait(10)
