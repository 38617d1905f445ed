"""The embedded ledger: an in-process fakeredis server with Lua, for the demo and tests.

Features
    The same stores and scripts as on Redis: fakeredis answers the Redis
    protocol and runs the Lua in an emulator (lupa). Every store of this
    process opened with the same name shares one server. Nothing survives the
    process, so ``[ledger] durability`` ``replica`` and ``disk`` are refused.

Connection string
    ``fakeredis://[name]``; no name is ``default``.

Installing
    Not part of a production install: ``pip install 'qsched[embedded]'`` adds
    fakeredis and lupa (``make install`` does). fakeredis is imported on first
    use, so a ledger on a real Redis never needs it; without it, opening a
    ``fakeredis://`` URL raises :class:`EmbeddedNotInstalled`.
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


def connect(url: str) -> Any:
    """A client of the process's server named in ``url`` (made on first use): a
    ``fakeredis.FakeRedis``, which is a ``redis.Redis``.

    :raises EmbeddedNotInstalled: fakeredis or lupa is missing.
    """
    fakeredis = _fakeredis(url)
    name = urlsplit(url).netloc or "default"
    with _lock:
        server = _servers.setdefault(name, fakeredis.FakeServer())
    return fakeredis.FakeRedis(server=server)


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
