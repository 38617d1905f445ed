"""Poison messages: whatever lands on a boot queue is dead-lettered once, and boots go on.

Messages are published raw with kombu, as anyone who can reach the broker could,
to the queue of a class an agent consumes. The regression tests run on every
transport (RabbitMQ and kombu's Redis transport marked ``real``); the generated
ones on ``memory://``. Each checks what qsched-admin makes of the dead letters.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.service import ComputeAgent
from agents.virt.fake import FakeNodeSpec
from qsched.admin import deadletters, schemas, views
from qsched.admin.cli_bus import LETTER_COLUMNS
from qsched.bus import base
from qsched.bus.kombu import KombuBus
from qsched.bus.kombu import message as kombu_message
from qsched.compute.api import ComputeAPI
from qsched.context import RequestContext
from qsched.embedded import Stack, embedded_options, start_stack
from qsched.flavors import Flavor
from qsched.ledger.base import State
from qsched.scheduling.message import ActionRequest, BootRequest, PoisonMessage, decode
from qsched.stack.cleanup import forget_bus
from tests.admin.test_admin import Admin, config_file
from tests.cloud import transport_url
from tests.conftest import IN_CI
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(90)

USER = RequestContext.for_project("u1", "p1")
SPEC = FakeNodeSpec(vcpus=64, ram_mb=65536, disk_gb=100, cpu_allocation_ratio=1.0)
CLASS = "m1.tiny"
PROMPT_S = 2.0  # a boot behind a poison message: 0.2 s normally, 2.9 s when it crash-looped
QUIET_S = 0.5  # for a second copy that must not come


@dataclasses.dataclass
class Cell:
    """One agent on a transport, the API's domain, and qsched-admin pointed at both."""

    stack: Stack
    admin: Admin
    api: ComputeAPI

    @property
    def bus(self) -> KombuBus:
        return self.stack.bus

    @property
    def agent(self) -> ComputeAgent:
        return self.stack.agents[0]

    def boot(self) -> str:
        return self.api.boot(USER, "vm", CLASS).uuid

    def active(self, uuid_: str) -> bool:
        return self.stack.stores.instances.get(uuid_).state == State.ACTIVE

    def letters(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.admin.json(schemas.DEAD_LETTERS, "dead-letters", "list")
        return rows


def open_cell(tmp: Path, url: str) -> Cell:
    conf = embedded_options(
        transport_url=(None, url),
        build_timeout_s=("scheduler", 60),
        class_poll_interval_s=("agent", 0.05),
        heartbeat_interval_s=("agent", 0.2),
    )
    stack = start_stack(conf, hosts=2, agents=1, node_spec=SPEC)
    stack.stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    admin = Admin(config_file(tmp / "qsched.conf", stack))
    cell = Cell(stack, admin, stack.compute_api())
    first = cell.boot()  # the class queue exists and the agent consumes it
    assert wait_until(lambda: cell.active(first), 10)
    return cell


def close_cell(cell: Cell) -> None:
    bus = cell.bus
    classes = sorted(bus.boot_classes())
    cell.stack.stop()
    url = cell.stack.options.bus.transport_url
    failed = forget_bus(url, bus.names.prefix, classes, ["cn0"])
    assert not failed, failed


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("rabbitmq", id="rabbitmq", marks=pytest.mark.real),
        pytest.param("redis", id="redis", marks=pytest.mark.real),
    ],
)
def cell(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Cell]:
    url = "memory://" if request.param == "memory" else transport_url(request.param)
    opened = open_cell(tmp_path_factory.mktemp(request.param), url)
    yield opened
    close_cell(opened)


def publish_raw(bus: KombuBus, body: Any, **props: Any) -> None:
    """Publish ``body`` as it is to the class queue, with plain kombu (no qsched checks)."""
    wire = bus.wire
    exchange, key = wire.route(wire.boot_entity(CLASS))
    with wire.channel() as channel:
        kombu.Producer(channel).publish(body, exchange=exchange, routing_key=key, **props)


