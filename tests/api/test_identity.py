"""Identity without a Keystone: noauth2 kept off public addresses and remote peers,
the keystone seams.

The keystone strategy against a real Keystone is tests/api/test_keystone_real.py.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from qsched.api import app as api_app
from qsched.api import auth, keystone
from qsched.bus.kombu import KombuBus
from qsched.cmd import api as api_cmd
from qsched.conf import APIOptions, LedgerOptions
from qsched.context import global_request_id
from qsched.ledger import open_stores
from qsched.net import LOOPBACK, free_port, outward_address
from qsched.stack.config import ini_text
from tests.conftest import IN_CI, TEST_DURABILITY
from tests.helpers import ROOT

NOAUTH2 = APIOptions.defaults()


@pytest.mark.parametrize(
    "bind",
    ["127.0.0.1", "127.0.0.1:8774", "127.5.5.5:1", "localhost:8774", "::1", "[::1]:8774",
     "unix:/run/qsched/api.sock"],
)  # fmt: skip
def test_loopback_binds(bind: str) -> None:
    assert auth.is_loopback(bind)
    auth.refuse_public_noauth2(NOAUTH2, [bind])


@pytest.mark.parametrize(
    "bind", ["0.0.0.0", "0.0.0.0:8774", "[::]:8774", "::", "10.0.0.5:8774", "api.example.com:80"]
)
def test_noauth2_is_refused_on_a_public_bind(bind: str) -> None:
    assert not auth.is_loopback(bind)
    with pytest.raises(auth.PublicNoAuth2, match="anyone who reaches the port admin"):
        auth.refuse_public_noauth2(NOAUTH2, ["127.0.0.1:1", bind])


def test_the_loud_option_or_keystone_lets_it_listen_anywhere() -> None:
    auth.refuse_public_noauth2(NOAUTH2.replace(allow_noauth2_on_public_address=True), ["0.0.0.0"])
    auth.refuse_public_noauth2(NOAUTH2.replace(auth_strategy="keystone"), ["0.0.0.0"])


def write_conf(tmp_path: Path, **api: object) -> Path:
    path = tmp_path / "qsched.conf"
    sections = {
        "ledger": {"url": f"fakeredis://id-{uuid.uuid4().hex}", "durability": TEST_DURABILITY},
        "api": api,
    }
    path.write_text(ini_text({"DEFAULT": {"transport_url": "memory://"}, **sections}))
    return path


def test_qsched_api_refuses_noauth2_on_its_public_host(tmp_path: Path, capsys) -> None:
    conf = write_conf(tmp_path, host="0.0.0.0", port=free_port())
    assert api_cmd.main(["--config-file", str(conf)]) == 2
    assert "allow_noauth2_on_public_address" in capsys.readouterr().err


def test_load_app_refuses_noauth2_on_a_public_bind(tmp_path: Path) -> None:
    conf = write_conf(tmp_path)
    with pytest.raises(auth.PublicNoAuth2):
        api_app.load_app([str(conf)], bind=["0.0.0.0:8774"])
    with pytest.raises(auth.PublicNoAuth2):
        api_app.check_bind(["0.0.0.0:8774"], [str(conf)])
    api_app.check_bind(["127.0.0.1:8774"], [str(conf)])


def test_gunicorn_with_the_shipped_settings_refuses_noauth2_before_it_listens(
    tmp_path: Path,
) -> None:
    """deploy/gunicorn.conf.py binds 0.0.0.0: its on_starting hook stops the master."""
    conf = write_conf(tmp_path)
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    settings = str(ROOT / "deploy/gunicorn.conf.py")
    bind = f"0.0.0.0:{free_port()}"
    cmd = [gunicorn, "-c", settings, "-b", bind, "--no-control-socket", "qsched.api.app:wsgi_app"]
    env = {**os.environ, "QSCHED_CONFIG": str(conf)}
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    assert b"refusing to serve [api] auth_strategy = noauth2" in done.stderr


# -- noauth2 answers loopback peers only, whatever server runs it --


@pytest.mark.parametrize(
    "peer",
    ["127.0.0.1", "127.5.5.5", "::1", "::ffff:127.0.0.1", "::ffff:127.9.9.9", "", "localhost",
     None],
)  # fmt: skip
def test_local_peers(peer: str | None) -> None:
    """Loopback, IPv4-mapped loopback, and a unix socket's peer as servers report it
    (gunicorn '', waitress 'localhost', an in-process caller none)."""
    assert auth.is_local_peer(peer)
    auth.refuse_remote_peer(peer)


@pytest.mark.parametrize(
    "peer",
    ["192.0.2.2", "10.0.0.5", "0.0.0.0", "::ffff:10.0.0.5", "::", "fd00::2", "fe80::1%eth0",
     "2001:db8::1", "api.example.com", "127.0.0.1, 10.0.0.5", " "],
)  # fmt: skip
def test_remote_peers(peer: str) -> None:
    assert not auth.is_local_peer(peer)
    with pytest.raises(falcon.HTTPForbidden):
        auth.refuse_remote_peer(peer)


def noauth2_app(**api: Any) -> Any:
    """The noauth2 application as create_app builds it (no entry point in front)."""
    ledger = LedgerOptions.defaults().replace(durability=TEST_DURABILITY)
    stores = open_stores(ledger, url=f"fakeredis://id-{uuid.uuid4().hex}")
    bus = KombuBus("memory://", prefix=f"id{uuid.uuid4().hex[:8]}")
    return api_app.create_app(stores, bus, NOAUTH2.replace(**api))


def call(app: Any, path: str, peer: str | None, token: str = "admin") -> tuple[int, Any]:
    """GET ``path`` through a WSGI application with ``REMOTE_ADDR`` set to ``peer``
    (None: absent, as falcon's TestClient leaves it); the status and the JSON body."""
    environ = falcon.testing.create_environ(path, headers={"X-Auth-Token": token})
    environ.pop("REMOTE_ADDR", None)
    if peer is not None:
        environ["REMOTE_ADDR"] = peer
    answered: list[str] = []
    body = b"".join(app(environ, lambda status, headers, *exc: answered.append(status)))
    return int(answered[0].split()[0]), json.loads(body)


def assert_refused(status: int, body: Any, peer: str) -> None:
    assert status == 403, body
    fault = body["forbidden"]
    assert fault["code"] == 403
    message = fault["message"]
    assert "noauth2, which serves loopback peers only" in message
    assert f"came from {peer}." in message
    assert "auth_strategy = keystone" in message
    assert "allow_noauth2_on_public_address = true" in message


@pytest.mark.parametrize("peer", ["192.0.2.2", "::ffff:10.0.0.5", "2001:db8::1"])
def test_a_noauth2_app_refuses_a_remote_peer_on_every_path(peer: str) -> None:
    """The admin token from a peer not on loopback: 403 in Nova's format, the version
    documents and the health check too."""
    app = noauth2_app()
    for path in ("/v2.1/flavors", "/v2.1/servers", "/", "/v2.1", "/healthcheck", "/metrics"):
        assert_refused(*call(app, path, peer), peer)


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "::ffff:127.0.0.1", "", "localhost", None])
def test_a_noauth2_app_serves_a_local_peer(peer: str | None) -> None:
    app = noauth2_app()
    status, body = call(app, "/v2.1/flavors", peer)
    assert status == 200, body
    assert call(app, "/v2.1/servers", peer, token="alice:p1")[0] == 200


