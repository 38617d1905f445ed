"""Agent heartbeats and services, the live scheduling classes and the known zones."""

from __future__ import annotations

import builtins
import json
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from typing import Any

from qsched import exception
from qsched.ledger.base import AgentInfo, AgentRegistry, Service
from qsched.ledger.errors import maps_errors
from qsched.ledger.redis import RedisStore, text, text_map

#: The fields of a service record, in the order they are read.
_SERVICE_FIELDS = ("id", "seq", "disabled", "disabled_reason", "forced_down", "created_at",
                   "updated_at", "zone")  # fmt: skip


@maps_errors
class RedisAgents(AgentRegistry):
    """Who is alive (a key with a time to live per agent), which classes and zones exist."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.keys = store.keys

    def heartbeat(
        self,
        host: str,
        ttl_s: float,
        free: Mapping[str, int] | None = None,
        **detail: Any,
    ) -> Service | None:
        """Say ``host`` is alive for ``ttl_s`` seconds more; ``detail`` is shown to admins.
        Keeps it in the zones it serves (``zone_beat``) and its ``free`` capacity in the
        cell's (``free_beat``), and answers with its service record, in the same round
        trip."""
        now = self.store.now()
        key = self.keys.agent(host)

        def build(pipe: Any) -> None:  # every command may run twice (RedisStore.execute)
            pipe.hset(key, mapping={"time": now, "detail": json.dumps(detail, sort_keys=True)})
            pipe.pexpire(key, int(ttl_s * 1000))
            pipe.zadd(self.keys.agents, {host: now})
            self.store.queue_script(
                pipe,
                "zone_beat",
                keys=[self.keys.service(host)],
                args=[self.keys.prefix, host, repr(now + ttl_s), repr(now)],
            )
            if free is not None:
                self._free_beat(pipe, host, repr(now + ttl_s), now, free)
            pipe.hmget(self.keys.service(host), *_SERVICE_FIELDS)

        return _service(host, self.store.execute(build)[-1])

    def alive(self, host: str) -> bool:
        """True while the host's last heartbeat has not expired and its service is not
        forced down (O(1))."""
        pipe = self.store.client.pipeline(transaction=False)
        pipe.exists(self.keys.agent(host))
        pipe.hget(self.keys.service(host), "forced_down")
        beating, forced = pipe.execute()
        return bool(beating) and text(forced or b"0") != "1"

    def last_seen(self, host: str) -> float | None:
        """When ``host`` last beat: its score in the agents index (O(1))."""
        score = self.store.client.zscore(self.keys.agents, host)
        return None if score is None else float(score)

    def _free_beat(
        self, pipe: Any, host: str, expires: str, now: float, free: Mapping[str, int]
    ) -> None:
        pairs = [str(x) for rc, n in sorted(free.items()) for x in (rc, max(int(n), 0))]
        self.store.queue_script(pipe, "free_beat", keys=[self.keys.service(host)],
                                args=[self.keys.prefix, host, expires, repr(now),
                                      *pairs])  # fmt: skip

    def forget(self, host: str) -> None:
        """An agent that stops cleanly says so at once instead of waiting for its TTL;
        its free capacity leaves the cell's in the same round trip."""
        now = self.store.now()

        def build(pipe: Any) -> None:  # every command may run twice (RedisStore.execute)
            pipe.delete(self.keys.agent(host))
            self._free_beat(pipe, host, "", now, {})

        self.store.execute(build)

    def free(self) -> dict[str, int]:
        """The cell's free capacity (``cell-free``): one read."""
        raw = self.store.client.hgetall(self.keys.cell_free)
        return {text(rc): int(n) for rc, n in raw.items()}

    def list(self) -> builtins.list[AgentInfo]:
        """Every agent ever seen in the cell, alive or not (admin view: it scans)."""
        hosts: list[Any] = self.store.client.zrange(self.keys.agents, 0, -1, withscores=True)
        pipe = self.store.client.pipeline(transaction=False)
        for host, _score in hosts:
            pipe.hgetall(self.keys.agent(text(host)))
            pipe.hget(self.keys.service(text(host)), "forced_down")
        replies = pipe.execute()
        infos = []
        for (host, score), raw, forced in zip(hosts, replies[::2], replies[1::2], strict=True):
            fields = text_map(raw)
            detail = json.loads(fields["detail"]) if fields else {}
            alive = bool(fields) and text(forced or b"0") != "1"
            infos.append(AgentInfo(text(host), float(score), alive, detail))
        return infos

    def register_service(self, host: str, availability_zone: str | None = None) -> Service:
        """Make sure ``host`` has a service record, in its zone now, and return it (O(1))."""
        result = self.store.run(
            "service_register", self.keys.service(host), host, str(uuidlib.uuid4()),
            availability_zone or "", self.store.now(),
        )  # fmt: skip
        return _service_from_reply(result)

    def update_service(
        self,
        host: str,
        disabled: bool | None = None,
        disabled_reason: str | None = None,
        forced_down: bool | None = None,
    ) -> Service:
        """Enable or disable a host's service, force it down or up; None leaves a field."""
        result = self.store.run(
            "service_update", self.keys.service(host), host, _flag(disabled),
            disabled_reason or "", _flag(forced_down), self.store.now(),
        )  # fmt: skip
        return _service_from_reply(result)

    def service(self, host: str) -> Service:
        """One host's service (O(1))."""
        found = _service(host, self.store.client.hmget(self.keys.service(host), *_SERVICE_FIELDS))
        if found is None:
            raise exception.ComputeHostNotFound(host=host)
        return found

    def service_host(self, service_id: str) -> str:
        """The host of the service with that id (O(1))."""
        host = self.store.client.hget(self.keys.service_ids, service_id)
        if host is None:
            raise exception.ServiceNotFound(service_id=service_id)
        return text(host)

    def services(self) -> builtins.list[Service]:
        """Every service, by integer id (admin view: it scans)."""
        hosts = sorted({text(h) for h in self.store.client.hvals(self.keys.service_ids)})
        pipe = self.store.client.pipeline(transaction=False)
        for host in hosts:
            pipe.hmget(self.keys.service(host), *_SERVICE_FIELDS)
        found = [_service(host, raw) for host, raw in zip(hosts, pipe.execute(), strict=True)]
        return sorted((s for s in found if s is not None), key=lambda s: s.seq)

    def add_class(self, name: str, definition: Mapping[str, Any]) -> bool:
        """Publish a scheduling class for agents to consider; False if it was known."""
        return bool(self.store.client.hsetnx(self.keys.classes, name, class_json(definition)))

    def classes(self) -> dict[str, dict[str, Any]]:
        """Every live class: O(number of classes), never O(number of hosts)."""
        raw = text_map(self.store.client.hgetall(self.keys.classes))
        return {name: json.loads(value) for name, value in raw.items()}

    def set_classes(self, host: str, classes: Iterable[str]) -> None:
        """Replace the classes ``host`` has room for (one script, O(its classes))."""
        self.store.run("agent_classes", self.keys.agent_classes(host), host, *sorted(classes))

    def class_consumers(self, name: str) -> set[str]:
        """The hosts that said they have room for class ``name`` (admin view)."""
        return {text(host) for host in self.store.client.smembers(self.keys.class_consumers(name))}

    def add_zone(self, zone: str) -> None:
        """Make ``zone`` bootable. Never removed: a zone outlives its hosts being down."""
        self.store.client.sadd(self.keys.zones, zone)

    def zones(self) -> set[str]:
        """Every known availability zone (admin view)."""
        return {text(zone) for zone in self.store.client.smembers(self.keys.zones)}

    def has_zone(self, zone: str) -> bool:
        """Whether a boot may name ``zone``: O(1)."""
        return bool(self.store.client.sismember(self.keys.zones, zone))

    def zones_available(self, zones: Iterable[str]) -> dict[str, bool]:
        """Per zone, whether a host serving it is up and enabled: one ZCOUNT each."""
        names = sorted(set(zones))
        now = self.store.now()
        pipe = self.store.client.pipeline(transaction=False)
        for zone in names:
            pipe.zcount(self.keys.zone_hosts(zone), now, "+inf")
        return {zone: n > 0 for zone, n in zip(names, pipe.execute(), strict=True)}


