"""The invariants, checked from the ledger's raw keys and what the client saw.

Nothing here asks a service: the checks read the records of the cell as the
ledger stores them (instance records, consumers, providers and their consumer
sets, quota counters, through :class:`~qsched.ledger.base.Inspector`)
and compare them with the calls the load generator recorded. They
scan everything, which is fine for a test cell and never done on a request path.
:func:`qsched.ledger.audit.audit` runs as well, and its findings count.

Every check returns a list of findings (dicts naming the instance, provider or
project and the problem); an empty list means the invariant held.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from typing import Any

from qsched.bus.base import DeadLetter
from qsched.chaos.load import Call
from qsched.ledger import Stores
from qsched.ledger.audit import audit, stored_demand
from qsched.ledger.base import Usage
from qsched.resources import SHARES_VIA_AGGREGATE
from qsched.scheduling.message import PoisonMessage, decode
from qsched.scheduling.views import usage_term

HOLDING = ("BUILD", "ACTIVE")  # the states that hold quota (and, once claimed, allocations)
ENDED = ("ACTIVE", "ERROR", "DELETED")  # where an accepted request may end
API_DELETES = ("deleting", "local_delete")  # the events of a delete the API took


@dataclasses.dataclass
class Snapshot:
    """Everything the checks read, taken in one pass (the services should be quiet)."""

    records: dict[str, dict[str, str]]  # instance uuid -> every field of its record
    consumers: dict[str, dict[str, Any]]  # consumer uuid -> {"project", "allocs"}
    capacity: dict[str, dict[str, int]]  # provider -> resource class -> capacity
    usage: dict[str, dict[str, int]]  # provider -> resource class -> usage counter
    provider_consumers: dict[str, set[str]]
    provider_host: dict[str, str]  # provider -> the agent host it belongs to
    quota_used: dict[str, dict[str, int]]  # project -> instances, cores, ram_mb
    quota_held: dict[str, dict[str, Usage]]  # project -> holder -> what it reserved
    #: sharing providers (MISC_SHARES_VIA_AGGREGATE): no host's, held with a node's claim
    sharing: set[str] = dataclasses.field(default_factory=set)

    def by_name(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = defaultdict(list)
        for uuid, record in self.records.items():
            found[record.get("name", "")].append(uuid)
        return found


# -- reading ---------------------------------------------------------------------------


def read_records(stores: Stores, uuids: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
    """Instance records (all fields), of ``uuids`` or of every instance of the cell."""
    return stores.inspector.instance_records(None if uuids is None else list(uuids))


def claimed_by(stores: Stores, host: str, uuids: Iterable[str] | None = None) -> set[str]:
    """Instances in BUILD claimed by ``host`` (of ``uuids``, or of the whole cell)."""
    records = read_records(stores, uuids)
    return {u for u, r in records.items() if r.get("state") == "BUILD" and r.get("host") == host}


def take_snapshot(stores: Stores, hosts: list[str]) -> Snapshot:
    consumers = {
        uuid: {"project": consumer.project_id or "", "allocs": consumer.allocations}
        for uuid, consumer in stores.inspector.consumers().items()
    }
    snap = Snapshot(read_records(stores), consumers, {}, {}, {}, {}, {}, {})
    _read_providers(stores, hosts, snap)
    snap.quota_used = stores.inspector.quota_used()
    snap.quota_held = stores.inspector.quota_held()
    return snap


def _read_providers(stores: Stores, hosts: list[str], snap: Snapshot) -> None:
    providers = stores.ledger.list_providers()
    snap.provider_consumers = stores.ledger.providers_consumers([p.uuid for p in providers])
    names = {p.uuid: p.name for p in providers}
    for p in providers:
        snap.capacity[p.uuid] = {rc: inv.capacity for rc, inv in p.inventories.items()}
        snap.usage[p.uuid] = dict(p.usages)
        if SHARES_VIA_AGGREGATE in p.traits:
            snap.sharing.add(p.uuid)  # capacity and usage checked, but no host
            continue
        snap.provider_host[p.uuid] = _host_of(names.get(p.root_uuid or p.uuid, ""), hosts)


def _host_of(node_name: str, hosts: list[str]) -> str:
    """Fake nodes are named ``<host>-<digits>``."""
    host, _sep, number = node_name.rpartition("-")
    return host if host in hosts and number.isdigit() else f"?{node_name}"


# -- the invariants --------------------------------------------------------------------


def lost(snap: Snapshot, accepted: dict[str, Call]) -> list[dict[str, Any]]:
    """Accepted (202) requests whose instance has no record: what a machine crash under
    ``[ledger] durability = async`` may lose."""
    return [{"instance": uuid, "name": call.name, "problem": "no record"}
            for uuid, call in sorted(accepted.items()) if uuid not in snap.records]  # fmt: skip


def stuck(snap: Snapshot, accepted: dict[str, Call]) -> list[dict[str, Any]]:
    """Instances with a record that are not ACTIVE, ERROR or DELETED once the load is
    quiet: accepted ones, and those of boots that got no answer (a killed worker). No
    durability setting allows one: recovery must place or end whatever survived."""
    found: list[dict[str, Any]] = []
    for uuid, record in sorted(snap.records.items()):
        if record.get("state") in ENDED:
            continue
        item = {
            "instance": uuid,
            "name": record.get("name"),
            "state": record.get("state"),
            "host": record.get("host", ""),
            "task_state": record.get("task_state", ""),
        }
        if uuid not in accepted:
            item["problem"] = "its boot got no answer and it is still waiting"
        found.append(item)
    return found


#: what an agent writes in a history when it has a request in hand
_LOOKED_AT = ("claimed", "refused", "handed_back", "conflict", "parked", "group_refused",
              "host_rule_refused")  # fmt: skip


def stranded(
    snap: Snapshot,
    accepted: dict[str, Call],
    history: dict[str, list[dict[str, Any]]],
    crashes: list[tuple[float, float]],
) -> list[dict[str, Any]]:
    """Accepted instances that were waiting when the ledger lost writes (``crashes``:
    when each machine crash or master kill began and when the ledger answered again),
    ended in ERROR by their deadline, and that no agent had in hand after they last went
    waiting: a request nothing on the bus held any more (a claim a crash rolled back
    after its agent acked the request). A run's capacity exceeds its projects' quotas,
    so a request that no agent refused had room somewhere.

    Without a crash nothing is judged: a request can wait out its deadline in a queue
    whose consumers the bus keeps away (a RabbitMQ node lost for longer than it), held
    by the bus all along, and the ledger alone cannot tell the two apart.
    """
    if not crashes:
        return []
    last_back = max(restored for _started, restored in crashes)
    found = []
    for uuid in sorted(accepted):
        record = snap.records.get(uuid, {})
        fault = json.loads(record["fault"]) if record.get("fault") else {}
        if (fault.get("details") or {}).get("reason") != "deadline":
            continue
        events = history.get(uuid, [])
        names = [e.get("event") for e in events]
        waits = [i for i, e in enumerate(names) if e in ("accepted", "requeued", "released")]
        went_waiting = float(events[waits[-1]].get("t", 0)) if waits else 0.0
        since = names[waits[-1] + 1 :] if waits else names
        if went_waiting <= last_back and not any(event in _LOOKED_AT for event in since):
            found.append({"instance": uuid, "name": accepted[uuid].name, "events": names,
                          "problem": "ended by its deadline, no agent had it in hand"})  # fmt: skip
    return found


def lost_deletes(snap: Snapshot, deletes: list[Call]) -> list[dict[str, Any]]:
    """Instances whose last DELETE was answered 204 but that are not DELETED."""
    last: dict[str, Call] = {}
    for call in sorted(deletes, key=lambda c: c.sent):
        if call.uuid:
            last[call.uuid] = call
    found: list[dict[str, Any]] = []
    for uuid, call in sorted(last.items()):
        state = snap.records.get(uuid, {}).get("state")
        if call.status == 204 and state != "DELETED":
            record = snap.records.get(uuid, {})
            found.append(
                {
                    "instance": uuid,
                    "state": state,
                    "host": record.get("host", ""),
                    "task_state": record.get("task_state", ""),
                    "problem": "DELETE answered 204 but the instance is not DELETED",
                }
            )
    return found


def duplicates(snap: Snapshot, histories: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Instances placed twice: allocations on two hosts, a provider of another host
    holding them, or a history with two ACTIVE events or overlapping claims."""
    found: list[dict[str, Any]] = []
    for uuid, consumer in sorted(snap.consumers.items()):
        hosts = sorted({snap.provider_host.get(rp, f"?{rp}") for rp in consumer["allocs"]
                        if rp not in snap.sharing})  # fmt: skip
        if len(hosts) > 1:
            found.append(
                {"instance": uuid, "problem": "allocations on several hosts", "hosts": hosts}
            )
    for rp, members in sorted(snap.provider_consumers.items()):
        if rp in snap.sharing:
            continue  # it serves every host of its aggregates
        for uuid in sorted(members):
            record = snap.records.get(uuid, {})
            host = record.get("host", "")
            if record.get("state") in HOLDING and host and host != snap.provider_host.get(rp):
                found.append(
                    {
                        "instance": uuid,
                        "problem": "held by a provider of another host",
                        "provider_host": snap.provider_host.get(rp),
                        "record_host": host,
                    }
                )
    for uuid, events in sorted(histories.items()):
        problem = _history_problem(events)
        if problem:
            found.append({"instance": uuid, "problem": problem})
    return found


