"""The load generator: boots sent at a fixed rate, through HTTP or the library call.

The load is open-loop: request ``i`` is due at ``start + i / rate`` whatever
happened to the ones before, and its latency counts from that due time. A
generator that falls behind (all its workers busy) therefore shows up in the
latency instead of hiding it, and its lag is reported separately.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from http import client
from urllib.parse import urlsplit

from qsched.compute.api import ComputeAPI
from qsched.compute.host_rules import HostRequest
from qsched.context import RequestContext

IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"  # any UUID: the fake driver boots no image
PROJECT = USER = "bench"


class SubmitFailed(Exception):
    """The front door did not accept a boot (HTTP status other than 202, or an error)."""


@dataclasses.dataclass
class Sent:
    """One boot request: when it was due, sent and answered, and the instance it made."""

    index: int
    flavor: str
    due: float  # epoch s
    sent: float = 0.0
    answered: float = 0.0
    uuid: str | None = None
    error: str | None = None


Submit = Callable[[str, str], str]  # (name, flavor) -> instance uuid


class HttpSubmitter:
    """POST /v2.1/servers over kept-alive connections, reused across phases and threads.

    A connection goes back to the pool after each request, so a warm-up with as
    many workers as the timed phase opens every connection the phase will use.
    """

    def __init__(self, base_url: str, token: str = f"{USER}:{PROJECT}") -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port
        self.headers = {"Content-Type": "application/json", "X-Auth-Token": token}
        self._idle: queue.LifoQueue[client.HTTPConnection] = queue.LifoQueue()

    def __call__(self, name: str, flavor: str) -> str:
        body = json.dumps({"server": {"name": name, "flavorRef": flavor, "imageRef": IMAGE}})
        for attempt in (1, 2):  # a kept-alive connection the server closed: once more
            conn = self._connection()
            try:
                conn.request("POST", "/v2.1/servers", body, self.headers)
                response = conn.getresponse()
                raw = response.read()
            except (OSError, client.HTTPException):
                conn.close()
                if attempt == 2:
                    raise
                continue
            self._idle.put(conn)
            if response.status != 202:
                raise SubmitFailed(f"HTTP {response.status}: {raw[:200]!r}")
            return str(json.loads(raw)["server"]["id"])
        raise AssertionError("unreachable")

    def _connection(self) -> client.HTTPConnection:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return client.HTTPConnection(self.host, self.port, timeout=30)


class LibrarySubmitter:
    """:meth:`ComputeAPI.boot` in this process: the front door without HTTP."""

    def __init__(
        self,
        compute: ComputeAPI,
        project: str = PROJECT,
        hosts: HostRequest | None = None,
        group: str | None = None,
    ) -> None:
        self.compute = compute
        self.context = RequestContext.for_project(USER, project)
        self.hosts = hosts  # a host rule every boot asks for (same_host, different_host)
        self.group = group  # the server group every boot joins (the group hint)

    def __call__(self, name: str, flavor: str) -> str:
        if self.hosts is None:
            return self.compute.boot(self.context, name, flavor, IMAGE, group=self.group).uuid
        made = self.compute.boot_many(self.context, name, flavor, IMAGE, group=self.group,
                                      hosts=self.hosts)  # fmt: skip
        return made.instances[0].uuid


def open_loop(
    submit: Submit,
    flavors: Sequence[str],
    rate_per_s: float,
    workers: int,
    stop: threading.Event | None = None,
    tick: Callable[[int], None] | None = None,
) -> list[Sent]:
    """Send ``flavors[i]`` at ``start + i / rate_per_s`` from ``workers`` threads.

    Stops early when ``stop`` is set (requests not yet due are not sent).
    ``tick(sent so far)`` is called about twice a second from this thread.
    """
    todo: queue.SimpleQueue[Sent | None] = queue.SimpleQueue()
    done: list[Sent] = []
    threads = [
        threading.Thread(target=_work, args=(submit, todo, done), daemon=True, name=f"load-{i}")
        for i in range(workers)
    ]
    for thread in threads:
        thread.start()
    start_epoch, start = time.time(), time.perf_counter()
    last_tick = start
    for index, flavor in enumerate(flavors):
        offset = index / rate_per_s
        delay = start + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if stop is not None and stop.is_set():
            break
        todo.put(Sent(index, flavor, start_epoch + offset))
        if tick is not None and time.perf_counter() - last_tick > 0.5:
            last_tick = time.perf_counter()
            tick(index + 1)
    for _ in threads:
        todo.put(None)
    for thread in threads:
        thread.join()
    return sorted(done, key=lambda s: s.index)


def _work(submit: Submit, todo: queue.SimpleQueue[Sent | None], done: list[Sent]) -> None:
    while (item := todo.get()) is not None:
        item.sent = time.time()
        try:
            item.uuid = submit(f"bench-{item.index}", item.flavor)
        except Exception as exc:  # counted and reported, never fatal to the run
            item.error = f"{type(exc).__name__}: {exc}"[:300]
        item.answered = time.time()
        done.append(item)  # list.append is atomic
