"""What asking Keystone about every token costs an API call: auth_token's cache on and off.

``python -m qsched.bench.tokens --calls 300 --memcached`` starts a real Keystone
(:mod:`qsched.stack.keystone`: SQLite, fernet tokens, keystone's application under
gunicorn, one worker of four threads, on loopback; 15 to 40 s to set up), makes a
member and qsched's service user there, and serves qsched-api's application behind
keystonemiddleware's ``auth_token`` (:func:`qsched.api.app.authenticated`, on the
embedded ledger) in this process once for each way auth_token can keep the tokens it
validated:

- ``in-process``: ``[keystone_authtoken]`` as shipped (``token_cache_time`` 300 s, in
  auth_token's own memory): Keystone is asked about a token on its first call only;
- ``memcached`` (with ``--memcached``): the same, in a memcached of the measure's own;
- ``no cache``: ``token_cache_time = -1``: Keystone is asked on every call.

It times ``--calls`` ``GET /v2.1/flavors`` on each with one member token, the modes
taking turns call by call so that the machine's load weighs on each alike (a few
untimed calls first), and prints one JSON line: each mode's latency in ms
(:func:`qsched.bench.measure.percentiles`) and how many calls it answered 200 (all,
or its figures mean nothing), and ``validation_ms_p50``, the no-cache p50 less the
in-process one: what asking Keystone adds to a call. The figures are
docs/identity.rst's ("How long a revoked token is served").
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.api.wsgi import make_server
from qsched.bench.measure import percentiles
from qsched.bus.kombu import KombuBus
from qsched.ledger import open_stores
from qsched.net import LOOPBACK
from qsched.stack.config import ini_text
from qsched.stack.keystone import KeystoneServer, User
from qsched.stack.memcached import MemcachedServer

#: The ``[keystone_authtoken]`` options of each mode but memcached (module doc).
MODES: dict[str, dict[str, Any]] = {"in-process": {}, "no cache": {"token_cache_time": -1}}
WARM_CALLS = 5
PATH = "/v2.1/flavors"


def measure(
    keystone: KeystoneServer, member: User, service: User, calls: int, memcached: str | None = None
) -> dict[str, Any]:
    """Time ``calls`` calls with ``member``'s token on each mode (module doc).

    ``service``: qsched's user there (the service role on a project); ``memcached``:
    ``host:port`` of a memcached, to time that mode too (None: not timed).
    """
    modes = dict(MODES)
    if memcached is not None:
        modes["memcached"] = {"memcached_servers": memcached}
    token = keystone.session(member).get_token()
    with (
        tempfile.TemporaryDirectory(prefix="qsched-bench-tokens-") as directory,
        contextlib.ExitStack() as stack,
    ):
        ports = {
            mode: stack.enter_context(_served(Path(directory), keystone, service, options))
            for mode, options in modes.items()
        }
        figures = _timed(ports, token, calls)
    p50 = {mode: float(figures[mode]["p50"] or 0.0) for mode in modes}
    return {
        "calls": calls,
        "path": PATH,
        "modes": figures,
        "validation_ms_p50": round(p50["no cache"] - p50["in-process"], 2),
        "versions": {name: metadata.version(name) for name in ("keystone", "keystonemiddleware")},
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def _timed(ports: dict[str, int], token: str, calls: int) -> dict[str, dict[str, Any]]:
    """``calls`` calls on each mode's port, the modes taking turns; each mode's latency
    figures and how many calls it answered 200."""
    times: dict[str, list[float]] = {mode: [] for mode in ports}
    ok = dict.fromkeys(ports, 0)
    for _ in range(WARM_CALLS):
        for port in ports.values():
            _call(port, token)
    for _ in range(calls):
        for mode, port in ports.items():
            began = time.perf_counter()
            ok[mode] += _call(port, token) == 200
            times[mode].append(time.perf_counter() - began)
    return {mode: {**percentiles(times[mode]), "ok": ok[mode]} for mode in ports}


def _call(port: int, token: str) -> int:
    """GET :data:`PATH` on the API at ``port`` with ``token``; the status."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=60)
    try:
        connection.request("GET", PATH, headers={"X-Auth-Token": token})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


@contextlib.contextmanager
def _served(
    directory: Path, keystone: KeystoneServer, service: User, authtoken: dict[str, Any]
) -> Iterator[int]:
    """The API behind ``keystone`` with ``authtoken`` options, in a thread; its port."""
    path = directory / f"qsched-{uuid.uuid4().hex[:8]}.conf"
    path.write_text(ini_text(_sections(keystone, service, authtoken)))
    conf = qconf.load(config_files=[str(path)])
    options = qconf.Options.from_conf(conf)
    stores = open_stores(options.ledger, options.quota)
    bus = KombuBus("memory://", prefix=f"tk{uuid.uuid4().hex[:8]}")
    app = api_app.create_app(stores, bus, options.api, options.scheduler, conf=conf)
    server = make_server(api_app.authenticated(app, options.api, conf), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        bus.close()


def _sections(
    keystone: KeystoneServer, service: User, authtoken: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The configuration of one mode: keystone, the embedded ledger (``async``: it
    keeps nothing on disk), one flavor."""
    return {
        "ledger": {"url": f"fakeredis://tokens-{uuid.uuid4().hex}", "durability": "async"},
        "api": {"auth_strategy": "keystone", "flavor": ["m1.small:1:2048:20"]},
        "keystone_authtoken": keystone.authtoken(service, **authtoken),
    }


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--calls", type=click.IntRange(1), default=300, show_default=True,
              help="Timed calls on each mode (after a few untimed ones).")  # fmt: skip
@click.option("--memcached/--no-memcached", default=False, show_default=True,
              help="Also time a cache in memcached (Debian's, started here).")  # fmt: skip
def main(calls: int, memcached: bool) -> None:
    """Time API calls with auth_token's token cache and without; print one JSON line."""
    with tempfile.TemporaryDirectory(prefix="qsched-bench-keystone-") as directory:
        keystone = KeystoneServer(Path(directory))
        cache = MemcachedServer() if memcached else None
        try:
            keystone.start()
            member = keystone.create_user("bench-member", "bench", ("member",))
            service = keystone.create_user("bench-qsched", "service", ("service",))
            if cache is not None:
                cache.start()
            found = measure(keystone, member, service, calls, cache.address if cache else None)
        finally:
            if cache is not None:
                cache.stop()
            keystone.stop()
    click.echo(json.dumps(found, sort_keys=True))


if __name__ == "__main__":
    main()