def _history_problem(events: list[dict[str, Any]]) -> str:
    """Two ACTIVE events, or a claim by one host while another held it."""
    holder = None
    actives = 0
    for event in events:
        kind, host = event.get("event"), event.get("host")
        if kind == "active":
            actives += 1
        elif kind == "claimed":
            if holder and holder != host:
                return f"claimed by {host} while {holder} held it"
            holder = host
        elif kind in ("released", "requeued", "deleted", "error"):
            holder = None
    return f"{actives} ACTIVE events" if actives > 1 else ""


def overcommits(snap: Snapshot) -> list[dict[str, Any]]:
    """Providers whose allocations (summed from consumers) or usage exceed capacity."""
    summed = _summed_allocations(snap)
    found: list[dict[str, Any]] = []
    for rp, capacities in sorted(snap.capacity.items()):
        for rc, capacity in sorted(capacities.items()):
            allocated, usage = summed[rp][rc], snap.usage.get(rp, {}).get(rc, 0)
            if max(allocated, usage) > capacity:
                found.append(
                    {
                        "provider": rp,
                        "host": snap.provider_host.get(rp),
                        "resource_class": rc,
                        "allocated": allocated,
                        "usage": usage,
                        "capacity": capacity,
                    }
                )
    return found


def _summed_allocations(snap: Snapshot) -> defaultdict[str, Counter[str]]:
    summed: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for consumer in snap.consumers.values():
        for rp, amounts in consumer["allocs"].items():
            summed[rp].update({rc: int(n) for rc, n in amounts.items()})
    return summed


