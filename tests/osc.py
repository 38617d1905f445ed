"""``openstack`` commands, each in a process of its own, without paying the import each time.

Every ``openstack`` command spends about 1.5 s of CPU importing python-openstackclient
and its plug-ins before it sends a request. :class:`OpenStackRunner` starts one server
process that imports them once, then forks a child per command: the child gets the
command's environment (the user's ``OS_*`` variables), its own stdout and stderr,
and runs ``openstackclient.shell.main`` as the ``openstack`` script does, so each
command still reads its configuration from scratch, as a user's shell would run it.

One thing differs from a user's shell, said here so that nobody mistakes it: the
``--wait`` of ``server create``, ``delete`` and ``reboot`` polls every 5 s in
python-openstackclient; in the child every sleep is cut to ``max_sleep_s``.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

_SERVER = r"""
import json, os, sys, time

import openstackclient.shell

real_sleep = time.sleep
for line in sys.stdin:
    asked = json.loads(line)
    out = os.open(asked["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(asked["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    pid = os.fork()
    if pid == 0:
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.environ.clear()
        os.environ.update(asked["env"])
        cap = asked["max_sleep_s"]
        time.sleep = lambda s: real_sleep(min(s, cap))
        sys.argv = ["openstack", *asked["args"]]
        try:
            code = openstackclient.shell.main(asked["args"])
        except SystemExit as stop:
            code = stop.code
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)
    os.close(out)
    os.close(err)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class OpenStackRunner:
    """Runs ``openstack`` commands in children of one process that imported the client."""

    def __init__(self, max_sleep_s: float = 0.2) -> None:
        self.max_sleep_s = max_sleep_s
        self._dir = tempfile.TemporaryDirectory(prefix="osc-")
        self._server = subprocess.Popen(
            [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1,
        )  # fmt: skip

    def run(
        self, args: Sequence[str], env: Mapping[str, str], timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """``openstack <args>`` with ``env`` as its whole environment."""
        assert self._server.stdin is not None and self._server.stdout is not None
        out, err = Path(self._dir.name, "stdout"), Path(self._dir.name, "stderr")
        asked = {"args": list(args), "env": dict(env), "stdout": str(out), "stderr": str(err),
                 "max_sleep_s": self.max_sleep_s}  # fmt: skip
        self._server.stdin.write(json.dumps(asked) + "\n")
        self._server.stdin.flush()
        ready, _, _ = select.select([self._server.stdout], [], [], timeout_s)
        if not ready:
            self.close()
            raise TimeoutError(f"openstack {' '.join(args)} ran over {timeout_s:.0f}s")
        line = self._server.stdout.readline()
        if not line:
            raise RuntimeError(f"the openstack runner exited ({self._server.wait()})")
        code = json.loads(line)["returncode"]
        return subprocess.CompletedProcess(
            ["openstack", *args], code, out.read_text(), err.read_text()
        )

    def close(self) -> None:
        if self._server.poll() is None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
        self._dir.cleanup()
