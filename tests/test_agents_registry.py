"""Agent heartbeats and live classes, against fakeredis and a real Redis."""

from __future__ import annotations

import time

from qsched.ledger import Stores
from tests.raw import redis_store


def test_heartbeat_expires(stores: Stores) -> None:
    stores.agents.heartbeat("cn1", ttl_s=0.2, nodes=3)
    assert stores.agents.alive("cn1") and not stores.agents.alive("cn2")
    (info,) = stores.agents.list()
    assert (info.host, info.alive, info.detail) == ("cn1", True, {"nodes": 3})
    deadline = time.time() + 5
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