def leaks(snap: Snapshot) -> list[dict[str, Any]]:
    """Allocations or quota held for no live instance."""
    found: list[dict[str, Any]] = []
    for uuid in sorted(snap.consumers):
        record = snap.records.get(uuid)
        state = record.get("state") if record else None
        if state not in HOLDING:
            found.append(
                {"instance": uuid, "problem": "allocations without a live instance", "state": state}
            )
        elif state == "BUILD" and not record.get("host"):  # type: ignore[union-attr]
            found.append({"instance": uuid, "problem": "allocations of an unclaimed BUILD"})
    for project, held in sorted(snap.quota_held.items()):
        for holder in sorted(held):
            state = snap.records.get(holder, {}).get("state")
            if state not in HOLDING:
                found.append(
                    {
                        "instance": holder,
                        "project": project,
                        "state": state,
                        "problem": "quota held for an instance that is not live",
                    }
                )
    return found


def accounting(snap: Snapshot) -> list[dict[str, Any]]:
    """Counters that disagree with what they count: provider usage and consumer sets,
    ACTIVE instances without allocations, quota used vs the live instances."""
    found: list[dict[str, Any]] = []
    summed = _summed_allocations(snap)
    for rp in sorted(set(snap.usage) | set(summed)):
        counted = {rc: n for rc, n in snap.usage.get(rp, {}).items() if n}
        allocated = {rc: n for rc, n in summed[rp].items() if n}
        if counted != allocated:
            found.append(
                {
                    "provider": rp,
                    "problem": "usage counter differs from allocations",
                    "usage": counted,
                    "allocated": allocated,
                }
            )
        holders = {c for c, v in snap.consumers.items() if rp in v["allocs"]}
        if snap.provider_consumers.get(rp, set()) != holders:
            found.append(
                {
                    "provider": rp,
                    "problem": "consumer set differs from allocations",
                    "extra_or_missing": sorted(snap.provider_consumers.get(rp, set()) ^ holders),
                }
            )
    for uuid, record in sorted(snap.records.items()):
        offloaded = record.get("shelved") == "offloaded"  # holds nothing, but its quota
        if record.get("state") == "ACTIVE" and uuid not in snap.consumers and not offloaded:
            found.append({"instance": uuid, "problem": "ACTIVE without allocations"})
        elif offloaded and uuid in snap.consumers and not record.get("migration"):
            found.append({"instance": uuid, "problem": "offloaded with allocations"})
    return found + quota_mismatches(snap)


