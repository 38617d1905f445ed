"""Twenty live migrations at once of the members of one anti-affinity group over 25
hosts, on a real Redis ledger and a real RabbitMQ bus (docs/moves.rst, "The claim of a
destination"): the group's rule is checked in each destination's claim, counted on
both hosts until a move settles, so racing destinations never put two members on one
host. Three rounds, every one whole.

Nova checks the group late, on the destination, and parallel live migrations can
break it there; this is the case the claim makes impossible.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from agents.service import ComputeAgent
from qsched.bus.kombu import KombuBus
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, LedgerOptions, QuotaOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from tests.agents.test_agent import make_agent
from tests.cloud import transport_url
from tests.helpers import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(300)]

HOSTS, MEMBERS, ROUNDS = 25, 20, 3
USER = RequestContext.for_project("u1", "p1")
ADMIN = RequestContext.for_project("a1", "p1", roles=("admin", "member", "reader"))


@pytest.fixture
def cloud(conf, real_redis_url: str) -> Iterator[tuple[Stores, ComputeAPI, list[ComputeAgent]]]:
    bus = KombuBus(transport_url("rabbitmq"), prefix=f"pm{uuid.uuid4().hex[:8]}")
    quota = QuotaOptions.defaults().replace(server_group_members=MEMBERS)
    stores = open_stores(LedgerOptions.from_conf(conf), quota, url=real_redis_url)
    api = ComputeAPI(stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf))
    api.cell.flavors.create(Flavor("small", 1, 1024, 0))
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    agents: list[ComputeAgent] = []
    try:
        for i in range(HOSTS):
            agents.append(make_agent(conf, stores, bus, f"pm{i:02d}", nodes=1, vcpus=4))
        yield stores, api, agents
    finally:
        for agent in agents:
            agent.stop(timeout_s=5)
        bus.close()


def test_parallel_live_migrations_keep_an_anti_affinity_group_whole(cloud) -> None:
    stores, api, _agents = cloud
    group = api.groups.create(USER, "apart", "anti-affinity")
    members = [api.boot(USER, f"m{i}", "small", group=group.uuid).uuid for i in range(MEMBERS)]
    assert wait_until(lambda: all(stores.instances.get(m).state == State.ACTIVE
                                  for m in members), 60)  # fmt: skip
    for n in range(ROUNDS):
        before = {m: stores.instances.get(m).host for m in members}
        assert len(set(before.values())) == MEMBERS  # whole before the round
        start = threading.Barrier(MEMBERS)
        threads = [threading.Thread(target=_move, args=(api, m, start)) for m in members]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert wait_until(lambda: all(stores.instances.get(m).migration is None
                                      for m in members), 120), n  # fmt: skip
        after = {m: stores.instances.get(m).host for m in members}
        moved = [m for m in members if after[m] != before[m]]
        crowded = {h: c for h, c in Counter(after.values()).items() if c > 1}
        assert crowded == {}, (n, crowded)  # never two members on one host
        assert len(moved) >= MEMBERS // 2, (n, len(moved))  # most found a free host
        assert {stores.instances.get(m).state for m in members} == {State.ACTIVE}
        report = audit(stores)
        assert report.ok, report.to_dict()


def _move(api: ComputeAPI, member: str, start: threading.Barrier) -> None:
    """One live migration, asked when every other is ready to be asked too."""
    start.wait(30)
    api.moves.live_migrate(ADMIN, member)
