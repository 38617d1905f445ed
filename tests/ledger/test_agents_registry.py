"""Agent heartbeats and live classes, against fakeredis and a real Redis."""

from __future__ import annotations

import time
import uuid

import pytest

from qsched import exception
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores
from tests.raw import redis_store


def test_heartbeat_expires(stores: Stores) -> None:
    stores.agents.heartbeat("cn1", ttl_s=1.0, nodes=3)  # read alive within it, even loaded
    assert stores.agents.alive("cn1") and not stores.agents.alive("cn2")
    (info,) = stores.agents.list()
    assert (info.host, info.alive, info.detail) == ("cn1", True, {"nodes": 3})
    deadline = time.time() + 10
    while stores.agents.alive("cn1") and time.time() < deadline:
        time.sleep(0.05)
    assert not stores.agents.alive("cn1")
    assert [(i.host, i.alive) for i in stores.agents.list()] == [("cn1", False)]


def test_last_seen_outlives_the_heartbeat(stores: Stores) -> None:
    assert stores.agents.last_seen("cn1") is None
    before = time.time()
    stores.agents.heartbeat("cn1", ttl_s=0.05)
    seen = stores.agents.last_seen("cn1")
    time.sleep(0.1)
    assert seen is not None and seen >= before and not stores.agents.alive("cn1")
    assert stores.agents.last_seen("cn1") == seen


def test_a_heartbeat_after_the_server_lost_its_scripts(conf) -> None:
    """The heartbeat's script is loaded once and sent as EVALSHA in the pipeline: a
    server that lost its script cache (restarted, or a replica that took over) answers
    NOSCRIPT, and the heartbeat loads it again. fakeredis only: a SCRIPT FLUSH on the
    shared Redis would reach every test using it (the cluster has its own test)."""
    stores = open_stores(LedgerOptions.from_conf(conf), url=f"fakeredis://t-{uuid.uuid4().hex}")
    stores.agents.heartbeat("cn1", ttl_s=60)
    redis_store(stores).client.script_flush()
    stores.agents.heartbeat("cn2", ttl_s=60)
    assert stores.agents.alive("cn1") and stores.agents.alive("cn2")


def test_forget(stores: Stores) -> None:
    stores.agents.heartbeat("cn1", ttl_s=60)
    stores.agents.forget("cn1")
    assert not stores.agents.alive("cn1")


def test_zones_are_registered_and_kept(stores: Stores) -> None:
    assert stores.agents.zones() == set() and not stores.agents.has_zone("az1")
    for zone in ("az1", "nova", "az1"):  # every agent of a zone registers it at start
        stores.agents.add_zone(zone)
    assert stores.agents.zones() == {"az1", "nova"}
    assert stores.agents.has_zone("az1") and not stores.agents.has_zone("az2")
    assert redis_store(stores).keys.zones == "qsched:{cell1}:zones"  # in the cell's slot


def test_classes_are_published_once(stores: Stores) -> None:
    assert stores.agents.add_class("m1.small", {"flavor": {"name": "m1.small"}})
    assert not stores.agents.add_class("m1.small", {"flavor": {"name": "other"}})
    assert stores.agents.classes() == {"m1.small": {"flavor": {"name": "m1.small"}}}


def test_a_service_is_registered_once_and_enabled(stores: Stores) -> None:
    assert stores.agents.heartbeat("cn1", ttl_s=60) is None  # no service yet
    first = stores.agents.register_service("cn1")
    assert (first.host, first.seq, first.schedulable, first.disabled_reason) == (
        "cn1", 1, True, None,
    )  # fmt: skip
    assert str(uuid.UUID(first.id)) == first.id
    assert stores.agents.register_service("cn1") == first  # a restart keeps its id
    second = stores.agents.register_service("cn2", "az1")
    assert (second.seq, second.zone, first.zone) == (2, "az1", None) and second.id != first.id
    assert stores.agents.register_service("cn2").zone is None  # restarted in no zone
    assert stores.agents.heartbeat("cn1", ttl_s=60) == first
    assert stores.agents.service_host(first.id) == "cn1"
    assert [s.host for s in stores.agents.services()] == ["cn1", "cn2"]
    with pytest.raises(exception.ServiceNotFound):
        stores.agents.service_host(str(uuid.uuid4()))


def test_disable_with_a_reason_enable_and_force_down(stores: Stores) -> None:
    stores.agents.register_service("cn1")
    stores.agents.heartbeat("cn1", ttl_s=60)
    off = stores.agents.update_service("cn1", disabled=True, disabled_reason="new disks")
    assert (off.disabled, off.disabled_reason, off.schedulable) == (True, "new disks", False)
    assert off.updated_at is not None
    assert stores.agents.heartbeat("cn1", ttl_s=60) == off
    assert stores.agents.alive("cn1")  # disabled is not down
    down = stores.agents.update_service("cn1", forced_down=True)
    assert (down.disabled, down.disabled_reason, down.forced_down) == (True, "new disks", True)
    assert not stores.agents.alive("cn1") and not stores.agents.list()[0].alive
    on = stores.agents.update_service("cn1", disabled=False, forced_down=False)
    assert (on.disabled, on.disabled_reason, on.forced_down) == (False, None, False)
    assert stores.agents.alive("cn1") and stores.agents.service("cn1") == on
    again = stores.agents.update_service("cn1", disabled=True)
    assert (again.disabled, again.disabled_reason) == (True, None)


def test_an_unknown_host_has_no_service(stores: Stores) -> None:
    with pytest.raises(exception.ComputeHostNotFound):
        stores.agents.update_service("cn9", disabled=True)
    with pytest.raises(exception.ComputeHostNotFound):
        stores.agents.service("cn9")
    assert stores.agents.services() == []
