"""Versioned notifications: Nova's payloads, sent once per event, in order per server.

The payloads are checked against Nova's own field lists, read from the installed nova
package's source (never imported). The flow runs on the embedded stack twice: with a
recording notifier, and marked ``real`` through oslo.messaging's Notifier to a real
oslo.messaging notification listener on RabbitMQ, on an exchange of its own.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.virt.fake import FakeNodeSpec
from qsched.conf import NotificationOptions
from qsched.conf import notifications as notification_conf
from qsched.context import RequestContext
from qsched.embedded import Stack, embedded_options, start_stack
from qsched.exception import InstanceNotFound
from qsched.flavors import Flavor
from qsched.ledger.base import State
from qsched.notifications import NULL, Notifier, open_notifier, payloads, updates
from qsched.notifications.base import RecordingNotifier
from qsched.recovery.reaper import NO_VALID_HOST
from qsched.scheduling.message import BootRequest
from tests.cloud import AMQP_URL, require_rabbitmq
from tests.helpers import RecordingDelivery, before_claim, wait_until

pytestmark = pytest.mark.timeout(90)

USER = RequestContext.for_project("u1", "p1")
SPEC = FakeNodeSpec(vcpus=2, ram_mb=16384, disk_gb=100, cpu_allocation_ratio=1.0)
ENVELOPE = {"nova_object.name", "nova_object.namespace", "nova_object.version",
            "nova_object.data"}  # fmt: skip
#: What one server that boots and is deleted sends, in order.
LIFE = ["scheduler.claim", "instance.create.start", "instance.create.end",
        "instance.delete.start", "instance.delete.end"]  # fmt: skip
QUIET_S = 0.5
RABBIT_URL = "rabbit://guest:guest@127.0.0.1:5672/"


# -- Nova's payloads, as its source declares them -----------------------------------------


def nova_fields(module: str, name: str) -> set[str]:
    """The fields of Nova's notification object ``name`` and of its bases in ``module``."""
    spec = importlib.util.find_spec("nova")
    if spec is None or spec.origin is None:
        pytest.skip("the nova package is not installed")
    path = Path(spec.origin).parent / "notifications" / "objects" / f"{module}.py"
    classes = {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}
    found: set[str] = set()
    todo = [name]
    while todo:
        node = classes[todo.pop()]
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "fields":
                assert isinstance(stmt.value, ast.Dict)
                found |= {k.value for k in stmt.value.keys if isinstance(k, ast.Constant)}
        todo += [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes]
    return found


def request() -> BootRequest:
    flavor = Flavor.from_dict(
        {
            "name": "m1.tiny",
            "id": "1",
            "vcpus": 1,
            "ram_mb": 512,
            "disk_gb": 1,
            "extra_specs": {"hw:cpu_policy": "shared"},
        }
    )
    return BootRequest.create(str(uuid.uuid4()), "p1", "u1", flavor)  # fmt: skip


def test_create_payload_has_novas_fields_and_envelope() -> None:
    sent = payloads.create_from_request(request(), "cn0", "cn0-n0", "building", None, "pending")
    assert set(sent) == ENVELOPE
    assert sent["nova_object.name"] == "InstanceCreatePayload"
    assert sent["nova_object.version"] == "1.13" and sent["nova_object.namespace"] == "nova"
    data = sent["nova_object.data"]
    assert set(data) == nova_fields("instance", "InstanceCreatePayload")
    assert set(data["flavor"]["nova_object.data"]) == nova_fields("flavor", "FlavorPayload")
    assert (data["host"], data["node"], data["tenant_id"]) == ("cn0", "cn0-n0", "p1")
    assert data["flavor"]["nova_object.data"]["memory_mb"] == 512


def test_create_end_built_from_the_start_is_the_one_built_from_the_request() -> None:
    msg = request()
    started = payloads.create_from_request(msg, "cn0", "cn0-n0", "building", "spawning",
                                           "pending")  # fmt: skip
    before = repr(started)
    ended = payloads.create_ended(started, 1_700_000_000.0)
    assert ended == payloads.create_from_request(msg, "cn0", "cn0-n0", "active", None,
                                                 "running", 1_700_000_000.0)  # fmt: skip
    assert ended["nova_object.data"]["launched_at"] == "2023-11-14T22:13:20Z"
    assert repr(started) == before  # the .start payload, still queued, is unchanged


