"""Identity without a Keystone: noauth2 kept off public addresses, the keystone seams.

The keystone strategy against a real Keystone is tests/test_keystone_real.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import falcon.testing
import pytest

from qsched.api import app as api_app
from qsched.api import auth, keystone
from qsched.bus.kombu import KombuBus
from qsched.cmd import api as api_cmd
from qsched.conf import APIOptions, LedgerOptions
from qsched.context import global_request_id
from qsched.ledger import open_stores
from qsched.net import free_port
from qsched.stack.config import ini_text
from tests.conftest import TEST_DURABILITY

ROOT = Path(__file__).resolve().parent.parent
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
