"""What versioned notifications cost an agent: CPU per placement, built and sent.

``python -m qsched.bench.notify --rate 100 --seconds 10`` does, at ``--rate``
placements a second, what an agent does for the notifications of one placement
(``scheduler.claim`` and ``instance.create.start`` once its claim is in, then
``instance.create.end``: the payloads built from the boot request and handed to the
notifier) and sends them with qsched's ``messagingv2`` sender to the RabbitMQ at
``--url``, on an exchange and a topic (so a queue) of its own, removed at the end. It prints one
JSON line: the process's CPU per placement, split into building the payloads (the
placing threads' part) and the rest (the sender thread: encoding, framing, writing,
reading the broker's confirms), and the messages the broker holds at the end. The
building part includes the measure's own loop (sleeping until each placement is due,
making its boot request), which ``pace_ms_per_placement`` times alone, nothing built.

The figure it isolates is the agents' row of ``qsched-bench --notifications both``
(docs/notifications.rst, "Cost"), without the claims around it.

``--rounds N`` then measures in turns, as the plumbing scenario does: N rounds of
``--seconds`` each with the payloads built and handed to no notifier, and N with
them sent, alternately; ``turns`` gives each round's CPU per placement and the
difference of the medians, what queueing and sending add. ``--hold N`` keeps N
small objects alive meanwhile, as an agent's index keeps many (a larger heap for
the garbage collector to walk).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from typing import Any

import click
import kombu

from qsched.conf.transport import parse_transport_url
from qsched.flavors import Flavor
from qsched.notifications import NULL, payloads
from qsched.notifications.base import Notifier
from qsched.notifications.rabbit import RabbitNotifier
from qsched.scheduling.message import BootRequest


def boot_request(flavor: Flavor) -> BootRequest:
    """A boot request as the API publishes one (the fields a payload reads)."""
    now = time.time()
    return BootRequest(
        request_id=f"req-{uuid.uuid4()}", instance_uuid=str(uuid.uuid4()),
        project_id=uuid.uuid4().hex, user_id=uuid.uuid4().hex, flavor=flavor.to_dict(),
        scheduling_class=flavor.name, deadline=now + 300, published_at=now,
    )  # fmt: skip


def notify_placement(notifier: Notifier, msg: BootRequest, host: str, node: str) -> None:
    """The three notifications of one placement, built as the agent builds them."""
    context = payloads.context(msg)
    allocations = {str(uuid.UUID(int=1)): {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    notifier.notify("scheduler.claim", payloads.claim(msg, host, node, allocations),
                    context=context)  # fmt: skip
    started = payloads.create_from_request(msg, host, node, "building", "spawning", "pending")
    notifier.notify("instance.create.start", started, context=context)
    ended = payloads.create_from_request(msg, host, node, "active", None, "running", time.time())
    notifier.notify("instance.create.end", ended, context=context)


def _paced(rate: float, seconds: float, flavor: Flavor, notifier: Notifier | None) -> int:
    """Placements' notifications at ``rate`` a second for ``seconds`` (None: their boot
    requests only); how many."""
    count, began = 0, time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        due = int(elapsed * rate) + 1
        while count < due:
            msg = boot_request(flavor)
            if notifier is not None:
                notify_placement(notifier, msg, "cn-bench", "cn-bench-0")
            count += 1
        time.sleep(max(0.0, count / rate - (time.monotonic() - began)))
    return count


def measure(url: str, rate: float, seconds: float, rounds: int = 0) -> dict[str, Any]:
    """CPU per placement of building and sending its notifications; with ``rounds``,
    also in turns (module doc)."""
    flavor = Flavor("m1.small", vcpus=1, ram_mb=2048, disk_gb=20)
    pace_began = time.process_time()
    paced = _paced(rate, min(seconds, 2.0), flavor, None)
    pace_ms = 1000 * (time.process_time() - pace_began) / paced
    build_began = time.process_time()
    built = _paced(rate, min(seconds, 2.0), flavor, NULL)
    build_ms = 1000 * (time.process_time() - build_began) / built
    run = uuid.uuid4().hex[:8]
    exchange, topic = f"qsched-bench-notify-{run}", f"bench_notifications_{run}"
    notifier = RabbitNotifier(parse_transport_url(url), exchange, [topic], "qsched-agent:bench")
    try:
        began = time.process_time()
        placements = _paced(rate, seconds, flavor, notifier)
        notifier.flush(30)
        total_ms = 1000 * (time.process_time() - began) / placements
        turns = _turns(notifier, rate, seconds, rounds, flavor) if rounds else None
        lost = notifier.lost
    finally:
        notifier.close()
        held = _forget(url, exchange, f"{topic}.info")
    sent = placements + (turns["sent"] if turns else 0)
    return {
        "rate_per_s": rate,
        "placements": placements,
        "messages": 3 * sent,
        "cpu_ms_per_placement": round(total_ms, 3),
        "build_ms_per_placement": round(build_ms, 3),
        "send_ms_per_placement": round(total_ms - build_ms, 3),
        "pace_ms_per_placement": round(pace_ms, 3),
        "lost": lost,
        "held_by_broker": held,
        "turns": turns,
    }


def _turns(
    notifier: RabbitNotifier, rate: float, seconds: float, rounds: int, flavor: Flavor
) -> dict[str, Any]:
    """``rounds`` rounds without sending and ``rounds`` with, alternately: each one's
    CPU ms per placement, and what sending added (the medians' difference)."""
    off: list[float] = []
    on: list[float] = []
    sent = 0
    for _ in range(rounds):
        for sending, figures in ((None, off), (notifier, on)):
            began = time.process_time()
            count = _paced(rate, seconds, flavor, sending or NULL)
            if sending is not None:
                notifier.flush(30)
                sent += count
            figures.append(round(1000 * (time.process_time() - began) / count, 3))
    return {"off_ms": off, "on_ms": on, "sent": sent,
            "added_ms": round(statistics.median(on) - statistics.median(off), 3)}  # fmt: skip


def _forget(url: str, exchange: str, queue: str) -> int:
    """Remove the run's queue and exchange; how many messages the queue held."""
    urls = parse_transport_url(url).urls
    with kombu.Connection(urls[0]) as conn:
        channel = conn.channel()
        _name, held, _consumers = channel.queue_declare(queue, passive=True)
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
        return int(held)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rate", type=click.FloatRange(min=1.0), default=100.0, show_default=True,
              help="Placements a second (three notifications each).")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(min=1.0), default=10.0, show_default=True,
              help="How long the sending part runs.")  # fmt: skip
@click.option("--url", default="rabbit://guest:guest@127.0.0.1:5672/", show_default=True,
              help="The notification bus, in oslo.messaging's syntax.")  # fmt: skip
@click.option("--rounds", type=click.IntRange(min=0), default=0, show_default=True,
              help="Then that many rounds without sending and with, in turns.")  # fmt: skip
@click.option("--hold", type=click.IntRange(min=0), default=0, show_default=True,
              help="Small objects kept alive meanwhile, as an agent's index does.")  # fmt: skip
def main(rate: float, seconds: float, url: str, rounds: int, hold: int) -> None:
    """Time the notifications of placements, built and sent; print one JSON line."""
    held = [{"id": [n], "node": {"n": n}} for n in range(hold)]
    click.echo(json.dumps(measure(url, rate, seconds, rounds), sort_keys=True))
    del held  # alive until the measure is done


if __name__ == "__main__":
    main()
