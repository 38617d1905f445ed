"""The key names of one cell, built here and nowhere else.

Every key carries the cell's hash tag ``{cell}``: Redis Cluster hashes only what
is inside the braces, so a whole cell lives in one slot and every script
touching a cell runs on one shard.

:class:`Keyspace` builds the keys for Python, and :func:`lua_prelude` turns
the same builders into Lua, prepended to every script, so that the scripts
never spell a key: ``K.instance(uuid)`` in Lua is ``keys.instance(uuid)`` here,
``K.outbox`` is ``keys.outbox``. What each key holds, its type and who writes
it: the keyspace table of ``docs/ledger.rst``; ``tests/ledger/test_keyspace.py``
keeps that table, this class and the scripts in step.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json

_PART = "\0"  # stands for a variable part of a key while its template is read


class Keyspace:
    def __init__(self, cell: str) -> None:
        if not cell or any(c in cell for c in "{}: "):
            raise ValueError(f"cell name {cell!r} must be non-empty without braces, ':' or spaces")
        self.cell = cell
        self.prefix = f"qsched:{{{cell}}}:"

    # providers
    def provider(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}"

    def provider_traits(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:traits"

    def provider_aggregates(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:aggs"

    def provider_children(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:children"

    def provider_consumers(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:consumers"

    @property
    def providers(self) -> str:
        return f"{self.prefix}rps"

    @property
    def provider_names(self) -> str:
        return f"{self.prefix}rp-names"

    @property
    def sharing_providers(self) -> str:
        return f"{self.prefix}rp-sharing"

    @property
    def hypervisors(self) -> str:
        return f"{self.prefix}hypervisors"

    @property
    def hypervisor_seq(self) -> str:
        return f"{self.prefix}hypervisor-seq"

    # consumers and usages
    def consumer(self, uuid: str) -> str:
        return f"{self.prefix}consumer:{uuid}"

    def project_usage(self, project_id: str) -> str:
        return f"{self.prefix}project:{project_id}:usage"

    def project_instances(self, project_id: str) -> str:
        return f"{self.prefix}project:{project_id}:instances"

    def project_deleted(self, project_id: str) -> str:
        return f"{self.prefix}project:{project_id}:deleted"

    # quota
    def quota_limits(self, project_id: str) -> str:
        return f"{self.prefix}quota:{project_id}:limits"

    def quota_used(self, project_id: str) -> str:
        return f"{self.prefix}quota:{project_id}:used"

    def quota_held(self, project_id: str) -> str:
        return f"{self.prefix}quota:{project_id}:held"

    @property
    def quota_class_default(self) -> str:
        return f"{self.prefix}quota-class:default"

    # instances
    def instance(self, uuid: str) -> str:
        return f"{self.prefix}inst:{uuid}"

    def instance_events(self, uuid: str) -> str:
        return f"{self.prefix}inst:{uuid}:events"

    def instance_abandoned(self, uuid: str) -> str:
        return f"{self.prefix}inst:{uuid}:abandoned"

    @property
    def live_instances(self) -> str:
        return f"{self.prefix}live-instances"

    @property
    def deleted_instances(self) -> str:
        return f"{self.prefix}deleted-instances"

    @property
    def archive_staged(self) -> str:
        return f"{self.prefix}archive-staged"

    @property
    def deadlines(self) -> str:
        return f"{self.prefix}deadlines"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}outbox"

    # several cells behind one API (qsched.cells)
    @property
    def quota_home(self) -> str:
        return f"{self.prefix}quota-home"

    @property
    def quota_ends(self) -> str:
        return f"{self.prefix}quota-ends"

    def instance_cell(self, uuid: str) -> str:
        return f"{self.prefix}inst-map:{uuid}"

    @property
    def mapping_pending(self) -> str:
        return f"{self.prefix}inst-map-pending"

    def group_cell(self, uuid: str) -> str:
        return f"{self.prefix}group-map:{uuid}"

    @property
    def group_mapping_pending(self) -> str:
        return f"{self.prefix}group-map-pending"

    def host_cell(self, host: str) -> str:
        return f"{self.prefix}host-map:{host}"

    def node_cell(self, node: str) -> str:
        return f"{self.prefix}node-map:{node}"

    @property
    def aggregate_seq(self) -> str:
        return f"{self.prefix}agg-seq"

    def aggregate_lock(self, aggregate_id: str) -> str:
        return f"{self.prefix}agg-lock:{aggregate_id}"

    @property
    def durability_barrier(self) -> str:
        return f"{self.prefix}durability-barrier"

    def host_building(self, host: str) -> str:
        return f"{self.prefix}host:{host}:building"

    def host_deleting(self, host: str) -> str:
        return f"{self.prefix}host:{host}:deleting"

    def host_held(self, host: str) -> str:
        return f"{self.prefix}host:{host}:held"

    def host_actions(self, host: str) -> str:
        return f"{self.prefix}host:{host}:actions"

    def host_migrations(self, host: str) -> str:
        return f"{self.prefix}host:{host}:migrations"

    def host_shelved(self, host: str) -> str:
        return f"{self.prefix}host:{host}:shelved"

    # moves (resize, migrations, evacuations)
    def migration(self, uuid: str) -> str:
        return f"{self.prefix}migration:{uuid}"

    @property
    def migrations(self) -> str:
        return f"{self.prefix}migrations"

    @property
    def migration_seq(self) -> str:
        return f"{self.prefix}migration-seq"

    @property
    def move_deadlines(self) -> str:
        return f"{self.prefix}move-deadlines"

    @property
    def moves_finished(self) -> str:
        return f"{self.prefix}moves-finished"

    def instance_migrations(self, uuid: str) -> str:
        return f"{self.prefix}inst:{uuid}:migrations"

    # services
    def agent(self, host: str) -> str:
        return f"{self.prefix}agent:{host}"

    def agent_classes(self, host: str) -> str:
        return f"{self.prefix}agent:{host}:classes"

    @property
    def agents(self) -> str:
        return f"{self.prefix}agents"

    def service(self, host: str) -> str:
        return f"{self.prefix}service:{host}"

    @property
    def service_ids(self) -> str:
        return f"{self.prefix}service-ids"

    @property
    def service_seq(self) -> str:
        return f"{self.prefix}service-seq"

    @property
    def classes(self) -> str:
        return f"{self.prefix}classes"

    def class_consumers(self, name: str) -> str:
        return f"{self.prefix}class:{name}:consumers"

    @property
    def zones(self) -> str:
        return f"{self.prefix}zones"

    def zone_hosts(self, zone: str) -> str:
        return f"{self.prefix}zone:{zone}:hosts"

    @property
    def cell_free(self) -> str:
        return f"{self.prefix}cell-free"

    @property
    def free_by_agent(self) -> str:
        return f"{self.prefix}free-by-agent"

    @property
    def free_expiry(self) -> str:
        return f"{self.prefix}free-expiry"

    @property
    def flavors(self) -> str:
        return f"{self.prefix}flavors"

    # host aggregates
    def aggregate(self, uuid: str) -> str:
        return f"{self.prefix}agg:{uuid}"

    def aggregate_hosts(self, uuid: str) -> str:
        return f"{self.prefix}agg:{uuid}:hosts"

    @property
    def aggregate_ids(self) -> str:
        return f"{self.prefix}agg-ids"

    @property
    def aggregate_names(self) -> str:
        return f"{self.prefix}agg-names"

    @property
    def aggregates_version(self) -> str:
        return f"{self.prefix}agg-version"

    def host_aggregates(self, host: str) -> str:
        return f"{self.prefix}host:{host}:aggs"

    def host_roots(self, host: str) -> str:
        return f"{self.prefix}host:{host}:roots"

    # server groups
    def group(self, uuid: str) -> str:
        return f"{self.prefix}group:{uuid}"

    def group_members(self, uuid: str) -> str:
        return f"{self.prefix}group:{uuid}:members"

    def group_hosts(self, uuid: str) -> str:
        return f"{self.prefix}group:{uuid}:hosts"

    def group_abandoned(self, uuid: str) -> str:
        return f"{self.prefix}group:{uuid}:abandoned"

    def project_groups(self, project_id: str) -> str:
        return f"{self.prefix}project:{project_id}:groups"

    @property
    def groups(self) -> str:
        return f"{self.prefix}groups"

    # keypairs
    def user_keypairs(self, user_id: str) -> str:
        return f"{self.prefix}user:{user_id}:keypairs"

    @property
    def keypair_seq(self) -> str:
        return f"{self.prefix}keypair-seq"

    # batches (multi-create)
    def batch(self, reservation_id: str) -> str:
        return f"{self.prefix}batch:{reservation_id}"

    def batch_members(self, reservation_id: str) -> str:
        return f"{self.prefix}batch:{reservation_id}:members"


@dataclasses.dataclass(frozen=True)
class Template:
    """One builder of :class:`Keyspace`: its name, the names of its parts, and the key
    after the cell's prefix as text and parts (``["rp:", ("uuid",), ":traits"]``)."""

    name: str
    params: tuple[str, ...]
    pieces: tuple[str | tuple[str], ...]

    @property
    def pattern(self) -> str:
        """The key as ``docs/ledger.rst`` writes it: ``rp:<uuid>:traits``."""
        return "".join(p if isinstance(p, str) else f"<{p[0]}>" for p in self.pieces)

    @property
    def literals(self) -> list[str]:
        """The fixed text of the key, piece by piece: what no script may spell."""
        return [p for p in self.pieces if isinstance(p, str) and p]

    def lua(self) -> str:
        """The Lua that builds the key from ``P``, the cell's prefix."""
        parts = [json.dumps(p) if isinstance(p, str) else p[0] for p in self.pieces if p]
        expr = " .. ".join(["P", *parts])
        if not self.params:
            return f"K.{self.name} = {expr}"
        return f"K.{self.name} = function({', '.join(self.params)}) return {expr} end"


