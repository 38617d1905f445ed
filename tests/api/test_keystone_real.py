"""The API with auth_strategy = keystone against a real Keystone, driven by keystoneauth.

The API runs in this process on the port the Keystone catalog names for
``compute``, behind keystonemiddleware's auth_token configured from a
``[keystone_authtoken]`` section, on an in-process ledger and bus. Every call
goes through a keystoneauth session that found the endpoint in the catalog.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon
import pytest
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
from oslo_context import context as oslo_context

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.api.wsgi import ThreadingWSGIServer, make_server
from qsched.bench import tokens as tokens_bench
from qsched.bus.kombu import KombuBus
from qsched.conf.policy import policy_enforcer
from qsched.context import RequestContext
from qsched.ledger import open_stores
from qsched.policy import Policy
from qsched.stack.config import ini_text
from qsched.stack.keystone import KeystoneFailed, KeystoneServer
from qsched.stack.memcached import MemcachedFailed, MemcachedServer
from tests.conftest import TEST_DURABILITY, KeystoneCloud, require_server
from tests.helpers import ROOT

pytestmark = pytest.mark.real

DEPLOY_CONF = ROOT / "deploy/qsched.conf"
IMAGE = "155d900f-4e14-4e4c-a73d-069cbf4541e6"
COMPUTE = {"service_type": "compute", "interface": "public"}


class Seen:
    """A falcon middleware keeping the context of each authenticated request, and the
    thread's current one then (oslo.context's, which oslo.log's lines name)."""

    def __init__(self) -> None:
        self.contexts: list[RequestContext] = []
        self.current: list[Any] = []

    def process_resource(self, req: falcon.Request, resp: Any, resource: Any, params: Any) -> None:
        context = getattr(req.context, "compute", None)
        if context is not None:
            self.contexts.append(context)
            self.current.append(oslo_context.get_current())


class KeystoneAPI:
    def __init__(self, cloud: KeystoneCloud, seen: Seen) -> None:
        self.cloud = cloud
        self.seen = seen

    def session(self, user: str) -> ks_session.Session:
        return self.cloud.server.session(self.cloud.users[user])

    def call(self, sess: ks_session.Session, method: str, path: str, **kwargs: Any) -> Any:
        return sess.request(path, method, endpoint_filter=COMPUTE, raise_exc=False, **kwargs)

    def boot(self, user: str, name: str = "vm1") -> dict[str, Any]:
        body = {"server": {"name": name, "flavorRef": "small", "imageRef": IMAGE}}
        answer = self.call(self.session(user), "POST", "/servers", json=body)
        assert answer.status_code == 202, answer.text
        return answer.json()["server"]


def keystone_conf(
    cloud: KeystoneCloud, directory: Path, authtoken: dict[str, Any] | None = None, **api: Any
) -> Path:
    """A qsched.conf for an API behind ``cloud``'s Keystone; ``authtoken``: more
    ``[keystone_authtoken]`` options, ``api``: more ``[api]`` options."""
    service = cloud.users["service"]
    path = directory / "qsched.conf"
    path.write_text(
        ini_text(
            {
                "ledger": {"durability": TEST_DURABILITY},
                "api": {"auth_strategy": "keystone", "flavor": ["small:1:512:0"], **api},
                "keystone_authtoken": cloud.server.authtoken(service, **(authtoken or {})),
            }
        )
    )
    return path


