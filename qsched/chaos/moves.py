"""Moves under the faults: a stream of resizes, cold and live migrations, shelves and
unshelves of the load's servers, through the HTTP API (docs/moves.rst).

Every ``1 / rate`` seconds on average the mover picks one of the load's accepted
servers not yet deleted and asks one move of it, as its project's user (resize,
shelve) or the admin (migrate, live migration). A resize or a cold migration that
reaches VERIFY_RESIZE is confirmed or reverted a moment later; a server shelved and
offloaded is unshelved. When the load stops, :meth:`Mover.finish` confirms every move
of its servers still waiting for one, so that the checks find every migration ended:
what a move left behind (an allocation, a migration consumer, a copy on a second
host) is then a finding of the run's checks (``leaks``, ``moves``, the drivers').
Every call is recorded as the load's are; answers the state of the server refuses
(409: it moves already, it was deleted) are part of the game and counted.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http import client
from typing import Any

from qsched.chaos.load import Call, LoadGenerator, token
from qsched.stack import http_call

ADMIN = "admin"
#: the moves asked, with their weights
MOVES = (("resize", 3), ("migrate", 2), ("live", 3), ("shelve", 2))
FOLLOW_UP_S = 2.0  # a move's confirm, revert or unshelve is looked at after this
FOLLOW_UPS = 10  # how often a server not there yet is looked at again
CONFIRM_TRIES = 20


class Mover:
    """Moves of the load's servers against the API at 127.0.0.1:``port``."""

    def __init__(
        self,
        port: int,
        load: LoadGenerator,
        flavors: list[str],
        rate: float = 1.0,
        seed: int = 1,
        clients: int = 2,
        timeout_s: float = 30.0,
    ) -> None:
        self.port = port
        self.load = load
        self.flavors = flavors
        self.rate = rate
        self.timeout_s = timeout_s
        self.rng = random.Random(seed)
        self.calls: list[Call] = []
        self.asked: Counter[str] = Counter()
        self.moved: dict[str, str] = {}  # server -> its project
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(clients, thread_name_prefix="chaos-mover")
        self._due: list[tuple[float, int, str, str, int]] = []  # (at, seq, uuid, project, n)
        self._seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-mover", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask no more moves; wait for the calls in flight."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        self._pool.shutdown(wait=True)

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def finish(self, timeout_s: float = 60.0) -> list[str]:
        """Confirm every moved server that waits for a confirm (a fault may have eaten
        the first one); the servers still waiting at ``timeout_s``."""
        deadline = time.time() + timeout_s
        waiting = sorted(self.moved)
        for _ in range(CONFIRM_TRIES):
            left = []
            for uuid in waiting:
                status = self._status(uuid)
                if status == "VERIFY_RESIZE":
                    self._call("confirmResize", uuid, self.moved[uuid], {"confirmResize": None})
                if status in ("VERIFY_RESIZE", "RESIZE", "REVERT_RESIZE", "MIGRATING"):
                    left.append(uuid)
            waiting = left
            if not waiting or time.time() > deadline:
                break
            time.sleep(1.0)
        return waiting

    # -- the schedule ------------------------------------------------------------------

    def _run(self) -> None:
        next_move = time.monotonic() + self.rng.expovariate(self.rate)
        while not self._stop.is_set():
            if time.monotonic() >= next_move:
                self._pool.submit(self._move)
                next_move += self.rng.expovariate(self.rate)
            self._follow_ups()
            self._stop.wait(0.05)

    def _candidate(self) -> tuple[str, str] | None:
        calls = self.load.snapshot()
        deleted = {c.uuid for c in calls if c.kind == "delete"}
        live = [
            (c.uuid, c.project)
            for c in calls
            if c.kind == "boot" and c.status == 202 and c.uuid and c.uuid not in deleted
        ]
        return self.rng.choice(live) if live else None

    def _move(self) -> None:
        with self._lock:
            picked = self._candidate()
            if picked is None:
                return
            kind = self.rng.choices([m for m, _ in MOVES], [w for _, w in MOVES])[0]
            flavor = self.rng.choice(self.flavors)
        uuid, project = picked
        if kind == "resize":
            call = self._call(kind, uuid, project, {"resize": {"flavorRef": flavor}})
        elif kind == "migrate":
            call = self._call(kind, uuid, project, {"migrate": None}, ADMIN)
        elif kind == "live":
            body = {"os-migrateLive": {"host": None, "block_migration": "auto"}}
            call = self._call(kind, uuid, project, body, ADMIN, "2.25")
        else:
            call = self._call(kind, uuid, project, {"shelve": None})
        if call.status == 202:
            with self._lock:
                self.moved[uuid] = project
            self._later(uuid, project, 0)

    def _later(self, uuid: str, project: str, times: int) -> None:
        with self._lock:
            self._seq += 1
            heapq.heappush(self._due, (time.time() + FOLLOW_UP_S, self._seq, uuid, project, times))

    def _follow_ups(self) -> None:
        now = time.time()
        while True:
            with self._lock:
                if not self._due or self._due[0][0] > now:
                    return
                _at, _seq, uuid, project, times = heapq.heappop(self._due)
            self._pool.submit(self._follow_up, uuid, project, times)

    def _follow_up(self, uuid: str, project: str, times: int) -> None:
        """Confirm or revert a move that waits for it, unshelve a server offloaded; look
        again later at one still on its way."""
        status = self._status(uuid, project)
        if status == "VERIFY_RESIZE":
            confirm = self.rng.random() < 0.5
            step = "confirmResize" if confirm else "revertResize"
            self._call(step, uuid, project, {step: None})
        elif status == "SHELVED_OFFLOADED":
            self._call("unshelve", uuid, project, {"unshelve": None})
        elif times < FOLLOW_UPS and (
            status in ("RESIZE", "MIGRATING", "SHELVED") or (status == "ACTIVE" and times == 0)
        ):  # a move on its way, a shelve not offloaded yet: look again
            self._later(uuid, project, times + 1)

    # -- the calls ---------------------------------------------------------------------

    def _status(self, uuid: str, project: str | None = None) -> str:
        try:
            who = token(project) if project else ADMIN
            code, reply = http_call(
                self.port, "GET", f"/v2.1/servers/{uuid}", None, who, self.timeout_s
            )
        except (OSError, client.HTTPException, ValueError):
            return ""
        return str((reply.get("server") or {}).get("status", "")) if code == 200 else ""

    def _call(
        self,
        kind: str,
        uuid: str,
        project: str,
        body: Any,
        as_whom: str | None = None,
        version: str | None = None,
    ) -> Call:
        call = Call(f"move:{kind}", uuid, project, time.time(), uuid=uuid)
        try:
            call.status, _reply = http_call(
                self.port, "POST", f"/v2.1/servers/{uuid}/action", body,
                as_whom or token(project), self.timeout_s, version,
            )  # fmt: skip
        except (OSError, client.HTTPException, ValueError) as exc:
            call.error = f"{type(exc).__name__}: {exc}"
        call.done = time.time()
        with self._lock:
            self.calls.append(call)
            self.asked[f"{kind}:{call.status}"] += 1
        return call
