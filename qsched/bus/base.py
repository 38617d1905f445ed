"""The bus: how boot requests reach agents, deletes reach hosts, and bad messages stop.

Names (``<prefix>`` is "qsched" unless a deployment or a test run picks another):

================  ==========================  ====================  =====================
what              queue                       routing key           exchange
================  ==========================  ====================  =====================
boot requests     ``<prefix>.boot.<class>``   ``boot.<class>``      ``<prefix>`` (direct)
deletes per host  ``<prefix>.host.<host>``    ``host.<host>``       ``<prefix>`` (direct)
dead letters      ``<prefix>.dead``           ``dead``              ``<prefix>.dead``
================  ==========================  ====================  =====================

One queue per scheduling class: an agent consumes the classes it can fit now and
nothing else, so the broker does the matching and no one scans hosts.
A host's queue also carries its server actions (stop, start, reboot) and the boot
requests sent to that host only: members of
an affinity server group go to the host their group is on.

Delivery is at least once. An agent settles every delivery exactly once:

* :meth:`Delivery.ack` -- done with it (claimed, or handed to the ledger for good);
* :meth:`Delivery.requeue` -- publish a new body (the caller made it: attempt + 1,
  host added to tried_hosts) to the tail of the same queue, then ack the old one;
* :meth:`Delivery.reject` -- publish it to the dead letters with a reason, then ack.

``requeue`` never uses the broker's own requeue: RabbitMQ puts a requeued message
back at the head of its queue, so a lone agent that cannot fit it would take it
again at once and starve everything behind it. The copy is confirmed by the broker
before the old one is acked, so a crash in between leaves two copies, never none;
the ledger claim is idempotent per instance, so a duplicate cannot place twice.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from qsched import exception
from qsched.scheduling.message import BootRequest, DeleteRequest, HostAction

DEFAULT_PREFIX = "qsched"
DEAD_ROUTING_KEY = "dead"
REASON_HEADER = "x-qsched-reason"
ORIGIN_QUEUE_HEADER = "x-qsched-queue"
ORIGIN_KEY_HEADER = "x-qsched-routing-key"
DEAD_AT_HEADER = "x-qsched-dead-at"
MAX_REASON_CHARS = 1000

_CLASS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}").fullmatch
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}").fullmatch
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}").fullmatch


#: Why the bus is unavailable, in words safe for a public page (no URL, host or
#: password): ``BusUnavailable.category``, and what ``/healthcheck`` shows.
UNAVAILABLE = "unavailable"  # no more is known
UNREACHABLE = "unreachable"  # no connection: down, refused, timed out, bad credentials
DECLARE_FAILED = "declares failing"  # connected, but the broker fails to declare queues
PUBLISH_FAILED = "publishes failing"  # declared, but no confirm in time, or the write refused
REFUSED = "queue refused"  # the broker refused one queue: its arguments, full, no route


class BusUnavailable(exception.BackendUnavailable):
    """The broker did not take a message (unreachable, no confirm in time, nacked).

    ``category`` is one of the words above; ``reason`` is for logs only.
    """

    msg_fmt = "Message bus at {url} is unavailable: {reason}"
    service = "the message bus"
    url: str  # password masked
    reason: str
    category: str

    def __init__(self, url: str, reason: str, category: str = UNAVAILABLE) -> None:
        super().__init__(backend="Message bus", url=url, reason=reason, category=category)


class MessageSettled(exception.QschedError):
    """A delivery is settled once: ack, requeue or reject, not two of them."""

    msg_fmt = "Message {delivery} from {queue} was already {state}."


def check_class(name: object) -> str:
    """Return a scheduling class usable in a queue name, or raise Invalid."""
    if isinstance(name, str) and _CLASS(name):
        return name
    raise exception.Invalid(
        reason=f"scheduling class {name!r} must be 1-200 of letters, digits, '.', '_', '+', '-'"
    )


def check_host(name: object) -> str:
    """Return a host name usable in a queue name, or raise Invalid."""
    if isinstance(name, str) and _HOST(name):
        return name
    raise exception.Invalid(reason=f"host {name!r} must be 1-200 of letters, digits, '.', '_', '-'")


@dataclasses.dataclass(frozen=True)
class Names:
    """Queue, exchange and routing key names under one prefix (pure, no I/O)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX(self.prefix):
            raise exception.Invalid(reason=f"bus prefix {self.prefix!r} is not a valid name")

    @property
    def exchange(self) -> str:
        return self.prefix

    @property
    def dead_exchange(self) -> str:
        return f"{self.prefix}.dead"

    @property
    def dead_queue(self) -> str:
        return f"{self.prefix}.dead"

    def boot_queue(self, scheduling_class: str) -> str:
        return f"{self.prefix}.boot.{check_class(scheduling_class)}"

    @staticmethod
    def boot_routing_key(scheduling_class: str) -> str:
        return f"boot.{check_class(scheduling_class)}"

    def host_queue(self, host: str) -> str:
        return f"{self.prefix}.host.{check_host(host)}"

    @staticmethod
    def host_routing_key(host: str) -> str:
        return f"host.{check_host(host)}"


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """What the broker tells about one queue; None where the transport cannot tell."""

    queue: str
    ready: int | None  # waiting for a consumer
    unacked: int | None  # delivered, not settled yet
    consumers: int | None


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A message taken from the dead letters, with why it went there."""

    body: bytes
    reason: str
    queue: str | None  # where it was consumed from
    routing_key: str | None
    dead_at: float | None  # epoch seconds, when qsched put it there
    headers: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Delivery(abc.ABC):
    """One message handed to a consumer callback; settle it exactly once.

    The settling methods may be called from the consumer's thread (inside the
    callback) or from any other thread; from another thread they wait until the
    consumer's thread has done it.
    """

    @property
    @abc.abstractmethod
    def queue(self) -> str:
        """The queue it came from."""

    @property
    @abc.abstractmethod
    def routing_key(self) -> str:
        """``boot.<class>`` or ``host.<host>``: where :meth:`requeue` publishes."""

    @property
    @abc.abstractmethod
    def redelivered(self) -> bool:
        """True if the broker delivered it before (to someone) without an ack."""

    @property
    @abc.abstractmethod
    def headers(self) -> Mapping[str, Any]:
        """Transport headers (``x-delivery-count`` on RabbitMQ quorum queues)."""

    @abc.abstractmethod
    def ack(self) -> None:
        """Done with the message: the broker forgets it.

        :raises MessageSettled: it was settled before.
        :raises BusUnavailable: the connection that delivered it is gone; the
            broker delivers it again (to this consumer after it reconnects, or
            to another).
        """

    @abc.abstractmethod
    def requeue(self, new_body: bytes) -> None:
        """Publish ``new_body`` to the tail of the same queue, confirmed; then ack this one.

        The caller builds the body (``BootRequest.next_attempt(host).encode()``).

        :raises MessageSettled: it was settled before; nothing is published.
        :raises BusUnavailable: the copy was not confirmed: the old one is given
            back to the broker as it came (RabbitMQ: at the head of the queue),
            never acked. Or the ack failed: both copies may come back.
        """

    @abc.abstractmethod
    def reject(self, reason: str) -> None:
        """Publish the message to the dead letters with ``reason``, confirmed; then ack it.

        :raises MessageSettled: it was settled before.
        :raises BusUnavailable: as :meth:`requeue`.
        """


GIVEN_BACK = "given back"  # a delivery's state once returned to the broker unsettled


class SettledOnce:
    """A delivery's state, claimed once from any thread: what both buses' deliveries share.

    ``state`` is None until claimed, then "acked", "requeued", "rejected" or
    :data:`GIVEN_BACK`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state: str | None = None

    def _claim(self, state: str, url: str, given_back: str, tag: object, queue: str) -> None:
        """Claim the delivery for ``state``: whatever follows fails or not, it is settled once.

        :raises BusUnavailable: it was given back (``given_back`` says when).
        :raises MessageSettled: it was settled before.
        """
        with self._lock:
            if self.state == GIVEN_BACK:
                raise BusUnavailable(url, given_back)
            if self.state is not None:
                raise MessageSettled(delivery=tag, queue=queue, state=self.state)
            self.state = state


