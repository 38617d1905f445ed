"""A real Keystone (the ``keystone`` package from PyPI) on SQLite, for the tests.

:meth:`KeystoneServer.start` makes a ``keystone.conf`` in its directory
(SQLite database, fernet and credential key repositories there too), runs
``keystone-manage db_sync``, ``fernet_setup``, ``credential_setup`` and
``bootstrap`` (user ``admin`` with the admin role on project ``admin``, region
``RegionOne``, the identity endpoint), then serves keystone's public WSGI
application under gunicorn on a free loopback port and waits until ``/v3``
answers. :meth:`KeystoneServer.register_service` puts a service in the catalog
(qsched as ``compute``, Glance as ``image``) and :meth:`KeystoneServer.create_user` makes a user
with roles on a project, both through python-keystoneclient on the admin's
keystoneauth session. :meth:`KeystoneServer.stop` ends the server.

Keystone parses ``sys.argv`` when its WSGI application loads, so gunicorn runs
with no arguments at all: its settings come from the ``gunicorn.conf.py`` in
its working directory, the server's directory.

``keystone`` is a test dependency (the ``test`` extra), never a production one:
this module imports nothing of it and runs its commands from this environment.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib import error, request

from qsched.net import LOOPBACK, free_port

BINDIR = Path(sys.executable).parent
REGION = "RegionOne"
DOMAIN = "default"

KEYSTONE_CONF = """\
[DEFAULT]
log_file = {log}

[database]
connection = sqlite:///{dir}/keystone.db

[fernet_tokens]
key_repository = {dir}/fernet-keys

[credential]
key_repository = {dir}/credential-keys

[token]
expiration = {expiration_s}
"""

GUNICORN_CONF = """\
# gunicorn settings of one test Keystone, written by qsched.stack.keystone.
bind = {bind!r}
workers = 1
worker_class = "gthread"
threads = 4
timeout = 60
control_socket_disable = True
wsgi_app = "keystone.server.wsgi:initialize_public_application()"
"""


class KeystoneFailed(Exception):
    """Keystone could not be set up or did not answer in time; with what it said."""


@dataclasses.dataclass(frozen=True)
class User:
    """A Keystone user with a password, and the project it works in."""

    name: str
    password: str
    project: str
    id: str = ""
    project_id: str = ""

    def auth_args(self, auth_url: str) -> dict[str, Any]:
        """Keyword arguments of keystoneauth's ``v3.Password`` for a token in the project."""
        return {
            "auth_url": auth_url,
            "username": self.name,
            "password": self.password,
            "project_name": self.project,
            "user_domain_id": DOMAIN,
            "project_domain_id": DOMAIN,
        }


