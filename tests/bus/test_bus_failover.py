"""The bus on a ``transport_url`` naming several RabbitMQ hosts: it fails over across them.

A host that is down from the start is a closed port; one that goes down while
the bus is on it is a forwarding port in front of the local RabbitMQ, closed
with every connection through it, as a node that dies. The whole bus contract
also runs through a failover URL (``tests/bus/test_bus.py``, ``rabbit-failover``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from qsched.bus.base import BusUnavailable
from qsched.bus.kombu import KombuBus, KombuOptions
from qsched.net import LOOPBACK, free_port
from tests.bus.test_bus import AMQP_URL, Harness, Inbox, ack, reachable, request

pytestmark = pytest.mark.timeout(60)

FAILING_OVER = "is unreachable"


class NodeStandIn:
    """A port forwarding to RabbitMQ, which goes down like a broker node: :meth:`down`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server((LOOPBACK, 0))
        self.port = int(self._server.getsockname()[1])
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def down(self) -> None:
        """Stop listening and cut every connection through it."""
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._server.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def rabbitmq() -> tuple[str, int]:
    reachable(AMQP_URL)
    parts = urlsplit(AMQP_URL)
    return str(parts.hostname), parts.port or 5672


def credentials() -> str:
    parts = urlsplit(AMQP_URL)
    return f"{parts.username}:{parts.password}"


@contextlib.contextmanager
def harness_on(url: str) -> Iterator[Harness]:
    harness = Harness(url)
    try:
        yield harness
    finally:
        harness.cleanup()


def receive(inbox: Inbox, request_id: str, timeout_s: float = 10.0) -> None:
    """Wait for ``request_id``, passing over the first message if it comes again (its
    ack may have been lost with the node)."""
    deadline = time.monotonic() + timeout_s
    while inbox.get(max(deadline - time.monotonic(), 0.01))[0].request_id != request_id:
        pass


def failovers(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if FAILING_OVER in r.getMessage()]


def two_hosts(form: str, first: str, second: str, user: str = "guest:guest") -> str:
    """A URL naming ``first`` then ``second`` (``host:port``) in one of the forms that fail over."""
    if form == "kombu":
        return f"amqp://{user}@{first}//;amqp://{user}@{second}//"
    return f"{form}://{user}@{first},{user}@{second}/"


FORMS = ["rabbit", "amqp", "kombu"]  # oslo.messaging's two, and kombu's ';' list


@pytest.mark.parametrize("form", FORMS)
def test_every_host_down_fails_promptly_and_names_them_all(form: str) -> None:
    ports = free_port(), free_port()
    url = two_hosts(form, f"{LOOPBACK}:{ports[0]}", f"{LOOPBACK}:{ports[1]}", "guest:s3cret")
    bus = KombuBus(url, options=KombuOptions(connect_timeout_s=1.0))
    started = time.monotonic()
    with pytest.raises(BusUnavailable) as info:
        bus.publish_boot(request())
    assert time.monotonic() - started < 3.0
    assert info.value.category == "unreachable"
    assert all(str(port) in str(info.value) for port in ports)
    assert "s3cret" not in str(info.value)
    with pytest.raises(BusUnavailable):
        bus.check_health()


@pytest.mark.real
@pytest.mark.parametrize("form", FORMS)
def test_a_publish_fails_over_when_the_first_host_is_down(
    rabbitmq: tuple[str, int], form: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="qsched.bus.kombu.wire")
    up = f"{rabbitmq[0]}:{rabbitmq[1]}"
    url = two_hosts(form, f"{LOOPBACK}:{free_port()}", up, credentials())
    with harness_on(url) as harness:
        inbox = Inbox(ack)
        harness.consumer(inbox, classes=("m1.small",))
        sent = request()
        harness.bus.publish_boot(sent)
        assert inbox.get()[0].request_id == sent.request_id
        assert len(failovers(caplog)) == 1, "each connection starts at the host last reached"
        connection = harness.bus.wire.connect()
        connection.release()
        harness.bus.check_health()
        assert len(failovers(caplog)) == 1


@pytest.mark.real
@pytest.mark.parametrize("strategy", ["round-robin", "shuffle"])
def test_the_bus_moves_on_when_the_host_it_is_on_goes_down(
    rabbitmq: tuple[str, int], strategy: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="qsched.bus.kombu.wire")
    node = NodeStandIn(rabbitmq)
    up = f"{rabbitmq[0]}:{rabbitmq[1]}"
    url = two_hosts("rabbit", f"{LOOPBACK}:{node.port}", up, credentials())
    url += f"?kombu_failover_strategy={strategy}"
    with harness_on(url) as harness:
        harness.bus.wire._reached = 0  # shuffle starts anywhere: start on the node that will die
        inbox = Inbox(ack)
        harness.consumer(inbox, classes=("m1.small",))
        first = request()
        harness.bus.publish_boot(first)
        assert inbox.get()[0].request_id == first.request_id
        assert not failovers(caplog)
        node.down()
        second = request()
        harness.bus.publish_boot(second)  # the pooled connection is dead: a new one, elsewhere
        receive(inbox, second.request_id)  # the consumer moved on too
        left = failovers(caplog)
        assert left and all(f":{node.port}/" in message for message in left)
