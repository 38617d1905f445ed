"""GroupStore: server groups, their members and the hosts they hold claims on."""

from __future__ import annotations

import abc
import builtins

from qsched.ledger.records import ServerGroup


class GroupStore(abc.ABC):
    """Server groups (Nova's instance groups) and where their members hold claims.

    Membership is written with the instance (:meth:`InstanceStore.create` with
    ``Instance.group``), the hosts by the claim, which refuses a host that would
    break a hard policy (:class:`~qsched.exception.GroupPolicyRefused`).
    """

    @abc.abstractmethod
    def create(self, group: ServerGroup) -> ServerGroup:
        """Record a new group, within its project's limit; return it as written.

        :raises ServerGroupLimitExceeded: the project holds ``[quota] server_groups``.
        :raises Conflict: the uuid is taken, or was abandoned (:meth:`abandon`).
        """

    @abc.abstractmethod
    def get(self, uuid: str, members: bool = True) -> ServerGroup:
        """One group (O(1)), with its members unless ``members`` is False (O(members)).

        :raises GroupNotFound:
        """

    @abc.abstractmethod
    def list_project(self, project_id: str) -> builtins.list[ServerGroup]:
        """A project's groups with their members (at most ``[quota] server_groups``)."""

    @abc.abstractmethod
    def list_all(self) -> builtins.list[ServerGroup]:
        """Every group of the cell (an admin view: it scans)."""

    @abc.abstractmethod
    def delete(self, uuid: str) -> None:
        """Forget a group; its servers live on in no group, as in Nova.

        :raises GroupNotFound:
        """

    @abc.abstractmethod
    def abandon(self, uuid: str) -> bool:
        """Give up on a group whose create may not have run here (the front door of
        several cells, :mod:`qsched.cells`): True if the group is here (it is kept); else
        a mark is left, in the same step, so that a :meth:`create` arriving late refuses
        (:class:`~qsched.exception.Conflict`), and False."""

    @abc.abstractmethod
    def hosts(self, uuid: str) -> dict[str, int]:
        """Host -> how many of the group's members hold a claim there (O(hosts of the
        group), which its member limit bounds)."""

    @abc.abstractmethod
    def members_on(self, uuid: str, host: str) -> int:
        """How many of the group's members hold a claim on ``host`` (O(1))."""
