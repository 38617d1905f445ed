"""Boots that hold quota for nothing: recorded and never published, or told 503.

The instance record is the outbox: a boot recorded and not confirmed by the
broker is published by the janitor after ``outbox_grace_s``; a boot whose client
was told 503 while its create's outcome was unknown is abandoned, whether the
create ran before, after, or never.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from qsched import exception
from qsched.chaos.servers import RedisServer
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, LedgerOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, State, Usage
from qsched.recovery import janitor
from qsched.scheduling.message import BootRequest
from qsched.scheduling.records import record_for
from tests.agents.test_convergence import SPEC, freeze, start
from tests.conftest import require_server
from tests.helpers import wait_until
from tests.raw import DeadClient, redis_store

USER = RequestContext.for_project("u1", "p1")


class WorkerKilled(BaseException):
    """The front door's process died here: nothing after it runs."""


def kill_in_publish(bus: Any) -> None:
    def publish_boot(msg: Any) -> None:
        raise WorkerKilled

    bus.publish_boot = publish_boot


def test_a_boot_recorded_and_never_published_is_published_by_the_janitor(
    conf, stores, bus, api, agents
) -> None:
    agents.append(start(conf, stores, bus, "cn0"))
    real = bus.publish_boot
    kill_in_publish(bus)
    with pytest.raises(WorkerKilled):
        api.boot(USER, "vm", "small")
    bus.publish_boot = real
    ((stranded, _),) = stores.instances.unpublished()
    assert stores.instances.get(stranded).state == State.BUILD
    assert janitor.run(stores, bus, outbox_grace_s=60).published == []  # not stranded yet
    assert janitor.run(stores, bus, outbox_grace_s=0).published == [stranded]
    assert wait_until(lambda: stores.instances.get(stranded).state == State.ACTIVE, 10)
    assert stores.instances.unpublished() == []
    assert audit(stores).ok


def test_a_requeue_whose_publish_was_lost_is_published_by_the_janitor(
    conf, stores, bus, api, agents
) -> None:
    """An agent requeued a failed spawn and died before it published the request."""
    from agents.virt.fake import FakeDriver

    def die(instance: str, node: str) -> None:
        raise WorkerKilled

    agent = start(conf, stores, bus, "cn0", FakeDriver(1, SPEC, host="cn0", spawn_hook=die))
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.building("cn0") == {inst}, 10)
    freeze(agent)
    stores.instances.requeue(inst, "cn0", "spawn failed")  # and then the agent died
    assert [u for u, _ in stores.instances.unpublished()] == [inst]
    agents.append(start(conf, stores, bus, "cn1"))
    assert janitor.run(stores, bus, outbox_grace_s=0).published == [inst]
    assert wait_until(lambda: stores.instances.get(inst).state == State.ACTIVE, 10)
    assert stores.instances.get(inst).host == "cn1"


def test_confirmed_boots_leave_the_outbox_and_are_not_published_twice(
    conf, stores, bus, api
) -> None:
    """No agent: the request waits in its queue, and the janitor leaves it there."""
    inst = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: stores.instances.unpublished() == [], 5)
    assert janitor.run(stores, bus, outbox_grace_s=0).published == []
    assert stores.instances.get(inst).state == State.BUILD


def test_an_outbox_entry_is_taken_once_and_a_newer_one_kept(stores, api) -> None:
    inst = stores.instances.create(_record(), 1e12)
    assert stores.instances.outbox_take(0.0) == [(inst.uuid, _score(stores, inst.uuid))]
    assert stores.instances.outbox_take(0.5) == []  # another janitor: taken, not due again
    old = inst.outbox
    assert old is not None and stores.instances.outbox_done([(inst.uuid, old)]) == 0  # taken
    stores.instances.requeue(inst.uuid, None, "again")
    assert stores.instances.outbox_done([(inst.uuid, old)]) == 0
    assert [u for u, _ in stores.instances.unpublished()] == [inst.uuid]


def _boot_when_create(monkeypatch: pytest.MonkeyPatch, api: ComputeAPI, stores: Any,
                      create: Any) -> None:  # fmt: skip
    """Boot with ``create`` in place of the store's own: the API must answer 503."""
    monkeypatch.setattr(stores.instances, "create", create)
    with pytest.raises(exception.BackendUnavailable):
        api.boot(USER, "vm", "small")
    monkeypatch.undo()


