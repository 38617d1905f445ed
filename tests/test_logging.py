"""oslo.log in the services: a request's log lines name it; the options are honoured.

In process, a request's lines go through oslo.log's own formatter (formatted as
they are written, while the request's context is current). The entry points
run as processes: oslo.log's setup replaces the root logger's handlers, which
pytest's own capture lives on.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http import client
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
from oslo_log import formatters

from qsched import conf as qconf
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.net import LOOPBACK, free_port
from qsched.stack.config import ini_text
from tests.api.test_api import post_server
from tests.compute.test_compute import RecordingBus, make_app
from tests.conftest import TEST_DURABILITY
from tests.helpers import wait_until
from tests.images.test_images import _agent

BINDIR = Path(sys.executable).parent
USER = {"X-Auth-Token": "alice:pa"}


class Lines(logging.Handler):
    """Each record as oslo.log formats it, when it is written."""

    def __init__(self, conf: Any) -> None:
        super().__init__()
        formatter = formatters.ContextFormatter(
            project="qsched", config=conf, datefmt=conf.log_date_format
        )
        self.setFormatter(formatter)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def of(self, request_line: str) -> str:
        (found,) = [line for line in self.lines if request_line in line]
        return found


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Iterator[Lines]:
    handler = Lines(qconf.load(service=True))
    logger = logging.getLogger("qsched.api.app")
    caplog.set_level(logging.INFO, logger=logger.name)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_a_request_s_log_lines_name_its_ids_user_and_project(
    conf, stores: Stores, lines: Lines
) -> None:
    api = falcon.testing.TestClient(make_app(conf, stores, RecordingBus()))
    global_id = f"req-{uuid.uuid4()}"
    answer = api.simulate_get(
        "/v2.1/flavors", headers={**USER, "X-OpenStack-Request-ID": global_id}
    )
    request_id = answer.headers["x-openstack-request-id"]
    assert f"[{global_id} {request_id} alice pa " in lines.of('"GET /v2.1/flavors"')


def test_a_request_before_or_without_authentication_is_named_alone(
    conf, stores: Stores, lines: Lines
) -> None:
    """A refused token and a public path: the request's ids, no one's identity (and
    not the identity of the thread's request before)."""
    api = falcon.testing.TestClient(make_app(conf, stores, RecordingBus()))
    api.simulate_get("/v2.1/flavors", headers=USER)
    global_id = f"req-{uuid.uuid4()}"
    refused = api.simulate_get("/v2.1/servers", headers={"X-OpenStack-Request-ID": global_id})
    assert refused.status_code == 401
    request_id = refused.headers["x-openstack-request-id"]
    assert f"[{global_id} {request_id} - - " in lines.of('"GET /v2.1/servers"')
    health = api.simulate_get("/healthcheck")
    request_id = health.headers["x-openstack-request-id"]
    assert f"[None {request_id} - - " in lines.of('"GET /healthcheck"')


def test_the_agent_that_places_a_boot_logs_the_callers_global_request_id(
    conf, stores: Stores, bus, agents: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """X-OpenStack-Request-ID sent to the API travels in the boot message to the agent,
    whose "ACTIVE" line names it beside the API's own request id."""
    caplog.set_level(logging.INFO, logger="agents.spawning")
    agents.append(_agent(stores, bus, "cn-log", frozenset()))
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    api = falcon.testing.TestClient(make_app(conf, stores, bus))
    global_id = f"req-{uuid.uuid4()}"
    booted = post_server(api, {**USER, "X-OpenStack-Request-ID": global_id})
    assert booted.status_code == 202, booted.text
    server, request_id = booted.json["server"]["id"], booted.headers["x-openstack-request-id"]
    assert wait_until(lambda: stores.instances.get(server).state == State.ACTIVE, 10)

    def placed() -> list[logging.LogRecord]:
        return [r for r in caplog.records
                if r.name == "agents.spawning" and server in r.getMessage()]  # fmt: skip

    assert wait_until(lambda: bool(placed()), 5)
    (record,) = placed()
    assert record.getMessage() == (
        f"[{request_id} global {global_id}] instance {server} ACTIVE on {record.args[-1]}"
    )
    assert str(record.args[-1]).startswith("cn-log")


# -- the entry points, as processes ----------------------------------------------------------


@contextmanager
def qsched_api(tmp_path: Path, *args: str, **sections: dict[str, Any]) -> Iterator[Api]:
    """``qsched-api`` on the embedded ledger and bus, with ``args`` and config ``sections``."""
    port = free_port()
    given = {"DEFAULT": {"transport_url": "memory://"},
             "ledger": {"url": f"fakeredis://log-{uuid.uuid4().hex}",
                        "durability": TEST_DURABILITY}, **sections}  # fmt: skip
    given["api"] = {**given.get("api", {}), "port": port}
    config = tmp_path / "qsched.conf"
    config.write_text(ini_text(given))
    output = tmp_path / "qsched-api.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [str(BINDIR / "qsched-api"), "--config-file", str(config), *args],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    api = Api(port, output)
    try:
        api.wait_ready(proc)
        yield api
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


class Api:
    """A running qsched-api: HTTP calls to it and what it wrote."""

    def __init__(self, port: int, output: Path) -> None:
        self.port = port
        self.output = output

    def call(
        self, method: str, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lowercase names, body)."""
        conn = client.HTTPConnection(LOOPBACK, self.port, timeout=10)
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            found = {name.lower(): value for name, value in response.getheaders()}
            return response.status, found, response.read()
        finally:
            conn.close()

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert proc.poll() is None, self.output.read_text()
            try:
                self.call("GET", "/")
                return
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"qsched-api did not answer in {timeout_s}s: {self.output.read_text()}")

    def logged(self) -> list[str]:
        return self.output.read_text().splitlines()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "default", "debug"),
    [(["--debug"], {}, True), ([], {"debug": "true"}, True), ([], {}, False)],
    ids=["--debug", "[DEFAULT] debug", "info"],
)
def test_qsched_api_logs_at_debug_when_told(
    tmp_path: Path, args: list[str], default: dict[str, str], debug: bool
) -> None:
    """oslo.log's ``--debug`` and ``[DEFAULT] debug``; a request's lines carry its ids."""
    global_id = f"req-{uuid.uuid4()}"
    sections = {"DEFAULT": {"transport_url": "memory://", **default}}
    with qsched_api(tmp_path, *args, **sections) as api:
        _, headers, _ = api.call(
            "GET", "/v2.1/flavors", {**USER, "X-OpenStack-Request-ID": global_id}
        )
        request_id = headers["x-openstack-request-id"]
    logged = api.logged()
    (access,) = [line for line in logged if '"GET /v2.1/flavors"' in line]
    assert f" INFO qsched.api.app [{global_id} {request_id} alice pa " in access
    # the WSGI server's line of each request is a DEBUG one
    server_lines = [line for line in logged if " DEBUG qsched.api.wsgi " in line]
    assert bool(server_lines) == debug, logged


@pytest.mark.slow
def test_qsched_agent_logs_where_its_config_says(tmp_path: Path) -> None:
    """``[DEFAULT] log_file``, in oslo.log's format, from start to stop."""
    log_file = tmp_path / "agent.log"
    config = tmp_path / "qsched.conf"
    config.write_text(ini_text({
        "DEFAULT": {"transport_url": "memory://", "log_file": str(log_file)},
        "ledger": {"url": f"fakeredis://log-{uuid.uuid4().hex}", "durability": TEST_DURABILITY},
        "agent": {"host": "cn-log", "node_count": 1},
    }))  # fmt: skip
    proc = subprocess.Popen(
        [str(BINDIR / "qsched-agent"), "--config-file", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "consuming" not in (log_file.read_text() if log_file.exists() else ""):
            assert proc.poll() is None, "qsched-agent exited"
            assert time.monotonic() < deadline, "qsched-agent did not start in 60s"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert out == b"", "with log_file, nothing on stdout"
    logged = log_file.read_text()
    assert f" {proc.pid} INFO agents.service [-] agent cn-log: 1 nodes, consuming" in logged
    assert " INFO qsched.agent [-] agent cn-log: signal 15, stopping" in logged