class KeystoneServer:
    """One Keystone process and its files (see the module docstring).

    :param directory: where its configuration, database, keys and log go.
    :param token_expiration_s: how long the tokens it issues live.
    :param database: another server's directory, to share its database and keys
        (a second server issuing tokens that the first validates).
    """

    def __init__(
        self, directory: Path, token_expiration_s: int = 3600, database: Path | None = None
    ) -> None:
        self.dir = directory.resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.shared = (database or self.dir).resolve()
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}/v3"
        self.admin = User("admin", secrets.token_urlsafe(16), "admin")
        self.token_expiration_s = token_expiration_s
        self.config = self.dir / "keystone.conf"
        self.process: subprocess.Popen[bytes] | None = None

    # -- setting up --

    def start(self, timeout_s: float = 60.0) -> None:
        """Set up the database and keys (unless shared) and serve; wait until it answers.

        :raises KeystoneFailed: a ``keystone-manage`` step failed, gunicorn exited,
            or ``/v3`` did not answer within ``timeout_s``.
        """
        self.config.write_text(
            KEYSTONE_CONF.format(
                dir=self.shared, log=self.dir / "keystone.log", expiration_s=self.token_expiration_s
            )
        )
        if self.shared == self.dir:
            self._set_up()
        self._serve()
        self._wait(timeout_s)

    def _set_up(self) -> None:
        owner = ["--keystone-user", str(os.getuid()), "--keystone-group", str(os.getgid())]
        self._manage("db_sync")
        self._manage("fernet_setup", *owner)
        self._manage("credential_setup", *owner)
        self._manage(
            "bootstrap",
            "--bootstrap-username", self.admin.name,
            "--bootstrap-password", self.admin.password,
            "--bootstrap-project-name", self.admin.project,
            "--bootstrap-role-name", "admin",
            "--bootstrap-region-id", REGION,
            "--bootstrap-admin-url", self.url,
            "--bootstrap-internal-url", self.url,
            "--bootstrap-public-url", self.url,
        )  # fmt: skip

    def _manage(self, *args: str) -> None:
        cmd = [str(BINDIR / "keystone-manage"), "--config-file", str(self.config), *args]
        done = subprocess.run(cmd, cwd=self.dir, capture_output=True, timeout=300)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[-2000:]
            raise KeystoneFailed(f"keystone-manage {args[0]} exited {done.returncode}: {said}")

    def _serve(self) -> None:
        (self.dir / "gunicorn.conf.py").write_text(
            GUNICORN_CONF.format(bind=f"{LOOPBACK}:{self.port}")
        )
        env = {**os.environ, "OS_KEYSTONE_CONFIG_FILES": str(self.config)}
        log = (self.dir / "gunicorn.log").open("ab")
        try:
            self.process = subprocess.Popen(
                [str(BINDIR / "gunicorn")], cwd=self.dir, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise KeystoneFailed(f"gunicorn exited {self.process.returncode}: {self.log()}")
            try:
                with request.urlopen(self.url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise KeystoneFailed(f"no answer at {self.url} after {timeout_s:.0f} s: {self.log()}")

    def log(self, chars: int = 3000) -> str:
        """The end of gunicorn's and keystone's logs."""
        found = []
        for name in ("gunicorn.log", "keystone.log"):
            path = self.dir / name
            if path.exists():
                found.append(f"{name}: {path.read_text(errors='replace')[-chars:]}")
        return "\n".join(found)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM gunicorn (SIGKILL its group after ``timeout_s``); its exit code."""
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout_s)

    # -- the admin's work, through keystoneauth and python-keystoneclient --

    def session(self, user: User | None = None) -> Any:
        """A keystoneauth session holding a project token of ``user`` (default: the admin)."""
        from keystoneauth1 import session
        from keystoneauth1.identity import v3

        return session.Session(auth=v3.Password(**(user or self.admin).auth_args(self.url)))

    def client(self) -> Any:
        """python-keystoneclient on the admin's session."""
        from keystoneclient.v3 import client

        return client.Client(session=self.session(), interface="public", region_name=REGION)

    def register_service(self, service_type: str, name: str, url: str) -> None:
        """Put a service with public and internal endpoints at ``url`` in the catalog."""
        keystone = self.client()
        service = keystone.services.create(name=name, type=service_type, description=name)
        for interface in ("public", "internal"):
            keystone.endpoints.create(service, url, interface=interface, region=REGION)

    def create_user(self, name: str, project: str, roles: tuple[str, ...]) -> User:
        """A user (new) with ``roles`` on ``project`` (made if missing), with a password."""
        keystone = self.client()
        found = keystone.projects.list(name=project, domain=DOMAIN)
        target = found[0] if found else keystone.projects.create(project, domain=DOMAIN)
        password = secrets.token_urlsafe(16)
        user = keystone.users.create(name, domain=DOMAIN, password=password)
        for role in roles:
            keystone.roles.grant(keystone.roles.find(name=role), user=user, project=target)
        return User(name, password, project, id=user.id, project_id=target.id)

    def revoke(self, token: str) -> None:
        """Revoke a token (Keystone answers 404 for it from now on)."""
        self.client().tokens.revoke_token(token)
