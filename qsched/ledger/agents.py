"""Agent heartbeats, the live scheduling classes and the known zones, next to the ledger."""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable, Mapping
from typing import Any

from qsched.ledger.base import AgentInfo, AgentRegistry
from qsched.ledger.redis import RedisStore, maps_errors, text, text_map


@maps_errors
class RedisAgents(AgentRegistry):
    """Who is alive (a key with a time to live per agent), which classes and zones exist."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.keys = store.keys

    def heartbeat(self, host: str, ttl_s: float, **detail: Any) -> None:
        """Say ``host`` is alive for ``ttl_s`` seconds more; ``detail`` is shown to admins."""
        now = self.store.now()
        key = self.keys.agent(host)
        pipe = self.store.client.pipeline(transaction=False)
        pipe.hset(key, mapping={"time": now, "detail": json.dumps(detail, sort_keys=True)})
        pipe.pexpire(key, int(ttl_s * 1000))
        pipe.zadd(self.keys.agents, {host: now})
        pipe.execute()

    def alive(self, host: str) -> bool:
        """True while the host's last heartbeat has not expired (O(1))."""
        return bool(self.store.client.exists(self.keys.agent(host)))

    def last_seen(self, host: str) -> float | None:
        """When ``host`` last beat: its score in the agents index (O(1))."""
        score = self.store.client.zscore(self.keys.agents, host)
        return None if score is None else float(score)

    def forget(self, host: str) -> None:
        """An agent that stops cleanly says so at once instead of waiting for its TTL."""
        pipe = self.store.client.pipeline(transaction=False)
        pipe.delete(self.keys.agent(host))
        pipe.execute()

    def list(self) -> builtins.list[AgentInfo]:
        """Every agent ever seen in the cell, alive or not (admin view: it scans)."""
        hosts: list[Any] = self.store.client.zrange(self.keys.agents, 0, -1, withscores=True)
        pipe = self.store.client.pipeline(transaction=False)
        for host, _score in hosts:
            pipe.hgetall(self.keys.agent(text(host)))
        infos = []
        for (host, score), raw in zip(hosts, pipe.execute(), strict=True):
            fields = text_map(raw)
            detail = json.loads(fields["detail"]) if fields else {}
            infos.append(AgentInfo(text(host), float(score), bool(fields), detail))
        return infos

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


def class_json(definition: Mapping[str, Any]) -> str:
    """A scheduling class definition as the ``classes`` hash stores it."""
    return json.dumps(definition, sort_keys=True)
