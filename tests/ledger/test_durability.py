"""The [ledger] durability setting on real servers the tests start: what each promises.

``replica`` acknowledges a write only once a replica holds it; ``disk``, the default,
only on a server that fsyncs before it answers, and a server that does not is refused
with what to set. The machine-crash emulation the chaos run
uses is checked here too: it must lose the unsynced tail under ``everysec`` (else
the chaos figures for ``async`` would prove nothing) and nothing under ``always``.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from qsched import exception
from qsched.conf import LedgerOptions
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import Instance, State
from qsched.ledger.durability import DurabilityRefused
from qsched.ledger.server import AofSampler, RedisServer
from tests.conftest import require_server
from tests.raw import redis_store

pytestmark = [pytest.mark.real, pytest.mark.timeout(120)]

FLAVOR = Flavor("small", 1, 1024, 0)


def _server(tmp: Path, name: str, **kwargs: object) -> RedisServer:
    try:
        server = RedisServer(tmp, name, **kwargs)  # type: ignore[arg-type]
        server.start()
    except Exception as exc:
        require_server("redis-server", f"a port of its own ({name})", exc,
                       "install redis-server (apt-get install redis-server)")  # fmt: skip
        raise
    return server


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and its replica, linked."""
    master = _server(tmp_path, "master")
    replica = _server(tmp_path, "replica", replica_of=master)
    try:
        assert replica.wait_synced(), "the replica did not link to its master"
        yield master, replica
    finally:
        replica.stop()
        master.stop()


def _stores(conf, url: str, durability: str, timeout_ms: int = 500) -> Stores:
    conf.set_override("durability", durability, group="ledger")
    conf.set_override("durability_timeout_ms", timeout_ms, group="ledger")
    return open_stores(LedgerOptions.from_conf(conf), url=url)


def _create(stores: Stores) -> str:
    record = Instance(str(uuid.uuid4()), "p1", "u1", "vm", FLAVOR.to_dict(), State.BUILD)
    return stores.instances.create(record, 1e12).uuid


def test_replica_durability_acknowledges_what_a_replica_holds(conf, pair) -> None:
    master, replica = pair
    stores = _stores(conf, master.url, "replica", timeout_ms=10_000)  # a loaded machine
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    created = _create(stores)
    # the moment it is acknowledged, the replica has it
    assert replica.client().hget(redis_store(stores).keys.instance(created), "state") == b"BUILD"
    stores.flavors.create(FLAVOR)  # an admin write waits too (a barrier)
    assert replica.client().hexists(redis_store(stores).keys.flavors, "small")


def test_replica_durability_fails_a_write_no_replica_acknowledged(conf, pair) -> None:
    master, replica = pair
    stores = _stores(conf, master.url, "replica", timeout_ms=200)
    replica.stop(signal.SIGKILL)  # its machine is gone
    with pytest.raises(exception.BackendUnavailable, match="0 of 1 replicas"):
        _create(stores)
    with pytest.raises(exception.BackendUnavailable, match="0 of 1 replicas"):
        stores.quota.set_limits("p1", instances=3)


def test_disk_durability_needs_a_server_that_fsyncs_before_it_answers(conf, tmp_path: Path) -> None:
    everysec = _server(tmp_path, "everysec")
    always = _server(tmp_path, "always", fsync="always")
    try:
        with pytest.raises(DurabilityRefused, match="appendfsync everysec"):
            _stores(conf, everysec.url, "disk")
        stores = _stores(conf, always.url, "disk")
        _create(stores)
    finally:
        everysec.stop()
        always.stop()


def test_the_default_opens_a_server_that_fsyncs_and_refuses_one_without_an_aof(
    tmp_path: Path,
) -> None:
    """The shipped options, untouched: ``disk``. A server without an AOF is refused at
    open with the redis.conf lines to add and the way to opt out; one with them opens."""
    default = LedgerOptions.defaults()
    assert default.durability == "disk"
    bare = _server(tmp_path, "bare")
    always = _server(tmp_path, "always", fsync="always")
    try:
        bare.client().config_set("appendonly", "no")  # as a Redis installed as shipped
        with pytest.raises(DurabilityRefused) as err:
            open_stores(default, url=bare.url)
        message = str(err.value)
        assert message.startswith("[ledger] durability = disk: the ledger's Redis")
        assert "it runs appendonly no, appendfsync everysec" in message
        lines = "appendonly yes; appendfsync always; no-appendfsync-on-rewrite no"
        assert f"set in its redis.conf (deploy/redis-ledger.conf): {lines}" in message
        assert "durability = replica" in message and "or async (opting out" in message
        stores = open_stores(default, url=always.url)
        _create(stores)
        always.client().config_set("no-appendfsync-on-rewrite", "yes")  # a rewrite skips fsync
        with pytest.raises(DurabilityRefused, match="it runs no-appendfsync-on-rewrite yes:"):
            open_stores(default, url=always.url)
    finally:
        bare.stop()
        always.stop()


def test_a_server_that_refuses_config_cannot_be_checked(tmp_path: Path) -> None:
    """A user without CONFIG in its ACL (as on a managed Redis): refused, saying why."""
    always = _server(tmp_path, "acl", fsync="always")
    try:
        always.client().acl_setuser("qsched", enabled=True, passwords=["+pw"], keys=["*"],
                                    commands=["+@all", "-config"])  # fmt: skip
        url = f"redis://qsched:pw@127.0.0.1:{always.port}/0"
        with pytest.raises(DurabilityRefused, match=r"refused CONFIG GET .* cannot be checked"):
            open_stores(LedgerOptions.defaults(), url=url)
        open_stores(LedgerOptions.defaults().replace(durability="async"), url=url)
    finally:
        always.stop()


@pytest.mark.parametrize("durability", ["replica", "disk"])
def test_fakeredis_cannot_keep_a_durable_promise(conf, durability: str) -> None:
    with pytest.raises(DurabilityRefused, match="needs a real Redis") as err:
        _stores(conf, f"fakeredis://d-{uuid.uuid4().hex}", durability)
    assert "or durability = async to run on the embedded ledger" in str(err.value)


def _write_until_crash(
    conf, server: RedisServer, sampler: AofSampler, lose_s: float
) -> tuple[list[str], dict[str, float]]:
    """Write records for a while, crash the machine mid-stream; what was acknowledged."""
    stores = _stores(conf, server.url, "async")
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    acked: list[str] = []
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            try:
                acked.append(_create(stores))
            except exception.BackendUnavailable:
                return

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(2.0)  # past a second of samples
    cut = server.crash(sampler, lose_s=lose_s, outage_s=0.0, abort=threading.Event())
    stop.set()
    writer.join(10)
    return acked, cut


@pytest.mark.parametrize(("fsync", "lose_s"), [("everysec", 1.0), ("always", 0.0)])
def test_a_machine_crash_loses_what_the_disk_did_not_have(
    conf, tmp_path: Path, fsync: str, lose_s: float
) -> None:
    server = _server(tmp_path, f"crash-{fsync}", fsync=fsync)
    sampler = AofSampler(server)
    sampler.start()
    try:
        acked, cut = _write_until_crash(conf, server, sampler, lose_s)
        stores = _stores(conf, server.url, "async")
        found = stores.instances.get_many(acked)
        lost = [u for u in acked if u not in found]
        if fsync == "everysec":
            assert cut["lost_bytes"] > 0 and lost, (cut, len(acked))
            assert lost == acked[-len(lost) :]  # the newest ones, a suffix
        else:
            assert cut["lost_bytes"] == 0 and lost == [], (cut, len(lost))
    finally:
        sampler.stop()
        server.stop(signal.SIGKILL)
