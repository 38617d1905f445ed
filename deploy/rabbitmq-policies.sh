#!/bin/sh
# Broker policies for qsched on RabbitMQ. qsched declares its boot queues as quorum
# queues with a delivery limit and a dead-letter exchange; queue arguments cannot
# change once a queue exists, so operators tune them later with policies, which
# RabbitMQ applies to existing queues too.
set -eu
VHOST=${VHOST:-/}
PREFIX=${PREFIX:-qsched}

# Deliveries without an ack before a boot request is dead-lettered (a poison
# message that crashes every agent that takes it ends there instead of looping).
rabbitmqctl set_policy -p "$VHOST" --apply-to quorum_queues qsched-boot \
    "^${PREFIX}\\.boot\\." '{"delivery-limit": 20, "dead-letter-exchange": "'"${PREFIX}"'.dead"}'

# Classes that nobody publishes to any more: drop their empty queues after a day.
rabbitmqctl set_policy -p "$VHOST" --apply-to queues --priority 1 qsched-idle-classes \
    "^${PREFIX}\\.boot\\..*\\+" '{"expires": 86400000}'