@functools.cache
def templates() -> tuple[Template, ...]:
    """Every builder of :class:`Keyspace`, in the order the class defines them."""
    space = Keyspace("cell")
    found = []
    for name, member in vars(Keyspace).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            params: tuple[str, ...] = ()
            key = member.fget(space) if member.fget else ""
        else:
            params = tuple(inspect.signature(member).parameters)[1:]
            key = member(space, *(f"{_PART}{p}{_PART}" for p in params))
        found.append(Template(name, params, _pieces(key.removeprefix(space.prefix))))
    return tuple(found)


def _pieces(key: str) -> tuple[str | tuple[str], ...]:
    """``"rp:\\0uuid\\0:traits"`` -> ``("rp:", ("uuid",), ":traits")``."""
    split = key.split(_PART)
    return tuple(p if i % 2 == 0 else (p,) for i, p in enumerate(split))


@functools.cache
def lua_prelude() -> str:
    """Lua defining ``P`` (``ARGV[1]``, the cell's prefix) and ``K``, one key builder per
    builder of :class:`Keyspace`; the loader puts it before ``lib.lua`` and each script."""
    lines = [
        "-- Generated from qsched/ledger/keys.py (Keyspace) when the script is loaded.",
        "local P = ARGV[1]",
        "local K = {}",
    ]
    return "\n".join([*lines, *(t.lua() for t in templates())]) + "\n"
