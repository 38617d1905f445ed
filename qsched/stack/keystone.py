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
from pathlib import Path
from typing import Any

from qsched.net import LOOPBACK
from qsched.stack.wsgi_service import WSGIService

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

[identity]
# bcrypt's cheapest cost: a throwaway Keystone hashes a password for each user it
# makes and checks it for each token, at about 0.3 s a time at the default cost of 12
password_hash_rounds = 4
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


class KeystoneServer(WSGIService):
    """One Keystone process and its files (see the module docstring).

    :param directory: where its configuration, database, keys and log go.
    :param token_expiration_s: how long the tokens it issues live.
    :param database: another server's directory, to share its database and keys
        (a second server issuing tokens that the first validates).
    """

    NAME, MANAGE, LOGS = "Keystone", "keystone-manage", ("keystone.log",)
    FAILED = KeystoneFailed
    WSGI_APP = "keystone.server.wsgi:initialize_public_application()"

    def __init__(
        self, directory: Path, token_expiration_s: int = 3600, database: Path | None = None
    ) -> None:
        super().__init__(directory, "keystone.conf")
        self.shared = (database or self.dir).resolve()
        self.url = f"http://{LOOPBACK}:{self.port}/v3"
        self.admin = User("admin", secrets.token_urlsafe(16), "admin")
        self.token_expiration_s = token_expiration_s

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
        self._serve({"OS_KEYSTONE_CONFIG_FILES": str(self.config)})
        self._wait(self.url, timeout_s)

    def _set_up(self) -> None:
        owner = ["--keystone-user", str(os.getuid()), "--keystone-group", str(os.getgid())]
        self._manage("db_sync")
        self._manage("fernet_setup", *owner)
        self._manage("credential_setup", *owner)
        self._manage(
            "bootstrap",
            "--bootstrap-username", self.admin.name,
            # One word: a password may begin with "-", and would be read as an option.
            f"--bootstrap-password={self.admin.password}",
            "--bootstrap-project-name", self.admin.project,
            "--bootstrap-role-name", "admin",
            "--bootstrap-region-id", REGION,
            "--bootstrap-admin-url", self.url,
            "--bootstrap-internal-url", self.url,
            "--bootstrap-public-url", self.url,
        )  # fmt: skip

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

    def authtoken(self, service: User, **overrides: Any) -> dict[str, Any]:
        """The ``[keystone_authtoken]`` section of an API that validates tokens here as
        ``service`` (a user with the service role), ``overrides`` on top (the token
        cache's options, say)."""
        return {
            "www_authenticate_uri": self.url,
            "auth_url": self.url,
            "auth_type": "password",
            "username": service.name,
            "password": service.password,
            "project_name": service.project,
            "user_domain_id": DOMAIN,
            "project_domain_id": DOMAIN,
            "service_token_roles_required": True,
            **overrides,
        }

    def revoke(self, token: str) -> None:
        """Revoke a token (Keystone answers 404 for it from now on)."""
        self.client().tokens.revoke_token(token)
