"""The deadline reaper, against fakeredis and a real Redis."""

from __future__ import annotations

import uuid

from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, State, Usage
from qsched.recovery.reaper import NO_VALID_HOST, reap_expired
from tests.raw import redis_store

FLAVOR = {"name": "huge", "vcpus": 4, "ram_mb": 4096}


def boot(stores: Stores, deadline: float) -> str:
    inst = Instance(str(uuid.uuid4()), "p1", "u1", "vm", FLAVOR, State.BUILD)
    return stores.instances.create(inst, deadline=deadline).uuid


def test_expired_requests_end_in_no_valid_host(stores: Stores) -> None:
    late, early = boot(stores, deadline=10.0), boot(stores, deadline=1000.0)
    stores.instances.add_event(late, "refused", host="cn1", reason="not enough VCPU: 2 free of 4")
    assert reap_expired(stores, now=20.0) == 1
    failed = stores.instances.get(late)
    assert failed.state == State.ERROR and failed.fault is not None
    assert failed.fault["message"] == NO_VALID_HOST
    assert failed.fault["details"]["refused_by"] == {"cn1": "not enough VCPU: 2 free of 4"}
    assert stores.instances.get(early).state == State.BUILD
    assert stores.quota.get_usage("p1") == Usage(1, 4, 4096)
    assert reap_expired(stores, now=20.0) == 0  # idempotent
    assert audit(stores).ok


def test_vanished_records_leave_the_index(stores: Stores) -> None:
    ghost = str(uuid.uuid4())
    redis_store(stores).client.zadd(redis_store(stores).keys.deadlines, {ghost: 1.0})
    assert reap_expired(stores, now=2.0) == 0
    assert stores.instances.expired(now=2.0) == []
