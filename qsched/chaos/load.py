"""The load: a sustained, bounded stream of boots and deletes through the HTTP API.

Boots arrive as a Poisson stream at ``rate`` per second from a fixed pool of
client threads; when every client is busy (the API is slow during an outage)
a boot is skipped and counted, never queued, so the load stays bounded. Each
accepted server is deleted after a random lifetime; some very soon, to race
the delete with the placement. A delete answered 409, 5xx or not at all is
tried again a few times. Every call is recorded with its times and status:
the checks compare the ledger with what the client saw.

A share of the boots (``DIFFERENT_HOST_SHARE``) asks, with the ``different_host``
scheduler hint, to keep away from the project's latest accepted server: the audit
then checks that no claim broke a host rule while faults ran.

Instance names carry the run's tag and a sequence number, so a request the API
refused (503) can be looked up by name: the API picks the UUID.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http import client
from typing import Any

from qsched.stack import http_call

IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"  # the fake driver boots no image
SHORT_LIFE_SHARE = 0.15  # deleted within ~1.5 s: races the delete with the claim
DELETE_TRIES = 6
DIFFERENT_HOST_SHARE = 0.2  # boots that keep away from the project's latest server


@dataclasses.dataclass
class Call:
    """One HTTP call the load made, as the client saw it."""

    kind: str  # "boot" or "delete"
    name: str  # the instance name (boots) or its UUID (deletes)
    project: str
    sent: float
    done: float = 0.0
    status: int | None = None  # None: no answer (connection refused, reset, timeout)
    uuid: str | None = None
    error: str = ""
    attempt: int = 1


@dataclasses.dataclass(order=True)
class _Due:
    at: float
    uuid: str = dataclasses.field(compare=False)
    project: str = dataclasses.field(compare=False)
    attempt: int = dataclasses.field(compare=False, default=1)


class LoadGenerator:
    """Boots and deletes against the API at 127.0.0.1:``port``; see the module docstring."""

    def __init__(
        self,
        port: int,
        projects: list[str],
        flavors: list[tuple[str, int]],
        tag: str,
        rate: float = 4.0,
        lifetime_s: float = 8.0,
        clients: int = 8,
        seed: int = 1,
        timeout_s: float = 30.0,
    ) -> None:
        self.port = port
        self.projects = projects
        self.flavors = [name for name, _ in flavors]
        self.weights = [weight for _, weight in flavors]
        self.tag = tag
        self.rate = rate
        self.lifetime_s = lifetime_s
        self.timeout_s = timeout_s
        self.rng = random.Random(seed)
        self.calls: list[Call] = []
        self.skipped: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(clients)
        self._pool = ThreadPoolExecutor(clients, thread_name_prefix="chaos-client")
        self._due: list[_Due] = []
        self._seq = 0
        self._latest: dict[str, str] = {}  # project -> its latest accepted server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)

    # -- control -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sending; wait for the calls in flight to answer (or time out)."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        self._pool.shutdown(wait=True)

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def burst(self, count: int) -> int:
        """Send up to ``count`` boots at once (as many as clients are free); how many."""
        sent = 0
        for _ in range(count):
            if not self._submit_boot():
                break
            sent += 1
        return sent

    # -- the schedule ------------------------------------------------------------------

    def _run(self) -> None:
        next_boot = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_boot:
                self._submit_boot()
                next_boot = max(next_boot + self.rng.expovariate(self.rate), now - 1.0)
            self._submit_due_deletes()
            self._stop.wait(max(0.0, min(next_boot - time.monotonic(), 0.05)))

    def _submit_boot(self) -> bool:
        with self._lock:
            if not self._slots.acquire(blocking=False):
                self.skipped["boot"] += 1
                return False
            self._seq += 1
            seq = self._seq
            name = f"{self.tag}-{seq:06d}"
            project = self.projects[seq % len(self.projects)]
            flavor = self.rng.choices(self.flavors, self.weights)[0]
            life_s = (
                self.rng.uniform(0.0, 1.5)
                if self.rng.random() < SHORT_LIFE_SHARE
                else self.rng.expovariate(1.0 / self.lifetime_s)
            )
            apart = self._latest.get(project) if self.rng.random() < DIFFERENT_HOST_SHARE else None
        self._pool.submit(self._release_after, self._boot, name, project, flavor, life_s, apart)
        return True

    def _submit_due_deletes(self) -> None:
        now = time.time()
        while True:
            with self._lock:
                if not self._due or self._due[0].at > now:
                    return
                due = heapq.heappop(self._due)
            if not self._slots.acquire(blocking=False):
                self._schedule(dataclasses.replace(due, at=now + 0.5))
                self.skipped["delete"] += 1
                return
            self._pool.submit(self._release_after, self._delete, due)

    def _schedule(self, due: _Due) -> None:
        with self._lock:
            heapq.heappush(self._due, due)

    def _release_after(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        finally:
            self._slots.release()

    # -- the calls ---------------------------------------------------------------------

    def _boot(self, name: str, project: str, flavor: str, life_s: float, apart: str | None) -> None:
        body: dict[str, Any] = {"server": {"name": name, "flavorRef": flavor, "imageRef": IMAGE}}
        if apart is not None:
            body["os:scheduler_hints"] = {"different_host": [apart]}
        call = self._call("boot", name, project, "POST", "/v2.1/servers", body)
        if call.status == 202 and call.uuid:
            with self._lock:
                self._latest[project] = call.uuid
            self._schedule(_Due(call.done + life_s, call.uuid, project))

    def _delete(self, due: _Due) -> None:
        path = f"/v2.1/servers/{due.uuid}"
        call = self._call("delete", due.uuid, due.project, "DELETE", path, attempt=due.attempt)
        call.uuid = due.uuid
        retry = call.status is None or call.status == 409 or call.status >= 500
        if retry and due.attempt < DELETE_TRIES and not self._stop.is_set():
            self._schedule(
                _Due(time.time() + 2.0 * due.attempt, due.uuid, due.project, due.attempt + 1)
            )

    def _call(
        self,
        kind: str,
        name: str,
        project: str,
        method: str,
        path: str,
        body: Any = None,
        attempt: int = 1,
    ) -> Call:
        call = Call(kind, name, project, time.time(), attempt=attempt)
        try:
            call.status, reply = http_call(
                self.port, method, path, body, token(project), self.timeout_s
            )
            call.uuid = (reply.get("server") or {}).get("id")
        except (OSError, client.HTTPException, ValueError) as exc:
            call.error = f"{type(exc).__name__}: {exc}"
        call.done = time.time()
        with self._lock:
            self.calls.append(call)
        return call


def token(project: str) -> str:
    """The noauth2 token of the load's user in ``project``."""
    return f"chaos:{project}"