@contextlib.contextmanager
def served(conf: Any, port: int, seen: Seen | None = None) -> Iterator[ThreadingWSGIServer]:
    """The API of ``conf`` behind auth_token on ``port`` (0: any), on an in-process ledger
    and bus, with ``conf``'s policy; ``seen``: a middleware to add."""
    options = qconf.Options.from_conf(conf)
    stores = open_stores(options.ledger, options.quota, url=f"fakeredis://ks-{uuid.uuid4().hex}")
    bus = KombuBus("memory://", prefix=f"ks{uuid.uuid4().hex[:8]}")
    policy = Policy(policy_enforcer(conf))
    app = api_app.create_app(stores, bus, options.api, options.scheduler, policy)
    if seen is not None:
        app.add_middleware(seen)
    server = make_server(api_app.authenticated(app, options.api, conf), port=port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        bus.close()


@pytest.fixture(scope="module")
def keystone_api(
    keystone: KeystoneCloud, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KeystoneAPI]:
    conf = qconf.load(config_files=[str(keystone_conf(keystone, tmp_path_factory.mktemp("api")))])
    seen = Seen()
    with served(conf, keystone.api_port, seen):
        yield KeystoneAPI(keystone, seen)


def test_a_member_boots_lists_shows_and_deletes_in_their_project(keystone_api) -> None:
    member = keystone_api.session("member_a")
    server = keystone_api.boot("member_a")
    listed = keystone_api.call(member, "GET", "/servers").json()["servers"]
    assert server["id"] in [s["id"] for s in listed]
    shown = keystone_api.call(member, "GET", f"/servers/{server['id']}")
    assert shown.status_code == 200
    user = keystone_api.cloud.users["member_a"]
    assert (shown.json()["server"]["tenant_id"], shown.json()["server"]["user_id"]) == (
        user.project_id,
        user.id,
    )
    assert keystone_api.call(member, "DELETE", f"/servers/{server['id']}").status_code == 204


def test_a_member_of_another_project_sees_nothing_of_it(keystone_api) -> None:
    server = keystone_api.boot("member_a", "private")
    other = keystone_api.session("member_b")
    listed = keystone_api.call(other, "GET", "/servers/detail").json()["servers"]
    assert server["id"] not in [s["id"] for s in listed]
    for method in ("GET", "DELETE"):
        answer = keystone_api.call(other, method, f"/servers/{server['id']}")
        assert answer.status_code == 404, answer.text
        assert answer.json()["itemNotFound"]["code"] == 404
    owner = keystone_api.session("member_a")
    assert keystone_api.call(owner, "GET", f"/servers/{server['id']}").status_code == 200


def test_the_context_is_the_tokens_with_the_global_request_id(keystone_api) -> None:
    member = keystone_api.session("member_a")
    global_id = f"req-{uuid.uuid4()}"
    answer = keystone_api.call(
        member, "GET", "/servers", headers={"X-OpenStack-Request-ID": global_id}
    )
    assert answer.status_code == 200
    context = keystone_api.seen.contexts[-1]
    user = keystone_api.cloud.users["member_a"]
    assert (context.user_id, context.project_id) == (user.id, user.project_id)
    assert {"member", "reader"} <= set(context.roles)  # reader: implied by member
    assert not context.is_admin
    assert context.user_domain_id == "default" and context.project_domain_id == "default"
    assert context.global_request_id == global_id
    assert context.request_id == answer.headers["x-openstack-request-id"] != global_id
    assert keystone_api.seen.current[-1] is context


def test_a_global_request_id_not_of_the_req_uuid_form_is_dropped(keystone_api) -> None:
    member = keystone_api.session("member_a")
    headers = {"X-OpenStack-Request-ID": "req-<script>"}
    assert keystone_api.call(member, "GET", "/servers", headers=headers).status_code == 200
    assert keystone_api.seen.contexts[-1].global_request_id is None


def test_the_admin_token_is_admin(keystone_api) -> None:
    admin = keystone_api.session("admin")
    assert keystone_api.call(admin, "GET", "/servers?all_tenants=1").status_code == 200
    assert keystone_api.seen.contexts[-1].is_admin


def assert_unauthorized(answer: Any) -> None:
    assert answer.status_code == 401, answer.text
    fault = answer.json()["unauthorized"]
    assert fault["code"] == 401 and fault["message"]
    assert answer.headers["WWW-Authenticate"].startswith("Keystone uri=")


def list_with_token(token: str, keystone_api: KeystoneAPI) -> Any:
    """GET /servers through a session that sends exactly ``token``."""
    sess = ks_session.Session(auth=token_endpoint.Token(keystone_api.cloud.api_url, token))
    return sess.get("/servers", endpoint_filter=COMPUTE, raise_exc=False)


def test_a_garbage_token_gets_401(keystone_api) -> None:
    for token in ("garbage", "admin", "gAAAAAB" + "x" * 180):
        answer = list_with_token(token, keystone_api)
        assert_unauthorized(answer)


def test_no_token_gets_401(keystone_api) -> None:
    answer = ks_session.Session().get(f"{keystone_api.cloud.api_url}/servers", raise_exc=False)
    assert_unauthorized(answer)


def test_a_revoked_token_gets_401(keystone_api) -> None:
    """Revoked before its first call here, so never cached (for one used before, see
    test_a_revoked_token_is_served_until_the_token_cache_time_passes)."""
    token = keystone_api.session("member_a").get_token()
    keystone_api.cloud.server.revoke(token)
    assert_unauthorized(list_with_token(token, keystone_api))


# -- how long a revoked token lives: keystonemiddleware's token cache (docs/identity.rst) --

#: The token_cache_time of the tests that wait for it to pass (300 s as shipped).
CACHE_TIME_S = 5
#: How long after its first call a cached token is surely still in the cache: both
#: caches count whole seconds (keystonemiddleware's own by time.time(), memcached by its
#: clock, ticking each second), so an entry may go up to a second or so early.
SURELY_CACHED_S = CACHE_TIME_S - 2


@dataclasses.dataclass(frozen=True)
class TokenCache:
    """Where auth_token keeps the tokens it validated: its ``[keystone_authtoken]``
    options, and the memcached they name (None: auth_token's own memory)."""

    options: dict[str, Any]
    memcached: MemcachedServer | None = None

    def hits(self) -> int | None:
        """How often memcached handed a token back (None: no memcached)."""
        return None if self.memcached is None else self.memcached.stats()["get_hits"]


@pytest.fixture(params=["in-process", "memcached"])
def token_cache(request: pytest.FixtureRequest) -> TokenCache:
    """auth_token's own memory (no memcached_servers, as in the tests above), then a
    real memcached."""
    if request.param == "in-process":
        return TokenCache({})
    server: MemcachedServer = request.getfixturevalue("memcached")
    return TokenCache({"memcached_servers": server.address}, server)


def status_with_token(url: str, token: str) -> int:
    """The status of GET ``url`` with exactly ``token`` (no keystoneauth around it)."""
    answer = ks_session.Session().get(url, headers={"X-Auth-Token": token}, raise_exc=False)
    return int(answer.status_code)


@contextlib.contextmanager
def servers_url(cloud: KeystoneCloud, directory: Path, **authtoken: Any) -> Iterator[str]:
    """``/v2.1/servers`` of an API behind ``cloud``'s Keystone, with ``authtoken``."""
    path = keystone_conf(cloud, directory, authtoken=authtoken)
    with served(qconf.load(config_files=[str(path)]), 0) as server:
        yield f"http://127.0.0.1:{server.server_port}/v2.1/servers"


def test_a_revoked_token_is_served_until_the_token_cache_time_passes(
    keystone: KeystoneCloud, token_cache: TokenCache, tmp_path: Path
) -> None:
    """As in Nova: auth_token keeps a token it validated for token_cache_time and asks
    Keystone nothing about it meanwhile, so a token used once and then revoked is still
    served until its cache entry expires, and gets 401 from then on."""
    admin = keystone.server.client()  # logged in before any clock starts
    options = {"token_cache_time": CACHE_TIME_S, **token_cache.options}
    with servers_url(keystone, tmp_path, **options) as url:
        for _attempt in range(3):  # a machine too busy to call twice in time tries again
            token = keystone.server.session(keystone.users["member_a"]).get_token()
            cached = time.monotonic()
            assert status_with_token(url, token) == 200  # validated, now cached
            admin.tokens.revoke_token(token)
            served_revoked = status_with_token(url, token)
            if time.monotonic() - cached < SURELY_CACHED_S:
                break
        else:
            pytest.fail(f"no call within {SURELY_CACHED_S} s of the first, three times")
        assert served_revoked == 200, "revoked and cached: still served"
        assert token_cache.hits() != 0, "memcached never handed the token back"
        deadline = cached + CACHE_TIME_S + 60
        while (status := status_with_token(url, token)) == 200 and time.monotonic() < deadline:
            time.sleep(0.25)
        assert status == 401, f"still served {time.monotonic() - cached:.0f} s after caching"
        assert time.monotonic() - cached > SURELY_CACHED_S


def test_without_the_token_cache_a_revoked_token_gets_401_on_the_next_call(
    keystone: KeystoneCloud, token_cache: TokenCache, tmp_path: Path
) -> None:
    """token_cache_time = -1 (keystonemiddleware's "no cache"; it still stores each
    token, already expired): auth_token asks Keystone on every call, so the call after
    the revocation is refused."""
    admin = keystone.server.client()
    with servers_url(keystone, tmp_path, token_cache_time=-1, **token_cache.options) as url:
        token = keystone.server.session(keystone.users["member_a"]).get_token()
        assert status_with_token(url, token) == 200
        assert status_with_token(url, token) == 200
        admin.tokens.revoke_token(token)
        answer = ks_session.Session().get(url, headers={"X-Auth-Token": token}, raise_exc=False)
        assert_unauthorized(answer)
    assert token_cache.hits() in (None, 0), "memcached handed a token back"


def test_the_token_cost_measure_times_every_cache_mode(
    keystone: KeystoneCloud, memcached: MemcachedServer
) -> None:
    """``python -m qsched.bench.tokens`` on the session's Keystone: every mode answered
    every call, memcached was the one asked in its mode, and its figures add up."""
    users = keystone.users
    found = tokens_bench.measure(keystone.server, users["member_a"], users["service"], calls=10,
                                 memcached=memcached.address)  # fmt: skip
    modes = found["modes"]
    assert set(modes) == {"in-process", "memcached", "no cache"}
    for figures in modes.values():
        assert figures["count"] == figures["ok"] == 10 and figures["p50"] > 0
    assert memcached.stats()["get_hits"] >= 10
    assert found["validation_ms_p50"] == round(
        modes["no cache"]["p50"] - modes["in-process"]["p50"], 2
    )


def test_an_expired_token_gets_401(keystone_api, tmp_path: Path) -> None:
    """A second Keystone on the same database and keys issues tokens that live 1 s."""
    cloud = keystone_api.cloud
    short = KeystoneServer(tmp_path / "short", token_expiration_s=1, database=cloud.server.dir)
    short.start()
    try:
        token = short.session(cloud.users["member_a"]).get_token()
    finally:
        short.stop()
    time.sleep(2.0)
    assert_unauthorized(list_with_token(token, keystone_api))


def test_a_client_cannot_pose_as_auth_token(keystone_api) -> None:
    """Identity headers a caller sends are not believed: auth_token strips them."""
    headers = {"X-Identity-Status": "Confirmed", "X-User-Id": "eve", "X-Project-Id": "pa",
               "X-Roles": "admin"}  # fmt: skip
    answer = ks_session.Session().get(
        f"{keystone_api.cloud.api_url}/servers", headers=headers, raise_exc=False
    )
    assert_unauthorized(answer)


@pytest.mark.parametrize("path", ["/", "/v2.1", "/v2.1/", "/healthcheck"])
def test_version_documents_and_healthcheck_need_no_token(keystone_api, path: str) -> None:
    base = keystone_api.cloud.api_url.removesuffix("/v2.1")
    answer = ks_session.Session().get(f"{base}{path}", raise_exc=False)
    assert answer.status_code == 200, answer.text


# -- authorisation: oslo.policy's defaults on real tokens --


def test_a_reader_cannot_boot(keystone_api) -> None:
    reader = keystone_api.session("reader_a")
    body = {"server": {"name": "ro", "flavorRef": "small", "imageRef": IMAGE}}
    answer = keystone_api.call(reader, "POST", "/servers", json=body)
    assert answer.status_code == 403, answer.text
    message = answer.json()["forbidden"]["message"]
    assert message == "Policy doesn't allow os_compute_api:servers:create to be performed."


def test_a_reader_lists_and_shows_but_cannot_delete(keystone_api) -> None:
    server = keystone_api.boot("member_a", "shared")
    reader = keystone_api.session("reader_a")
    for path in ("/servers", "/servers/detail"):
        listed = keystone_api.call(reader, "GET", path)
        assert listed.status_code == 200, listed.text
        assert server["id"] in [s["id"] for s in listed.json()["servers"]]
    assert keystone_api.call(reader, "GET", f"/servers/{server['id']}").status_code == 200
    answer = keystone_api.call(reader, "DELETE", f"/servers/{server['id']}")
    assert answer.status_code == 403, answer.text


@pytest.mark.parametrize("path", ["/servers", "/servers/detail"])
def test_a_member_asking_for_all_tenants_is_refused_as_by_nova(keystone_api, path: str) -> None:
    """Nova asks ``...:get_all_tenants`` when all_tenants is given, and refuses with 403."""
    member = keystone_api.session("member_a")
    answer = keystone_api.call(member, "GET", f"{path}?all_tenants=1")
    assert answer.status_code == 403, answer.text
    rule = "index" if path == "/servers" else "detail"
    assert answer.json()["forbidden"]["message"] == (
        f"Policy doesn't allow os_compute_api:servers:{rule}:get_all_tenants to be performed."
    )


def test_an_admins_all_tenants_list_sees_both_projects(keystone_api) -> None:
    mine, theirs = keystone_api.boot("member_a", "in-pa"), keystone_api.boot("member_b", "in-pb")
    admin = keystone_api.session("admin")
    answer = keystone_api.call(admin, "GET", "/servers/detail?all_tenants=1")
    assert answer.status_code == 200, answer.text
    projects = {s["id"]: s["tenant_id"] for s in answer.json()["servers"]}
    users = keystone_api.cloud.users
    assert projects[mine["id"]] == users["member_a"].project_id
    assert projects[theirs["id"]] == users["member_b"].project_id
    own = keystone_api.call(admin, "GET", "/servers").json()["servers"]
    assert not {mine["id"], theirs["id"]} & {s["id"] for s in own}  # without it: admin's own


def test_a_policy_file_overrides_the_defaults_for_real_tokens(
    keystone: KeystoneCloud, tmp_path: Path
) -> None:
    """[oslo_policy] policy_file in qsched.conf: readers may boot, only admins list."""
    rules = tmp_path / "policy.yaml"
    rules.write_text('"os_compute_api:servers:create": "role:reader"\n'
                     '"os_compute_api:servers:index": "role:admin"\n')  # fmt: skip
    path = keystone_conf(keystone, tmp_path)
    path.write_text(path.read_text() + f"\n[oslo_policy]\npolicy_file = {rules}\n")
    with served(qconf.load(config_files=[str(path)]), 0) as server:
        url = f"http://127.0.0.1:{server.server_port}/v2.1/servers"
        reader = keystone.server.session(keystone.users["reader_a"])
        body = {"server": {"name": "ro", "flavorRef": "small", "imageRef": IMAGE}}
        booted = reader.post(url, json=body, raise_exc=False)
        assert booted.status_code == 202, booted.text
        member = keystone.server.session(keystone.users["member_a"])
        refused = member.get(url, raise_exc=False)
        assert refused.status_code == 403, refused.text
        assert refused.json()["forbidden"]["message"] == (
            "Policy doesn't allow os_compute_api:servers:index to be performed."
        )
        admin = keystone.server.session(keystone.users["admin"])
        assert admin.get(url, raise_exc=False).status_code == 200


def test_only_admin_creates_flavors(keystone_api) -> None:
    body = {"flavor": {"name": f"f{uuid.uuid4().hex[:6]}", "vcpus": 1, "ram": 256, "disk": 0}}
    member = keystone_api.session("member_a")
    assert keystone_api.call(member, "POST", "/flavors", json=body).status_code == 403
    admin = keystone_api.session("admin")
    answer = keystone_api.call(admin, "POST", "/flavors", json=body)
    assert answer.status_code == 200, answer.text


def test_only_admin_sets_extra_specs_and_lists_other_projects(keystone_api) -> None:
    server = keystone_api.boot("member_a", "listed")
    member_b, admin = keystone_api.session("member_b"), keystone_api.session("admin")
    project_a = keystone_api.call(
        keystone_api.session("member_a"), "GET", f"/servers/{server['id']}"
    )
    project = project_a.json()["server"]["tenant_id"]
    theirs = keystone_api.call(member_b, "GET", f"/servers/detail?project_id={project}")
    own = keystone_api.cloud.users["member_b"].project_id
    # a filter member_b may not use is ignored: its own project's servers only
    assert {s["tenant_id"] for s in theirs.json()["servers"]} <= {own}
    everyone = keystone_api.call(admin, "GET", f"/servers?all_tenants=1&project_id={project}")
    assert server["id"] in [s["id"] for s in everyone.json()["servers"]]
    specs = {"extra_specs": {"hw:cpu_policy": "dedicated"}}
    refused = keystone_api.call(member_b, "POST", "/flavors/small/os-extra_specs", json=specs)
    assert refused.status_code == 403, refused.text
    done = keystone_api.call(admin, "POST", "/flavors/small/os-extra_specs", json=specs)
    assert done.status_code == 200, done.text


# -- the shipped deploy/qsched.conf --


@pytest.fixture
def memcached() -> Iterator[MemcachedServer]:
    """A real memcached of the test's own, stopped after it."""
    server = MemcachedServer()
    try:
        server.start()
    except (MemcachedFailed, OSError) as exc:
        require_server("memcached", server.address, exc, "install it: apt-get install memcached")
    try:
        yield server
    finally:
        server.stop()


def test_the_shipped_deploy_config_serves_tokens_cached_in_memcached(
    keystone: KeystoneCloud, memcached: MemcachedServer, tmp_path: Path
) -> None:
    """deploy/qsched.conf as shipped, with a second file naming this machine's servers
    (as an operator's CHANGE_ME edits would): auth_token validates a real token, keeps it
    in memcached, and finds it there for the next request."""
    service = keystone.users["service"]
    local = tmp_path / "local.conf"
    local.write_text(
        ini_text(
            {
                "DEFAULT": {"transport_url": "memory://"},
                "ledger": {"url": f"fakeredis://deploy-{uuid.uuid4().hex}",
                           "durability": TEST_DURABILITY},
                "scheduler": {"reap_interval_s": 0, "janitor_interval_s": 0,
                              "outbox_interval_s": 0},
                "keystone_authtoken": {
                    "www_authenticate_uri": keystone.server.url,
                    "auth_url": keystone.server.url,
                    "username": service.name,
                    "password": service.password,
                    "project_name": service.project,
                    "memcached_servers": memcached.address,
                },
            }
        )
    )  # fmt: skip
    app = api_app.load_app([str(DEPLOY_CONF), str(local)], bind=["127.0.0.1:0"])
    server = make_server(app, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v2.1/servers"
        member = keystone.server.session(keystone.users["member_a"])
        first = member.get(url, raise_exc=False)
        assert first.status_code == 200, first.text
        assert first.json() == {"servers": []}
        stored = memcached.stats()
        assert stored["cmd_set"] >= 1 and stored["curr_items"] >= 1, stored
        assert member.get(url, raise_exc=False).status_code == 200
        assert memcached.stats()["get_hits"] > stored["get_hits"]
        assert_unauthorized(ks_session.Session().get(url, raise_exc=False))
    finally:
        server.shutdown()
        server.server_close()


def test_a_failed_manage_step_says_what_keystone_said(tmp_path: Path) -> None:
    """A ``keystone-manage`` step that fails raises KeystoneFailed with its words."""
    server = KeystoneServer(tmp_path)
    server.config.write_text("[database]\nconnection = sqlite:///" + str(tmp_path / "k.db") + "\n")
    said = r"(?s)keystone-manage no_such_step exited 2: .*invalid choice"
    with pytest.raises(KeystoneFailed, match=said):
        server._manage("no_such_step")


def test_an_admin_password_beginning_with_a_dash_bootstraps(keystone: KeystoneCloud) -> None:
    """The session's Keystone was bootstrapped with an admin password that begins with
    "-" (the ``keystone`` fixture); keystone-manage took it as the password."""
    assert keystone.server.admin.password.startswith("-")
    assert keystone.server.session().get_token()
