"""agents.lease: until when an agent counts itself alive, from its own clock only."""

from __future__ import annotations

import threading

from agents.lease import Lease


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_it_holds_from_the_sending_of_the_last_acknowledged_heartbeat() -> None:
    clock = Clock()
    lease = Lease(10.0, clock)
    assert lease.valid()  # no heartbeat yet: nobody judges this agent
    lease.renew(sent_at=100.0)
    clock.now = 109.9
    assert lease.valid()
    clock.now = 110.0  # the ledger's own expiry is no sooner than this
    assert not lease.valid()
    lease.renew(sent_at=109.0)  # a late heartbeat, acknowledged now
    assert lease.valid()


def test_a_forced_down_service_ends_it_until_the_next_heartbeat() -> None:
    clock = Clock()
    lease = Lease(10.0, clock)
    lease.renew(sent_at=100.0)
    lease.end()
    assert not lease.valid()
    lease.renew(sent_at=100.5)
    assert lease.valid()


def test_wait_returns_once_a_heartbeat_renews_it() -> None:
    clock = Clock()
    lease = Lease(1.0, clock)
    lease.renew(sent_at=90.0)
    assert not lease.wait(0.01)
    threading.Timer(0.05, lease.renew, args=(clock.now,)).start()
    assert lease.wait(5.0)


def test_a_heartbeat_after_a_lapse_starts_a_new_term() -> None:
    """What a term covered may have been taken during the lapse: it holds no more,
    though the lease holds again."""
    clock = Clock()
    lease = Lease(10.0, clock)
    lease.renew(sent_at=100.0)
    term = lease.current()
    clock.now = 105.0
    lease.renew(sent_at=104.0)  # in time: the same term
    assert lease.holds(term) and lease.current() == term
    clock.now = 114.0  # past 104 + 10: it lapsed
    assert not lease.holds(term) and lease.current() is None
    lease.renew(sent_at=113.5)  # sent before the end, acknowledged after: a lapse
    assert lease.valid() and not lease.holds(term) and lease.current() == term + 1
    lease.end()  # forced down
    assert lease.current() is None
    lease.renew(sent_at=114.0)
    assert lease.current() == term + 2
    assert not lease.holds(None)
