"""Options of the compute agent: the [agent] section, and Nova's ``[DEFAULT]`` options of
shelving that the compute service reads."""

from __future__ import annotations

import dataclasses
import socket

from oslo_config import cfg

from qsched.conf.base import Section

#: [DEFAULT] shelved_offload_time and shelved_poll_interval, as Nova's compute reads them.
shelve_opts = [
    cfg.IntOpt(
        "shelved_offload_time",
        default=0,
        min=-1,
        help="Time in seconds before a shelved server is offloaded from its host "
        '(docs/moves.rst, "Shelve"): its VM destroyed and its claim released, its '
        "quota kept (SHELVED_OFFLOADED); an unshelve then places it again through the "
        "queues. 0: at once, as part of the shelve. -1: never (an admin's shelveOffload "
        "still does). As Nova's [DEFAULT] option of that name.",
    ),
    cfg.IntOpt(
        "shelved_poll_interval",
        default=3600,
        min=-1,
        help="Interval in seconds at which an agent offloads the servers shelved on its "
        "host longer than shelved_offload_time (when that is positive). 0 or -1: never. "
        "As Nova's [DEFAULT] option of that name.",
    ),
]

agent_opts = [
    cfg.StrOpt(
        "host",
        default=socket.gethostname(),
        sample_default="<hostname>",
        help="Name of this compute service: its queue is <prefix>.host.<host>, its nodes "
        "are named <host>-<n>. Unique per agent.",
    ),
    cfg.IntOpt(
        "node_count",
        default=1,
        min=1,
        help="Nodes this agent drives. One for a hypervisor; thousands to simulate a "
        "large cloud with the fake driver.",
    ),
    cfg.IntOpt(
        "node_vcpus",
        default=32,
        min=0,
        help="VCPUs of each fake node's root provider; 0 when its NUMA nodes "
        "(node_provider) hold them instead.",
    ),
    cfg.IntOpt(
        "node_ram_mb",
        default=131072,
        min=0,
        help="MiB of RAM of each fake node's root provider; 0 when its NUMA nodes hold it.",
    ),
    cfg.IntOpt("node_disk_gb", default=1000, min=0, help="GiB of disk of each fake node."),
    cfg.ListOpt("node_traits", default=[], help="Traits of every node, e.g. HW_CPU_X86_AVX2."),
    cfg.MultiStrOpt(
        "node_provider",
        default=[],
        help="A child provider of every fake node, one per line, in tree order: "
        "<name>[@<parent>]:<RC>=<n>[,<RC>=<n>...][;<TRAIT>,...]. Without @<parent> it hangs "
        "under the node's root; with it, under the child named. A NUMA node and a GPU "
        "on it: 'node_provider = numa0:VCPU=16,MEMORY_MB=65536' and 'node_provider = "
        "gpu0@numa0:VGPU=4;CUSTOM_NVIDIA_A100'. The agent registers the whole tree; "
        "flavors reach children through granular groups (resources1:VGPU=1).",
    ),
    cfg.StrOpt(
        "availability_zone",
        default="nova",
        help="Availability zone of this agent's nodes (Nova's default zone is 'nova'). "
        "The agent registers it at start; the API refuses boots into zones no agent has "
        "registered. Empty: the nodes are in no zone.",
    ),
    cfg.ListOpt(
        "aggregates", default=[], help="Aggregate UUIDs the nodes of this agent belong to."
    ),
    cfg.FloatOpt("spawn_delay_s", default=0.0, min=0.0, help="Fake driver: seconds per spawn."),
    cfg.FloatOpt(
        "spawn_failure_rate",
        default=0.0,
        min=0.0,
        max=1.0,
        help="Fake driver: share of spawns that fail (they are rescheduled).",
    ),
    cfg.IntOpt("seed", default=0, help="Fake driver: seed of the failure draws."),
    cfg.StrOpt(
        "fake_state_path",
        help="Fake driver: a file where the simulated hypervisor keeps what runs on its "
        "nodes, so that its VMs outlive the agent process as real ones outlive a killed "
        "nova-compute (one line per spawn or destroy). Unset: they live in the process.",
    ),
    cfg.StrOpt(
        "placement_policy",
        default="pack",
        choices=[
            ("pack", "fill the most used node that still fits first (less fragmentation)"),
            ("spread", "use the least used node first"),
        ],
        help="Which of its nodes the agent picks for a request.",
    ),
    cfg.IntOpt(
        "spawn_workers",
        default=8,
        min=1,
        help="Spawns in flight at once. The consumer claims and acks, then hands the spawn "
        "to these workers and takes the next request.",
    ),
    cfg.IntOpt(
        "max_handbacks",
        default=10,
        min=0,
        help="Alternates: a host that already held a request and gave it back (its spawn "
        "failed, or its claim was taken back) hands the request back, without claiming "
        "it or using an attempt, while another live agent that has not tried it has room "
        "for its class. After this many hand-backs of one request, by any hosts, one that "
        "tried it may claim it again, so that an alternate that never takes it (its "
        "consumer cut off from the broker) cannot hold it until its deadline. 0: a host "
        "may claim a request it failed at once (no alternates).",
    ),
    cfg.FloatOpt(
        "handback_pause_s",
        default=1.0,
        min=0.0,
        help="After handing a request back, this agent stops consuming its scheduling "
        "class for this long, so that the broker gives the request to another agent "
        "rather than straight back to this one; its other classes go on. The same pause "
        "follows a refusal because a shared provider (MISC_SHARES_VIA_AGGREGATE) its "
        "nodes use is full, so that agents do not spin on the class until others free "
        "room.",
    ),
    cfg.FloatOpt("heartbeat_interval_s", default=2.0, min=0.1, help="Seconds between heartbeats."),
    cfg.FloatOpt(
        "heartbeat_ttl_s",
        default=10.0,
        min=0.5,
        help="A heartbeat older than this marks the agent down: the API then releases "
        "deleted instances locally, as Nova does for a down compute.",
    ),
    cfg.FloatOpt(
        "class_poll_interval_s",
        default=1.0,
        min=0.05,
        help="Seconds between reads of the live scheduling classes (one small hash).",
    ),
    cfg.FloatOpt(
        "reap_interval_s",
        default=5.0,
        min=0.0,
        help="Seconds between runs of the deadline reaper in this agent; 0 turns it off. "
        "Running it in several services is safe.",
    ),
    cfg.BoolOpt(
        "release_leaked_allocations",
        default=True,
        help="On start, release allocations on this agent's nodes that no live instance "
        "of this host explains (its record is gone, ended, or placed elsewhere). Off: "
        "only report them.",
    ),
    cfg.FloatOpt(
        "reconcile_interval_s",
        default=10.0,
        min=0.05,
        help="Seconds between passes of the periodic reconcile over a slice of this "
        "agent's nodes (reconcile_batch of them), on average: each pass is due 0.5 to 1.5 "
        "times this after the last, at random, so that hosts one event woke together "
        "spread out again. In a pass, allocations no live instance of this "
        "host explains are released (if release_leaked_allocations), instances the driver "
        "runs that the ledger has deleted, ended or placed elsewhere are handled as "
        "running_deleted_instance_action says, and the node views are brought back to "
        "the ledger. Every node is seen within ceil(nodes / reconcile_batch) passes; an "
        "agent that finds it was silent past its heartbeat TTL runs every slice at once.",
    ),
    cfg.IntOpt(
        "reconcile_batch",
        default=1000,
        min=1,
        help="Nodes per reconcile pass. Each pass costs a few pipelined ledger reads per "
        "thousand nodes and one list_instances per node.",
    ),
    cfg.StrOpt(
        "running_deleted_instance_action",
        default="reap",
        choices=[
            ("reap", "destroy it and free what it uses (Nova's default)"),
            ("log", "log a warning and leave it running"),
            ("noop", "do nothing"),
        ],
        help="What the reconcile does with an instance the driver runs while the ledger "
        "calls it deleted or ended, places it on another host, or does not know it (as "
        "Nova's option of the same name). An agent cut off past its TTL comes back to "
        "find its instances deleted locally by the API.",
    ),
    cfg.StrOpt(
        "lost_instance_action",
        default="error",
        choices=[
            (
                "error",
                "set it ERROR with a fault saying its VM was lost, and free what it "
                "held (allocations, quota), so its owner sees why and can delete it",
            ),
            ("log", "log a warning and leave it ACTIVE, as Nova's power-state sync does"),
        ],
        help="What the reconcile does with an instance the ledger has ACTIVE on this host "
        "that the driver does not run (listed twice, with no delete or action under way): a "
        "hypervisor that lost the VM, or a crash of the ledger under durability = async "
        "that brought back a server whose delete the agent had done.",
    ),
    cfg.FloatOpt(
        "ledger_retry_max_s",
        default=5.0,
        min=0.1,
        help="While the ledger is unreachable the agent stops taking requests and retries "
        "with a backoff up to this many seconds; what it holds goes back to the broker.",
    ),
    cfg.HostAddressOpt(
        "metrics_host",
        default="0.0.0.0",
        help="Address the agent serves its Prometheus metrics on (see metrics_port).",
    ),
    cfg.PortOpt(
        "metrics_port",
        default=0,
        help="Port the agent serves its Prometheus metrics on, at /metrics, without a "
        "token: placements, refusals by reason, claim conflicts, spawn failures, "
        "latencies, free capacity and the classes consumed (docs/metrics.rst). Each agent "
        "of a machine needs its own. 0: no metrics, and the per-placement timings are not "
        "taken.",
    ),
    cfg.FloatOpt(
        "shutdown_timeout_s",
        default=30.0,
        min=0.0,
        help="On SIGTERM, how long to wait for spawns in flight before exiting.",
    ),
]


@dataclasses.dataclass(frozen=True)
class AgentOptions(Section):
    """The ``[agent]`` options."""

    GROUPS = (("agent", agent_opts), (None, shelve_opts))

    host: str
    node_count: int
    node_vcpus: int
    node_ram_mb: int
    node_disk_gb: int
    node_traits: tuple[str, ...]
    node_provider: tuple[str, ...]
    availability_zone: str
    aggregates: tuple[str, ...]
    spawn_delay_s: float
    spawn_failure_rate: float
    seed: int
    fake_state_path: str | None
    placement_policy: str
    spawn_workers: int
    max_handbacks: int
    handback_pause_s: float
    heartbeat_interval_s: float
    heartbeat_ttl_s: float
    class_poll_interval_s: float
    reap_interval_s: float
    release_leaked_allocations: bool
    reconcile_interval_s: float
    reconcile_batch: int
    running_deleted_instance_action: str
    lost_instance_action: str
    ledger_retry_max_s: float
    metrics_host: str
    metrics_port: int
    shutdown_timeout_s: float
    shelved_offload_time: int
    shelved_poll_interval: int
