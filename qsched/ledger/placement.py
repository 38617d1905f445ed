"""RedisLedger: resource providers, inventories and allocations with generations."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from qsched import exception
from qsched.ledger.base import (
    DEFAULT_MAX_HANDBACKS,
    Allocations,
    Claim,
    ClaimGuard,
    Consumer,
    Inventory,
    Ledger,
    Provider,
    ProviderSpec,
)
from qsched.ledger.errors import maps_errors
from qsched.ledger.redis import RedisStore, canonical_json, text, text_map
from qsched.resources import (
    DISK_GB,
    MEMORY_MB,
    VCPU,
    check_aggregate,
    check_resource_class,
    check_trait,
    check_uuid,
)

_MAX_AMOUNT = 2**31 - 1
#: Providers one script call reads whole (``providers_read.lua``): Redis runs nothing
#: else meanwhile, so a call is kept to about a millisecond of its time.
_READ_CHUNK = 200


@maps_errors
class RedisLedger(Ledger):
    def __init__(self, store: RedisStore, default_ratios: Mapping[str, float] | None = None):
        self.store = store
        self.keys = store.keys
        self.default_ratios = dict(default_ratios or {VCPU: 4.0, MEMORY_MB: 1.0, DISK_GB: 1.0})

    # providers

    def create_provider(self, uuid: str, name: str, parent_uuid: str | None = None) -> Provider:
        uuid = check_uuid(uuid, "Provider UUID")
        if parent_uuid is not None:
            parent_uuid = check_uuid(parent_uuid, "Parent provider UUID")
        if not isinstance(name, str) or not 0 < len(name) <= 200:
            raise exception.Invalid(reason="provider name must be a string of 1-200 characters")
        result = self.store.run(
            "provider_create",
            self.keys.provider(uuid),
            uuid,
            name,
            parent_uuid or "",
            self.store.now(),
        )
        return Provider(uuid, name, 0, parent_uuid, result["root"])

    def get_provider(self, uuid: str) -> Provider:
        found = self.get_providers([uuid]).get(uuid)
        if found is None:
            raise exception.ProviderNotFound(provider=uuid)
        return found

    def find_provider(self, name: str) -> Provider | None:
        uuid = self.store.client.hget(self.keys.provider_names, name)
        if uuid is None:
            return None
        try:
            return self.get_provider(text(uuid))
        except exception.ProviderNotFound:  # deleted between the two reads
            return None

    def delete_provider(self, uuid: str, generation: int) -> None:
        self.store.run("provider_delete", self.keys.provider(uuid), uuid, generation)

    def set_inventory(
        self, uuid: str, generation: int, inventories: Mapping[str, Inventory]
    ) -> int:
        specs = {rc: self._inventory_spec(uuid, rc, inv) for rc, inv in inventories.items()}
        result = self.store.run(
            "provider_inventory", self.keys.provider(uuid), uuid, generation, canonical_json(specs)
        )
        return int(result["generation"])

    def set_traits(self, uuid: str, generation: int, traits: Iterable[str]) -> int:
        members = sorted({check_trait(t) for t in traits})
        return self._set_members(uuid, generation, "traits", members)

    def set_aggregates(self, uuid: str, generation: int, aggregates: Iterable[str]) -> int:
        members = sorted({check_aggregate(a) for a in aggregates})
        return self._set_members(uuid, generation, "aggregates", members)

    def _set_members(self, uuid: str, generation: int, kind: str, members: list[str]) -> int:
        key = self.keys.provider(uuid)
        result = self.store.run("provider_members", key, uuid, generation, kind, *members)
        return int(result["generation"])

    def register_providers(self, specs: Sequence[ProviderSpec]) -> list[Provider]:
        if not specs:
            return []
        batch = [self._spec_json(spec) for spec in specs]
        result = self.store.run(
            "provider_register", self.keys.providers, self.store.now(), canonical_json(batch)
        )
        return [
            _registered(spec, item) for spec, item in zip(specs, result["providers"], strict=True)
        ]

    def _spec_json(self, spec: ProviderSpec) -> dict[str, Any]:
        uuid = check_uuid(spec.uuid, "Provider UUID")
        if spec.parent_uuid is not None:
            check_uuid(spec.parent_uuid, "Parent provider UUID")
        if not isinstance(spec.name, str) or not 0 < len(spec.name) <= 200:
            raise exception.Invalid(reason="provider name must be a string of 1-200 characters")
        if spec.host is not None and not (isinstance(spec.host, str) and spec.host):
            raise exception.Invalid(reason="a provider's host must be a non-empty string")
        return {
            "uuid": uuid,
            "name": spec.name,
            "parent": spec.parent_uuid or "",
            "host": spec.host or "",
            "inv": {
                rc: self._inventory_spec(uuid, rc, inv) for rc, inv in spec.inventories.items()
            },
            "traits": sorted(check_trait(t) for t in spec.traits),
            "aggs": sorted(check_aggregate(a) for a in spec.aggregates),
        }

    def list_providers(self) -> list[Provider]:
        uuids = sorted(text(u) for u in self.store.client.smembers(self.keys.providers))
        return list(self.get_providers(uuids).values())

    def sharing_providers(self, aggregates: Iterable[str] | None = None) -> dict[str, Provider]:
        uuids = sorted(text(u) for u in self.store.client.smembers(self.keys.sharing_providers))
        found = self.get_providers(uuids)
        if aggregates is None:
            return found
        wanted = frozenset(aggregates)
        return {uuid: p for uuid, p in found.items() if p.aggregates & wanted}

    def get_providers(self, uuids: Sequence[str]) -> dict[str, Provider]:
        found: dict[str, Provider] = {}
        for uuid, reply in self._read_providers("providers_read", uuids):
            if reply:  # else deleted, or never there
                fields, traits, aggs = reply
                pairs = dict(zip(fields[::2], fields[1::2], strict=True))
                found[uuid] = _provider(uuid, pairs, traits or (), aggs or ())
        return found

    def _read_providers(self, script: str, uuids: Sequence[str]) -> Iterator[tuple[str, Any]]:
        """Each of ``uuids`` with its entry in the JSON list that read-only ``script``
        returns, :data:`_READ_CHUNK` providers a call."""
        for start in range(0, len(uuids), _READ_CHUNK):
            chunk = uuids[start : start + _READ_CHUNK]
            replies = json.loads(self.store.read(script, self.keys.providers, *chunk))
            yield from zip(chunk, replies, strict=True)

    def hypervisors(self, after: int = 0, limit: int | None = None) -> list[tuple[int, str]]:
        client, key = self.store.client, self.keys.hypervisors
        if limit is None:
            found: list[Any] = client.zrangebyscore(key, f"({after}", "+inf", withscores=True)
        else:
            found = client.zrangebyscore(key, f"({after}", "+inf", 0, limit, withscores=True)
        return [(int(score), text(uuid)) for uuid, score in found]

    def hypervisor_ids(self, uuids: Sequence[str]) -> dict[str, int]:
        scores = self.store.client.zmscore(self.keys.hypervisors, list(uuids)) if uuids else []
        return {u: int(s) for u, s in zip(uuids, scores, strict=True) if s is not None}

    def hypervisor_uuid(self, hypervisor_id: int) -> str | None:
        found = self.store.client.zrangebyscore(
            self.keys.hypervisors, hypervisor_id, hypervisor_id, start=0, num=1
        )
        return text(found[0]) if found else None

    def default_inventory(self, resource_class: str, total: int, **fields: Any) -> Inventory:
        """An Inventory with the configured allocation ratio for its class."""
        fields.setdefault("allocation_ratio", self.default_ratios.get(resource_class, 1.0))
        return Inventory(total=total, **fields)

    def _inventory_spec(self, uuid: str, rc: str, inv: Inventory) -> str:
        check_resource_class(rc)
        max_unit = inv.effective_max_unit
        ints = (inv.total, inv.reserved, inv.min_unit, max_unit, inv.step_size)
        problem = None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
            problem = "total, reserved, min_unit, max_unit and step_size must be integers"
        elif inv.total < 1 or inv.total > _MAX_AMOUNT:
            problem = f"total must be within 1..{_MAX_AMOUNT}"
        elif not 0 <= inv.reserved <= inv.total:
            problem = "reserved must be within 0..total"
        elif not 1 <= inv.min_unit <= max_unit:
            problem = "min_unit must be at least 1 and at most max_unit"
        elif inv.step_size < 1:
            problem = "step_size must be at least 1"
        elif not isinstance(inv.allocation_ratio, int | float) or inv.allocation_ratio <= 0:
            problem = "allocation_ratio must be a number > 0"
        if problem:
            raise exception.InvalidInventory(resource_class=rc, provider=uuid, reason=problem)
        return f"{inv.total} {inv.reserved} {inv.min_unit} {max_unit} {inv.step_size} " + repr(
            float(inv.allocation_ratio)
        )

    # allocations

    def get_allocations(self, consumer_uuid: str) -> Consumer:
        fields = text_map(self.store.client.hgetall(self.keys.consumer(consumer_uuid)))
        if not fields:
            return Consumer(consumer_uuid, None)
        return Consumer(
            consumer_uuid,
            int(fields["generation"]),
            fields["project"],
            fields["user"],
            _json_allocations(fields["allocs"]),
        )

    def provider_consumers(self, uuid: str) -> set[str]:
        return {text(c) for c in self.store.client.smembers(self.keys.provider_consumers(uuid))}

    def providers_consumers(self, uuids: Sequence[str]) -> dict[str, set[str]]:
        return {uuid: set(consumers) for uuid, consumers
                in self._read_providers("providers_consumers", uuids)}  # fmt: skip

    def project_usages(self, project_id: str) -> dict[str, int]:
        raw = text_map(self.store.client.hgetall(self.keys.project_usage(project_id)))
        return {rc: int(n) for rc, n in raw.items() if int(n)}

    def put_allocations(
        self,
        consumer_uuid: str,
        allocations: Allocations,
        consumer_generation: int | None,
        project_id: str,
        user_id: str,
        provider_generations: Mapping[str, int] | None = None,
    ) -> int:
        result = self._allocate(
            consumer_uuid, allocations, consumer_generation, project_id, user_id,
            provider_generations, claim=None,
        )  # fmt: skip
        return result["generation"]

    def claim(
        self,
        instance_uuid: str,
        allocations: Allocations,
        host: str,
        node: str,
        consumer_generation: int | None = None,
        provider_generations: Mapping[str, int] | None = None,
        max_handbacks: int = DEFAULT_MAX_HANDBACKS,
        guard: ClaimGuard | None = None,
        scheduling_class: str | None = None,
    ) -> Claim:
        if max_handbacks < 0:
            raise exception.Invalid(reason=f"max_handbacks {max_handbacks} must be >= 0")
        result = self._allocate(
            instance_uuid, allocations, consumer_generation, "", "",  # from the record
            provider_generations, claim=(host, node), max_handbacks=max_handbacks, guard=guard,
            scheduling_class=scheduling_class,
        )  # fmt: skip
        return Claim(
            result["generation"], bool(result.get("already")), result.get("batch") or None,
            bool(result.get("permitted", True)),
        )  # fmt: skip

    def _allocate(
        self,
        consumer_uuid: str,
        allocations: Allocations,
        consumer_generation: int | None,
        project_id: str,
        user_id: str,
        provider_generations: Mapping[str, int] | None,
        claim: tuple[str, str] | None,
        max_handbacks: int = 0,
        guard: ClaimGuard | None = None,
        scheduling_class: str | None = None,
    ) -> dict[str, Any]:
        consumer_uuid = check_uuid(consumer_uuid, "Consumer UUID")
        clean = check_allocations(allocations)
        if claim is not None and not clean:
            raise exception.Invalid(reason="a claim must allocate something")
        host, node = claim or ("", "")
        return self.store.run(
            "allocate",
            self.keys.consumer(consumer_uuid),
            consumer_uuid,
            "" if consumer_generation is None else consumer_generation,
            project_id,
            user_id,
            canonical_json(clean),
            canonical_json(dict(provider_generations)) if provider_generations else "",
            "1" if claim else "",
            host,
            node,
            self.store.now(),
            self.store.max_events,
            max_handbacks,
            canonical_json(guard.to_json()) if guard else "",
            scheduling_class or "",
        )

    def release_unexplained(self, consumer_uuid: str, host: str, provider_uuid: str) -> bool:
        consumer_uuid = check_uuid(consumer_uuid, "Consumer UUID")
        result = self.store.run(
            "release_unexplained", self.keys.consumer(consumer_uuid), consumer_uuid, host,
            provider_uuid,
        )  # fmt: skip
        return bool(result["released"])

    def held_claims(self, host: str) -> dict[str, str]:
        """What ``host:<host>:held`` holds: instance uuid -> its held consumer."""
        return text_map(self.store.client.hgetall(self.keys.host_held(host)))

    def release_held(self, host: str, instance_uuid: str) -> bool:
        result = self.store.run("release_held", self.keys.host_held(host), host, instance_uuid)
        return bool(result["released"])

    def release(self, instance_uuid: str, host: str | None = None, reason: str = "") -> bool:
        result = self.store.run(
            "release",
            self.keys.instance(instance_uuid),
            instance_uuid,
            host or "",
            self.store.now(),
            self.store.max_events,
            reason,
        )
        return bool(result["released"])


def check_allocations(allocations: Allocations) -> dict[str, dict[str, int]]:
    """Validate shapes and amounts; return a plain copy. Raises before anything is written."""
    if not isinstance(allocations, Mapping):
        raise exception.Invalid(reason="allocations must be a mapping {provider: {class: n}}")
    clean: dict[str, dict[str, int]] = {}
    for rp, amounts in allocations.items():
        rp = check_uuid(rp, "Provider UUID")
        if not isinstance(amounts, Mapping) or not amounts:
            raise exception.Invalid(reason=f"allocations on {rp} must be a non-empty mapping")
        for rc, n in amounts.items():
            check_resource_class(rc)
            if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= _MAX_AMOUNT:
                raise exception.InvalidAmount(
                    amount=n, resource_class=rc, provider=rp,
                    reason=f"must be an integer within 1..{_MAX_AMOUNT}",
                )  # fmt: skip
        clean[rp] = dict(amounts)
    return clean


def _json_allocations(raw: str) -> dict[str, dict[str, int]]:
    return {rp: dict(amounts) for rp, amounts in json.loads(raw).items()}


def _registered(spec: ProviderSpec, item: dict[str, Any]) -> Provider:
    usages = item["usages"] if isinstance(item["usages"], dict) else {}
    return Provider(
        uuid=spec.uuid,
        name=spec.name,
        generation=int(item["generation"]),
        parent_uuid=spec.parent_uuid,
        root_uuid=item["root"],
        inventories={rc: _stored(inv) for rc, inv in spec.inventories.items()},
        usages={rc: int(n) for rc, n in usages.items()},
        traits=frozenset(spec.traits),
        aggregates=frozenset(item.get("aggs") or ()),
        host=spec.host if spec.parent_uuid is None else None,
    )


def _stored(inv: Inventory) -> Inventory:
    """An inventory as the ledger stores it (max_unit spelled out)."""
    return dataclasses.replace(
        inv, max_unit=inv.effective_max_unit, allocation_ratio=float(inv.allocation_ratio)
    )


def _provider(uuid: str, fields: dict[str, str], traits: Any, aggs: Any) -> Provider:
    inventories: dict[str, Inventory] = {}
    usages: dict[str, int] = {}
    for field, value in fields.items():
        if field.startswith("i:"):
            total, reserved, min_unit, max_unit, step, ratio = value.split()
            inventories[field[2:]] = Inventory(
                int(total), int(reserved), int(min_unit), int(max_unit), int(step), float(ratio)
            )
        elif field.startswith("u:"):
            usages[field[2:]] = int(value)
    return Provider(
        uuid=uuid,
        name=fields["name"],
        generation=int(fields["generation"]),
        parent_uuid=fields.get("parent") or None,
        root_uuid=fields.get("root") or None,
        inventories=inventories,
        usages=usages,
        traits=frozenset(text(t) for t in traits),
        aggregates=frozenset(text(a) for a in aggs),
        host=fields.get("host") or None,
    )