#: A consumer callback: the raw body (bytes, whatever type the transport handed
#: over) and its delivery. It runs in the consumer's thread. If it raises without
#: settling, the message is dead-lettered with the exception as the reason --
#: unless the exception is a BackendUnavailable (a ledger or bus outage is not the
#: message's fault): then it is given back. It is not called for a message kombu
#: could not decode: that one is dead-lettered with kombu's reason.
OnMessage = Callable[[bytes, Delivery], None]


class Consumer(abc.ABC):
    """An agent's consumer: some boot classes plus its own host queue, in its own thread.

    Prefetch is 1 and acks are manual. It reconnects (and declares its queues
    again) after a broker restart or a dropped connection, until :meth:`stop`.
    """

    @abc.abstractmethod
    def start(self) -> None:
        """Start the consumer thread (returns at once; see :meth:`wait_ready`)."""

    @abc.abstractmethod
    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop consuming and close; safe from any thread, idempotent.

        A callback already running finishes first (if called from another
        thread, for up to ``timeout_s``). Deliveries not settled by then are
        given back to the broker, never taken as settled; settling them later
        raises :class:`BusUnavailable`. (The kombu bus rejects them with requeue;
        the oslo.messaging bus publishes a confirmed copy at the tail and acks
        the old one, so that a quorum queue counts no delivery:
        :mod:`qsched.bus.oslo.listener`.)
        """

    @abc.abstractmethod
    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until connected and consuming; False if that took longer than ``timeout_s``."""

    @abc.abstractmethod
    def add_class(self, scheduling_class: str) -> Future[None]:
        """Start consuming ``boot.<class>`` without touching the other queues.

        Thread-safe. The future is done once the consumer's thread has
        subscribed (at once when called from a callback).

        :raises Invalid: the name cannot be a queue name.
        """

    @abc.abstractmethod
    def remove_class(self, scheduling_class: str) -> Future[None]:
        """Stop consuming ``boot.<class>``; a delivery from it in hand can still be settled.

        Thread-safe; the future is done as for :meth:`add_class`.
        """

    @property
    @abc.abstractmethod
    def classes(self) -> frozenset[str]:
        """The boot classes this consumer wants (applied or about to be)."""

    @property
    @abc.abstractmethod
    def host(self) -> str:
        """The host whose queue it always consumes."""


