"""The virt driver interface: what a compute agent needs from a hypervisor.

A driver drives one node or many (like nova-compute with ironic). It reports each node as a
tree of resource providers with inventories and traits; the agent writes those to the ledger.
Usages, aggregates and availability zones are not the driver's business: the ledger and the
operator own them.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping

from qsched import exception
from qsched.flavors import Flavor
from qsched.ledger.base import Inventory
from qsched.scheduling.views import NodeView, ProviderView


class SpawnFailed(exception.QschedError):
    """The instance did not start; nothing of it is left on the node. Reschedule it."""

    msg_fmt = "Spawning instance {instance} on node {node} failed: {reason}"


class SpawnFenced(exception.QschedError):
    """The spawn's fence said no right before the instance would start: nothing of it
    runs (the agent's lease had ended, :mod:`agents.lease`). Not a failure: try again
    once the fence allows it."""

    msg_fmt = "Spawning instance {instance} on node {node} was fenced off before it started"


class MigrationFailed(exception.QschedError):
    """A live migration did not happen: the server still runs on its source node."""

    msg_fmt = "Live-migrating instance {instance} from node {node} to {dest} failed: {reason}"


class NodeNotFound(exception.NotFound):
    msg_fmt = "Node {node} is not driven by this agent."


@dataclasses.dataclass(frozen=True, slots=True)
class ProviderInfo:
    """One provider of a node as the driver reports it."""

    uuid: str
    name: str
    inventories: Mapping[str, Inventory]
    traits: frozenset[str] = frozenset()
    parent_uuid: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node: its name (the ``node`` of a claim) and its providers, root first."""

    name: str
    providers: tuple[ProviderInfo, ...]

    @property
    def root(self) -> ProviderInfo:
        return self.providers[0]

    def view(
        self, availability_zone: str | None = None, aggregates: frozenset[str] = frozenset()
    ) -> NodeView:
        """A fresh view with no usage; ``aggregates`` go on the root provider."""
        providers = tuple(
            ProviderView(
                p.uuid,
                p.name,
                p.inventories,
                {},
                p.traits,
                aggregates if p.parent_uuid is None else frozenset(),
                p.parent_uuid,
            )
            for p in self.providers
        )
        return NodeView(self.name, providers, availability_zone)


class VirtDriver(abc.ABC):
    """Start and stop instances on the nodes of one agent. Implementations are thread-safe."""

    @abc.abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """Every node this driver drives, sorted by name, with its provider tree."""

    @abc.abstractmethod
    def spawn(
        self,
        instance_uuid: str,
        node: str,
        flavor: Flavor,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        """Start an instance on a node and return once it runs.

        Idempotent: spawning an instance already running on ``node`` returns at once.

        ``fence`` is asked right before the instance starts to run (its VM created and
        started, after whatever preparation comes first): False, and nothing is started.
        The agent's lease (:mod:`agents.lease`): past it, the instance may have been
        placed again elsewhere.

        :raises SpawnFailed: the instance could not start (unknown node, already running on
            another node, hypervisor error); nothing of it is left behind.
        :raises SpawnFenced: ``fence`` said no; nothing of it is left behind.
        """

    def receive(
        self,
        instance_uuid: str,
        node: str,
        flavor: Flavor,
        source: str,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        """Bring up on ``node`` a server that moves here from host ``source`` with
        ``flavor`` (docs/moves.rst): a cold migration's or a resize's finish, an
        evacuation's rebuild; ``source`` is this driver's host for a resize in place,
        which resizes the server where it runs. The source's copy is the source's
        driver's. Returns once it runs here. The default spawns it.

        :raises SpawnFailed, SpawnFenced: as :meth:`spawn`; the server is left as it was.
        """
        self.spawn(instance_uuid, node, flavor, fence)

    def rebuild(self, instance_uuid: str, node: str, flavor: Flavor, image_ref: str) -> None:
        """Spawn a server running (or off) on ``node`` again from ``image_ref``, there;
        it runs after. The default destroys it and spawns it (Nova's default rebuild).

        :raises SpawnFailed: it could not start again; nothing of it is left on ``node``.
        """
        self.destroy(instance_uuid, node)
        self.spawn(instance_uuid, node, flavor)

    def live_migrate(
        self,
        instance_uuid: str,
        node: str,
        dest: str,
        block_migration: bool | None = None,
        asked: Callable[[], str] | None = None,
    ) -> None:
        """Send a running server from ``node`` to host ``dest``, whose driver received it
        (:meth:`receive`), and return once it runs there and no longer here. Its disks go
        along when ``block_migration`` (None: as the driver finds best, Nova's ``auto``).
        ``asked``, read now and then while it copies, says what an admin asked since:
        ``force_complete`` (pause the server so that the copy ends: Nova's
        ``live_migration_force_complete``), ``abort`` (stop: it raises MigrationFailed and
        the server runs here still), or "". The default cannot.

        :raises MigrationFailed: it still runs here, as it did.
        """
        raise MigrationFailed(instance=instance_uuid, node=node, dest=dest,
                              reason=f"{type(self).__name__} cannot live-migrate")  # fmt: skip

    @abc.abstractmethod
    def destroy(self, instance_uuid: str, node: str) -> bool:
        """Stop an instance and free what it used; False if it was not on ``node``.

        Idempotent. :raises NodeNotFound: an unknown node.
        """

    @abc.abstractmethod
    def power_off(self, instance_uuid: str, node: str) -> None:
        """Shut an instance down; it stays on ``node`` with what it holds (a stop).

        Idempotent: an instance already off returns at once.

        :raises NodeNotFound: an unknown node.
        :raises InstanceNotFound: the instance is not on ``node``.
        """

    @abc.abstractmethod
    def power_on(self, instance_uuid: str, node: str) -> None:
        """Start an instance that is off (a start). Idempotent; raises as :meth:`power_off`."""

    @abc.abstractmethod
    def reboot(self, instance_uuid: str, node: str, hard: bool) -> None:
        """Reboot an instance: ``hard`` powers it off and on (from off too), soft asks its
        guest to restart. It runs after. Raises as :meth:`power_off`."""

    @abc.abstractmethod
    def list_instances(self, node: str) -> list[str]:
        """UUIDs of the instances on a node, sorted (for reconciliation), off or running.

        :raises NodeNotFound: an unknown node.
        """