def _flag(value: bool | None) -> str:
    return "" if value is None else ("1" if value else "0")


def _service(host: str, raw: Iterable[Any]) -> Service | None:
    """A service from its fields as HMGET reads them (None: no record)."""
    values = dict(zip(_SERVICE_FIELDS, (None if v is None else text(v) for v in raw),
                      strict=True))  # fmt: skip
    if values["id"] is None:
        return None
    return Service(
        host, values["id"], int(values["seq"] or 0), values["disabled"] == "1",
        values["disabled_reason"], values["forced_down"] == "1",
        float(values["created_at"] or 0), _float(values["updated_at"]), values["zone"],
    )  # fmt: skip


def _service_from_reply(result: Mapping[str, Any]) -> Service:
    return Service(
        str(result["host"]), str(result["id"]), int(result["seq"]), bool(result["disabled"]),
        result.get("disabled_reason"), bool(result["forced_down"]),
        float(result.get("created_at") or 0), _float(result.get("updated_at")),
        result.get("zone"),
    )  # fmt: skip


def _float(value: str | None) -> float | None:
    return None if value is None else float(value)


def class_json(definition: Mapping[str, Any]) -> str:
    """A scheduling class definition as the ``classes`` hash stores it."""
    return json.dumps(definition, sort_keys=True)