def quota_mismatches(snap: Snapshot) -> list[dict[str, Any]]:
    """Quota used must equal the sum over the project's live instances' flavors."""
    expected: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for record in snap.records.values():
        if record.get("state") in HOLDING:
            flavor = json.loads(record.get("flavor") or "{}")
            expected[record.get("project_id", "")].update(
                {
                    "instances": 1,
                    "cores": int(flavor.get("vcpus", 0)),
                    "ram_mb": int(flavor.get("ram_mb", 0)),
                }
            )
    found: list[dict[str, Any]] = []
    for project in sorted(set(expected) | set(snap.quota_used)):
        used = {k: v for k, v in snap.quota_used.get(project, {}).items() if v}
        want = {k: v for k, v in expected[project].items() if v}
        if used != want:
            found.append(
                {
                    "project": project,
                    "problem": "quota used differs from live instances",
                    "used": used,
                    "live_instances": want,
                }
            )
    return found


def partial_state(snap: Snapshot, refused: list[Call]) -> list[dict[str, Any]]:
    """A boot answered 5xx must leave nothing: no live record, no quota, no allocation."""
    names = snap.by_name()
    held = {h for holders in snap.quota_held.values() for h in holders}
    found: list[dict[str, Any]] = []
    for call in sorted(refused, key=lambda c: c.name):
        for uuid in names.get(call.name, []):
            record = snap.records[uuid]
            if record.get("state") != "DELETED" or uuid in held or uuid in snap.consumers:
                found.append(
                    {
                        "instance": uuid,
                        "name": call.name,
                        "status": call.status,
                        "state": record.get("state"),
                        "quota_held": uuid in held,
                        "allocations": uuid in snap.consumers,
                    }
                )
    return found


def drained(snap: Snapshot) -> list[dict[str, Any]]:
    """After every server was deleted: nothing may be held anywhere."""
    found: list[dict[str, Any]] = []
    for uuid, record in sorted(snap.records.items()):
        if record.get("state") != "DELETED":
            found.append(
                {
                    "instance": uuid,
                    "problem": "not DELETED after the drain",
                    "state": record.get("state"),
                    "host": record.get("host", ""),
                }
            )
    found += [{"instance": u, "problem": "allocations left"} for u in sorted(snap.consumers)]
    for rp, usage in sorted(snap.usage.items()):
        if any(usage.values()):
            found.append({"provider": rp, "problem": "usage left", "usage": usage})
    for project, used in sorted(snap.quota_used.items()):
        if any(used.values()):
            found.append({"project": project, "problem": "quota used left", "used": used})
    return found


