#!/bin/sh
# Broker policies for qsched's queues on RabbitMQ 3.10 and later.
#
#   deploy/rabbitmq-policies.sh [-p VHOST]
#
# Environment (each with its default):
#   VHOST=/                  the vhost of [DEFAULT] transport_url (-p wins over it)
#   PREFIX=qsched            [bus] prefix
#   DELIVERY_LIMIT=20        [bus] delivery_limit
#   IDLE_EXPIRES_MS=86400000 how long an unused constrained class's queue lives (a day)
#   RABBITMQCTL=rabbitmqctl  the command, split on spaces: "sudo rabbitmqctl",
#                            "docker exec rabbitmq rabbitmqctl"
#
# qsched declares its queues with these settings as queue arguments already (see
# qsched/bus/kombu/wire.py). Arguments cannot change once a queue exists, so operators
# tune them later with policies, which RabbitMQ applies to existing queues too. Where
# both set a key, the queue argument wins, except that the lower delivery limit and
# the policy's overflow apply: a policy can lower the delivery limit, not raise it.
#
# Under [bus] driver = oslo.messaging the queues are PREFIX.boot.<class>.info and
# PREFIX.host.<host>.info, which the same patterns match, and these policies are
# required: oslo.messaging declares a delivery limit without a dead-letter exchange,
# and RabbitMQ drops a message over the limit (docs/pipeline.rst).
#
# RabbitMQ applies one policy to a queue, the highest priority one whose pattern
# matches, so the patterns below never overlap and each policy carries everything
# its queues need. The dead-letter queue (PREFIX.dead) has no policy: a dead-letter
# exchange on it would send its messages round in a loop.
set -eu

VHOST=${VHOST:-/}
while getopts p: flag; do
    case $flag in
    p) VHOST=$OPTARG ;;
    *) echo "usage: $0 [-p VHOST]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || { echo "usage: $0 [-p VHOST]" >&2; exit 2; }
PREFIX=${PREFIX:-qsched}
DELIVERY_LIMIT=${DELIVERY_LIMIT:-20}
IDLE_EXPIRES_MS=${IDLE_EXPIRES_MS:-86400000}
RABBITMQCTL=${RABBITMQCTL:-rabbitmqctl}

# The prefix in a pattern: its dots are literal ([bus] prefix is letters, digits, ., _, -).
P=$(printf '%s' "$PREFIX" | sed 's/\./\\./g')
DEAD_LETTERS="\"dead-letter-exchange\": \"$PREFIX.dead\", \"dead-letter-routing-key\": \"dead\""
# Deliveries without an ack before a boot request is dead-lettered (a poison message
# that crashes every agent that takes it ends there instead of looping); at-least-once
# dead lettering, which needs reject-publish, so that none is lost on the way.
BOOT="\"delivery-limit\": $DELIVERY_LIMIT, $DEAD_LETTERS"
BOOT="$BOOT, \"dead-letter-strategy\": \"at-least-once\", \"overflow\": \"reject-publish\""

policy() {  # name, pattern, definition
    # shellcheck disable=SC2086 # RABBITMQCTL is a command and its arguments
    $RABBITMQCTL set_policy -p "$VHOST" --apply-to queues "$1" "$2" "{$3}"
}

# Flavor classes (PREFIX.boot.<flavor>): there is one per flavor, kept.
policy "${PREFIX}-boot" "^${P}\\.boot\\.[^+]*\$" "$BOOT"
# Classes with constraints (PREFIX.boot.<flavor>+<hash>) come and go with the requests
# that ask for them: a queue nobody consumed, declared or read from for a while is
# deleted, with whatever is left in it (requests past their build timeout long since).
policy "${PREFIX}-idle-classes" "^${P}\\.boot\\.[^+]*\\+" "$BOOT, \"expires\": $IDLE_EXPIRES_MS"
# Host queues (PREFIX.host.<host>) are classic queues, which have no delivery limit.
policy "${PREFIX}-host" "^${P}\\.host\\." "$DEAD_LETTERS"
