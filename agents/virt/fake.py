"""A fake virt driver that simulates many nodes in one process.

Features
--------
- ``node_count`` identical nodes named ``<host>-<index>``; provider UUIDs derive from the
  host and node names, so a restarted agent reports the same providers.
- Per-node inventory from a :class:`FakeNodeSpec`: vcpus, ram_mb, disk_gb, allocation
  ratios, traits, and optional child providers (NUMA nodes, and GPUs or PCI devices under
  them) with their own resources and traits: a provider tree, as a real driver's
  ``update_provider_tree`` reports it (``[agent] node_provider``, :meth:`FakeChild.parse`).
- ``spawn_delay_s``: how long a spawn takes (0 allowed); spawns on different threads overlap.
- ``failure_rate`` (0..1): the share of spawns that raise :class:`SpawnFailed`. Whether one
  spawn fails is a keyed hash of (seed, instance, node, earlier failures of that instance on
  this driver): the same seed gives the same outcomes whatever the order or threads.
- ``spawn_hook(instance_uuid, node)``: called when a spawn has done everything but record the
  instance. A test can raise there (the spawn records nothing) or block there (the spawn stays
  in flight) to inject faults at a known point. It may be set or cleared at any time.
- A spawn's ``fence`` is asked after the hook, under the lock, right before the instance is
  recorded (where a real driver would start the VM).
- Power: :meth:`FakeDriver.power_off`, ``power_on`` and ``reboot`` turn a VM off and on;
  ``reboots`` counts the reboots of each instance, :meth:`FakeDriver.is_running` says
  whether it runs. A state file keeps the power too (``off <uuid> <node>`` and ``on <uuid>
  <node>`` lines, which :func:`read_state` skips), so a stopped VM stays off.
- ``state_path``: the simulated hypervisor's memory of what runs where, kept in a file so that
  it outlives the agent process, as VMs outlive a killed nova-compute. Each spawn and destroy
  appends one line (``+ <uuid> <node>`` or ``- <uuid> <node>``, flushed to the operating
  system, so a SIGKILL of the agent loses none); the file is replayed and compacted when the
  driver starts. Unset: the VMs live only in this process. :func:`read_state` reads the file
  from another process (a test harness checking what runs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import IO

from agents.virt.base import (
    MigrationFailed,
    NodeInfo,
    NodeNotFound,
    ProviderInfo,
    SpawnFailed,
    SpawnFenced,
    VirtDriver,
)
from qsched import exception
from qsched.flavors import Flavor
from qsched.ledger.base import Inventory
from qsched.resources import DISK_GB, MEMORY_MB, VCPU, check_resource_class, check_trait

_NAMESPACE = uuidlib.UUID("5b0f6f9e-1d7c-4c55-9a57-7f2f0f3f9a11")
#: how often a live migration under way reads what an admin asked of it
ASKED_POLL_S = 0.25

SpawnHook = Callable[[str, str], None]


@dataclasses.dataclass(frozen=True)
class FakeChild:
    """A child provider of every fake node, e.g. ``FakeChild("gpu0", {"VGPU": 4})``.

    ``parent``: the name of another child it hangs under (a device under its NUMA
    node), declared before it; None: under the node's root.
    """

    name: str
    resources: Mapping[str, int]
    traits: frozenset[str] = frozenset()
    parent: str | None = None

    @classmethod
    def parse(cls, line: str) -> FakeChild:
        """One ``[agent] node_provider`` line: ``<name>[@<parent>]:<RC>=<n>[,...][;<TRAIT>,...]``.

        For example ``numa0:VCPU=16,MEMORY_MB=65536`` or
        ``gpu0@numa0:VGPU=4;CUSTOM_NVIDIA_A100``.

        :raises Invalid: a malformed line, an unknown resource class or trait, or an
            amount that is not a whole number above 0.
        """
        head, sep, rest = line.strip().partition(":")
        name, at, parent = head.partition("@")
        if not sep or not _CHILD_NAME.match(name) or (at and not _CHILD_NAME.match(parent)):
            raise exception.Invalid(
                reason=f"node_provider {line!r}: write <name>[@<parent>]:<RC>=<n>[,...]"
                "[;<TRAIT>,...], names of letters, digits, '_' and '-'"
            )
        amounts, _semi, traits = rest.partition(";")
        resources: dict[str, int] = {}
        for item in filter(None, (a.strip() for a in amounts.split(","))):
            rc, _eq, value = item.partition("=")
            if not value.strip().isdigit() or int(value) < 1:
                raise exception.Invalid(
                    reason=f"node_provider {line!r}: {item!r} needs a whole amount above 0"
                )
            resources[check_resource_class(rc.strip())] = int(value)
        names = frozenset(check_trait(t.strip()) for t in traits.split(",") if t.strip())
        if not resources and not names:
            raise exception.Invalid(reason=f"node_provider {line!r} has no resource and no trait")
        return cls(name, MappingProxyType(resources), names, parent or None)


_CHILD_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_children(children: Sequence[FakeChild]) -> tuple[FakeChild, ...]:
    """Children in tree order: unique names, each parent declared before its children.

    :raises Invalid:
    """
    seen: set[str] = set()
    for child in children:
        if child.name in seen:
            raise exception.Invalid(reason=f"node_provider {child.name} is declared twice")
        if child.parent is not None and child.parent not in seen:
            raise exception.Invalid(
                reason=f"node_provider {child.name}@{child.parent}: declare {child.parent} first"
            )
        seen.add(child.name)
    return tuple(children)


@dataclasses.dataclass(frozen=True)
class FakeNodeSpec:
    """What each fake node reports."""

    vcpus: int = 32
    ram_mb: int = 131072
    disk_gb: int = 1000
    cpu_allocation_ratio: float = 1.0
    ram_allocation_ratio: float = 1.0
    traits: frozenset[str] = frozenset()
    children: tuple[FakeChild, ...] = ()

    def root_inventories(self) -> Mapping[str, Inventory]:
        """The root's VCPU, MEMORY_MB and DISK_GB; a zero amount is no inventory (the
        NUMA nodes below the root hold them instead)."""
        inventories = {}
        if self.vcpus:
            inventories[VCPU] = Inventory(self.vcpus, allocation_ratio=self.cpu_allocation_ratio)
        if self.ram_mb:
            inventories[MEMORY_MB] = Inventory(
                self.ram_mb, allocation_ratio=self.ram_allocation_ratio
            )
        if self.disk_gb:
            inventories[DISK_GB] = Inventory(self.disk_gb)
        return MappingProxyType(inventories)

    def child_inventories(self, child: FakeChild) -> Mapping[str, Inventory]:
        """A child's inventories; NUMA nodes' VCPU and MEMORY_MB take the node's ratios."""
        ratios = {VCPU: self.cpu_allocation_ratio, MEMORY_MB: self.ram_allocation_ratio}
        return MappingProxyType({
            rc: Inventory(n, allocation_ratio=ratios.get(rc, 1.0))
            for rc, n in child.resources.items()
        })  # fmt: skip


