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

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib import error, request

from qsched.net import LOOPBACK, free_port
from qsched.stack.keystone import DOMAIN, User

BINDIR = Path(sys.executable).parent
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

GUNICORN_CONF = """\
# gunicorn settings of one test Glance, written by qsched.stack.glance.
bind = {bind!r}
workers = 1
worker_class = "gthread"
threads = 4
timeout = 60
control_socket_disable = True
wsgi_app = "glance.wsgi.api:application"
# One line per request: the global request id it came with, and the user and project
# auth_token found in its token (as the environment holds them after the request).
accesslog = "access.log"
access_log_format = (
    "%(m)s %({{RAW_URI}}e)s %(s)s global=%({{x-openstack-request-id}}i)s "
    "user=%({{HTTP_X_USER_ID}}e)s project=%({{HTTP_X_PROJECT_ID}}e)s"
)
"""


class GlanceFailed(Exception):
    """Glance could not be set up or did not answer in time; with what it said."""


class GlanceServer:
    """One glance-api process and its files (see the module docstring).

    :param directory: where its configuration, database, images and logs go.
    :param keystone_url: the Keystone (``.../v3``) that issues and validates tokens.
    :param service_user: glance's own user there, holding the ``service`` role.
    """

    def __init__(self, directory: Path, keystone_url: str, service_user: User) -> None:
        self.dir = directory.resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keystone_url = keystone_url
        self.service_user = service_user
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.config = self.dir / "glance-api.conf"
        self.process: subprocess.Popen[bytes] | None = None

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
        self._serve()
        self._wait(timeout_s)

    def _manage(self, *args: str) -> None:
        cmd = [str(BINDIR / "glance-manage"), "--config-file", str(self.config), *args]
        done = subprocess.run(cmd, cwd=self.dir, capture_output=True, timeout=300)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[-2000:]
            raise GlanceFailed(f"glance-manage {args[0]} exited {done.returncode}: {said}")

    def _serve(self) -> None:
        (self.dir / "gunicorn.conf.py").write_text(
            GUNICORN_CONF.format(bind=f"{LOOPBACK}:{self.port}")
        )
        env = {**os.environ, "OS_GLANCE_CONFIG_DIR": str(self.dir)}
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
                raise GlanceFailed(f"gunicorn exited {self.process.returncode}: {self.log()}")
            try:
                with request.urlopen(f"{self.url}/versions", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise GlanceFailed(f"no answer at {self.url} after {timeout_s:.0f} s: {self.log()}")

    def log(self, chars: int = 3000) -> str:
        """The end of gunicorn's and glance-api's logs."""
        found = []
        for name in ("gunicorn.log", "glance-api.log"):
            path = self.dir / name
            if path.exists():
                found.append(f"{name}: {path.read_text(errors='replace')[-chars:]}")
        return "\n".join(found)

    def requests(self) -> list[str]:
        """The access log's lines so far: ``GET /v2/images/<id> 200 global=req-...
        user=<id> project=<id>``."""
        path = self.dir / "access.log"
        return path.read_text().splitlines() if path.exists() else []

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