def test_fault_is_novas_exception_payload() -> None:
    sent = payloads.fault(NO_VALID_HOST)
    assert set(sent["nova_object.data"]) == nova_fields("exception", "ExceptionPayload")
    assert sent["nova_object.data"]["exception"] == "NoValidHost"


def test_options_are_named_and_typed_as_oslo_messagings() -> None:
    from oslo_messaging.notify import notifier

    theirs = {o.dest: (type(o), o.default) for o in notifier._notifier_opts}
    ours = {o.dest: (type(o), o.default) for o in notification_conf.oslo_notifications_opts}
    assert ours == theirs


def test_off_by_default_and_oslo_messaging_not_imported() -> None:
    assert not NotificationOptions.defaults().enabled
    code = (
        "import sys; from qsched import conf; from qsched.notifications import open_notifier\n"
        "n = open_notifier(conf.load_options().notifications, 'x')\n"
        "assert not n.enabled and 'oslo_messaging' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_noop_driver_and_unversioned_format_send_nothing() -> None:
    on = NotificationOptions.defaults().replace(driver=("messagingv2",))
    assert on.enabled
    assert not on.replace(driver=("noop",)).enabled
    assert not on.replace(notification_format="unversioned").enabled
    assert open_notifier(on.replace(driver=("noop",)), "x") is NULL


# -- the flow, on the embedded stack ------------------------------------------------------


def open_stack(notifier: Notifier) -> Stack:
    conf = embedded_options(
        build_timeout_s=("scheduler", 6),  # the boot no host fits ends then
        class_poll_interval_s=("agent", 0.05),
        heartbeat_interval_s=("agent", 0.2),
    )
    stack = start_stack(conf, hosts=2, agents=2, node_spec=SPEC, notifier=notifier)
    stack.stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    return stack


def run_flow(stack: Stack, events: Callable[[], list[tuple[str, str, dict]]]) -> None:
    """Boot servers (one request published twice, one handed again to an agent once
    ACTIVE), one that no host fits, delete the placed ones; check what was sent."""
    api = stack.compute_api()
    claimed: list[BootRequest] = []
    for agent in stack.agents:
        before_claim(agent, claimed.append)
    servers = [api.boot(USER, f"vm{i}", "m1.tiny").uuid for i in range(3)]
    assert wait_until(lambda: len(claimed) >= 1, 10)
    stack.bus.publish_boot(claimed[0])  # a redelivery while it builds, or after
    active = {State.ACTIVE}
    assert wait_until(lambda: {stack.stores.instances.get(u).state for u in servers} == active, 10)
    stack.agents[0].on_message(claimed[-1].encode(), RecordingDelivery())  # once more, ACTIVE
    too_big = api.boot(USER, "big", "m1.large").uuid  # 4 VCPUs: fits no 2-VCPU node
    for u in servers:
        api.delete(USER, u)
    deleted = {State.DELETED}
    assert wait_until(lambda: {stack.stores.instances.get(u).state for u in servers} == deleted, 10)
    wanted = {*servers, too_big}
    assert wait_until(lambda: stack.stores.instances.get(too_big).state == State.ERROR, 15)
    assert wait_until(lambda: len([e for e in events() if about(e) in wanted]) >= 16, 15), events()
    time.sleep(QUIET_S)  # for a second copy that must not come
    sent = [e for e in events() if about(e) in wanted]
    told = [(about(e), e[1]) for e in sent]
    for u in servers:
        assert [t for who, t in told if who == u] == LIFE, told
    errors = [(priority, p) for priority, t, p in sent if t == "instance.create.error"]
    assert len(errors) == 1 and about(("", "", errors[0][1])) == too_big
    priority, error = errors[0]
    assert priority == "ERROR"
    fault = error["nova_object.data"]["fault"]["nova_object.data"]
    assert fault["exception"] == "NoValidHost" and fault["exception_message"] == NO_VALID_HOST
    assert error["nova_object.data"]["state"] == "error"
    for _, event_type, payload in sent:
        check_payload(event_type, payload)
    api.delete(USER, too_big)  # ended here, by the API: it tells the delete itself
    with pytest.raises(InstanceNotFound):
        api.delete(USER, too_big)  # gone: nothing more is told
    ended = ["instance.create.error", "instance.delete.start", "instance.delete.end"]
    assert wait_until(
        lambda: [t for _, t, p in events() if about(("", t, p)) == too_big] == ended, 10
    )
    time.sleep(QUIET_S)
    assert [t for _, t, p in events() if about(("", t, p)) == too_big] == ended


def about(event: tuple[str, str, dict]) -> str:
    data = event[2]["nova_object.data"]
    return str(data.get("uuid") or data.get("instance_uuid"))


def check_payload(event_type: str, payload: dict[str, Any]) -> None:
    assert set(payload) == ENVELOPE, event_type
    data = payload["nova_object.data"]
    if event_type == "scheduler.claim":
        assert payload["nova_object.namespace"] == "qsched"
        assert data["host"] and data["node"] and data["allocations"]
        return
    name = "InstanceActionPayload" if ".delete." in event_type else "InstanceCreatePayload"
    assert payload["nova_object.name"] == name
    assert set(data) == nova_fields("instance", name), event_type
    if event_type != "instance.create.error":
        assert data["host"] and data["node"]
    states = {"instance.create.end": "active", "instance.delete.end": "deleted"}
    if event_type in states:
        assert data["state"] == states[event_type]


def test_each_event_is_sent_once_in_order() -> None:
    recorder = RecordingNotifier()
    stack = open_stack(recorder)
    try:
        run_flow(stack, lambda: list(recorder.sent))
    finally:
        stack.stop()


# -- through oslo.messaging, to a real listener on RabbitMQ -------------------------------


class Endpoint:
    """An oslo.messaging notification endpoint that keeps what it receives."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[tuple[str, str, dict]] = []
        self.publishers: set[str] = set()

    def _keep(self, priority: str, publisher_id: str, event_type: str, payload: dict) -> None:
        with self.lock:
            self.received.append((priority, event_type, payload))
            self.publishers.add(publisher_id)

    def info(self, ctxt: dict, publisher_id: str, event_type: str, payload: dict,
             metadata: dict) -> None:  # fmt: skip
        self._keep("INFO", publisher_id, event_type, payload)

    def error(self, ctxt: dict, publisher_id: str, event_type: str, payload: dict,
              metadata: dict) -> None:  # fmt: skip
        self._keep("ERROR", publisher_id, event_type, payload)

    def events(self) -> list[tuple[str, str, dict]]:
        with self.lock:
            return list(self.received)


@pytest.fixture
def listener() -> Iterator[tuple[Endpoint, str]]:
    """A real oslo.messaging notification listener on an exchange and a topic of its own
    (``versioned_notifications`` is the notifier's default: a shared broker would keep
    its queues); the exchange and every queue deleted after."""
    require_rabbitmq()
    import kombu
    import oslo_messaging
    from oslo_config import cfg

    exchange = f"qsched-test-{uuid.uuid4().hex[:8]}"
    topic = f"{exchange}-versioned"
    conf = cfg.ConfigOpts()
    conf([], project="qsched-test", default_config_files=[])
    transport = oslo_messaging.get_notification_transport(conf, url=RABBIT_URL)
    endpoint = Endpoint()
    target = oslo_messaging.Target(topic=topic, exchange=exchange)
    server = oslo_messaging.get_notification_listener(
        transport, [target], [endpoint], executor="threading", pool=exchange
    )
    server.start()
    try:
        yield endpoint, exchange
    finally:
        server.stop()
        server.wait()
        transport.cleanup()
        with kombu.Connection(AMQP_URL) as connection:
            channel = connection.channel()
            for queue in (exchange, f"{topic}.info", f"{topic}.error"):
                channel.queue_delete(queue)  # the notifier declares <topic>.<priority>
            channel.exchange_delete(exchange)


@pytest.mark.real
def test_a_real_listener_receives_each_event_once(listener: tuple[Endpoint, str]) -> None:
    endpoint, exchange = listener
    options = NotificationOptions.defaults().replace(
        driver=("messagingv2",),
        transport_url=RABBIT_URL,
        control_exchange=exchange,
        versioned_notifications_topics=(f"{exchange}-versioned",),
    )
    notifier = open_notifier(options, "qsched-agent:test")
    assert notifier.enabled
    stack = open_stack(notifier)
    try:
        run_flow(stack, endpoint.events)
    finally:
        stack.stop()
        notifier.close()
    assert endpoint.publishers == {"qsched-agent:test"}


def test_a_claim_found_in_the_ledger_already_sends_nothing_again() -> None:
    """The agent restarted between its claim and the ack (its build forgotten): the
    redelivery's claim finds itself in the ledger (``already``) and sends nothing."""
    recorder = RecordingNotifier()
    conf = embedded_options(class_poll_interval_s=("agent", 0.05))
    stack = start_stack(conf, hosts=1, agents=1, node_spec=SPEC, spawn_delay_s=0.5,
                        notifier=recorder)  # fmt: skip
    try:
        stack.stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        agent, claimed = stack.agents[0], []
        before_claim(agent, claimed.append)
        server = stack.compute_api().boot(USER, "vm", "m1.tiny").uuid
        assert wait_until(lambda: server in agent.builds, 10)
        agent.builds.pop(server)  # as a restarted agent knows nothing of it
        delivery = RecordingDelivery()
        agent.on_message(claimed[0].encode(), delivery)
        assert delivery.settled == [("ack", None)]
        assert wait_until(lambda: stack.stores.instances.get(server).state == State.ACTIVE, 10)
        time.sleep(QUIET_S + 0.5)  # both spawns settle
        told = [t for _, t, p in recorder.sent if about(("", t, p)) == server]
        assert told == LIFE[:3]
    finally:
        stack.stop()


def test_a_spawn_the_reconcile_finds_running_tells_its_create_end_once() -> None:
    """The spawn finished but its agent never recorded it (it died in between): the
    reconcile that finds the VM running and records it ACTIVE sends ``create.end``."""
    recorder = RecordingNotifier()
    conf = embedded_options(class_poll_interval_s=("agent", 0.05))
    stack = start_stack(conf, hosts=1, agents=1, node_spec=SPEC, notifier=recorder)
    try:
        stack.stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        agent = stack.agents[0]
        settled: list[str] = []
        agent.spawner.settle = lambda build: settled.append(  # type: ignore[method-assign]
            build.request.instance_uuid)  # fmt: skip
        server = stack.compute_api().boot(USER, "vm", "m1.tiny").uuid
        assert wait_until(lambda: settled == [server], 10)
        agent.builds.pop(server)  # as an agent restarted after the spawn
        assert stack.stores.instances.get(server).state == State.BUILD
        assert agent.reconciler.run_all().activated == [server]
        assert agent.reconciler.run_all().activated == []  # ACTIVE now: nothing more
        assert stack.stores.instances.get(server).state == State.ACTIVE
        told = [(t, p) for _, t, p in recorder.sent if about(("", t, p)) == server]
        assert [t for t, _ in told] == LIFE[:3]
        end = told[2][1]
        check_payload("instance.create.end", end)
        assert end["nova_object.data"]["host"] == agent.host
    finally:
        stack.stop()


# -- sending off the caller's thread ------------------------------------------------------


class SlowOsloNotifier:
    """Stands in for an ``oslo_messaging.Notifier`` (its ``info``/``error`` and
    ``transport.cleanup``) whose sends wait until ``release`` is set, as oslo.messaging's
    do with ``retry = -1`` while the notification bus is down."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.sending = threading.Event()  # set once a send has begun
        self.sent: list[tuple[str, str]] = []
        self.cleaned = False
        self.transport = self

    def _send(self, priority: str, event_type: str) -> None:
        self.sending.set()
        self.release.wait(30)
        self.sent.append((priority, event_type))

    def info(self, ctxt: dict, event_type: str, payload: dict) -> None:
        self._send("INFO", event_type)

    def error(self, ctxt: dict, event_type: str, payload: dict) -> None:
        self._send("ERROR", event_type)

    def cleanup(self) -> None:
        self.cleaned = True


def test_a_send_that_waits_for_the_bus_never_holds_the_caller() -> None:
    from qsched.notifications.oslo import OsloNotifier

    slow = SlowOsloNotifier()
    notifier = OsloNotifier([slow], max_pending=3)
    started = time.monotonic()
    notifier.notify("e0", {})
    assert slow.sending.wait(5)  # in the sender's hands, waiting for the bus
    for i in range(1, 10):
        notifier.notify(f"e{i}", {}, priority="ERROR" if i == 1 else "INFO")
    assert time.monotonic() - started < 0.5  # nothing waited on the bus
    assert notifier.dropped == 6  # three queued behind e0, the rest dropped and counted
    assert not notifier.flush(0.1)
    slow.release.set()
    assert notifier.flush(5)
    assert slow.sent == [("INFO", "e0"), ("ERROR", "e1"), ("INFO", "e2"), ("INFO", "e3")]
    notifier.close()
    assert slow.cleaned


def test_close_sends_what_is_queued_first() -> None:
    from qsched.notifications.oslo import OsloNotifier

    slow = SlowOsloNotifier()
    slow.release.set()
    notifier = OsloNotifier([slow])
    for i in range(50):
        notifier.notify(f"e{i}", {})
    notifier.close()
    notifier.close()  # idempotent
    assert [t for _, t in slow.sent] == [f"e{i}" for i in range(50)] and slow.cleaned
    notifier.notify("late", {})  # after close: logged, not sent, never raises
    assert len(slow.sent) == 50


# -- instance.update, with [notifications] notify_on_state_change ------------------------


def test_update_payload_has_novas_fields() -> None:
    started = payloads.create_from_request(request(), "cn0", "n0", "building", "spawning", "x")
    sent = updates.update_payload(started["nova_object.data"], "building", "active", "spawning",
                                  None)  # fmt: skip
    assert sent["nova_object.name"] == "InstanceUpdatePayload"
    assert sent["nova_object.version"] == "2.1"
    data = sent["nova_object.data"]
    assert set(data) == nova_fields("instance", "InstanceUpdatePayload")
    change = data["state_update"]["nova_object.data"]
    assert set(change) == nova_fields("instance", "InstanceStateUpdatePayload")
    assert change == {"old_state": "building", "state": "active", "old_task_state": "spawning",
                      "new_task_state": None}  # fmt: skip
    period = data["audit_period"]["nova_object.data"]
    assert set(period) == nova_fields("instance", "AuditPeriodPayload")
    assert (data["state"], data["task_state"]) == ("active", None)


def test_state_changes_are_off_by_default_and_an_option_as_novas() -> None:
    assert NotificationOptions.defaults().notify_on_state_change is None
    with pytest.raises(ValueError, match="notify_on_state_change 'vm'"):
        updates.StateChangeNotifier(RecordingNotifier(), "vm")


def state_changes(recorder: RecordingNotifier, uuid_: str) -> list[tuple]:
    return [
        tuple(p["nova_object.data"]["state_update"]["nova_object.data"].values())
        for _, t, p in recorder.sent
        if t == "instance.update" and p["nova_object.data"]["uuid"] == uuid_
    ]


@pytest.mark.parametrize(
    ("mode", "life", "no_host"),
    [
        ("vm_state",
         [("building", "active", None, None), ("active", "deleted", None, None)],
         [("building", "error", None, None)]),
        ("vm_and_task_state",
         [("building", "building", "scheduling", "spawning"),
          ("building", "active", "spawning", None),
          ("active", "active", None, "deleting"), ("active", "deleted", "deleting", None)],
         [("building", "error", "scheduling", None)]),
    ],
)  # fmt: skip
def test_each_state_change_sends_one_instance_update(mode: str, life: list, no_host: list):
    """A server that boots and is deleted, and one that no host fits, on the embedded
    stack: the changes of (old_state, state, old_task_state, new_task_state) that
    ``mode`` asks for, once each, in order."""
    recorder = RecordingNotifier()
    stack = open_stack(updates.StateChangeNotifier(recorder, mode))
    try:
        api = stack.compute_api()
        server = api.boot(USER, "vm", "m1.tiny").uuid
        too_big = api.boot(USER, "big", "m1.large").uuid  # fits no 2-VCPU node
        assert wait_until(lambda: stack.stores.instances.get(server).state == State.ACTIVE, 10)
        api.delete(USER, server)
        assert wait_until(lambda: len(state_changes(recorder, server)) >= len(life), 10)
        assert wait_until(lambda: len(state_changes(recorder, too_big)) >= 1, 15)
        time.sleep(QUIET_S)  # for a second copy that must not come
        assert state_changes(recorder, server) == life
        assert state_changes(recorder, too_big) == no_host
    finally:
        stack.stop()


def test_a_service_notifier_sends_state_changes_when_asked() -> None:
    options = dataclasses.replace(NotificationOptions.defaults(), driver=("log",))
    assert not isinstance(open_notifier(options, "x"), updates.StateChangeNotifier)
    asked = dataclasses.replace(options, notify_on_state_change="vm_and_task_state")
    notifier = open_notifier(asked, "x")
    assert isinstance(notifier, updates.StateChangeNotifier) and notifier.enabled
    assert notifier.mode == "vm_and_task_state"
    notifier.close()