class WantingConsumer(Consumer):
    """What every consumer here shares: the host and the classes wanted, changed by a
    thread that subscribes and unsubscribes (:meth:`_later`), its own or one it shares
    with the consumers of other hosts (:mod:`qsched.bus.kombu.consumer`)."""

    def __init__(self, host: str, on_message: OnMessage, classes: Iterable[str]) -> None:
        self._host = check_host(host)
        self._on_message = on_message
        self._wanted = {check_class(name) for name in classes}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()

    @property
    def host(self) -> str:
        return self._host

    @property
    def classes(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._wanted)

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def add_class(self, scheduling_class: str) -> Future[None]:
        name = check_class(scheduling_class)
        with self._lock:
            self._wanted.add(name)
        return self._later(functools.partial(self._subscribe, name))

    def remove_class(self, scheduling_class: str) -> Future[None]:
        name = check_class(scheduling_class)
        with self._lock:
            self._wanted.discard(name)
        return self._later(functools.partial(self._unsubscribe, name))

    @abc.abstractmethod
    def _later(self, change: Callable[[], None]) -> Future[None]:
        """Have the consumer thread run ``change``; the future is done once it has."""

    @abc.abstractmethod
    def _subscribe(self, name: str) -> None:
        """In the consumer thread: start consuming class ``name``."""

    @abc.abstractmethod
    def _unsubscribe(self, name: str) -> None:
        """In the consumer thread: stop consuming class ``name``."""


class ThreadedConsumer(WantingConsumer):
    """A consumer with one thread of its own (:meth:`_run`)."""

    def __init__(self, host: str, on_message: OnMessage, classes: Iterable[str]) -> None:
        super().__init__(host, on_message, classes)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        name = f"qsched-bus-{self._host}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @abc.abstractmethod
    def _run(self) -> None:
        """The consumer thread."""