# -- regressions, on every transport -------------------------------------------------------

BINARY = {"content_type": "application/x-msgpack", "content_encoding": "binary"}
#: (body as published, publish properties, the bytes kombu keeps, words the reason holds)
POISONS = (
    # py-amqp hands an empty body over as "" (a str): bytes("") crashed every consumer.
    (b"", BINARY, b"", "the body is empty"),
    # A text content_encoding makes py-amqp hand over a str; it crashed them the same way.
    ("not a boot request", {"content_type": "text/plain"}, b"not a boot request", "not msgpack"),
    # kombu undoes the compression a header names; when it could not, it raised out of the
    # consumer's loop: reconnect, the same message again, forever.
    (b"\x81\xa4kind\xa4boot", {**BINARY, "headers": {"compression": "application/x-gzip"}},
     b"\x81\xa4kind\xa4boot", "kombu could not decode it"),
)  # fmt: skip


def test_poison_is_dead_lettered_once_and_boots_go_on(cell: Cell) -> None:
    for body, props, _kept, _words in POISONS:
        publish_raw(cell.bus, body, **props)
    behind = cell.boot()
    assert wait_until(lambda: cell.active(behind), PROMPT_S, interval_s=0.02), (
        f"the boot behind the poison was not placed within {PROMPT_S} s"
    )
    time.sleep(QUIET_S)  # time for a second copy of any of them, which must not come
    letters = {row["bytes"]: row for row in cell.letters()}
    assert sorted(letters) == sorted(len(kept) for _, _, kept, _ in POISONS), letters
    for _body, _props, kept, words in POISONS:
        row = letters[len(kept)]
        assert words in row["reason"], row
        assert (row["class"], row["kind"]) == (CLASS, None)
        shown = cell.admin.json(schemas.DEAD_LETTER, "dead-letters", "show", row["id"])
        assert shown["body_hex"] == kept.hex() and shown["problem"]
        assert words in cell.admin("dead-letters", "show", row["id"]).stdout
    table = cell.admin("dead-letters", "list").stdout
    assert all(row["id"] in table for row in letters.values())
    outcome = cell.admin.json(schemas.OUTCOMES, "dead-letters", "requeue", "--all")
    assert all(o["result"].startswith("not requeued") for o in outcome), outcome
    cell.admin("dead-letters", "purge", "--all", "--yes", "--format", "json")
    assert cell.letters() == []


def publish_dead_raw(bus: KombuBus, body: Any, **props: Any) -> None:
    """Publish ``body`` to the dead-letter queue as a broker's dead-lettering would."""
    wire = bus.wire
    dead = wire.dead_entity()
    exchange, key = wire.route(dead)
    with wire.channel() as channel:
        wire.declare(channel, dead)
        kombu.Producer(channel).publish(body, exchange=exchange, routing_key=key, **props)


def test_letters_the_broker_wrote_are_listed(cell: Cell) -> None:
    """RabbitMQ's delivery limit dead-lettered the empty body: every list then exited 1."""
    death = {"x-first-death-reason": "delivery_limit", "x-first-death-queue": "q.boot.x",
             "x-qsched-dead-at": "not a time", "x-qsched-reason": b""}  # fmt: skip
    publish_dead_raw(cell.bus, b"", **BINARY, headers=death)
    publish_dead_raw(cell.bus, "text", content_type="text/plain", headers={"compression": "zlib"})
    letters = {row["bytes"]: row for row in cell.letters()}
    assert sorted(letters) == [0, 4], letters
    assert letters[0]["reason"] == "the broker dead-lettered it: delivery_limit"
    assert (letters[0]["queue"], letters[0]["dead_at"]) == ("q.boot.x", None)
    assert letters[4]["reason"].startswith("no reason given")
    for row in letters.values():
        cell.admin.json(schemas.DEAD_LETTER, "dead-letters", "show", row["id"])
    assert "delivery_limit" in cell.admin("dead-letters", "list").stdout
    assert len(cell.letters()) == 2, "reading kept both"
    cell.admin("dead-letters", "requeue", "--all")
    cell.admin("dead-letters", "purge", "--all", "--yes")
    assert cell.letters() == []


