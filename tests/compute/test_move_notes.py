"""What the steps of moves tell (agents/move_notes.py): Nova's versioned notifications,
once each, from the host that made the step, and the agents' counts of moves
(``qsched_agent_moves_total``)."""

from __future__ import annotations

from prometheus_client import generate_latest

from agents.service import ComputeAgent
from qsched.compute.api import ComputeAPI
from qsched.ledger import Stores
from qsched.notifications.base import RecordingNotifier
from tests.compute.test_moves import ADMIN, USER, booted, status_of
from tests.helpers import wait_until


def told(recorder: RecordingNotifier, vm: str) -> list[tuple[str, str | None, str | None]]:
    """(event, vm_state, task_state) of what was told of ``vm``, in order."""
    found = []
    for _priority, event, payload in recorder.sent:
        data = payload["nova_object.data"]
        if data.get("uuid") == vm:
            found.append((event, data["state"], data["task_state"]))
    return found


def recording(agents: dict[str, ComputeAgent]) -> RecordingNotifier:
    recorder = RecordingNotifier()
    for agent in agents.values():
        agent.moves.parts.notifier = recorder  # the parts every step of the agent shares
    return recorder


def test_a_cold_migration_and_its_confirm_tell_novas_events_once(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    recorder = recording(two)
    vm = booted(api, stores)
    source = stores.instances.get(vm).host or ""
    recorder.sent.clear()  # its boot's
    api.moves.migrate(ADMIN, vm)
    assert wait_until(lambda: status_of(stores, vm) == "VERIFY_RESIZE", 10)
    api.moves.confirm(USER, vm)
    assert wait_until(lambda: stores.instances.get(vm).migration is None, 10)
    assert wait_until(lambda: len(told(recorder, vm)) == 4, 10)  # sent after their steps
    assert told(recorder, vm) == [
        ("instance.resize_finish.start", "active", "resize_finish"),
        ("instance.resize_finish.end", "resized", None),
        ("instance.resize_confirm.start", "resized", None),
        ("instance.resize_confirm.end", "active", None),
    ]
    dest = next(agent for host, agent in two.items() if host != source)
    assert dest.counters["move:migration:in"] == 1
    assert two[source].counters["move:migration:confirmed"] == 1
    scraped = generate_latest(dest.metrics.registry).decode()
    assert 'qsched_agent_moves_total{kind="migration",outcome="in"} 1.0' in scraped


def test_a_live_migration_an_evacuation_and_an_unshelve_tell_theirs(
    stores: Stores, api: ComputeAPI, two: dict[str, ComputeAgent]
) -> None:
    recorder = recording(two)
    vm = booted(api, stores)
    recorder.sent.clear()  # its boot's
    api.moves.live_migrate(ADMIN, vm)
    assert wait_until(lambda: len(told(recorder, vm)) == 4, 10)
    assert [event for event, _s, _t in told(recorder, vm)] == [
        "instance.live_migration_pre.start", "instance.live_migration_pre.end",
        "instance.live_migration_post.start", "instance.live_migration_post.end",
    ]  # fmt: skip
    recorder.sent.clear()
    host = stores.instances.get(vm).host or ""
    stores.agents.update_service(host, forced_down=True)
    api.moves.evacuate(ADMIN, vm)
    assert wait_until(lambda: told(recorder, vm), 10)
    assert told(recorder, vm) == [("instance.evacuate", "active", None)]
    stores.agents.update_service(host, forced_down=False)
    recorder.sent.clear()
    api.actions.shelve(USER, vm)
    assert wait_until(lambda: status_of(stores, vm) == "SHELVED_OFFLOADED", 10)
    recorder.sent.clear()  # the shelve's are the server actions' (tests/compute)
    api.moves.unshelve(USER, vm)
    assert wait_until(lambda: len(told(recorder, vm)) == 2, 10)
    assert told(recorder, vm) == [
        ("instance.unshelve.start", "shelved_offloaded", "spawning"),
        ("instance.unshelve.end", "active", None),
    ]
