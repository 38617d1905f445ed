"""A real memcached (Debian's ``memcached`` package) on a free loopback port, for the tests.

keystonemiddleware's ``auth_token`` keeps validated tokens in memcached when
``[keystone_authtoken] memcached_servers`` is set, as the shipped
``deploy/qsched.conf`` does; :class:`MemcachedServer` runs one for a test of that
file and reads memcached's own counters (``stats``) to see what was stored and
found there. Nothing is written to disk; :meth:`MemcachedServer.stop` ends it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

from qsched.net import LOOPBACK, free_port


class MemcachedFailed(Exception):
    """memcached is not installed, or did not answer in time."""


class MemcachedServer:
    """One memcached process listening on ``127.0.0.1:<port>`` (TCP only)."""

    def __init__(self, memory_mb: int = 16) -> None:
        self.port = free_port()
        self.memory_mb = memory_mb
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``host:port``, as ``memcached_servers`` takes it."""
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start memcached and wait until it answers ``stats``.

        :raises MemcachedFailed: no ``memcached`` on PATH, it exited, or no answer in time.
        """
        binary = shutil.which("memcached")
        if binary is None:
            raise MemcachedFailed("no memcached on PATH (Debian: apt-get install memcached)")
        cmd = [binary, "-l", LOOPBACK, "-p", str(self.port), "-U", "0",
               "-m", str(self.memory_mb), "-u", "nobody"]  # fmt: skip
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = self.process.stderr.read() if self.process.stderr else b""
                raise MemcachedFailed(f"memcached exited {self.process.returncode}: {said!r}")
            try:
                self.stats()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise MemcachedFailed(f"memcached did not answer on {self.address} in {timeout_s} s")

    def stats(self) -> dict[str, int]:
        """memcached's integer counters (``get_hits``, ``cmd_set``, ``curr_items``, ...).

        :raises OSError: it does not answer.
        """
        with socket.create_connection((LOOPBACK, self.port), timeout=2) as sock:
            sock.sendall(b"stats\r\n")
            said = b""
            while not said.endswith(b"END\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("memcached closed the connection")
                said += chunk
        counters = {}
        for line in said.decode().splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[0] == "STAT" and fields[2].isdigit():
                counters[fields[1]] = int(fields[2])
        return counters

    def stop(self, timeout_s: float = 10.0) -> None:
        """End memcached (SIGTERM, then SIGKILL after ``timeout_s``)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
