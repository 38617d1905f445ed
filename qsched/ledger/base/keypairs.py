"""KeypairStore: the keypairs of each user, and the Keypair record it takes and returns."""

from __future__ import annotations

import abc
import dataclasses

SSH, X509 = "ssh", "x509"


@dataclasses.dataclass(frozen=True)
class Keypair:
    """One keypair of a user: what Nova's ``key_pairs`` table keeps (no private key)."""

    user_id: str
    name: str
    public_key: str
    fingerprint: str
    type: str = SSH
    id: int = 0  # Nova's integer id, given by the store
    created_at: float = 0.0


class KeypairStore(abc.ABC):
    """The keypairs of each user."""

    @abc.abstractmethod
    def create(self, keypair: Keypair, limit: int | None = None) -> Keypair:
        """Keep ``keypair``; return it with its id and creation time. ``limit``: the
        most keypairs the user may hold (-1: no limit; None: the store's default).

        :raises KeypairExists: the user has a keypair of that name (409).
        :raises KeypairLimitExceeded: the user holds their limit of keypairs (403).
        """

    @abc.abstractmethod
    def get(self, user_id: str, name: str) -> Keypair:
        """One keypair of ``user_id``.

        :raises KeypairNotFound: none of that name.
        """

    @abc.abstractmethod
    def list_user(self, user_id: str) -> list[Keypair]:
        """Every keypair of ``user_id``, by name (Nova's order)."""

    @abc.abstractmethod
    def delete(self, user_id: str, name: str) -> None:
        """Forget one keypair of ``user_id``.

        :raises KeypairNotFound: none of that name.
        """
