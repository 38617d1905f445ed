"""What serving several cells costs the front door and each Redis: per call, by cells.

``python -m qsched.bench.cells --cells 1,2,4 --calls 2000`` measures the calls of
the HTTP layer's front door (the library, no HTTP) first on one cell as
``qsched-api`` serves it without ``[cells]`` (``ComputeAPI``), then behind the
front door of several cells (:func:`qsched.cells.opening.front_door` over
:func:`qsched.cells.opening.open_cells`)
for each number of cells given. Every keyspace, the API keyspace and each cell, is
on a ``redis-server`` of its own started for the run (no persistence), so that the
CPU each server spends per call is told apart (``INFO cpu``): the API keyspace is
one slot, shared by the whole deployment, and its CPU per boot bounds the boots a
second of every cell together.

Calls, each timed one by one: ``boot`` (one server, no zone: the cell drawn), ``show``
(a booted server), ``list`` (``limit`` 50, detail, the merged page), ``flavor`` (a
create and its delete: a write to every cell each) and ``keypair`` (the same).
``list``, ``flavor`` and ``keypair`` run a tenth as many times as the others. No
agent runs: boots wait in the bus (kombu ``memory://``, in this process), so what is
measured is the front door and the ledger, not placing. It prints one JSON line per
deployment: per call, wall ms p50 and p99, this process's CPU ms, and each
server's CPU ms (``api``, ``cells``: the cells' sum); and how many boots each cell
took (``landed``).

With ``--embedded`` every keyspace is fakeredis in this process and no server's CPU
is read (a check of the harness, not a measure).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from qsched import conf as qconf
from qsched.bench.measure import percentiles
from qsched.bus.kombu import KombuBus
from qsched.cells.opening import front_door, open_cells
from qsched.compute.api import ComputeAPI
from qsched.conf import BusOptions, CellsOptions, LedgerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.server import unreachable
from qsched.stack import free_port

USER = RequestContext.for_project("bench-user", "bench-cells")
ADMIN = RequestContext.for_project("admin", "admin", ("admin", "member", "reader"))
FLAVOR = Flavor("cells-bench", 2, 4096, 20, id="cells-bench")
#: [ledger] durability of every keyspace: its servers keep nothing on disk (the front
#: door's cost is measured, not the disk's), so disk, the default, would be refused
DURABILITY = "async"
#: the calls a tenth as often as boots and shows
RARE = ("list", "flavor", "keypair")


class Servers:
    """``redis-server`` processes of the run, one per keyspace, on free loopback ports."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.running: list[tuple[subprocess.Popen[bytes], int]] = []

    def start(self) -> str:
        """A new server's URL, once it answers."""
        if shutil.which("redis-server") is None:
            raise click.ClickException("redis-server is not on PATH: install Redis, or "
                                       "pass --embedded")  # fmt: skip
        port = free_port()
        process = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.running.append((process, port))
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while (error := unreachable(url)) is not None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(f"redis-server on port {port} did not start: {error}")
            time.sleep(0.05)
        return url

    def stop(self) -> None:
        for process, _port in self.running:
            process.terminate()
        for process, _port in self.running:
            process.wait(timeout=10)


class Keyspaces:
    """Where each keyspace lives: a server of its own, or fakeredis (``--embedded``)."""

    def __init__(self, servers: Servers | None) -> None:
        self.servers = servers

    def url(self) -> str:
        if self.servers is None:
            return f"fakeredis://bench-cells-{uuid.uuid4().hex}"
        return self.servers.start()


def _bus(options: BusOptions) -> KombuBus:
    return KombuBus("memory://", prefix=options.prefix)


@contextlib.contextmanager
def one_cell(keyspaces: Keyspaces) -> Iterator[tuple[Any, list[Stores]]]:
    """``qsched-api`` without ``[cells]``: one ComputeAPI, and its one keyspace."""
    ledger = LedgerOptions.from_conf(qconf.load()).replace(
        cell="cell1", url=keyspaces.url(), durability=DURABILITY
    )
    stores = open_stores(ledger)
    stores.quota.set_limits(USER.project_id, instances=-1, cores=-1, ram_mb=-1)
    bus = _bus(BusOptions.from_conf(qconf.load()).replace(prefix="bench-cells-1"))
    try:
        yield ComputeAPI(stores, bus), [stores]
    finally:
        bus.close()
        stores.backend.forget_cell()
        stores.backend.close()


@contextlib.contextmanager
def many_cells(keyspaces: Keyspaces, count: int) -> Iterator[tuple[Any, list[Stores]]]:
    """The front door of ``count`` cells and the API keyspace, each on its own server."""
    conf = qconf.load()
    run = uuid.uuid4().hex[:6]
    options = CellsOptions.defaults().replace(
        api_url=keyspaces.url(),
        cell=tuple(f"cell{n} {keyspaces.url()} bench-{run}-{n}" for n in range(1, count + 1)),
    )
    ledger = LedgerOptions.from_conf(conf).replace(durability=DURABILITY)
    front = open_cells(options, ledger, BusOptions.from_conf(conf), _bus)
    front.api.quota.set_limits(USER.project_id, instances=-1, cores=-1, ram_mb=-1)
    cells = [compute.stores for compute in front.cells.values()]
    try:
        yield front_door(front), [front.api, *cells]
    finally:
        for stores in [front.api, *cells]:
            stores.backend.forget_cell()
        front.close()


