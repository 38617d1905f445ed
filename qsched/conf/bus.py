"""The [bus] section: names and tunables of the message bus."""

from __future__ import annotations

import dataclasses

from oslo_config import cfg

from qsched.conf.base import Section

#: [DEFAULT] transport_url: read with the [bus] section, which says how to use it.
default_opts = [
    cfg.StrOpt(
        "transport_url",
        default="memory://",
        secret=True,
        help="Bus URL. memory:// is the in-process embedded default; amqp://user:pass@host:5672// "
        "is RabbitMQ (the production path); redis://host:6379/0 uses kombu's Redis transport. "
        "oslo.messaging's syntax names a RabbitMQ cluster: "
        "rabbit://user:pass@host1:5672,user:pass@host2:5672/vhost?ssl=true, parsed by "
        "oslo.messaging; connections fail over across the hosts listed. Query options are "
        "those of oslo.messaging's rabbit driver: ssl, ssl_ca_file, ssl_cert_file, "
        "ssl_key_file, kombu_failover_strategy, rabbit_login_method, "
        "heartbeat_timeout_threshold and heartbeat_rate are honoured, any other is refused.",
    ),
]

KOMBU, OSLO_MESSAGING = "kombu", "oslo.messaging"
CLASSIC, QUORUM = "classic", "quorum"

bus_opts = [
    cfg.StrOpt(
        "driver",
        default=KOMBU,
        choices=[
            (
                KOMBU,
                "kombu's transports: memory://, amqp:// and rabbit:// (RabbitMQ), "
                "redis://; quorum boot queues with a dead-letter exchange of their own",
            ),
            (
                OSLO_MESSAGING,
                "oslo.messaging's notification layer on its rabbit driver, for "
                "deployments that run everything through oslo.messaging; needs a rabbit:// "
                "or amqp:// transport_url, and the broker policies of "
                "deploy/rabbitmq-policies.sh (see docs/pipeline.rst)",
            ),
        ],
        help="The library that carries the bus. With oslo.messaging, boot requests go on "
        "the topic <prefix>.boot.<class> (queue <prefix>.boot.<class>.info), deletes and "
        "server actions on <prefix>.host.<host> (queue <prefix>.host.<host>.info); agents "
        "consume with oslo.messaging's notification listener, which acknowledges a "
        "request only after the agent has placed or requeued it. Dead letters, queue "
        "counts and the health probe still speak AMQP to the same broker.",
    ),
    cfg.StrOpt(
        "prefix",
        default="qsched",
        help="Exchange and queue name prefix: <prefix>.boot.<class>, <prefix>.host.<host>, "
        "<prefix>.dead.",
    ),
    cfg.FloatOpt(
        "connect_timeout_s",
        default=5.0,
        min=0.1,
        help="Broker connect timeout, per host of transport_url; when no host answers, a "
        "publish fails (the API answers 503) after about twice this times the hosts listed.",
    ),
    cfg.FloatOpt(
        "confirm_timeout_s",
        default=5.0,
        min=0.1,
        help="How long a publish waits for the broker's confirm (also the Redis socket timeout).",
    ),
    cfg.IntOpt("heartbeat_s", default=30, min=0, help="AMQP heartbeat of agent consumers; 0: off."),
    cfg.IntOpt(
        "delivery_limit",
        default=20,
        min=1,
        help="RabbitMQ boot queues: deliveries without an ack before a message is "
        "dead-lettered. Fixed when a queue is created; change it later with a policy.",
    ),
    cfg.StrOpt(
        "host_queue_type",
        default=CLASSIC,
        choices=[
            (CLASSIC, "durable classic queues: cheap, but each lives on one RabbitMQ node"),
            (QUORUM, "quorum queues, replicated like the boot queues: one Raft group per host"),
        ],
        help="RabbitMQ host queues (<prefix>.host.<host>: deletes and server actions). On "
        "a cluster, a classic queue lives on the node that declared it: while that node is "
        "down its agent cannot consume at all (the consumer declares its host queue "
        'first and RabbitMQ refuses it with 404 "home node is down"), and deletes to it '
        "fail. Set quorum on a RabbitMQ cluster. Fixed when a queue is created: a queue "
        "declared with the other type is refused (PRECONDITION_FAILED) until it is "
        "deleted; delete the host queues of stopped agents when changing it.",
    ),
    cfg.FloatOpt(
        "visibility_timeout_s",
        default=3600.0,
        min=1.0,
        help="kombu Redis transport: a message held unacked this long is delivered again, "
        "even to a live consumer. Keep it far above any hold.",
    ),
    cfg.FloatOpt(
        "poll_interval_s",
        default=0.1,
        min=0.01,
        help="How often a consumer applies class changes and settles from other threads.",
    ),
    cfg.FloatOpt(
        "settle_timeout_s",
        default=30.0,
        min=0.1,
        help="How long an ack, requeue or reject from another thread waits for the "
        "consumer thread.",
    ),
    cfg.FloatOpt(
        "reconnect_max_delay_s",
        default=5.0,
        min=0.1,
        help="Upper bound of the consumer reconnect backoff, which doubles from 0.1 s "
        "and starts over once a connection lasted this long.",
    ),
    cfg.IntOpt(
        "publisher_pool_size",
        default=32,
        min=0,
        help="Idle publishing connections kept per process. Keep it at least the number "
        "of threads that publish at once (gunicorn's threads in the API): a connection "
        "beyond it is opened and closed for every message.",
    ),
]


@dataclasses.dataclass(frozen=True)
class BusOptions(Section):
    """``[DEFAULT] transport_url`` and the ``[bus]`` options."""

    GROUPS = ((None, default_opts), ("bus", bus_opts))

    transport_url: str
    driver: str
    prefix: str
    connect_timeout_s: float
    confirm_timeout_s: float
    heartbeat_s: int
    delivery_limit: int
    host_queue_type: str
    visibility_timeout_s: float
    poll_interval_s: float
    settle_timeout_s: float
    reconnect_max_delay_s: float
    publisher_pool_size: int
