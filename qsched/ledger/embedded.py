"""The embedded ledger: an in-process fakeredis server with Lua, for the demo and tests.

Features
    The same stores and scripts as on Redis: fakeredis answers the Redis
    protocol and runs the Lua in an emulator (lupa). Every store of this
    process opened with the same name shares one server. Nothing survives the
    process, so ``[ledger] durability`` ``replica`` and ``disk`` (the default)
    are refused: whoever opens it says ``async``, as :mod:`qsched.embedded` (the
    demo's stack) and the tests' fixtures do.

Connection string
    ``fakeredis://[name]``; no name is ``default``.

Installing
    Not part of a production install: ``pip install 'qsched[embedded]'`` adds
    fakeredis and lupa (``make install`` does). fakeredis is imported on first
    use, so a ledger on a real Redis never needs it; without it, opening a
    ``fakeredis://`` URL raises :class:`EmbeddedNotInstalled`.

Compiled scripts
    Redis compiles a script once per SHA and calls it after that; fakeredis
    compiles the whole source (key builders and ``lib.lua`` included) on every
    call, which cost about 0.5 ms a script. :class:`CompiledScripts` gives each
    server Redis's habit: a script is compiled into a Lua function once and
    called after that, with the same ``KEYS``, ``ARGV`` and errors.
"""

from __future__ import annotations

import importlib
import importlib.util
import socketserver
import sys
import threading
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from qsched import exception

SCHEME = "fakeredis://"
INSTALL = "pip install 'qsched[embedded]'"

_servers: dict[str, Any] = {}  # name -> fakeredis.FakeServer, one per name in this process
_lock = threading.Lock()


class EmbeddedNotInstalled(exception.QschedError):
    """A ``fakeredis://`` ledger on an install without the ``embedded`` extra."""

    msg_fmt = (
        "[ledger] url {url} is the embedded ledger, which this install lacks ({reason}): "
        + INSTALL
        + ", or set [ledger] url to a Redis (redis://host:6379/0)"
    )


def is_embedded_url(url: str) -> bool:
    return url.startswith(SCHEME)


def connect(url: str, max_connections: int | None = None) -> Any:
    """A client of the process's server named in ``url`` (made on first use): a
    ``fakeredis.FakeRedis``, which is a ``redis.Redis``, its pool bounded at
    ``max_connections`` (None: redis-py's default).

    :raises EmbeddedNotInstalled: fakeredis or lupa is missing.
    """
    fakeredis = _fakeredis(url)
    name = urlsplit(url).netloc or "default"
    with _lock:
        server = _servers.get(name)
        if server is None:
            server = _servers[name] = fakeredis.FakeServer()
            compile_scripts_once(fakeredis.FakeRedis(server=server))
    return fakeredis.FakeRedis(server=server, max_connections=max_connections)


class CompiledScripts:
    """A fakeredis server's Lua runtime that compiles each script once (see the module
    docstring); everything but ``execute`` is the runtime's own."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._compiled: dict[bytes, Any] = {}

    def execute(self, source: bytes | str) -> Any:
        if isinstance(source, str):  # fakeredis's own housekeeping ("collectgarbage()")
            return self._runtime.execute(source)
        function = self._compiled.get(source)
        if function is None:
            # A chunk is a function: the same locals, returns and errors, compiled once.
            function = self._runtime.eval(b"function(...) " + source + b"\nend")
            self._compiled[source] = function
        return function()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


def compile_scripts_once(client: Any) -> None:
    """Give ``client``'s server a :class:`CompiledScripts` runtime (its first script
    makes the runtime; a fakeredis without one keeps compiling each call)."""
    client.eval("return 1", 0)
    server = client.connection_pool.connection_kwargs.get("server")
    runtime = getattr(server, "_lua_runtime", None)
    if runtime is not None and not isinstance(runtime, CompiledScripts):
        server._lua_runtime = CompiledScripts(runtime)


def is_embedded(client: object) -> bool:
    """Whether ``client`` talks to an embedded server (it cannot if fakeredis never loaded)."""
    fakeredis = sys.modules.get("fakeredis")
    return fakeredis is not None and isinstance(client, fakeredis.FakeRedis)


def tcp_server(host: str, port: int) -> socketserver.BaseServer:
    """A new embedded server answering the Redis protocol on ``host:port``, so that
    other processes (``qsched-admin``) can open it as ``redis://``. Call
    ``serve_forever()`` on it, ``shutdown()`` and ``server_close()`` to stop.

    :raises EmbeddedNotInstalled: fakeredis or lupa is missing.
    """
    server: socketserver.BaseServer = _fakeredis(f"redis://{host}:{port}").TcpFakeServer(
        (host, port), server_type="redis"
    )
    return server


def _fakeredis(url: str) -> ModuleType:
    try:
        module = importlib.import_module("fakeredis")
    except ImportError as exc:
        raise EmbeddedNotInstalled(url=url, reason=str(exc)) from exc
    if importlib.util.find_spec("lupa") is None:  # fakeredis runs without it, but no Lua
        raise EmbeddedNotInstalled(url=url, reason="no Lua for fakeredis: lupa is missing")
    return module
