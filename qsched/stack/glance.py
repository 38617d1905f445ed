"""A real Glance (the ``glance`` package from PyPI) on SQLite and a file store, for the tests.

:meth:`GlanceServer.start` writes a ``glance-api.conf`` in its directory
(SQLite database, a ``file`` store and its staging and tasks stores there too,
keystonemiddleware's ``auth_token`` validating tokens against the Keystone it is
given, as its service user), copies the paste pipeline the wheel installs
(``<prefix>/etc/glance/glance-api-paste.ini``) beside it, runs
``glance-manage db_sync``, then serves glance's WSGI application
(``glance.wsgi.api:application``, which reads the configuration directory named
by ``OS_GLANCE_CONFIG_DIR``) under gunicorn on a free loopback port and waits
until ``/versions`` answers. gunicorn's ``access.log`` there has a line per request
with the global request id it carried and the user and project of its token
(:meth:`GlanceServer.requests`). :meth:`GlanceServer.create_image` makes an active
image (its bytes uploaded) through a keystoneauth session, as a user of that
Keystone would. :meth:`GlanceServer.stop` ends the server.

``glance`` is a test dependency (the ``test`` extra), never a production one:
this module imports nothing of it and runs its commands from this environment.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from qsched.net import LOOPBACK
from qsched.stack.keystone import DOMAIN, User
from qsched.stack.wsgi_service import WSGIService

#: Where the glance wheel puts its sample files, the paste pipeline among them.
PASTE_INI = Path(sys.prefix) / "etc" / "glance" / "glance-api-paste.ini"

GLANCE_CONF = """\
[DEFAULT]
log_file = {dir}/glance-api.log
enabled_backends = fs:file

[database]
connection = sqlite:///{dir}/glance.db

[glance_store]
default_backend = fs

[fs]
filesystem_store_datadir = {dir}/images

[os_glance_staging_store]
filesystem_store_datadir = {dir}/staging

[os_glance_tasks_store]
filesystem_store_datadir = {dir}/tasks

[paste_deploy]
flavor = keystone
config_file = {dir}/glance-api-paste.ini

[keystone_authtoken]
www_authenticate_uri = {keystone}
auth_url = {keystone}
auth_type = password
username = {user.name}
password = {user.password}
project_name = {user.project}
user_domain_id = {domain}
project_domain_id = {domain}

[oslo_policy]
enforce_new_defaults = true
enforce_scope = true
"""

#: gunicorn's access log: a line per request with the global request id it carried and
#: the user and project auth_token found in its token (as the environment holds them
#: after the request).
ACCESS_LOG = """\
accesslog = "access.log"
access_log_format = (
    "%(m)s %({RAW_URI}e)s %(s)s global=%({x-openstack-request-id}i)s "
    "user=%({HTTP_X_USER_ID}e)s project=%({HTTP_X_PROJECT_ID}e)s"
)
"""


class GlanceFailed(Exception):
    """Glance could not be set up or did not answer in time; with what it said."""


class GlanceServer(WSGIService):
    """One glance-api process and its files (see the module docstring).

    :param directory: where its configuration, database, images and logs go.
    :param keystone_url: the Keystone (``.../v3``) that issues and validates tokens.
    :param service_user: glance's own user there, holding the ``service`` role.
    """

    NAME, MANAGE, LOGS = "Glance", "glance-manage", ("glance-api.log",)
    FAILED = GlanceFailed
    WSGI_APP = "glance.wsgi.api:application"

    def __init__(self, directory: Path, keystone_url: str, service_user: User) -> None:
        super().__init__(directory, "glance-api.conf")
        self.keystone_url = keystone_url
        self.service_user = service_user
        self.url = f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Set up the database and serve; wait until it answers.

        :raises GlanceFailed: the paste pipeline is missing, ``glance-manage
            db_sync`` failed, gunicorn exited, or ``/versions`` did not answer
            within ``timeout_s``.
        """
        if not PASTE_INI.exists():
            raise GlanceFailed(f"no {PASTE_INI}: install glance in this environment")
        for store in ("images", "staging", "tasks"):
            (self.dir / store).mkdir(exist_ok=True)
        shutil.copy(PASTE_INI, self.dir / PASTE_INI.name)
        self.config.write_text(
            GLANCE_CONF.format(
                dir=self.dir, keystone=self.keystone_url, user=self.service_user, domain=DOMAIN
            )
        )
        self._manage("db_sync")
        self._serve({"OS_GLANCE_CONFIG_DIR": str(self.dir)}, ACCESS_LOG)
        self._wait(f"{self.url}/versions", timeout_s)

    def requests(self) -> list[str]:
        """The access log's lines so far: ``GET /v2/images/<id> 200 global=req-...
        user=<id> project=<id>``."""
        path = self.dir / "access.log"
        return path.read_text().splitlines() if path.exists() else []

    # -- images, as a user makes them --

    def create_image(
        self,
        session: Any,
        name: str,
        visibility: str = "private",
        upload: bool = True,
        **fields: Any,
    ) -> dict[str, Any]:
        """An image made through ``session`` (a keystoneauth session), active once its
        bytes are uploaded (``upload``; otherwise it stays ``queued``).

        ``fields``: more of the image's fields (``min_ram``, ``min_disk``) and
        properties (``trait:HW_CPU_X86_AVX2="required"``). Returns the image as
        Glance shows it after the upload.
        """
        endpoint = {"endpoint_override": self.url}
        body = {
            "name": name, "visibility": visibility, "disk_format": "raw",
            "container_format": "bare", **fields,
        }  # fmt: skip
        image = session.post("/v2/images", json=body, **endpoint).json()
        if upload:
            session.put(
                f"/v2/images/{image['id']}/file", data=b"\0" * 1024,
                headers={"Content-Type": "application/octet-stream"}, **endpoint,
            )  # fmt: skip
        answer: dict[str, Any] = session.get(f"/v2/images/{image['id']}", **endpoint).json()
        return answer
