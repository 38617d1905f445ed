"""The ledger on a real Redis Sentinel set (one master, two replicas, three sentinels)
that each test starts on loopback (:class:`qsched.stack.sentinel.SentinelSet`).

Claims run from several threads while the master is failed over (``SENTINEL
FAILOVER``) or killed (SIGKILL, promoted by the sentinels on their own): the ledger
must follow to the new master, load its scripts there (a replica's script cache is
empty, so the first call answers ``NOSCRIPT``), and afterwards the audit must find
no over-commit and no usage out of line with the allocations. With ``durability =
replica`` every claim the ledger acknowledged must still be on the new master.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from click.testing import CliRunner

from qsched import exception
from qsched.admin.cli import cli
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Consumer, Instance, Inventory, State
from qsched.ledger.server import RedisServer, wait_for
from qsched.stack.sentinel import RedisServerError, SentinelSet
from tests.conftest import DURABILITY_LINE, require_server
from tests.raw import redis_store

pytestmark = [pytest.mark.real, pytest.mark.chaos, pytest.mark.timeout(90)]

VCPU, RAM = "VCPU", "MEMORY_MB"
PROVIDERS, VCPUS = 4, 60  # 240 one-VCPU claims fill the cloud: the load reaches capacity
THREADS = 4
PACE_S = 0.01  # between two claims of a thread: a load, not a CPU hog on a shared machine


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    """A started set; every process stopped after the test."""
    started = SentinelSet(tmp_path)
    try:
        started.start()
    except (RedisServerError, OSError) as exc:
        require_server(
            "a Redis Sentinel set",
            "loopback ports of its own",
            exc,
            "install redis-server (apt-get install redis-server)",
        )
    try:
        yield started
    finally:
        started.stop()


def _stores(conf, url: str, durability: str = "async", replicas: int = 1) -> Stores:
    conf.set_override("durability", durability, group="ledger")
    conf.set_override("durability_replicas", replicas, group="ledger")
    conf.set_override("durability_timeout_ms", 2000, group="ledger")
    conf.set_override("timeout_s", 3.0, group="ledger")
    conf.set_override("connect_timeout_s", 1.0, group="ledger")
    return open_stores(LedgerOptions.from_conf(conf), url=url)


def _cloud(stores: Stores) -> list[str]:
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    providers = []
    for i in range(PROVIDERS):
        rp = str(uuid.uuid4())
        stores.ledger.create_provider(rp, f"node{i}")
        stores.ledger.set_inventory(rp, 0, {VCPU: Inventory(VCPUS), RAM: Inventory(1 << 20)})
        providers.append(rp)
    return providers


@dataclasses.dataclass
class Tally:
    """What the load saw acknowledged: claims still held (instance -> provider), deletes;
    and how often the ledger refused."""

    held: dict[str, str] = dataclasses.field(default_factory=dict)
    deleted: set[str] = dataclasses.field(default_factory=set)
    acked_at: list[float] = dataclasses.field(default_factory=list)  # of claims
    vanished: list[str] = dataclasses.field(default_factory=list)  # found gone at delete
    full: int = 0  # CapacityExceeded: the claim did not fit
    down: int = 0  # BackendUnavailable: the ledger did not answer, or not durably
    other: list[str] = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __repr__(self) -> str:
        return (
            f"Tally(claims {len(self.acked_at)}, held {len(self.held)}, deleted "
            f"{len(self.deleted)}, vanished {len(self.vanished)}, full {self.full}, "
            f"down {self.down}, other {self.other[:3]})"
        )

    def since(self, moment: float) -> int:
        with self.lock:
            return sum(1 for t in self.acked_at if t > moment)


class ClaimLoad:
    """Threads that each create an instance and claim one VCPU for it, over and over;
    a thread whose claim does not fit deletes one of its instances (a release)."""

    def __init__(self, stores: Stores, providers: list[str]) -> None:
        self.stores = stores
        self.providers = providers
        self.tally = Tally()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(THREADS)]

    def __enter__(self) -> ClaimLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self, seed: int) -> None:
        rng, mine = random.Random(seed), list[str]()
        while not self.stop.is_set():
            try:
                self._claim(rng, mine)
            except exception.CapacityExceeded:
                self.tally.full += 1
                if mine:
                    self._delete(mine.pop(rng.randrange(len(mine))))
            except exception.BackendUnavailable:
                self.tally.down += 1
                self.stop.wait(0.05)
            except exception.InstanceNotFound as exc:  # its acknowledged creation is gone
                self.tally.vanished.append(str(exc))  # (a finding unless replication is async)
            except Exception as exc:  # anything else is a finding
                self.tally.other.append(f"{type(exc).__name__}: {exc}")
            self.stop.wait(PACE_S)

    def _claim(self, rng: random.Random, mine: list[str]) -> None:
        inst = str(uuid.uuid4())
        record = Instance(
            inst, "p1", "u1", "vm", {"name": "f", "vcpus": 1, "ram_mb": 1}, State.BUILD
        )
        self.stores.instances.create(record, deadline=1e12)
        rp = rng.choice(self.providers)
        self.stores.ledger.claim(inst, {rp: {VCPU: 1, RAM: 1}}, "h1", "n1")
        with self.tally.lock:
            self.tally.held[inst] = rp
            self.tally.acked_at.append(time.time())
        mine.append(inst)

    def _delete(self, inst: str) -> None:
        with self.tally.lock:  # until acknowledged, its fate is unknown: not checked
            del self.tally.held[inst]
        try:
            self.stores.instances.delete(inst)
        except exception.InstanceNotFound:  # its acknowledged creation and claim are gone
            self.tally.vanished.append(inst)
            return
        except exception.BackendUnavailable:  # done or not: it stays unchecked
            self.tally.down += 1
            return
        with self.tally.lock:
            self.tally.deleted.add(inst)


def _script_cached(server: RedisServer, stores: Stores, name: str) -> bool:
    """Whether ``server``'s script cache holds the ledger's script ``name``."""
    client = server.client()
    try:
        return bool(client.script_exists(redis_store(stores).script(name).sha)[0])
    finally:
        client.close()


def _check_after(stores: Stores, tally: Tally, durable: bool) -> None:
    """The invariants on the new master; with ``durable``, every acknowledged claim."""
    assert not tally.other, tally.other[:5]
    report = audit(stores)
    assert report.ok, report
    for rp in set(tally.held.values()):
        used = stores.ledger.get_provider(rp).usages.get(VCPU, 0)
        assert used <= VCPUS
    if durable:
        assert not tally.vanished, f"acknowledged claims lost: {tally.vanished[:5]}"
        placed = stores.inspector.consumers()
        lost = [u for u, rp in tally.held.items() if rp not in _allocated(placed, u)]
        assert not lost, f"{len(lost)} of {len(tally.held)} acknowledged claims lost: {lost[:5]}"
        back = [u for u in tally.deleted if u in placed]
        assert not back, f"{len(back)} of {len(tally.deleted)} acknowledged deletes undone"


def _allocated(consumers: dict[str, Consumer], inst: str) -> Mapping[str, object]:
    consumer = consumers.get(inst)
    return consumer.allocations if consumer is not None else {}


def _run_across(
    conf, sentinel_set: SentinelSet, durability: str, replicas: int, fail
) -> tuple[Stores, Tally]:
    """Claims before, during and after ``fail(sentinel_set)``; until 20 more landed after."""
    stores = _stores(conf, sentinel_set.url(), durability, replicas)
    providers = _cloud(stores)
    replicas = sentinel_set.replicas()
    assert not any(_script_cached(r, stores, "allocate") for r in replicas)  # NOSCRIPT awaits there
    with ClaimLoad(stores, providers) as load:
        assert wait_for(lambda: len(load.tally.acked_at) >= 20, 10), load.tally
        fail(sentinel_set)
        promoted = time.time()
        assert wait_for(lambda: load.tally.since(promoted) >= 20, 20), load.tally
    new = sentinel_set.master()
    assert new in replicas
    assert _script_cached(new, stores, "allocate"), (
        "the claim script was not loaded on the new master"
    )
    return stores, load.tally


@pytest.mark.parametrize(("durability", "replicas"), [("async", 1), ("replica", 2)])
def test_claims_follow_a_forced_failover(
    conf, sentinel_set: SentinelSet, durability: str, replicas: int
) -> None:
    stores, tally = _run_across(conf, sentinel_set, durability, replicas, SentinelSet.failover)
    _check_after(stores, tally, durable=durability == "replica")
    stores.backend.close()


def test_no_acknowledged_claim_is_lost_when_the_master_is_killed(
    conf, sentinel_set: SentinelSet
) -> None:
    killed: list[RedisServer] = []
    stores, tally = _run_across(
        conf, sentinel_set, "replica", 1, lambda s: killed.append(s.kill_master()[0])
    )
    assert tally.down, "the load never saw the master gone: the test proved nothing"
    _check_after(stores, tally, durable=True)
    sentinel_set.rejoin(killed[0])  # the old master comes back as a replica, with the writes
    assert redis_store(stores).client.ping()
    stores.backend.close()


def test_the_admin_cli_and_its_janitor_read_the_ledger_through_the_sentinels(
    conf, sentinel_set: SentinelSet, tmp_path: Path
) -> None:
    providers = _cloud(_stores(conf, sentinel_set.url(), "replica", 2))  # on both replicas
    sentinel_set.kill_master()  # what they read is on the promoted replica
    config = tmp_path / "qsched.conf"
    config.write_text(f"[ledger]\nurl = {sentinel_set.url()}\n{DURABILITY_LINE}")
    runner = CliRunner()
    listed = runner.invoke(cli, ["--config-file", str(config), "providers", "-f", "json"])
    assert listed.exit_code == 0, listed.output
    assert {p["uuid"] for p in json.loads(listed.output)} == set(providers)
    janitor = runner.invoke(cli, ["--config-file", str(config), "janitor", "run", "--dry-run"])
    assert janitor.exit_code == 0, janitor.output