# -- pure parts ------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeMessage:
    """What kombu hands over, with the attributes the functions read."""

    body: Any = b""
    headers: Any = None
    content_encoding: Any = None
    errors: Any = None


@pytest.mark.parametrize(
    ("body", "encoding", "expected"),
    [
        (b"\x81", None, b"\x81"),
        ("", None, b""),  # py-amqp's empty body
        (None, None, b""),
        ("h\xe9", "latin-1", b"h\xe9"),  # py-amqp decoded it with the message's codec
        ("h\xe9", "utf-8", b"h\xc3\xa9"),
        ("h\xe9", "no-such-codec", b"h\xc3\xa9"),
        ("\ud800", "utf-8", b"\xed\xa0\x80"),  # a lone surrogate still encodes
        ("x", b"utf-8", b"x"),  # an encoding that is not even a str
        (bytearray(b"ab"), None, b"ab"),
        (memoryview(b"ab"), None, b"ab"),
        (12, None, b"12"),
    ],
)
def test_body_bytes(body: Any, encoding: Any, expected: bytes) -> None:
    assert kombu_message.body_bytes(FakeMessage(body, content_encoding=encoding)) == expected


def test_problem_names_what_kombu_recorded() -> None:
    assert kombu_message.problem(FakeMessage()) is None
    error = ValueError("Error -3 while decompressing")
    found = kombu_message.problem(FakeMessage(errors=[(ValueError, error, None)]))
    assert found == "kombu could not decode it: ValueError: Error -3 while decompressing"


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (None, "no reason given"),
        ([1, 2], "no reason given"),
        ({base.REASON_HEADER: ""}, "no reason given"),
        ({base.REASON_HEADER: 42}, "42"),
        ({base.REASON_HEADER: b"bytes \xff"}, "bytes \ufffd"),
        ({base.REASON_HEADER: "line\nbreak\x1b[2J"}, "line\\nbreak\\x1b[2J"),
        ({base.REASON_HEADER: "x" * 5000}, "x" * base.MAX_REASON_CHARS),
        ({"x-first-death-reason": "delivery_limit"}, "the broker dead-lettered it: delivery_limit"),
    ],
)
def test_dead_letter_reason_from_any_headers(headers: Any, reason: str) -> None:
    letter = kombu_message.dead_letter(FakeMessage(b"", headers))
    assert letter.reason.startswith(reason)
    assert len(letter.reason) <= base.MAX_REASON_CHARS + 60


@pytest.mark.parametrize(
    ("dead_at", "expected"),
    [(1.5, 1.5), (7, 7.0), (True, None), (math.nan, None), (math.inf, None), (-1, None),
     (10**400, None), ("1.5", None), (1e300, None)],
)  # fmt: skip
def test_dead_at_only_when_plausible(dead_at: Any, expected: float | None) -> None:
    letter = kombu_message.dead_letter(FakeMessage(b"", {base.DEAD_AT_HEADER: dead_at}))
    assert letter.dead_at == expected


def test_names_from_headers_are_text_or_none() -> None:
    headers = {base.ORIGIN_QUEUE_HEADER: 5, base.ORIGIN_KEY_HEADER: b"boot.x"}
    letter = kombu_message.dead_letter(FakeMessage(b"", headers))
    assert (letter.queue, letter.routing_key) == ("5", "boot.x")
    broker = kombu_message.dead_letter(FakeMessage(b"", {"x-first-death-queue": "q"}))
    assert (broker.queue, broker.routing_key) == ("q", None)


