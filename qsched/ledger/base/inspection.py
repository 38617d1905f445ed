"""Inspector: the records of a whole cell, read for admin views, audits and harnesses.

What qsched-admin, :func:`qsched.ledger.audit.audit`, the chaos checks and the
benchmarks read besides the stores' own methods. Every method scans the cell,
or the index it names, unless it says O(1): none of them is for a request path.
Instance records and histories come back as stored (field -> text, events as
dicts), for checks that look at the storage itself rather than at what the
stores make of it; the other records come back as the values of
:mod:`qsched.ledger.records`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from qsched.ledger.records import Consumer, Usage


class Inspector(abc.ABC):
    """Scans and counts over one cell. Nothing here writes."""

    @abc.abstractmethod
    def instance_records(
        self, uuids: Sequence[str] | None = None, fields: Sequence[str] = ()
    ) -> dict[str, dict[str, str]]:
        """Instance records as stored, by uuid: of ``uuids``, or of every instance of the
        cell (a scan of its keys). With ``fields``, only those (a field a record lacks is
        left out). Instances without a record are left out.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def histories(self, uuids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The history of each of ``uuids`` as stored (``t``, ``event``, ``host``,
        ``node``, ``detail``), oldest first; an empty list for one without any.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def events_trimmed(self, uuid: str) -> int:
        """How many old events the history of ``uuid`` has lost to its length limit (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def deadline_index(self) -> list[str]:
        """The instances in the deadline index (accepted, not ACTIVE nor ended yet),
        earliest deadline first: O(that many).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def waiting_count(self) -> int:
        """How many instances the deadline index holds (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def consumers(self) -> dict[str, Consumer]:
        """Every consumer holding allocations, by uuid (a scan).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def project_usages(self) -> dict[str, dict[str, int]]:
        """Every project's allocation usage counters, zeros left out (a scan).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def quota_used(self) -> dict[str, dict[str, int]]:
        """Every project's quota counters: ``instances``, ``cores``, ``ram_mb`` (a scan).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def quota_held(self) -> dict[str, dict[str, Usage]]:
        """Per project, what each holder reserved (one instance, its cores and RAM) (a scan).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def provider_uuid(self, name: str) -> str | None:
        """The uuid of the provider named ``name`` (names are unique), or None (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def provider_count(self) -> int:
        """How many providers the cell has (O(1)).

        :raises BackendUnavailable:
        """
