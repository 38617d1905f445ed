"""RedisArchive: :class:`~qsched.ledger.base.ArchiveStore` on the cell's Redis.

A step is the script ``instance_archive``; the staging area is the hash
``archive-staged`` (uuid -> the history's JSON text), read with ``HSCAN`` and
cleared with ``HDEL``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qsched import exception
from qsched.ledger.base import ArchiveStep, ArchiveStore
from qsched.ledger.errors import maps_errors
from qsched.ledger.redis import RedisStore, text


@maps_errors
class RedisArchive(ArchiveStore):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.keys = store.keys

    def step(
        self, before: float, batch: int, after: str | None = None, dry_run: bool = False
    ) -> ArchiveStep:
        if batch < 1:
            raise exception.Invalid(reason=f"an archive step of {batch} instances: use 1 or more")
        result = self.store.run(
            "instance_archive", self.keys.deleted_instances, repr(float(before)), int(batch),
            after or "", "1" if dry_run else "", self.store.now(),
        )  # fmt: skip
        return ArchiveStep(
            archived=tuple(_strings(result["archived"])),
            held=tuple((str(u), str(why)) for u, why in _items(result["held"])),
            stale=tuple(_strings(result["stale"])),
            cursor=result.get("cursor") or None,
            done=bool(result["done"]),
            left=int(result["left"]),
        )

    def staged(self, uuids: Sequence[str] | None = None, limit: int = 1000) -> dict[str, str]:
        key = self.keys.archive_staged
        if uuids is not None:
            texts = self.store.client.hmget(key, list(uuids)) if uuids else []
            return {u: text(t) for u, t in zip(uuids, texts, strict=True) if t is not None}
        found: dict[str, str] = {}
        cursor = 0
        while len(found) < limit:
            reply: Any = self.store.client.hscan(key, cursor, count=limit)
            cursor, page = reply
            found.update({text(k): text(v) for k, v in page.items()})
            if not cursor:
                break
        return dict(list(found.items())[:limit])

    def clear(self, uuids: Sequence[str]) -> int:
        if not uuids:
            return 0
        return int(self.store.client.hdel(self.keys.archive_staged, *uuids))

    def deleted_count(self, before: float | None = None) -> int:
        until = "+inf" if before is None else f"({float(before)!r}"
        return int(self.store.client.zcount(self.keys.deleted_instances, "-inf", until))


def _strings(value: Any) -> list[str]:
    """A list the script returned; cjson writes an empty one as ``{}``."""
    return [str(v) for v in value] if isinstance(value, list) else []


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