def test_kept_headers_drop_what_kombu_acts_on() -> None:
    kept = kombu_message.kept_headers({"compression": "zlib", base.REASON_HEADER: "r"})
    assert kept == {base.REASON_HEADER: "r"}


# -- generated input, on memory:// ---------------------------------------------------------

HEADER_NAMES = st.sampled_from([
    base.REASON_HEADER, base.ORIGIN_QUEUE_HEADER, base.ORIGIN_KEY_HEADER, base.DEAD_AT_HEADER,
    "compression", "x-death", "x-first-death-reason", "x-first-death-queue", "x-delivery-count",
])  # fmt: skip
SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
    | st.binary(max_size=40)
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)  # fmt: skip
HEADERS = st.none() | st.dictionaries(HEADER_NAMES | st.text(max_size=12), VALUES, max_size=6)
MSGPACK = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=16), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
BOOT_FIELDS = st.dictionaries(
    st.sampled_from([f.name for f in dataclasses.fields(BootRequest)] + ["kind", "version"]),
    MSGPACK,
    max_size=8,
).map(lambda d: {"kind": "boot", "version": "1.0", **d})
BODIES = (
    st.binary(max_size=300)
    | MSGPACK.map(lambda v: msgpack.packb(v, use_bin_type=True))
    | BOOT_FIELDS.map(lambda v: msgpack.packb(v, use_bin_type=True))
    | st.integers(64 * 1024 + 1, 80 * 1024).map(lambda n: b"\x92" * n)  # too big
)  # fmt: skip
CONTENT_TYPES = st.sampled_from([
    "application/x-msgpack", "application/json", "application/x-python-serialize",
    "application/x-yaml", "text/plain", "application/data", "no/such-type",
])  # fmt: skip
ENCODINGS = st.sampled_from(["binary", "utf-8", "latin-1", "utf-16", "base64", "no-such-codec"])

