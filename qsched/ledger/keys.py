"""Key names of one cell. Every key carries the cell's hash tag ``{cell}``.

Redis Cluster hashes only what is inside the braces, so a whole cell lives in
one slot and every script touching a cell runs on one shard.
"""

from __future__ import annotations


class Keyspace:
    def __init__(self, cell: str) -> None:
        if not cell or any(c in cell for c in "{}: "):
            raise ValueError(f"cell name {cell!r} must be non-empty without braces, ':' or spaces")
        self.cell = cell
        self.prefix = f"qsched:{{{cell}}}:"

    # providers
    def provider(self, uuid: str) -> str:
        """Hash: name, generation, parent, root, i:<RC> inventory, u:<RC> usage."""
        return f"{self.prefix}rp:{uuid}"

    def provider_traits(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:traits"

    def provider_aggregates(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:aggs"

    def provider_consumers(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:consumers"

    def provider_children(self, uuid: str) -> str:
        return f"{self.prefix}rp:{uuid}:children"

    @property
    def providers(self) -> str:
        """Set of every provider uuid (admin views only)."""
        return f"{self.prefix}rps"

    @property
    def provider_names(self) -> str:
        """Hash name -> uuid: names are unique, as in Placement."""
        return f"{self.prefix}rp-names"

    # consumers and usages
    def consumer(self, uuid: str) -> str:
        """Hash: generation, project, user, allocs (JSON {rp: {rc: n}})."""
        return f"{self.prefix}consumer:{uuid}"

    def project_usage(self, project_id: str) -> str:
        return f"{self.prefix}project:{project_id}:usage"

    # quota
    def quota_limits(self, project_id: str) -> str:
        return f"{self.prefix}quota:{project_id}:limits"

    def quota_used(self, project_id: str) -> str:
        return f"{self.prefix}quota:{project_id}:used"

    def quota_held(self, project_id: str) -> str:
        """Hash holder -> "cores ram_mb": what each holder reserved, so release is exact."""
        return f"{self.prefix}quota:{project_id}:held"

    # instances
    def host_deleting(self, host: str) -> str:
        """Sorted set: instances of ``host`` marked deleting, by when (for stuck deletes)."""
        return f"{self.prefix}host:{host}:deleting"

    def host_building(self, host: str) -> str:
        """Set: instances claimed by ``host`` and not ACTIVE yet (for the janitor)."""
        return f"{self.prefix}host:{host}:building"

    def instance(self, uuid: str) -> str:
        return f"{self.prefix}inst:{uuid}"

    def instance_events(self, uuid: str) -> str:
        return f"{self.prefix}inst:{uuid}:events"

    def instance_abandoned(self, uuid: str) -> str:
        """String with a time to live: the client was told this boot failed; never create it."""
        return f"{self.prefix}inst:{uuid}:abandoned"

    @property
    def outbox(self) -> str:
        """Sorted set: instances waiting for their boot request to be published, by when
        (server time) they started waiting; the janitor publishes those left too long."""
        return f"{self.prefix}outbox"

    @property
    def durability_barrier(self) -> str:
        """Counter written before a WAIT that covers writes made on other connections."""
        return f"{self.prefix}durability-barrier"

    def project_instances(self, project_id: str) -> str:
        return f"{self.prefix}project:{project_id}:instances"

    @property
    def deadlines(self) -> str:
        """Sorted set: instances waiting to be placed, scored by deadline."""
        return f"{self.prefix}deadlines"

    # services
    def agent(self, host: str) -> str:
        """Hash: an agent's heartbeat (time, nodes, classes consumed); expires when it dies."""
        return f"{self.prefix}agent:{host}"

    @property
    def agents(self) -> str:
        """Sorted set: every agent host by its last heartbeat (admin views, janitor)."""
        return f"{self.prefix}agents"

    @property
    def classes(self) -> str:
        """Hash: live scheduling class -> JSON {flavor, constraints}, read by agents."""
        return f"{self.prefix}classes"

    @property
    def zones(self) -> str:
        """Set: every availability zone an agent has registered; the API refuses others."""
        return f"{self.prefix}zones"

    @property
    def flavors(self) -> str:
        """Hash: flavor id -> JSON flavor."""
        return f"{self.prefix}flavors"