class FakeDriver(VirtDriver):
    """Simulated nodes; thread-safe. See the module docstring for the knobs.

    :raises Invalid: a negative count or delay, or a failure rate outside 0..1.
    """

    def __init__(
        self,
        node_count: int = 1,
        node_spec: FakeNodeSpec | None = None,
        *,
        host: str = "fake",
        spawn_delay_s: float = 0.0,
        failure_rate: float = 0.0,
        seed: int = 0,
        spawn_hook: SpawnHook | None = None,
        sleep: Callable[[float], None] = time.sleep,
        state_path: str | os.PathLike[str] | None = None,
    ) -> None:
        _check_config(node_count, spawn_delay_s, failure_rate)
        self.host = host
        self.node_spec = node_spec or FakeNodeSpec()
        self.spawn_delay_s = spawn_delay_s
        self.failure_rate = failure_rate
        self.seed = seed
        self.spawn_hook = spawn_hook
        self._sleep = sleep
        width = len(str(max(node_count - 1, 0)))
        self._names = [f"{host}-{i:0{width}d}" for i in range(node_count)]
        self._instances: dict[str, set[str]] = {name: set() for name in self._names}
        self._where: dict[str, str] = {}
        self._failures: dict[str, int] = {}
        self._off: set[str] = set()  # instances powered off
        self.reboots: dict[str, int] = {}  # instance -> reboots done
        self.rebuilds: dict[str, str] = {}  # instance -> the image it was last rebuilt from
        #: instance -> (the host it was sent to, block_migration as asked)
        self.live_migrations: dict[str, tuple[str, bool | None]] = {}
        self.forced: set[str] = set()  # live migrations an admin forced to complete
        self._lock = threading.Lock()
        self._root_inventories = self.node_spec.root_inventories()
        check_children(self.node_spec.children)
        self._child_inventories = [
            self.node_spec.child_inventories(child) for child in self.node_spec.children
        ]
        self._log: IO[str] | None = None
        if state_path is not None:
            self._log = self._load(Path(state_path))

    def nodes(self) -> list[NodeInfo]:
        """Every node, sorted by name. Built on each call: O(node_count)."""
        return [self.node(name) for name in self._names]

    def node(self, name: str) -> NodeInfo:
        """One node's provider tree. :raises NodeNotFound:"""
        self._check_node(name)
        root_uuid = self._uuid(name)
        spec = self.node_spec
        providers = [ProviderInfo(root_uuid, name, self._root_inventories, spec.traits)]
        for child, inventories in zip(spec.children, self._child_inventories, strict=True):
            child_name = f"{name}_{child.name}"
            parent = root_uuid if child.parent is None else self._uuid(f"{name}_{child.parent}")
            providers.append(
                ProviderInfo(self._uuid(child_name), child_name, inventories, child.traits, parent)
            )
        return NodeInfo(name, tuple(providers))

    def spawn(
        self,
        instance_uuid: str,
        node: str,
        flavor: Flavor,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        """Simulate a spawn: delay, maybe fail, call the hook, ask the fence, record (the
        VM starts there). See VirtDriver."""
        if node not in self._instances:
            raise SpawnFailed(instance=instance_uuid, node=node, reason="no such node")
        with self._lock:
            if self._placed(instance_uuid, node):
                return
        self._work(instance_uuid, node)
        hook = self.spawn_hook
        if hook is not None:
            hook(instance_uuid, node)
        with self._lock:
            if fence is not None and not fence():
                raise SpawnFenced(instance=instance_uuid, node=node)
            if not self._placed(instance_uuid, node):
                self._where[instance_uuid] = node
                self._instances[node].add(instance_uuid)
                self._failures.pop(instance_uuid, None)
                self._note("+", instance_uuid, node)

    def receive(
        self,
        instance_uuid: str,
        node: str,
        flavor: Flavor,
        source: str,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        """Simulate a move's arrival: a spawn; a resize in place (the server on ``node``
        already) takes the spawn's delay and may fail as a spawn does, and leaves the
        server running there. See VirtDriver."""
        with self._lock:
            in_place = self._where.get(instance_uuid) == node
        if not in_place:
            self.spawn(instance_uuid, node, flavor, fence)
            return
        self._work(instance_uuid, node)
        if fence is not None and not fence():
            raise SpawnFenced(instance=instance_uuid, node=node)

    def rebuild(self, instance_uuid: str, node: str, flavor: Flavor, image_ref: str) -> None:
        """Simulate a rebuild: the VM goes, then a spawn (its delay, a failure drawn as a
        spawn's, which leaves nothing); ``rebuilds`` records the image. See VirtDriver."""
        with self._lock:
            self._check_on(instance_uuid, node)
        super().rebuild(instance_uuid, node, flavor, image_ref)
        with self._lock:
            self.rebuilds[instance_uuid] = image_ref

    def live_migrate(
        self,
        instance_uuid: str,
        node: str,
        dest: str,
        block_migration: bool | None = None,
        asked: Callable[[], str] | None = None,
    ) -> None:
        """Simulate sending a server away: the spawn's delay, read in slices of
        ``ASKED_POLL_S`` between which ``asked`` is read (``force_complete`` ends the copy
        at once, ``abort`` stops it: the server stays), then a failure drawn as a spawn's
        (then it stays), else it no longer runs here; ``block_migration`` is recorded
        (``live_migrations``: instance -> (dest, block_migration)), a forced completion
        in ``forced``. See VirtDriver."""
        with self._lock:
            self._check_on(instance_uuid, node)
        left = self.spawn_delay_s
        while asked is not None and left > 0:
            wanted = asked()
            if wanted == "abort":
                raise MigrationFailed(instance=instance_uuid, node=node, dest=dest,
                                      reason="aborted by an admin")  # fmt: skip
            if wanted == "force_complete":
                self.forced.add(instance_uuid)
                break
            self._sleep(min(ASKED_POLL_S, left))
            left -= ASKED_POLL_S
        try:
            self._work(instance_uuid, node, delay=asked is None)
        except SpawnFailed as exc:
            raise MigrationFailed(instance=instance_uuid, node=node, dest=dest,
                                  reason=str(exc.kwargs.get("reason"))) from None  # fmt: skip
        with self._lock:
            self.live_migrations[instance_uuid] = (dest, block_migration)
        self.destroy(instance_uuid, node)

    def _work(self, instance_uuid: str, node: str, delay: bool = True) -> None:
        """The spawn delay (unless the caller took it), then an injected failure as the
        failure rate draws it.

        :raises SpawnFailed: the draw failed it (counted, so that a retry draws anew).
        """
        with self._lock:
            failures = self._failures.get(instance_uuid, 0)
        if delay and self.spawn_delay_s:
            self._sleep(self.spawn_delay_s)
        if self._roll(instance_uuid, node, failures) < self.failure_rate:
            with self._lock:
                self._failures[instance_uuid] = failures + 1
            reason = f"injected failure (failure_rate={self.failure_rate})"
            raise SpawnFailed(instance=instance_uuid, node=node, reason=reason)

    def destroy(self, instance_uuid: str, node: str) -> bool:
        """Forget an instance. See VirtDriver."""
        self._check_node(node)
        with self._lock:
            if self._where.get(instance_uuid) != node:
                return False
            del self._where[instance_uuid]
            self._instances[node].discard(instance_uuid)
            self._off.discard(instance_uuid)
            self._note("-", instance_uuid, node)
            return True

    def power_off(self, instance_uuid: str, node: str) -> None:
        """See VirtDriver."""
        with self._lock:
            self._check_on(instance_uuid, node)
            if instance_uuid not in self._off:
                self._off.add(instance_uuid)
                self._note("off", instance_uuid, node)

    def power_on(self, instance_uuid: str, node: str) -> None:
        """See VirtDriver."""
        with self._lock:
            self._check_on(instance_uuid, node)
            self._power_on(instance_uuid, node)

    def reboot(self, instance_uuid: str, node: str, hard: bool) -> None:
        """See VirtDriver. A soft reboot of a VM that is off fails, as a guest that is
        not running cannot restart itself."""
        with self._lock:
            self._check_on(instance_uuid, node)
            if not hard and instance_uuid in self._off:
                raise exception.Invalid(reason=f"instance {instance_uuid} is off")
            self._power_on(instance_uuid, node)
            self.reboots[instance_uuid] = self.reboots.get(instance_uuid, 0) + 1

    def _power_on(self, instance_uuid: str, node: str) -> None:
        """Call with the lock held."""
        if instance_uuid in self._off:
            self._off.discard(instance_uuid)
            self._note("on", instance_uuid, node)

    def is_running(self, instance_uuid: str) -> bool:
        """Whether the instance is on one of the nodes and powered on."""
        with self._lock:
            return instance_uuid in self._where and instance_uuid not in self._off

    def list_instances(self, node: str) -> list[str]:
        """See VirtDriver."""
        self._check_node(node)
        with self._lock:
            return sorted(self._instances[node])

    def close(self) -> None:
        """Close the state file, if any (the VMs stay in it)."""
        with self._lock:
            log, self._log = self._log, None
        if log is not None:
            log.close()

    def _load(self, path: Path) -> IO[str]:
        """Replay the state file, rewrite it compacted, and keep it open for appends."""
        off = _read_off(path)
        for uuid, node in read_state(path).items():
            if node in self._instances:  # a node this driver no longer has is forgotten
                self._where[uuid] = node
                self._instances[node].add(uuid)
                if uuid in off:
                    self._off.add(uuid)
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(path.name + ".new")
        with open(fresh, "w") as out:
            out.writelines(f"+ {uuid} {node}\n" for uuid, node in sorted(self._where.items()))
            out.writelines(f"off {uuid} {self._where[uuid]}\n" for uuid in sorted(self._off))
        os.replace(fresh, path)
        return open(path, "a", buffering=1)  # line-buffered: each line reaches the OS at once

    def _note(self, sign: str, instance_uuid: str, node: str) -> None:
        """Append one change to the state file. Call with the lock held."""
        if self._log is not None:
            self._log.write(f"{sign} {instance_uuid} {node}\n")

    def _check_on(self, instance_uuid: str, node: str) -> None:
        """Call with the lock held. :raises NodeNotFound, InstanceNotFound:"""
        self._check_node(node)
        if self._where.get(instance_uuid) != node:
            raise exception.InstanceNotFound(instance=instance_uuid)

    def _check_node(self, node: str) -> None:
        if node not in self._instances:
            raise NodeNotFound(node=node)

    def _placed(self, instance_uuid: str, node: str) -> bool:
        """True if already on ``node``. Call with the lock held.

        :raises SpawnFailed: it runs on another node of this driver.
        """
        where = self._where.get(instance_uuid)
        if where is not None and where != node:
            reason = f"already running on node {where}"
            raise SpawnFailed(instance=instance_uuid, node=node, reason=reason)
        return where == node

    def _uuid(self, name: str) -> str:
        return str(uuidlib.uuid5(_NAMESPACE, f"{self.host}/{name}"))

    def _roll(self, instance_uuid: str, node: str, failures: int) -> float:
        """A number in [0, 1) fixed by the seed, the instance, the node and earlier failures."""
        key = f"{self.seed}:{instance_uuid}:{node}:{failures}".encode()
        digest = hashlib.sha256(key).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64


def read_state(path: str | os.PathLike[str]) -> dict[str, str]:
    """What a state file says runs: instance uuid -> node. A torn last line is ignored."""
    where: dict[str, str] = {}
    try:
        with open(path) as lines:
            for line in lines:
                fields = line.split()
                if len(fields) != 3 or fields[0] not in ("+", "-") or not line.endswith("\n"):
                    continue
                sign, uuid, node = fields
                if sign == "+":
                    where[uuid] = node
                elif where.get(uuid) == node:
                    del where[uuid]
    except FileNotFoundError:
        pass
    return where


def _read_off(path: Path) -> set[str]:
    """The instances a state file says are powered off (its ``off`` and ``on`` lines)."""
    off: set[str] = set()
    try:
        with open(path) as lines:
            for line in lines:
                fields = line.split()
                if len(fields) != 3 or not line.endswith("\n"):
                    continue
                if fields[0] == "off":
                    off.add(fields[1])
                elif fields[0] in ("on", "-"):
                    off.discard(fields[1])
    except FileNotFoundError:
        pass
    return off


def _check_config(node_count: int, spawn_delay_s: float, failure_rate: float) -> None:
    if node_count < 0:
        raise exception.Invalid(reason=f"node_count {node_count} must be >= 0")
    if spawn_delay_s < 0:
        raise exception.Invalid(reason=f"spawn_delay_s {spawn_delay_s} must be >= 0")
    if not 0.0 <= failure_rate <= 1.0:
        raise exception.Invalid(reason=f"failure_rate {failure_rate} must be between 0 and 1")
