"""One qsched stack as separate processes on real servers: gunicorn and N agents.

Every process reads the same INI file, agents one more naming their host,
exactly as a deployment would; the API also finds it in ``QSCHED_CONFIG``.
Each process writes to ``<name>.log``, appended to across restarts. An agent
can be signalled and started again under the same host name, as an operator
would restart a compute service.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from http import client
from pathlib import Path
from typing import Any

from qsched import conf as qconf
from qsched.conf.bus import OSLO_MESSAGING
from qsched.ledger import Stores, open_stores
from qsched.net import LOOPBACK, free_port
from qsched.stack.cleanup import forget_bus
from qsched.stack.config import CellConfig, GunicornConfig, ini_text

BINDIR = Path(sys.executable).parent
PROGRESS_EVERY_S = 5.0

Popen = subprocess.Popen[bytes]


class StackFailed(Exception):
    """A process of the stack died, or the stack was not ready in time; with its logs."""


def new_prefix(kind: str) -> str:
    """A bus prefix (and cell name) no other run uses: ``kind`` and 8 hex digits."""
    return f"{kind}{uuid.uuid4().hex[:8]}"


def http_call(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = None,
    timeout_s: float = 30.0,
    version: str | None = None,
) -> tuple[int, dict[str, Any]]:
    """One call to the API at 127.0.0.1:``port``: (status, JSON body or {});
    ``version``: the compute microversion asked for (None: the default, 2.1)."""
    conn = client.HTTPConnection(LOOPBACK, port, timeout=timeout_s)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["X-Auth-Token"] = token
    if version:
        headers["OpenStack-API-Version"] = f"compute {version}"
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw.strip().startswith(b"{") else {}
    finally:
        conn.close()


def children(pid: int) -> list[int]:
    """PIDs of the live child processes of ``pid`` (read from /proc), sorted."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ')'
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return sorted(found)