def unsettled_moves(stores: Stores, records: Collection[str]) -> list[dict[str, Any]]:
    """Moves of these instances that did not end (a migration under way, or waiting for
    a confirm that never came): each holds a migration consumer, or will."""
    found: list[dict[str, Any]] = []
    for uuid in sorted(records):
        for move in stores.migrations.of_instance(uuid):
            if not move.final:
                found.append({
                    "instance": uuid, "migration": move.uuid, "kind": move.kind,
                    "status": move.status, "problem": "a move that did not end",
                })  # fmt: skip
    return found


def audit_findings(stores: Stores) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ledger's own audit, and its findings flattened."""
    report = audit(stores).to_dict()
    keys = (
        "overcommitted",
        "usage_mismatches",
        "orphan_allocations",
        "instance_mismatches",
        "quota_mismatches",
        "group_mismatches",
        "host_rule_mismatches",
    )
    found = [{"audit": key, "finding": item} for key in keys for item in report.get(key, [])]
    return report, found


def histories(stores: Stores, uuids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The event history of each instance, oldest first, as raw dicts."""
    return stores.inspector.histories(sorted(uuids))


# -- convergence, the outbox, quota over time, dead letters ------------------------------


def agent_details(stores: Stores, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """What each agent's last heartbeat says of itself (empty if it has expired)."""
    seen = {agent.host: dict(agent.detail) for agent in stores.agents.list() if agent.alive}
    return {host: seen.get(host, {}) for host in hosts}


def ledger_digests(snap: Snapshot) -> dict[str, str]:
    """The usage digest of each host's providers, as its agent's index should have it."""
    digests: defaultdict[str, int] = defaultdict(int)
    for rp, usages in snap.usage.items():
        for rc, used in usages.items():
            if used and rc in snap.capacity.get(rp, {}) and rp not in snap.sharing:
                digests[snap.provider_host.get(rp, "")] ^= usage_term(rp, rc, used)
    return {host: f"{digest:016x}" for host, digest in digests.items()}


def index_mismatches(snap: Snapshot, details: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Agents whose node index does not hold what the ledger holds for their nodes."""
    wanted = ledger_digests(snap)
    found: list[dict[str, Any]] = []
    for host, detail in sorted(details.items()):
        have, want = detail.get("index_digest"), wanted.get(host, f"{0:016x}")
        if have != want:
            found.append({"host": host, "problem": "the agent's index differs from the ledger",
                          "index_digest": have, "ledger_digest": want,
                          "index_used": detail.get("resources")})  # fmt: skip
    return found


def driver_mismatches(snap: Snapshot, running: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """VMs a driver runs that the ledger does not place there (deleted, ended, unknown,
    elsewhere), and ACTIVE instances whose VM no driver of their host runs."""
    found: list[dict[str, Any]] = []
    for host, vms in sorted(running.items()):
        for uuid, node in sorted(vms.items()):
            record = snap.records.get(uuid, {})
            here = (record.get("host"), record.get("node")) == (host, node)
            if not (record.get("state") in HOLDING and here):
                found.append(
                    {"instance": uuid, "host": host, "node": node, "state": record.get("state"),
                     "record_host": record.get("host"),
                     "problem": "runs while the ledger does not place it here"}
                )  # fmt: skip
    for uuid, record in sorted(snap.records.items()):
        host = record.get("host", "")
        if record.get("state") == "ACTIVE" and host in running and uuid not in running[host]:
            found.append({"instance": uuid, "host": host,
                          "problem": "ACTIVE but its host's driver does not run it"})  # fmt: skip
    return found


def unpublished(histories: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Instances that ended in ERROR while their boot request was never published:
    their quota was held for nothing until their deadline."""
    return [
        {"instance": uuid, "problem": "ended in ERROR with its request never published"}
        for uuid, events in sorted(histories.items())
        if any(_unpublished_error(e) for e in events)
    ]


def _unpublished_error(event: dict[str, Any]) -> bool:
    return event.get("event") == "error" and bool((event.get("detail") or {}).get("unpublished"))


def quota_samples(stores: Stores) -> dict[str, dict[str, int]]:
    """Every project's quota used now (one sample of the run)."""
    return stores.inspector.quota_used()


def quota_exceeded(
    samples: list[tuple[float, dict[str, dict[str, int]]]], limits: dict[str, int]
) -> list[dict[str, Any]]:
    """Moments a project held more than its limit (limits: instances, cores, ram_mb)."""
    found: list[dict[str, Any]] = []
    for at, used in samples:
        for project, counts in sorted(used.items()):
            over = {k: n for k, n in counts.items() if 0 <= limits.get(k, -1) < n}
            if over:
                found.append({"project": project, "at": at, "over": over, "limits": limits})
    return found


def dead_letter_findings(
    letters: list[DeadLetter],
    poison: list[dict[str, Any]],
    records: dict[str, dict[str, str]],
    history: dict[str, list[dict[str, Any]]] | None = None,
    asked_deletes: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Every poison message dead-lettered exactly once, a forged one (it names an
    instance of the run: ``instance``) at most once and never obeyed, and no valid
    request there. ``asked_deletes``: the instances whose delete the API took (204).

    A valid request is one that decodes and names an instance of the run, and that
    the run did not forge.
    """
    found: list[dict[str, Any]] = []
    empties = sum(1 for letter in letters if not letter.body)
    sent_empty = sum(1 for p in poison if p["token"] is None)
    if empties != sent_empty:
        found.append({"problem": "empty bodies dead-lettered", "sent": sent_empty,
                      "dead_letters": empties})  # fmt: skip
    for item in poison:
        if item["token"] is None:
            continue
        count = sum(1 for letter in letters if item["token"].encode() in letter.body)
        forged = "instance" in item  # dropped, not dead-lettered, once it no longer waits
        if count > 1 or (count == 0 and not forged):
            found.append({**item, "problem": f"dead-lettered {count} times, not once"})
        if forged:
            events = (history or {}).get(item["instance"], [])
            found += obeyed(item, records, events, item["instance"] in asked_deletes)
    tokens = {item["token"] for item in poison if item["token"] is not None}
    for letter in letters:
        try:
            message = decode(letter.body)
        except PoisonMessage:
            continue
        if message.instance_uuid in records and message.request_id not in tokens:
            found.append({"instance": message.instance_uuid, "kind": message.KIND,
                          "reason": letter.reason, "queue": letter.queue,
                          "problem": "a valid request was dead-lettered"})  # fmt: skip
    return found


def obeyed(
    item: dict[str, Any],
    records: dict[str, dict[str, str]],
    events: list[dict[str, Any]],
    delete_asked: bool = False,
) -> list[dict[str, Any]]:
    """Whether the instance a forged message named shows that it was obeyed: a claim of
    other amounts than its flavor asks (a forged boot), or DELETED with no delete asked
    of the API (a forged delete).

    A delete was asked when the API answered the load's delete with 204
    (``delete_asked``; a forged delete obeyed first would have made it 404) or the
    ledger shows the API took one: it marks the server ``deleting`` for its agent, or
    deletes it itself (``local_delete``) when that agent's heartbeat has expired: an
    agent killed by the run, or one starved on a loaded machine.
    """
    record = records.get(item["instance"], {})
    if item["kind"] == "forged delete":
        asked = delete_asked or any(e.get("event") in API_DELETES for e in events)
        if record.get("state") == "DELETED" and not asked:
            return [{**item, "problem": "a forged delete was obeyed: DELETED, never asked"}]
        return []
    asked_amounts = stored_demand(record.get("flavor", ""))
    found = []
    for event in events:
        if event.get("event") != "claimed" or asked_amounts is None:
            continue
        held: Counter[str] = Counter()
        for amounts in (event.get("detail") or {}).values():
            held.update(amounts)
        if {rc: n for rc, n in held.items() if n} != asked_amounts:
            found.append(
                {
                    **item,
                    "claimed": dict(held),
                    "flavor": asked_amounts,
                    "problem": "a forged boot was claimed: other amounts than its flavor",
                }
            )
    return found
