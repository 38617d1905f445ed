"""The qsched bus on oslo.messaging's notification layer (``[bus] driver = oslo.messaging``).

For deployments that run everything through oslo.messaging: the same per-class
topics and pulling agents as the kombu bus, on oslo.messaging's rabbit driver.

Features
========
* Why the notification listener and not the RPC server: oslo.messaging's RPC
  server acknowledges a message when it receives it, before the endpoint runs, so
  an agent that dies holding a request would lose it. Its notification listener
  with ``allow_requeue`` acknowledges after the endpoint returns ``HANDLED`` and
  gives the message back on ``REQUEUE``: an agent acknowledges a request only once
  its claim is in the ledger, or its copy is confirmed at the tail (requeue) or in
  the dead letters (reject), as on the kombu bus.
* Topics ``<prefix>.boot.<class>`` and ``<prefix>.host.<host>`` on the topic
  exchange ``<prefix>``, priority ``info``: the queues are
  ``<prefix>.boot.<class>.info`` and ``<prefix>.host.<host>.info``
  (:class:`~qsched.bus.oslo.wire.OsloNames`, which admin views use too). Boot
  queues are durable quorum queues with ``x-delivery-limit`` ``[bus]
  delivery_limit``; host queues durable classic queues, or quorum queues without a
  delivery limit under ``[bus] host_queue_type = quorum`` (for a RabbitMQ cluster).
* No pool: the agents of a class compete on its one queue; prefetch 1 per queue.
* Publishes are confirmed (the rabbit driver publishes with confirms, after
  declaring the queue), and a failure raises :class:`~qsched.bus.base.BusUnavailable`
  (oslo.messaging's Notifier would only log it: see
  :meth:`~qsched.bus.oslo.wire.OsloWire.publish`).
* Dead letters: oslo.messaging declares its queues with a delivery limit but no
  dead-letter exchange, and RabbitMQ drops a message over the limit. The policies
  of ``deploy/rabbitmq-policies.sh`` give ``<prefix>.boot.*`` and ``<prefix>.host.*``
  the dead-letter exchange ``<prefix>.dead``; they are required, not optional,
  with this bus. The dead-letter queue is the kombu bus's ``<prefix>.dead``
  (quorum, no delivery limit: reviewing letters is no delivery that may drop them),
  written and read over AMQP through :mod:`qsched.bus.kombu.wire`, so ``qsched-admin``
  sees one place for both. A letter the broker dead-lettered carries the
  oslo.messaging envelope; :meth:`OsloBus.take_dead_letters` shows its qsched body.
* What the contract cannot have here: ``Delivery.redelivered`` is always False and
  ``Delivery.headers`` empty (oslo.messaging hands its endpoint neither), and a
  message oslo.messaging cannot decode (not JSON, not an envelope) never reaches
  the agent: the rabbit driver rejects it, and the broker dead-letters it through
  the policy with the reason ``rejected``.
* Counts, purges, dead letters and the health probe go through kombu on the same
  broker (oslo.messaging has none of them); the probe is the kombu bus's.

Connection String
=================
.. code-block::

    rabbit://USER:PASSWORD@HOST1[:5672][,USER:PASSWORD@HOST2[:5672]...]/[VHOST][?OPTIONS]
    amqp://USER:PASSWORD@HOST[:5672]/[VHOST]     (rewritten as rabbit://)

Query options as for the kombu bus (:mod:`qsched.conf.transport`). The ``[bus]``
options used: ``prefix``, ``delivery_limit``, ``heartbeat_s`` (the rabbit driver's
``heartbeat_timeout_threshold``, which also bounds how long a publish waits for its
confirm), ``reconnect_max_delay_s`` (``rabbit_interval_max``), ``publisher_pool_size``
(``rpc_conn_pool_size``), and for the AMQP side ``connect_timeout_s`` and
``confirm_timeout_s``.

Modules
=======
* :mod:`qsched.bus.oslo.bus`: :class:`OsloBus`, the :class:`~qsched.bus.base.Bus`
  contract; its counts, purges and dead letters through the kombu bus on the same broker;
* :mod:`qsched.bus.oslo.wire`: names, transports, envelope, publishes;
* :mod:`qsched.bus.oslo.consumer`: a host's consumer and its deliveries, one listener
  per queue;
* :mod:`qsched.bus.oslo.listener`: one notification listener that stops without giving
  anything back to the broker.

What it may import: oslo.messaging and py-amqp, :mod:`qsched.bus.base`,
:mod:`qsched.bus.health`, the kombu bus (:mod:`qsched.bus.kombu`, for the AMQP side
above), :mod:`qsched.scheduling.message`, :mod:`qsched.conf` (the ``[bus]`` options as values, the
transport URL parser) and :mod:`qsched.exception`; nothing above the backends. Within
the package the bus comes last: the wire imports none of the others, the listener only
the wire, the consumer not the bus. Importing it imports oslo.messaging, so
:func:`qsched.bus.open_bus` imports it only for ``[bus] driver = oslo.messaging``.
"""

from __future__ import annotations

from qsched.bus.oslo.bus import SCHEMES, OsloBus
from qsched.bus.oslo.wire import OsloNames

__all__ = ["SCHEMES", "OsloBus", "OsloNames"]
