"""RedisQuota: per-project limits on instances, cores and RAM."""

from __future__ import annotations

from qsched import exception
from qsched.ledger.base import QuotaStore, Usage
from qsched.ledger.redis import RedisStore, maps_errors, text_map


@maps_errors
class RedisQuota(QuotaStore):
    def __init__(self, store: RedisStore, defaults: Usage) -> None:
        self.store = store
        self.keys = store.keys
        self.defaults = defaults

    def default_args(self) -> tuple[int, int, int]:
        """The default limits as script arguments (instances, cores, ram_mb)."""
        return (self.defaults.instances, self.defaults.cores, self.defaults.ram_mb)

    def get_limits(self, project_id: str) -> Usage:
        raw = text_map(self.store.client.hgetall(self.keys.quota_limits(project_id)))
        return Usage(
            instances=int(raw.get("instances", self.defaults.instances)),
            cores=int(raw.get("cores", self.defaults.cores)),
            ram_mb=int(raw.get("ram_mb", self.defaults.ram_mb)),
        )

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
        self.store.run(
            "quota_reserve",
            self.keys.quota_used(project_id),
            "reserve",
            project_id,
            holder,
            cores,
            ram_mb,
            *self.default_args(),
        )
        return self.get_usage(project_id)

    def release(self, project_id: str, holder: str) -> bool:
        result = self.store.run(
            "quota_reserve", self.keys.quota_used(project_id), "release", project_id, holder
        )
        return bool(result["released"])