GENERATED = settings(
    max_examples=100,
    deadline=None,
    derandomize=IN_CI,  # the same examples on every CI run
    database=None if IN_CI else settings().database,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def memory_cell(tmp_path_factory) -> Iterator[Cell]:
    opened = open_cell(tmp_path_factory.mktemp("generated"), "memory://")
    yield opened
    close_cell(opened)


def sentinel(cell: Cell) -> None:
    """Publish a boot for no instance behind what was published, and wait until it is dropped:
    with one agent and prefetch 1, what came before it has been handled by then."""
    dropped = cell.agent.counters["dropped"]
    flavor = Flavor(CLASS, 1, 512, 1)
    cell.bus.publish_boot(BootRequest.create(str(uuid.uuid4()), "p1", "u1", flavor))
    assert wait_until(lambda: cell.agent.counters["dropped"] > dropped, 5, interval_s=0.005)


def check_listing(cell: Cell, letters: list[deadletters.Letter]) -> None:
    """What every dead-letter command renders, for these letters: nothing may raise."""
    now = time.time()
    rows = [letter.row(now) for letter in letters]
    for fmt in views.FORMATS:
        views.render_rows(rows, LETTER_COLUMNS, fmt)
    for letter in letters:
        views.to_json(letter.doc(now))
        cell.admin.json(schemas.DEAD_LETTER, "dead-letters", "show", letter.id)
        cell.admin("dead-letters", "show", letter.id)


@GENERATED
@given(body=BODIES, headers=HEADERS, content_type=CONTENT_TYPES, encoding=ENCODINGS)
def test_anything_on_a_boot_queue_is_dead_lettered_once(
    memory_cell: Cell, body: bytes, headers: Any, content_type: str, encoding: str
) -> None:
    cell = memory_cell
    cell.bus.take_dead_letters()  # what an example that failed left
    props = {"content_type": content_type, "content_encoding": encoding}
    publish_raw(cell.bus, body, headers=headers, **props)
    sentinel(cell)
    box = deadletters.DeadLetterBox(cell.bus)
    letters = box.read()
    assert len(letters) == 1, [letter.dead.reason for letter in letters]
    letter = letters[0]
    assert letter.dead.reason and letter.dead.queue == cell.bus.names.boot_queue(CLASS)
    if "compression" not in (headers or {}):  # else kombu may have decompressed it
        assert letter.dead.body == body
    check_listing(cell, letters)
    assert [o.kept for o in box.purge()] == [None]


@GENERATED
@given(body=BODIES, headers=HEADERS)
def test_any_dead_letter_lists_shows_and_purges(
    memory_cell: Cell, body: bytes, headers: Any
) -> None:
    """Letters qsched did not write (the broker's, anyone's) must not break the admin."""
    cell = memory_cell
    cell.bus.take_dead_letters()  # what an example that failed left
    dead = cell.bus.wire.dead_entity()
    with cell.bus.wire.channel() as channel:
        kombu.Producer(channel).publish(body, routing_key=dead.name, headers=headers,
                                        content_type="application/data",
                                        content_encoding="binary")  # fmt: skip
    box = deadletters.DeadLetterBox(cell.bus)
    letters = box.read()
    assert len(letters) == 1 and letters[0].dead.reason
    check_listing(cell, letters)
    assert cell.admin.json(schemas.DEAD_LETTERS, "dead-letters", "list")[0]["id"] == letters[0].id
    assert len(box.read()) == 1, "reading keeps it"
    assert [o.kept for o in box.purge({letters[0].id})] == [None]
    assert box.read() == []


# -- the host queue: server actions -------------------------------------------------------

ACTION_FIELDS = st.dictionaries(
    st.sampled_from([f.name for f in dataclasses.fields(ActionRequest)] + ["kind", "version"]),
    MSGPACK | st.sampled_from(["stop", "start", "reboot_soft", "reboot_hard", "cn0", "cn0-0"]),
    max_size=7,
).map(lambda d: {"kind": "action", "version": "1.0", **d})


def publish_to_host_raw(bus: KombuBus, host: str, body: bytes) -> None:
    """Publish ``body`` as it is to ``host``'s queue, with plain kombu."""
    wire = bus.wire
    exchange, key = wire.route(wire.host_entity(host))
    with wire.channel() as channel:
        kombu.Producer(channel).publish(body, exchange=exchange, routing_key=key, **BINARY)


def host_sentinel(cell: Cell) -> None:
    """An action for no instance behind what was published on the host queue, and wait
    until it is dropped: the host queue is handled in order."""
    dropped = cell.agent.counters["actions_dropped"]
    msg = ActionRequest("req-sentinel", str(uuid.uuid4()), cell.agent.host, "n", "stop")
    cell.bus.publish_action(cell.agent.host, msg)
    assert wait_until(lambda: cell.agent.counters["actions_dropped"] > dropped, 5, 0.005)


@GENERATED
@given(body=ACTION_FIELDS.map(lambda v: msgpack.packb(v, use_bin_type=True)) | BODIES)
def test_anything_on_a_host_queue_leaves_the_agent_working(memory_cell: Cell, body: bytes):
    """Garbage, or action messages with any fields, on the host queue: dead-lettered once
    or handled, and the agent goes on (a valid action for no instance is dropped)."""
    cell = memory_cell
    cell.bus.take_dead_letters()
    publish_to_host_raw(cell.bus, cell.agent.host, body)
    host_sentinel(cell)
    letters = deadletters.DeadLetterBox(cell.bus).read()
    try:
        msg = decode(body)
    except PoisonMessage:
        assert len(letters) == 1 and letters[0].dead.reason, letters
    else:
        stray = isinstance(msg, ActionRequest) and msg.host != cell.agent.host
        assert len(letters) == (1 if stray else 0), [letter.dead.reason for letter in letters]
    check_listing(cell, letters)
    deadletters.DeadLetterBox(cell.bus).purge()
