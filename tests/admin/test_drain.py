"""qsched-admin service drain: a disabled host emptied by live and cold migrations
(qsched/admin/drain.py), through in-process agents on the memory bus."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from agents.service import ComputeAgent
from qsched.admin.cli import cli
from qsched.admin.drain import Drain, HostNotDisabled
from qsched.compute.api import ComputeAPI
from qsched.compute.server_actions import ServerActions
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.audit import audit
from qsched.ledger.base import State
from tests.agents.test_agent import make_agent, settled
from tests.helpers import wait_until

USER = RequestContext.for_project("u1", "p1")
ADMIN = RequestContext.for_project("a1", "p1", roles=("admin", "member", "reader"))


def test_a_disabled_host_is_emptied_running_servers_live_stopped_ones_cold(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1, vcpus=8))
    vms = [api.boot(USER, f"vm{i}", "small").uuid for i in range(3)]
    assert wait_until(lambda: settled(stores, vms), timeout_s=10)
    agents += [make_agent(conf, stores, bus, f"cn{i}", nodes=1, vcpus=8) for i in (1, 2)]
    ServerActions(stores, api.cell.bus, api.policy).stop(USER, vms[2])
    assert wait_until(lambda: stores.instances.get(vms[2]).stopped, timeout_s=5)
    drain = Drain(api.cell, ADMIN)
    with pytest.raises(HostNotDisabled, match="Disable it first"):
        drain.servers("cn0")
    stores.agents.update_service("cn0", disabled=True, disabled_reason="new disks")
    servers = drain.servers("cn0")
    assert [s.uuid for s in servers] == vms
    done: list[str] = []
    results = drain.run(servers, concurrency=2, timeout_s=30, on_done=lambda r: done.append(r.uuid))
    assert sorted(done) == sorted(vms)
    assert [(r.outcome, r.kind) for r in results] == [
        ("moved", "live"), ("moved", "live"), ("moved", "cold")]  # fmt: skip
    for result in results:
        record = stores.instances.get(result.uuid)
        assert record.host == result.host != "cn0" and record.state == State.ACTIVE
    assert drain.servers("cn0") == [] and agents[0].driver.list_instances("cn0-0") == []
    assert stores.instances.get(vms[2]).stopped and audit(stores).ok


def test_what_cannot_move_says_why(
    conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]
) -> None:
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=1))
    vm = api.boot(USER, "vm", "small").uuid
    assert wait_until(lambda: settled(stores, [vm]), timeout_s=10)
    stores.agents.update_service("cn0", disabled=True)
    # no other host: the move ends at once or, once cn0 takes no new work, at its deadline
    moves = api.cell.moves
    moves.scheduler = dataclasses.replace(moves.scheduler, build_timeout_s=3.0)
    drain = Drain(api.cell, ADMIN)
    (result,) = drain.run(drain.servers("cn0"), concurrency=1, timeout_s=30)
    assert (result.outcome, result.host) == ("failed", "cn0")  # no other host
    assert "No valid host was found" in result.why


def test_the_command_has_a_manual() -> None:
    shown = CliRunner().invoke(cli, ["service", "drain", "--help"])
    assert shown.exit_code == 0
    assert "live migration" in shown.output and "--concurrency" in shown.output