class Bus(abc.ABC):
    """Publish boot and delete requests, consume them, look at queues and dead letters."""

    names: Names

    @abc.abstractmethod
    def publish_boot(self, message: BootRequest) -> None:
        """Publish to ``boot.<message.scheduling_class>`` and wait for the broker's confirm.

        Thread-safe. The class queue is declared on first use by this process.

        :raises BusUnavailable: not confirmed (the API answers 503 and gives the
            quota back). A message may still have got through: delivery is at
            least once, the claim idempotent.
        :raises Invalid: the class cannot be a queue name.
        """

    @abc.abstractmethod
    def publish_delete(self, host: str, message: DeleteRequest) -> None:
        """Publish to ``host.<host>``, confirmed. Raises as :meth:`publish_boot`."""

    @abc.abstractmethod
    def publish_action(self, host: str, message: HostAction) -> None:
        """Publish a server action or a move's step to ``host.<host>``, confirmed.
        Raises as :meth:`publish_boot`."""

    @abc.abstractmethod
    def publish_to_host(self, host: str, message: BootRequest) -> None:
        """Publish a boot request to ``host.<host>`` only, confirmed: a member of an
        affinity server group goes to the host its group is on. Raises as
        :meth:`publish_boot`."""

    @abc.abstractmethod
    def consumer(self, host: str, on_message: OnMessage, classes: Iterable[str] = ()) -> Consumer:
        """A consumer (not started) of ``host``'s queue and the given boot classes.

        :raises Invalid: a host or class that cannot be a queue name.
        """

    @abc.abstractmethod
    def boot_classes(self) -> frozenset[str]:
        """Boot classes this process declared (published to or consumed); no broker call."""

    @abc.abstractmethod
    def queue_stats(self, scheduling_class: str) -> QueueStats:
        """Counts for one class queue, for admin views.

        :raises NotFound: the transport knows the queue does not exist.
        :raises BusUnavailable:
        """

    @abc.abstractmethod
    def dead_letter_stats(self) -> QueueStats:
        """Counts for the dead-letter queue. Raises as :meth:`queue_stats`."""

    @abc.abstractmethod
    def take_dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Remove up to ``limit`` dead letters, oldest first, and return them.

        :raises BusUnavailable:
        """

    @abc.abstractmethod
    def review_dead_letters(
        self, keep: Callable[[DeadLetter], bool], limit: int = 100
    ) -> list[DeadLetter]:
        """Show up to ``limit`` dead letters, oldest first, to ``keep``; drop those it refuses.

        For admins: list, requeue or purge some letters and keep the others. None
        is lost, and looking is no delivery (a quorum queue's delivery limit
        would drop letters read often): each is held unacked while ``keep``
        decides; one kept is published again to the tail of the dead letters,
        confirmed, before it is acked, so a crash in between leaves two copies,
        never none. When it died stays in its headers. ``keep`` may publish (a
        requeue) and may raise; the letters not decided yet then go back to the
        broker as they were.

        :returns: the letters shown, in order.
        :raises BusUnavailable: letters not decided yet were given back.
        """

    @abc.abstractmethod
    def purge_queue(self, scheduling_class: str) -> int:
        """Drop every message waiting in one class queue; return how many.

        Deliveries in a consumer's hands are not dropped.

        :raises NotFound: as :meth:`queue_stats`; nothing is dropped.
        :raises BusUnavailable:
        """

    @abc.abstractmethod
    def check_health(self) -> None:
        """Check that boots can be published now; cheap enough for a load balancer's polls.

        Thread-safe. Two sources: a probe of the broker (a real round trip, its
        outcome reused for about a second), and what this process's boot
        publishes met lately, which a probe may not see (a broker that accepts
        connections but fails to declare queues). One class whose queue the
        broker refuses does not make the bus unhealthy; see
        :class:`qsched.bus.health.PublishHistory`.

        :raises BusUnavailable: its ``category`` says why, in a word fit for a
            public page.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Close the publishing connections (consumers are stopped on their own)."""

    def requeue(self, delivery: Delivery, new_body: bytes) -> None:
        """Same as ``delivery.requeue(new_body)``: publish the copy, confirmed, then ack."""
        delivery.requeue(new_body)


class BootPublisher(Protocol):
    """What the janitor and the outbox need of a bus: :meth:`Bus.publish_boot`, to publish
    boot requests again."""

    def publish_boot(self, message: BootRequest) -> None: ...


class Publisher(BootPublisher, Protocol):
    """What a front door needs of a bus (a :class:`Bus`, or one wrapped to count its
    failures): each method as the :class:`Bus` method of its name."""

    def publish_delete(self, host: str, message: DeleteRequest) -> None: ...

    def publish_action(self, host: str, message: HostAction) -> None: ...

    def publish_to_host(self, host: str, message: BootRequest) -> None: ...

    def check_health(self) -> None: ...


def describe(exc: BaseException) -> str:
    """An exception in one line for logs and reasons: its type, and its text if any."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
