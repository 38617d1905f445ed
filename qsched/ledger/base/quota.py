"""QuotaStore: per-project limits, and the reservation each instance holds against them."""

from __future__ import annotations

import abc
from collections.abc import Mapping

from qsched.ledger.records import Usage

#: What a project's quota limits, by the ledger's names (Nova's, but ``ram_mb``): the
#: first three the reservation counts, the groups the group scripts, the rest are
#: limits that the API checks against what one request asks (keypairs per user,
#: metadata items and injected files per server).
QUOTA_LIMITS = (
    "instances", "cores", "ram_mb", "server_groups", "server_group_members", "key_pairs",
    "metadata_items", "injected_files", "injected_file_content_bytes",
    "injected_file_path_bytes",
)  # fmt: skip


class QuotaStore(abc.ABC):
    """Per-project limits on instances, cores and RAM, reserved per instance."""

    @abc.abstractmethod
    def get_limits(self, project_id: str) -> Usage:
        """The project's limits: its overrides over the configured defaults."""

    @abc.abstractmethod
    def set_limits(
        self,
        project_id: str,
        instances: int | None = None,
        cores: int | None = None,
        ram_mb: int | None = None,
    ) -> Usage:
        """Override some limits for one project (-1: no limit); return the new limits."""

    @abc.abstractmethod
    def get_usage(self, project_id: str) -> Usage:
        """What the project holds now (O(1))."""

    @abc.abstractmethod
    def reserve(self, project_id: str, holder: str, cores: int, ram_mb: int) -> Usage:
        """Reserve one instance with ``cores`` and ``ram_mb`` for ``holder``, atomically.

        Idempotent per holder. Returns the usage after.

        :raises QuotaExceeded: naming the first resource over its limit, with
            what was requested, used and allowed; nothing is reserved.
        """

    @abc.abstractmethod
    def release(self, project_id: str, holder: str) -> bool:
        """Return what ``holder`` reserved. False if it held nothing. Idempotent."""

    @abc.abstractmethod
    def default_limits(self) -> dict[str, int]:
        """Every limit of :data:`QUOTA_LIMITS` for a project without its own: the
        default quota class's over the ``[quota]`` options (-1: none)."""

    @abc.abstractmethod
    def update_default_limits(self, changes: Mapping[str, int]) -> dict[str, int]:
        """Set some limits of the default quota class (names of :data:`QUOTA_LIMITS`,
        values -1 and up), for every project without its own; return the defaults after.
        Nothing is checked against usage (as Nova's quota classes).

        :raises Invalid: an unknown name or a value below -1.
        """

    @abc.abstractmethod
    def limits(self, project_id: str) -> dict[str, int]:
        """Every limit of :data:`QUOTA_LIMITS` for one project: its own over the
        defaults (:meth:`default_limits`), in one round trip, O(1)."""

    @abc.abstractmethod
    def in_use(self, project_id: str) -> dict[str, int]:
        """What the project holds of what the ledger counts: ``instances``, ``cores``,
        ``ram_mb`` and ``server_groups`` (one round trip, O(1))."""

    @abc.abstractmethod
    def update_limits(
        self, project_id: str, changes: Mapping[str, int], force: bool = False
    ) -> dict[str, int]:
        """Override some limits of one project (names of :data:`QUOTA_LIMITS`, values
        -1 and up), all or none, atomically with the check; return every limit after.

        :raises QuotaBelowUsage: unless ``force``, a limit under what the project holds
            now (instances, cores, ram_mb, server_groups); nothing is written.
        :raises Invalid: an unknown name or a value below -1.
        """

    @abc.abstractmethod
    def clear_limits(self, project_id: str) -> None:
        """Drop every override of one project: its limits are the defaults again."""