def test_the_loud_option_lets_a_noauth2_app_serve_remote_peers() -> None:
    app = noauth2_app(allow_noauth2_on_public_address=True)
    status, body = call(app, "/v2.1/flavors", "192.0.2.2")
    assert status == 200, body


def test_the_keystone_strategy_does_not_look_at_the_peer(keystone_client) -> None:
    """Keystone tokens are what count there: a remote peer without one gets 401, and
    the version document without one."""
    answer = keystone_client.simulate_get("/v2.1/servers", remote_addr="192.0.2.2")
    assert answer.status_code == 401
    assert keystone_client.simulate_get("/v2.1", remote_addr="192.0.2.2").status_code == 200


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (the peer a server sees has no address)."""

    def __init__(self, socket_path: Path) -> None:
        super().__init__("localhost", timeout=30)
        self.socket_path = str(socket_path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def fetch(connection: http.client.HTTPConnection, path: str) -> tuple[int, Any]:
    """GET ``path`` with the noauth2 admin token; the status and the JSON body."""
    try:
        connection.request("GET", path, headers={"X-Auth-Token": "admin"})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def require_outward_address() -> str:
    """This machine's address on its network; the test skips without one (fails in CI)."""
    address = outward_address()
    if address is None:
        message = "this machine has no IPv4 address but loopback (no default route)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return address


