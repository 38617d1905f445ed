"""RedisKeypairs: :class:`~qsched.ledger.base.KeypairStore` on the cell's Redis.

A user's keypairs are one hash (name -> the keypair as JSON), so every call is
a constant number of Redis commands whatever the size of the cloud; a listing
reads one user's hash, which ``[quota] key_pairs`` bounds. A create checks the
name and the user's limit and takes Nova's integer id in one script
(``keypair_create``), so parallel creates cannot pass the limit or share a name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from qsched import exception
from qsched.ledger.base import SSH, Keypair, KeypairStore
from qsched.ledger.errors import maps_errors
from qsched.ledger.redis import RedisStore, text, text_map


@maps_errors
class RedisKeypairs(KeypairStore):
    """Keypairs in the cell's Redis; ``limit``: ``[quota] key_pairs`` (-1: no limit)."""

    def __init__(self, store: RedisStore, limit: int = 100) -> None:
        self.store = store
        self.keys = store.keys
        self.limit = limit

    def create(self, keypair: Keypair, limit: int | None = None) -> Keypair:
        created = dataclasses.replace(keypair, created_at=self.store.now())
        fields = _fields(created)
        del fields["id"]  # the script gives it
        done = self.store.run(
            "keypair_create", self.keys.user_keypairs(keypair.user_id), keypair.user_id,
            keypair.name, json.dumps(fields), self.limit if limit is None else limit,
        )  # fmt: skip
        return dataclasses.replace(created, id=int(done["id"]))

    def get(self, user_id: str, name: str) -> Keypair:
        raw = self.store.client.hget(self.keys.user_keypairs(user_id), name)
        if raw is None:
            raise exception.KeypairNotFound(name=name, user_id=user_id)
        return _keypair(user_id, name, text(raw))

    def list_user(self, user_id: str) -> list[Keypair]:
        raw = text_map(self.store.client.hgetall(self.keys.user_keypairs(user_id)))
        return [_keypair(user_id, name, raw[name]) for name in sorted(raw)]

    def delete(self, user_id: str, name: str) -> None:
        if not self.store.client.hdel(self.keys.user_keypairs(user_id), name):
            raise exception.KeypairNotFound(name=name, user_id=user_id)


def _fields(keypair: Keypair) -> dict[str, object]:
    return {
        "id": keypair.id,
        "type": keypair.type,
        "public_key": keypair.public_key,
        "fingerprint": keypair.fingerprint,
        "created_at": repr(keypair.created_at),  # text: Lua's cjson rounds numbers
    }


def _keypair(user_id: str, name: str, raw: str) -> Keypair:
    fields: Mapping[str, object] = json.loads(raw)
    return Keypair(
        user_id=user_id,
        name=name,
        public_key=str(fields["public_key"]),
        fingerprint=str(fields["fingerprint"]),
        type=str(fields.get("type") or SSH),
        id=int(str(fields.get("id") or 0)),
        created_at=float(str(fields.get("created_at") or 0)),
    )