class ProcessStack:
    """The processes of one stack, its files, and the caller's own view of its ledger.

    :param directory: where the config files go (made absolute: processes run there).
    :param extra_config: INI files every process reads after the stack's own.
    :param agent_command: what runs an agent, before its ``--config-file`` options.
    :param stop_timeout_s: how long :meth:`stop` lets a process exit after SIGTERM.
    """

    def __init__(
        self,
        directory: Path,
        config: CellConfig,
        api: GunicornConfig | None = None,
        extra_config: Sequence[Path] = (),
        logs: Path | None = None,
        agent_command: Sequence[str] = (str(BINDIR / "qsched-agent"),),
        host_stem: str = "cn",
        stop_timeout_s: float = 20.0,
    ) -> None:
        self.dir = directory.resolve()
        self.logs = (logs or directory).resolve()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.prefix = config.prefix
        self.transport_url = config.transport_url
        self.own_cell = config.cell is not None
        self.config = config.write(self.dir / "qsched.conf")
        self.config_files = [str(self.config), *(str(p.resolve()) for p in extra_config)]
        self.gunicorn = api or GunicornConfig()
        self.agent_command = list(agent_command)
        self.host_stem = host_stem
        self.stop_timeout_s = stop_timeout_s
        self.port = free_port()
        self.options = qconf.load_options(config_files=[str(self.config)])
        self.stores: Stores = open_stores(self.options.ledger, self.options.quota)
        self.api: Popen | None = None
        self.agents: dict[int, Popen] = {}
        self._hosts: set[str] = set()
        self._spawned: list[Popen] = []

    def host(self, index: int) -> str:
        return f"{self.prefix}-{self.host_stem}{index}"

    # -- processes ---------------------------------------------------------------------

    def start_api(self) -> None:
        """Start gunicorn (again, after a crash) on the stack's port."""
        settings = self.dir / "gunicorn.conf.py"
        settings.write_text(self.gunicorn.text(f"{LOOPBACK}:{self.port}"))
        cmd = [str(BINDIR / "gunicorn"), "-c", str(settings), "qsched.api.app:wsgi_app"]
        self.api = self._spawn("api", cmd)

    def start_agent(
        self, index: int, options: Mapping[str, Any] | None = None, args: Sequence[str] = ()
    ) -> None:
        """Start agent ``index`` (again) with ``[agent]`` ``options`` and extra ``args``.

        The same index keeps its host name, so a restarted agent finds its nodes and claims.
        """
        host_conf = self.dir / f"agent{index}.conf"
        host_conf.write_text(ini_text({"agent": {"host": self.host(index), **(options or {})}}))
        files = [a for f in [*self.config_files, str(host_conf)] for a in ("--config-file", f)]
        self.agents[index] = self._spawn(f"agent{index}", [*self.agent_command, *files, *args])
        self._hosts.add(self.host(index))

    def note_hosts(self, hosts: Sequence[str]) -> None:
        """Compute hosts run by the stack's agent processes under other names than theirs
        (a benchmark process running several agents): :meth:`forget` removes their
        queues too."""
        self._hosts.update(hosts)

    def signal_agent(self, index: int, sig: int) -> None:
        proc = self.agents[index]
        if proc.poll() is None:
            proc.send_signal(sig)

    def wait_agent_exit(self, index: int, timeout_s: float) -> int | None:
        """The exit code, or None if it still runs after ``timeout_s``."""
        try:
            return self.agents[index].wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def api_workers(self) -> list[int]:
        """PIDs of the API's gunicorn workers (the children of its master), sorted."""
        if self.api is None or self.api.poll() is not None:
            return []
        return children(self.api.pid)

    def agent_running(self, index: int) -> bool:
        return self.agents[index].poll() is None

    def kill_agent(self, index: int, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> int:
        """Signal agent ``index`` and wait for its exit code; it stays down until started.

        :raises subprocess.TimeoutExpired: it still ran after ``timeout_s``.
        """
        proc = self.agents.pop(index)
        proc.send_signal(sig)
        return proc.wait(timeout_s)

    def processes(self) -> dict[str, Popen]:
        """The latest process of each name: agents, then the API."""
        found = {f"agent{i}": p for i, p in self.agents.items()}
        return found | ({"api": self.api} if self.api is not None else {})

    def stop(self) -> dict[str, int | str]:
        """SIGTERM every process, SIGKILL what still runs after ``stop_timeout_s``.

        :returns: the exit code of each of :meth:`processes`, or how it was killed.
        """
        live = [p for p in self._spawned if p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        killed = []
        for proc in live:
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed.append(proc)
        how = f"killed after {self.stop_timeout_s:.0f}s"
        return {n: how if p in killed else p.returncode for n, p in self.processes().items()}

    def _spawn(self, name: str, cmd: list[str]) -> Popen:
        config = os.pathsep.join(self.config_files)  # what the API reads
        env = dict(os.environ, QSCHED_CONFIG=config, PYTHONUNBUFFERED="1")
        with open(self.logs / f"{name}.log", "ab") as log:  # the child keeps its own copy
            log.write(f"=== qsched.stack: starting {name} at {time.time():.3f}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
            )
        self._spawned.append(proc)
        return proc

    # -- readiness ---------------------------------------------------------------------

    def wait(
        self,
        ready: Callable[[], bool],
        timeout_s: float,
        what: str,
        interval_s: float = 0.2,
        progress: Callable[[], None] | None = None,
    ) -> None:
        """Poll ``ready`` until it holds, calling ``progress`` every few seconds.

        :raises StackFailed: a process exited meanwhile, or ``timeout_s`` passed
            (the message says ``what`` was not reached, with the logs' tails).
        """
        deadline = time.monotonic() + timeout_s
        next_progress = time.monotonic() + PROGRESS_EVERY_S
        while not ready():
            self.check_running()
            if time.monotonic() > deadline:
                raise StackFailed(f"{what} after {timeout_s:.0f}s (logs in {self.logs}):\n"
                                  f"{self.tail_logs()}")  # fmt: skip
            if progress is not None and time.monotonic() >= next_progress:
                next_progress += PROGRESS_EVERY_S
                progress()
            time.sleep(interval_s)

    def wait_ready(self, timeout_s: float, interval_s: float = 0.2) -> None:
        """Wait until the API (if started) answers and every agent started beats."""
        ready = lambda: (self.api is None or self.healthy()) and self.agents_alive()  # noqa: E731
        self.wait(ready, timeout_s, "the stack was not ready", interval_s)

    def check_running(self) -> None:
        """:raises StackFailed: one of :meth:`processes` has exited."""
        for name, proc in self.processes().items():
            if proc.poll() is not None:
                raise StackFailed(
                    f"{name} exited with {proc.returncode} ({proc.args!r}):\n{self.tail_logs()}"
                )

    def healthy(self) -> bool:
        try:
            return http_call(self.port, "GET", "/healthcheck", timeout_s=5.0)[0] == 200
        except OSError:
            return False

    def agents_alive(self) -> bool:
        """Every agent started has a heartbeat that has not expired (read from the ledger)."""
        return all(self.stores.agents.alive(self.host(i)) for i in self.agents)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        version: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """One HTTP call to the stack's API (``version``: its compute microversion);
        (status, JSON body or {})."""
        return http_call(self.port, method, path, body, token, version=version)

    def tail_logs(self, chars: int = 2000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
            for p in sorted(self.logs.glob("*.log"))
        )

    # -- cleanup -----------------------------------------------------------------------

    def forget(self) -> list[str]:
        """Remove the stack's queues and exchanges, and its cell's keys if it has its own.

        Call it once the processes stopped. :returns: what could not be deleted.
        :raises: what :func:`~qsched.stack.cleanup.forget_bus` and
            :meth:`~qsched.ledger.base.Backend.forget_cell` raise.
        """
        hosts = sorted(self._hosts)
        names = None
        if self.options.bus.driver == OSLO_MESSAGING:
            from qsched.bus.oslo.wire import OsloNames  # oslo.messaging only for that bus

            names = OsloNames(self.prefix)
        failed = forget_bus(self.transport_url, self.prefix, self.classes(), hosts, names)
        if self.own_cell:
            self.stores.backend.forget_cell()
        return failed

    def classes(self) -> list[str]:
        """The scheduling classes whose queues may exist: configured flavors and live ones."""
        names = {line.split(":", 1)[0] for line in self.options.api.flavor}
        with contextlib.suppress(Exception):  # the ledger may be what failed
            names |= set(self.stores.agents.classes())
        return sorted(names)

    def close(self) -> None:
        """Close this process's ledger connections."""
        self.stores.backend.close()