@pytest.fixture
def plain_gunicorn(tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    """The recipe of qsched.api.app's docstring, ``gunicorn qsched.api.app:wsgi_app``,
    with no settings file (so no start hook refuses the bind) and noauth2 on the
    embedded ledger, bound to this machine's outward address, to loopback on the same
    port and to a unix socket; yields those three once it answers through loopback."""
    address, port = require_outward_address(), free_port()
    sock = tmp_path / "api.sock"
    conf = tmp_path / "qsched.conf"
    sections = {"DEFAULT": {"transport_url": "memory://"},
                "ledger": {"url": f"fakeredis://id-{uuid.uuid4().hex}",
                           "durability": TEST_DURABILITY},
                "scheduler": {"reap_interval_s": 0, "janitor_interval_s": 0,
                              "outbox_interval_s": 0}}  # fmt: skip
    conf.write_text(ini_text(sections))
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    binds = [f"{address}:{port}", f"{LOOPBACK}:{port}", f"unix:{sock}"]
    cmd = [gunicorn, "--no-control-socket", "--workers", "1"]
    cmd += [*(arg for bind in binds for arg in ("--bind", bind)), "qsched.api.app:wsgi_app"]
    env = {**os.environ, api_app.CONFIG_ENV: str(conf)}
    env.pop("GUNICORN_CMD_ARGS", None)
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_until_served(process, port, log)
        yield address, port, sock
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def wait_until_served(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until ``GET /`` through loopback answers 200 (the worker builds the application
    on its first request); fails with gunicorn's log if it exits or 120 s pass."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"gunicorn exited {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if fetch(http.client.HTTPConnection(LOOPBACK, port, timeout=30), "/")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"gunicorn did not answer on {LOOPBACK}:{port} in 120 s: {log.read_text()[-3000:]}")


def test_plain_gunicorn_on_a_public_address_refuses_noauth2_to_a_remote_peer(
    plain_gunicorn: tuple[str, int, Path],
) -> None:
    """Issue 31's "done when": the admin token from this machine's outward address (a
    peer that is not loopback) gets 403; through 127.0.0.1 and the unix socket, 200."""
    address, port, sock = plain_gunicorn
    remote = http.client.HTTPConnection(address, port, timeout=30, source_address=(address, 0))
    status, body = fetch(remote, "/v2.1/flavors")
    assert_refused(status, body, address)
    status, body = fetch(http.client.HTTPConnection(LOOPBACK, port, timeout=30), "/v2.1/flavors")
    assert status == 200, body
    status, body = fetch(UnixHTTPConnection(sock), "/v2.1/flavors")
    assert status == 200, body


def test_the_global_request_id_is_kept_only_in_the_req_uuid_form() -> None:
    good = f"req-{uuid.uuid4()}"
    assert global_request_id(good) == global_request_id(f" {good} ") == good
    for bad in (None, "", "req-1", good.upper(), f"{good}\nx", "hello"):
        assert global_request_id(bad) is None


@pytest.fixture
def keystone_client() -> falcon.testing.TestClient:
    """The keystone strategy's falcon app with nothing in front of it."""
    stores = open_stores(
        LedgerOptions.defaults().replace(durability=TEST_DURABILITY),
        url=f"fakeredis://id-{uuid.uuid4().hex}",
    )
    bus = KombuBus("memory://", prefix=f"id{uuid.uuid4().hex[:8]}")
    return falcon.testing.TestClient(
        api_app.create_app(stores, bus, NOAUTH2.replace(auth_strategy="keystone"))
    )


def test_without_auth_token_in_front_nobody_gets_in(keystone_client) -> None:
    """The identity headers auth_token would set count only with auth_token's own
    environment key, which no client can send."""
    headers = {"X-Identity-Status": "Confirmed", "X-User-Id": "eve", "X-Project-Id": "pa",
               "X-Roles": "admin", "X-Auth-Token": "admin"}  # fmt: skip
    answer = keystone_client.simulate_get("/v2.1/servers", headers=headers)
    assert answer.status_code == 401
    assert answer.json == {
        "unauthorized": {
            "code": 401,
            "message": "The request you have made requires authentication.",
        }
    }
    assert keystone_client.simulate_get("/v2.1").status_code == 200


def test_public_paths_go_around_the_authenticated_app() -> None:
    def named(name: str):
        def app(environ, start_response):
            start_response("200 OK", [])
            return [name.encode()]

        return app

    router = keystone.PublicPaths(named("public"), named("auth_token"))
    for path, expected in [("/", b"public"), ("/v2.1/", b"public"), ("/healthcheck", b"public"),
                           ("/v2.1/servers", b"auth_token"), ("/healthcheck/x", b"auth_token"),
                           ("", b"public")]:  # fmt: skip
        body = b"".join(router({"PATH_INFO": path}, lambda *a: None))
        assert body == expected, path
