"""Concurrent changes of one server all land, on fakeredis and a real Redis.

A server's name, fields and metadata change by one script each, on the record as it
is when the script runs; a read-modify-write in Python would lose the writes that
came between its read and its write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from qsched import exception
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, SchedulerOptions
from qsched.ledger import Stores
from qsched.scheduling.records import details, server_change
from tests.compute.test_compute import ALICE, RecordingBus, boot, configure, place

SETTERS, WRITES = 3, 25  # threads setting items of their own, writes each (101 items at most)


@pytest.fixture
def compute(conf, stores: Stores) -> ComputeAPI:
    configure(conf)
    api = ComputeAPI(
        stores, RecordingBus(), SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf)
    )
    api.seed_flavors()
    return api


def run_together(writers: list[Callable[[int], object]]) -> list[BaseException]:
    """Run each writer for 0..WRITES-1 in a thread of its own, all starting at once."""
    start, failures = threading.Barrier(len(writers)), []

    def run(write: Callable[[int], object]) -> None:
        start.wait()
        try:
            for n in range(WRITES):
                write(n)
        except BaseException as exc:  # the test reports it, the thread does not swallow it
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return failures


def test_concurrent_metadata_and_field_writes_all_land(compute, stores) -> None:
    old = {f"old{n}": "x" for n in range(WRITES)}
    server = boot(compute, metadata={**old, "kept": "y"}).uuid
    place(stores, server)

    def setter(prefix: str) -> Callable[[int], object]:
        return lambda n: compute.set_metadata(ALICE, server, {f"{prefix}{n}": str(n)})

    def rename(n: int) -> object:
        return compute.update(ALICE, server, {"name": f"vm{n}", "description": f"d{n}"})

    def remove(n: int) -> None:
        compute.delete_metadata(ALICE, server, f"old{n}")

    prefixes = [f"t{p}-" for p in range(SETTERS)]
    assert run_together([*map(setter, prefixes), rename, remove]) == []
    record = stores.instances.get(server)
    written = {f"{p}{n}": str(n) for p in prefixes for n in range(WRITES)}
    assert dict(details(record).metadata) == {**written, "kept": "y"}
    last = WRITES - 1
    assert (record.name, details(record).server.description) == (f"vm{last}", f"d{last}")


def test_a_server_change_names_fields_of_a_server_only() -> None:
    assert server_change({"description": "d"})["server"].items == {"description": "d"}
    with pytest.raises(exception.Invalid, match="metadata"):
        server_change({"metadata": {}})
