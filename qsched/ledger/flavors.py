"""RedisFlavors: the flavor catalog, one hash in the cell's keyspace.

``keys.flavors`` maps a flavor id to its JSON (:meth:`Flavor.to_dict` plus what
only the catalog keeps: public or not, the projects granted a private one, swap,
ephemeral disk, rxtx factor, description). Reading one flavor is one HGET, so the
boot path stays O(1); the access list being part of the stored form, a caller that
keeps flavors in memory learns of a removed grant from the create script's check.
Writes are admin actions: they check name uniqueness over the whole catalog under
WATCH (optimistic, no read-modify-write race), which is O(number of flavors),
never O(hosts).
"""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import redis

from qsched import exception
from qsched.exception import FlavorExists, FlavorNotFound
from qsched.flavors import Flavor, check_flavor
from qsched.ledger.base import FlavorStore
from qsched.ledger.errors import maps_errors
from qsched.ledger.redis import RedisStore, canonical_json, text, text_map

_MAX_WATCH_RETRIES = 20


@maps_errors
class RedisFlavors(FlavorStore):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.keys = store.keys

    def get(self, flavor_id: str) -> Flavor:
        return self.get_stored(flavor_id)[0]

    def get_stored(self, flavor_id: str) -> tuple[Flavor, str]:
        raw = self.store.client.hget(self.keys.flavors, flavor_id)
        if raw is None:
            raise FlavorNotFound(flavor=flavor_id)
        stored = text(raw)
        return _flavor(stored), stored

    def list(self) -> list[Flavor]:
        raw = text_map(self.store.client.hgetall(self.keys.flavors))
        return [_flavor(raw[key]) for key in sorted(raw)]

    def create(self, flavor: Flavor) -> Flavor:
        flavor = _with_id(check_flavor(flavor))

        def write(catalog: dict[str, Flavor]) -> Flavor | None:
            if flavor.id in catalog:
                raise FlavorExists(field="ID", value=flavor.id)
            _check_name(catalog, flavor)
            return flavor

        self._transact(write)
        return flavor

    def put(self, flavor: Flavor) -> bool:
        flavor = _with_id(check_flavor(flavor))

        def write(catalog: dict[str, Flavor]) -> Flavor | None:
            _check_name(catalog, flavor)
            old = catalog.get(flavor.id)
            new = flavor if old is None else _keeping_api_fields(flavor, old)
            return None if old == new else new

        return self._transact(write) is not None

    def update(self, flavor_id: str, change: Callable[[Flavor], Flavor]) -> Flavor:
        def write(catalog: dict[str, Flavor]) -> Flavor | None:
            if flavor_id not in catalog:
                raise FlavorNotFound(flavor=flavor_id)
            new = check_flavor(change(catalog[flavor_id]))
            return dataclasses.replace(new, id=flavor_id)

        written = self._transact(write)
        assert written is not None
        return written

    def delete(self, flavor_id: str) -> Flavor:
        raw = self.store.client.hget(self.keys.flavors, flavor_id)
        if raw is None:
            raise FlavorNotFound(flavor=flavor_id)
        flavor = _flavor(text(raw))
        classes = self._classes_of(self.store.client, {flavor.class_key})
        pipe = self.store.client.pipeline(transaction=True)
        pipe.hdel(self.keys.flavors, flavor_id)
        if classes:
            pipe.hdel(self.keys.classes, *classes)
        if not pipe.execute()[0]:
            raise FlavorNotFound(flavor=flavor_id)
        self.store.barrier()
        return flavor

    def _classes_of(self, client: Any, flavor_names: set[str]) -> builtins.list[str]:
        """The live scheduling classes of these flavors (an admin scan of the classes).

        A changed or deleted flavor drops them: agents would otherwise decide on
        what it was. The API publishes a class again, as it is now, on its next boot.
        """
        names = (text(n) for n in client.hkeys(self.keys.classes))
        return [n for n in names if n.split("+", 1)[0] in flavor_names]

    @staticmethod
    def _changed_classes(old: Flavor | None, new: Flavor) -> set[str]:
        """The class keys whose definitions a write changes: none when only what agents
        never see changed (access, description, rxtx factor)."""
        if old is not None and old.to_dict() == new.to_dict():
            return set()
        return {new.class_key, old.class_key if old else ""} - {""}

    def _transact(self, write: Callable[[dict[str, Flavor]], Flavor | None]) -> Flavor | None:
        """Run ``write`` on the catalog under WATCH and store the flavor it returns."""
        key = self.keys.flavors
        with self.store.client.pipeline(transaction=True) as pipe:
            for _ in range(_MAX_WATCH_RETRIES):
                try:
                    pipe.watch(key)
                    catalog = {k: _flavor(v) for k, v in text_map(pipe.hgetall(key)).items()}
                    flavor = write(catalog)
                    classes: builtins.list[str] = []
                    if flavor is not None:
                        changed = self._changed_classes(catalog.get(flavor.id), flavor)
                        classes = self._classes_of(pipe, changed) if changed else []
                    pipe.multi()
                    if flavor is not None:
                        pipe.hset(key, flavor.id, _json(flavor))
                    if classes:
                        pipe.hdel(self.keys.classes, *classes)
                    pipe.execute()
                    self.store.barrier()
                    return flavor
                except redis.WatchError:
                    continue
                finally:
                    pipe.reset()
        raise exception.Conflict(reason="the flavor catalog kept changing; try again")


def _with_id(flavor: Flavor) -> Flavor:
    return flavor if flavor.id else dataclasses.replace(flavor, id=flavor.name)


def _check_name(catalog: dict[str, Flavor], flavor: Flavor) -> None:
    for other in catalog.values():
        if other.name == flavor.name and other.id != flavor.id:
            raise FlavorExists(field="name", value=flavor.name)


def _keeping_api_fields(flavor: Flavor, old: Flavor) -> Flavor:
    """A configured flavor over the stored one: the grants and description the API
    manages stay (the configuration has neither)."""
    description = flavor.description if flavor.description is not None else old.description
    return dataclasses.replace(flavor, projects=old.projects, description=description)


def _json(flavor: Flavor) -> str:
    return canonical_json(
        {
            **flavor.to_dict(),
            "is_public": flavor.is_public,
            "projects": sorted(flavor.projects),
            "swap_mb": flavor.swap_mb,
            "ephemeral_gb": flavor.ephemeral_gb,
            "rxtx_factor": flavor.rxtx_factor,
            "description": flavor.description,
        }
    )


def _flavor(raw: str) -> Flavor:
    # Checked when written; reading skips the checks to keep the boot path cheap.
    data: dict[str, Any] = json.loads(raw)
    return Flavor(
        name=data["name"],
        id=data["id"],
        vcpus=data["vcpus"],
        ram_mb=data["ram_mb"],
        disk_gb=data.get("disk_gb", 0),
        extra_specs=data.get("extra_specs") or {},
        is_public=data.get("is_public", True),
        swap_mb=data.get("swap_mb", 0),
        ephemeral_gb=data.get("ephemeral_gb", 0),
        rxtx_factor=data.get("rxtx_factor", 1.0),
        description=data.get("description"),
        projects=frozenset(data.get("projects") or ()),
    )