def measure(front: Any, keyspaces: Sequence[Stores], calls: int) -> dict[str, Any]:
    """Time each call of the module doc on ``front``; ``keyspaces``: (API or the one
    cell, then the cells), whose servers' CPU is read around each call's block."""
    front.create_flavor(ADMIN, FLAVOR)
    booted: list[str] = []
    rare = max(1, calls // 10)

    def boot(n: int) -> None:
        made = front.boot_many(USER, f"vm-{n}", FLAVOR.id)
        booted.append(made.instances[0].uuid)

    def flavor(n: int) -> None:
        front.create_flavor(ADMIN, Flavor(f"cells-bench-{n}", 1, 512, 1, id=f"cells-bench-{n}"))
        front.delete_flavor(ADMIN, f"cells-bench-{n}")

    made, _private = front.keypairs.create(USER, "cells-bench")  # an RSA key made once

    def keypair(n: int) -> None:
        front.keypairs.import_public_key(USER, f"key-{n}", made.public_key)
        front.keypairs.delete(USER, f"key-{n}")

    steps: dict[str, tuple[int, Callable[[int], object]]] = {
        "boot": (calls, boot),
        "show": (calls, lambda n: front.get(USER, booted[n % len(booted)])),
        "list": (rare, lambda n: front.list(USER, detail=True, limit=50)),
        "flavor": (rare, flavor),
        "keypair": (rare, keypair),
    }
    found: dict[str, Any] = {}
    for name, (times, step) in steps.items():
        found[name] = _timed(times, step, keyspaces)
    cells = keyspaces[1:] or keyspaces
    # where the boots went: the draw's evidence (each cell's count, in line order)
    found["landed"] = [len(stores.instances.list_project(USER.project_id)) for stores in cells]
    front.delete_flavor(ADMIN, FLAVOR.id)
    front.keypairs.delete(USER, "cells-bench")
    return found


def _timed(times: int, step: Callable[[int], object], keyspaces: Sequence[Stores]) -> dict:
    """Wall time of each call; CPU of this process and of each server over them all
    (None for fakeredis, which has no server)."""
    told = all(stores.backend.server_cpu_ms() > 0 for stores in keyspaces)
    servers_before = [stores.backend.server_cpu_ms() for stores in keyspaces]
    cpu_before = time.process_time()
    walls = []
    for n in range(times):
        began = time.perf_counter()
        step(n)
        walls.append(time.perf_counter() - began)
    cpu_ms = 1000 * (time.process_time() - cpu_before)
    servers = [stores.backend.server_cpu_ms() - before
               for stores, before in zip(keyspaces, servers_before, strict=True)]  # fmt: skip
    ms = percentiles(walls)
    return {
        "calls": times,
        "wall_ms_p50": ms["p50"],
        "wall_ms_p99": ms["p99"],
        "front_cpu_ms": round(cpu_ms / times, 3),
        # one cell: its server; several: the API keyspace's, then the cells' sum
        "api_redis_cpu_ms": round(servers[0] / times, 3) if told and len(servers) > 1 else None,
        "cells_redis_cpu_ms": round(sum(servers[1:] or servers) / times, 3) if told else None,
    }


def run(cells: Sequence[int], calls: int, keyspaces: Keyspaces) -> Iterator[dict[str, Any]]:
    """One line for one cell served alone, then one per number of ``cells``."""
    with one_cell(keyspaces) as (front, stores):
        yield {"deployment": "one cell, no [cells]", "cells": 1,
               **measure(front, stores, calls)}  # fmt: skip
    for count in cells:
        served = f"{count} cell{'s' if count > 1 else ''} behind one front door"
        with many_cells(keyspaces, count) as (front, stores):
            yield {"deployment": served, "cells": count, **measure(front, stores, calls)}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cells", "counts", default="1,2,4", show_default=True,
              help="Numbers of cells behind the front door, comma-separated.")  # fmt: skip
@click.option("--calls", type=click.IntRange(10), default=2000, show_default=True,
              help="Boots and shows per deployment (list, flavor, keypair: a tenth).")  # fmt: skip
@click.option("--embedded", is_flag=True,
              help="fakeredis in this process, no server: checks the harness only.")  # fmt: skip
def main(counts: str, calls: int, embedded: bool) -> None:
    """Time the front door's calls on one cell and on several; one JSON line each."""
    wanted = [int(n) for n in counts.split(",") if n.strip()]
    with tempfile.TemporaryDirectory(prefix="qsched-bench-cells-") as directory:
        servers = None if embedded else Servers(Path(directory))
        try:
            for line in run(wanted, calls, Keyspaces(servers)):
                click.echo(json.dumps(line, sort_keys=True))
        finally:
            if servers is not None:
                servers.stop()


if __name__ == "__main__":
    main()
