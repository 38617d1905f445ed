"""RedisQuota: per-project limits, and the reservations of instances, cores and RAM.

A project's own limits are one hash (``quota:<project>:limits``, a field per name of
:data:`~qsched.ledger.base.QUOTA_LIMITS`); what is not in it comes from the default
quota class (``quota-class:default``, the same fields), and what is in neither from
the ``[quota]`` options. The scripts that count read the same two hashes
(``quota_limits`` in ``lib.lua``): ``reserve_quota`` (instances, cores, ram_mb),
``group_create`` (server_groups), ``instance_create`` (server_group_members);
``quota_update`` checks new limits against what the project holds in the step that
writes them.
"""

from __future__ import annotations

from collections.abc import Mapping

from qsched import exception
from qsched.ledger.base import QUOTA_LIMITS, QuotaStore, Usage
from qsched.ledger.errors import maps_errors
from qsched.ledger.redis import RedisStore, text_map


@maps_errors
class RedisQuota(QuotaStore):
    def __init__(
        self, store: RedisStore, defaults: Usage, others: Mapping[str, int] | None = None
    ) -> None:
        """``defaults``: the limits the reservation counts; ``others``: the rest of
        :data:`QUOTA_LIMITS` (-1, no limit, for any not given)."""
        self.store = store
        self.keys = store.keys
        self.defaults = defaults
        self.others = {name: int((others or {}).get(name, -1)) for name in QUOTA_LIMITS[3:]}

    def default_args(self) -> tuple[int, int, int]:
        """The default limits as script arguments (instances, cores, ram_mb)."""
        return (self.defaults.instances, self.defaults.cores, self.defaults.ram_mb)

    def get_limits(self, project_id: str) -> Usage:
        limits = self.limits(project_id)
        return Usage(limits["instances"], limits["cores"], limits["ram_mb"])

    def set_limits(
        self,
        project_id: str,
        instances: int | None = None,
        cores: int | None = None,
        ram_mb: int | None = None,
    ) -> Usage:
        wanted = {"instances": instances, "cores": cores, "ram_mb": ram_mb}
        changes = {k: v for k, v in wanted.items() if v is not None}
        for name, value in changes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise exception.Invalid(reason=f"quota {name!s} must be an integer >= -1")
        if changes:
            self.store.client.hset(self.keys.quota_limits(project_id), mapping=dict(changes))  # type: ignore[arg-type]
            self.store.barrier()
        return self.get_limits(project_id)

    def get_usage(self, project_id: str) -> Usage:
        raw = text_map(self.store.client.hgetall(self.keys.quota_used(project_id)))
        return Usage(
            instances=int(raw.get("instances", 0)),
            cores=int(raw.get("cores", 0)),
            ram_mb=int(raw.get("ram_mb", 0)),
        )

    def reserve(self, project_id: str, holder: str, cores: int, ram_mb: int) -> Usage:
        for name, value in (("cores", cores), ("ram_mb", ram_mb)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise exception.Invalid(reason=f"{name} to reserve must be an integer >= 0")
        used = self.store.run(
            "quota_reserve",
            self.keys.quota_used(project_id),
            "reserve",
            project_id,
            holder,
            cores,
            ram_mb,
            *self.default_args(),
        )
        return Usage(instances=int(used["instances"]), cores=int(used["cores"]),
                     ram_mb=int(used["ram_mb"]))  # fmt: skip

    def release(self, project_id: str, holder: str) -> bool:
        result = self.store.run(
            "quota_reserve", self.keys.quota_used(project_id), "release", project_id, holder
        )
        return bool(result["released"])

    def configured_limits(self) -> dict[str, int]:
        """The ``[quota]`` options, before the default quota class."""
        first = {"instances": self.defaults.instances, "cores": self.defaults.cores,
                 "ram_mb": self.defaults.ram_mb}  # fmt: skip
        return {**first, **self.others}

    def default_limits(self) -> dict[str, int]:
        raw = text_map(self.store.client.hgetall(self.keys.quota_class_default))
        return _over(self.configured_limits(), raw)

    def limits(self, project_id: str) -> dict[str, int]:
        pipe = self.store.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.quota_class_default)
        pipe.hgetall(self.keys.quota_limits(project_id))
        default_class, own = (text_map(raw) for raw in pipe.execute())
        return _over(_over(self.configured_limits(), default_class), own)

    def update_default_limits(self, changes: Mapping[str, int]) -> dict[str, int]:
        pairs = _checked(changes)
        if pairs:
            self.store.client.hset(self.keys.quota_class_default, mapping=pairs)  # type: ignore[arg-type]
            self.store.barrier()
        return self.default_limits()

    def in_use(self, project_id: str) -> dict[str, int]:
        pipe = self.store.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.quota_used(project_id))
        pipe.scard(self.keys.project_groups(project_id))
        used, groups = pipe.execute()
        raw = text_map(used)
        counted = {name: int(raw.get(name, 0)) for name in ("instances", "cores", "ram_mb")}
        return {**counted, "server_groups": int(groups)}

    def update_limits(
        self, project_id: str, changes: Mapping[str, int], force: bool = False
    ) -> dict[str, int]:
        pairs = [part for pair in _checked(changes).items() for part in pair]
        self.store.run(
            "quota_update", self.keys.quota_limits(project_id), project_id,
            "1" if force else "", *pairs,
        )  # fmt: skip
        return self.limits(project_id)

    def clear_limits(self, project_id: str) -> None:
        self.store.client.delete(self.keys.quota_limits(project_id))
        self.store.barrier()


def _checked(changes: Mapping[str, int]) -> dict[str, int]:
    """Limits by the names of :data:`QUOTA_LIMITS`, each -1 or more.

    :raises Invalid: an unknown name or any other value.
    """
    for name, value in changes.items():
        if name not in QUOTA_LIMITS:
            raise exception.Invalid(reason=f"{name!r} is no quota; use one of {QUOTA_LIMITS}")
        if not isinstance(value, int) or isinstance(value, bool) or value < -1:
            raise exception.Invalid(reason=f"quota {name!s} must be an integer >= -1")
    return dict(changes)


def _over(limits: Mapping[str, int], overrides: Mapping[str, str]) -> dict[str, int]:
    """``limits`` with those of ``overrides`` (as stored) that name one of them."""
    return {name: int(overrides[name]) if name in overrides else value
            for name, value in limits.items()}  # fmt: skip
