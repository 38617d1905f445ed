"""The qsched bus on kombu transports: in memory, RabbitMQ, Redis.

Features
========
``memory://`` (the embedded default: API, agents and tests in one process)

* Everything lives in this process; threads only. No confirms (a put is synchronous).
* Prefetch 1 per consumer connection (all its queues together).
* Counts: ready messages only.

``amqp://`` (RabbitMQ, the production path)

* Boot queues are durable quorum queues with ``x-delivery-limit`` and a dead-letter
  exchange (at-least-once dead lettering), so a message that keeps coming back
  unacked (say, it crashes every agent that takes it) ends in ``<prefix>.dead``
  instead of looping forever. Host queues are durable classic queues with the same
  dead-letter exchange (thousands of hosts: one Raft group each would cost too much),
  or quorum queues under ``[bus] host_queue_type = quorum``, which a RabbitMQ cluster
  needs: a classic queue is gone while the one node holding it is.
* Publisher confirms, and ``mandatory``: a message no queue took comes back, the
  queue is declared again and the message published once more.
* Prefetch 1 per queue consumed: quorum queues refuse a channel-wide prefetch, so
  an agent consuming k classes may hold k + 1 messages at once.
* Counts: ready and consumers (passive declare); unacked needs the management API.

``redis://`` (kombu's Redis transport)

* Messages go straight to the list named after the queue: kombu's virtual
  exchanges find a route by scanning every binding of the exchange, which would
  make each publish O(hosts). The same holds for ``memory://``.
* A message held unacked longer than ``visibility_timeout_s`` is delivered again,
  even while its consumer lives; keep it far above any hold (an agent acks right
  after its claim). A redelivery cannot place twice: the claim is idempotent.
  A consumer that dies without closing gives its messages back only after it.
* Prefetch 1 per consumer connection. Counts: ready messages only.

``rabbit://`` (RabbitMQ in oslo.messaging's syntax, several hosts)

* Parsed by oslo.messaging (:mod:`qsched.conf.transport`): one ``amqp://`` URL
  per host, and the query options of its rabbit driver that mean something here
  (``ssl``, ``kombu_failover_strategy``, heartbeats...); the others are refused.
* Every connection (a publisher's, a consumer's, the probe's) tries each host
  once, starting from the one the last connection reached, then the others in
  the order listed (``round-robin``) or at random (``shuffle``). A host that
  fails is logged; a publish fails only when no host answers. oslo.messaging
  also starts a connection at a random host under ``round-robin``; here the
  first host listed is the one preferred.
* Everything else as ``amqp://``.

Connection String
=================
.. code-block::

    memory://
    amqp://USER:PASSWORD@HOST[:5672]/[VHOST]
    amqp://USER:PASSWORD@HOST1:5672//;amqp://USER:PASSWORD@HOST2:5672//
    rabbit://USER:PASSWORD@HOST1[:5672][,USER:PASSWORD@HOST2[:5672]...]/[VHOST][?OPTIONS]
    redis://[:PASSWORD@]HOST[:6379]/[DB]

A ``;`` list of kombu URLs fails over as ``rabbit://`` does; so does oslo's
``amqp://`` listing several hosts with commas (parsed as ``rabbit://``).

Options are in :class:`KombuOptions` (the ``[bus]`` tunables, see :meth:`KombuBus.from_options`).

Modules
=======
* :mod:`qsched.bus.kombu.bus`: :class:`KombuBus`, the :class:`~qsched.bus.base.Bus`
  contract and nothing more; it publishes, and builds consumers (each on a connection
  of its own, or all on one, :meth:`KombuBus.sharing_consumers`);
* :mod:`qsched.bus.kombu.wire`: connections, queues and exchanges, declares and
  confirmed publishes (dead letters too), which both halves stand on;
* :mod:`qsched.bus.kombu.consumer`: a host's consumer and its deliveries; it knows
  the wire it is handed, not the bus;
* :mod:`qsched.bus.kombu.loop`: the reconnecting connection and thread under one
  consumer, or under the consumers of several hosts;
* :mod:`qsched.bus.kombu.message`: what a kombu message holds, read without trusting it;
* :mod:`qsched.bus.health` (beside this package, the oslo.messaging bus uses it too):
  the publish history and probe cache behind ``check_health``.

What it may import: the kombu and py-amqp libraries (an absolute ``import kombu`` in
these modules is the library, never this package), :mod:`qsched.bus.base`,
:mod:`qsched.bus.health`, :mod:`qsched.scheduling.message`, :mod:`qsched.conf` (the ``[bus]``
options as values, and the transport URL parser) and :mod:`qsched.exception`; never
the oslo.messaging bus, nor anything above the backends. This package's own modules
import each other, the bus last: the wire imports none of them, the consumer not the bus.
"""

from __future__ import annotations

from qsched.bus.kombu.bus import KombuBus
from qsched.bus.kombu.wire import SCHEMES, KombuOptions

__all__ = ["SCHEMES", "KombuBus", "KombuOptions"]