TIMEOUT = exception.BackendUnavailable(backend="Redis", url="ledger", reason="timeout")


def test_a_create_whose_reply_was_lost_is_abandoned(
    conf, stores, bus, api, agents, monkeypatch
) -> None:
    """The create ran, its answer did not come: the client gets 503 and nothing boots."""
    real = stores.instances.create

    def ran_then_timed_out(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise TIMEOUT

    _boot_when_create(monkeypatch, api, stores, ran_then_timed_out)
    assert wait_until(lambda: api.cell.abandoner.pending == 0, 5)
    (record,) = _records(stores)
    assert record.state == State.DELETED
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0)
    assert stores.instances.unpublished() == []
    assert audit(stores).ok


def test_a_create_that_runs_after_its_abandon_is_refused(
    conf, stores, bus, api, monkeypatch
) -> None:
    """The create waited in a stalled server's buffers and ran after the 503."""
    real, held = stores.instances.create, []

    def stalled(*args: Any, **kwargs: Any) -> Any:
        held.append((args, kwargs))
        raise TIMEOUT

    _boot_when_create(monkeypatch, api, stores, stalled)
    assert wait_until(lambda: api.cell.abandoner.pending == 0, 5)
    ((args, kwargs),) = held
    with pytest.raises(exception.InstanceAbandoned):
        real(*args, **kwargs)  # the server runs it now
    assert _records(stores) == []
    assert stores.quota.get_usage("p1") == Usage(0, 0, 0)


def test_the_outbox_pass_waits_for_the_ledger_to_settle(stores, bus) -> None:
    """After an outage the front doors' abandons land first; the pass waits for them."""
    outbox = janitor.OutboxPass(stores, bus, grace_s=0.0, settle_s=0.3)
    stranded = stores.instances.create(_record(), 1e12).uuid
    live = redis_store(stores).client
    redis_store(stores).client = DeadClient()  # type: ignore[assignment]
    with pytest.raises(exception.BackendUnavailable):
        outbox()
    redis_store(stores).client = live
    assert outbox() == []  # back, but not for long enough
    time.sleep(0.35)
    assert outbox() == [stranded]


@pytest.mark.real
@pytest.mark.timeout(120)
def test_a_stalled_ledger_leaves_no_boot_behind(conf, bus, tmp_path: Path) -> None:
    """SIGSTOP the ledger's Redis under a boot: 503, then after SIGCONT nothing is held."""
    server = _own_redis(tmp_path)
    try:
        conf.set_override("timeout_s", 0.5, group="ledger")
        stores = open_stores(LedgerOptions.from_conf(conf), url=server.url)
        api = ComputeAPI(stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf))
        api.cell.flavors.create(Flavor("small", 1, 1024, 0))
        stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        first = api.boot(USER, "first", "small").uuid  # the flavor is in memory now
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(exception.BackendUnavailable):
                api.boot(USER, "late", "small")  # its create waits in the server's buffers
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert wait_until(lambda: api.cell.abandoner.pending == 0, 30)
        late = [r for r in _records(stores) if r.uuid != first]
        assert all(r.state == State.DELETED for r in late), late
        assert stores.quota.get_usage("p1") == Usage(1, 1, 1024)  # the first one only
        api.cell.confirmations.flush()
        assert stores.instances.unpublished() == []
    finally:
        server.stop()


def _own_redis(tmp_path: Path) -> RedisServer:
    try:
        server = RedisServer(tmp_path, "ledger")
        server.start()
    except Exception as exc:
        require_server("redis-server", "a port of its own", exc, "install redis-server")
        raise
    return server


def _record() -> Instance:
    request = BootRequest.create(str(uuid.uuid4()), "p1", "u1", Flavor("small", 1, 1024, 0))
    return record_for(request, "vm")


def _score(stores: Any, uuid: str) -> str:
    return f"{redis_store(stores).client.zscore(redis_store(stores).keys.outbox, uuid):.6f}"


def _records(stores: Any) -> list[Instance]:
    """Every instance record of the cell (a test-sized scan)."""
    uuids = sorted(stores.inspector.instance_records())
    return list(stores.instances.get_many(uuids).values())
