"""What the test harness's OpenStack services share: one WSGI application under gunicorn.

:class:`WSGIService` is the process side of :mod:`qsched.stack.keystone` and
:mod:`qsched.stack.glance`: the service's ``*-manage`` commands, gunicorn started
from a ``gunicorn.conf.py`` in the service's directory (the service's WSGI loader
parses ``sys.argv``, so gunicorn runs without arguments), the wait until a URL
answers 200, the end of its logs, and the stop. Subclasses name the commands,
logs and error type and write their own configuration.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import ClassVar
from urllib import error, request

from qsched.net import LOOPBACK, free_port
from qsched.stack.processes import BINDIR

GUNICORN_CONF = """\
# gunicorn settings of one test {service}, written by qsched.stack.
bind = {bind!r}
workers = 1
worker_class = "gthread"
threads = 4
timeout = 60
control_socket_disable = True
wsgi_app = {wsgi_app!r}
{extra}"""


class WSGIService:
    """One service's directory, port and gunicorn process (see the module docstring).

    Subclasses set ``NAME`` (for messages), ``MANAGE`` (its ``*-manage`` command),
    ``WSGI_APP`` (gunicorn's ``wsgi_app``), ``LOGS`` (the logs :meth:`log` shows)
    and ``FAILED`` (the exception raised when it cannot start).
    """

    NAME: ClassVar[str]
    MANAGE: ClassVar[str]
    WSGI_APP: ClassVar[str]
    LOGS: ClassVar[tuple[str, ...]]
    FAILED: ClassVar[type[Exception]]

    def __init__(self, directory: Path, config_name: str) -> None:
        self.dir = directory.resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config = self.dir / config_name
        self.process: subprocess.Popen[bytes] | None = None

    def _manage(self, *args: str) -> None:
        """Run ``<MANAGE> --config-file <config> args...``.

        :raises FAILED: it exited non-zero; with the end of what it said.
        """
        cmd = [str(BINDIR / self.MANAGE), "--config-file", str(self.config), *args]
        done = subprocess.run(cmd, cwd=self.dir, capture_output=True, timeout=300)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[-2000:]
            raise self.FAILED(f"{self.MANAGE} {args[0]} exited {done.returncode}: {said}")

    def _serve(self, env: dict[str, str], extra: str = "") -> None:
        """Start gunicorn in the directory; ``extra``: more lines of its settings."""
        (self.dir / "gunicorn.conf.py").write_text(
            GUNICORN_CONF.format(service=self.NAME, bind=f"{LOOPBACK}:{self.port}",
                                 wsgi_app=self.WSGI_APP, extra=extra)
        )  # fmt: skip
        log = (self.dir / "gunicorn.log").open("ab")
        try:
            self.process = subprocess.Popen(
                [str(BINDIR / "gunicorn")], cwd=self.dir, env={**os.environ, **env},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()

    def _wait(self, url: str, timeout_s: float) -> None:
        """Until ``url`` answers 200.

        :raises FAILED: gunicorn exited, or no answer within ``timeout_s`` (then stopped).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise self.FAILED(f"gunicorn exited {self.process.returncode}: {self.log()}")
            try:
                with request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise self.FAILED(f"no answer at {url} after {timeout_s:.0f} s: {self.log()}")

    def log(self, chars: int = 3000) -> str:
        """The end of gunicorn's log and the service's own."""
        found = []
        for name in ("gunicorn.log", *self.LOGS):
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
