"""The stack a chaos run breaks: the API under gunicorn and N agents, as processes.

A :class:`~qsched.stack.ProcessStack` whose bus prefix is unique per run, so
that queues on a shared RabbitMQ never meet another run's; the ledger (and the
Redis transport) are the run's own servers (:mod:`.servers`). Agents are
signalled and started again under the same host name, as an operator would
restart a compute service.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qsched.conf.ledger import DEFAULT_DURABILITY
from qsched.stack import CellConfig, GunicornConfig, Options, ProcessStack, new_prefix

#: name, vcpus, ram_mb, weight in the load's mix
FLAVORS = (("chaos.small", 1, 1024, 5), ("chaos.medium", 2, 2048, 3), ("chaos.large", 4, 4096, 1))


@dataclasses.dataclass(frozen=True)
class StackSpec:
    """What to start: how many agents and nodes, how the fake driver behaves."""

    agents: int = 3
    nodes_per_agent: int = 4
    node_vcpus: int = 8
    node_ram_mb: int = 16384
    spawn_delay_s: float = 1.0
    failure_rate: float = 0.05
    build_timeout_s: float = 30.0
    heartbeat_ttl_s: float = 3.0
    shutdown_timeout_s: float = 15.0
    api_workers: int = 2
    seed: int = 1
    #: the ledger's [ledger] durability, the product's default unless told (the server is
    #: set to match)
    durability: str = DEFAULT_DURABILITY
    quota_instances: int = 12  # per project: finite, so that "quota holds" is tested
    quota_cores: int = 20
    reconcile_interval_s: float = 2.0
    ledger_timeout_s: float = 3.0  # a stall longer than this makes the API answer 503
    delivery_limit: int = 20  # [bus] delivery_limit, and the oslo run's policies
    host_queue_type: str = "classic"  # [bus] host_queue_type: "quorum" on a RabbitMQ cluster
    extra_config: tuple[Path, ...] = ()

    @property
    def capacity_vcpus(self) -> int:
        return self.agents * self.nodes_per_agent * self.node_vcpus

    def options(self) -> Options:
        """The qsched options of the run: short timeouts so that faults resolve quickly."""
        return {
            "bus": {"connect_timeout_s": 2, "confirm_timeout_s": 5, "heartbeat_s": 10,
                    "reconnect_max_delay_s": 2, "delivery_limit": self.delivery_limit,
                    "host_queue_type": self.host_queue_type},
            "ledger": {"cpu_allocation_ratio": 1.0, "ram_allocation_ratio": 1.0,
                       "durability": self.durability, "timeout_s": self.ledger_timeout_s},
            "quota": {"instances": self.quota_instances, "cores": self.quota_cores,
                      "ram": self.quota_cores * 2048},
            "scheduler": {"build_timeout_s": self.build_timeout_s, "max_attempts": 3,
                          "reap_interval_s": 1, "janitor_interval_s": 2,
                          "outbox_grace_s": 3, "outbox_interval_s": 1},
            "api": {"flavor": [f"{n}:{v}:{r}:0" for n, v, r, _ in FLAVORS]},
            "agent": {"node_count": self.nodes_per_agent, "node_vcpus": self.node_vcpus,
                      "node_ram_mb": self.node_ram_mb, "node_disk_gb": 0,
                      "spawn_delay_s": self.spawn_delay_s,
                      "spawn_failure_rate": self.failure_rate, "heartbeat_interval_s": 0.5,
                      "heartbeat_ttl_s": self.heartbeat_ttl_s, "class_poll_interval_s": 0.5,
                      "reap_interval_s": 1, "shutdown_timeout_s": self.shutdown_timeout_s,
                      "reconcile_interval_s": self.reconcile_interval_s},
        }  # fmt: skip


class Stack(ProcessStack):
    """The processes of one run, its config, and the harness's own view of its ledger."""

    def __init__(
        self,
        spec: StackSpec,
        directory: Path,
        transport_url: str,
        ledger_url: str,
        bus_driver: str = "kombu",
    ):
        options = {**spec.options()}
        options["bus"] = {**options["bus"], "driver": bus_driver}  # [bus] driver
        config = CellConfig(transport_url, ledger_url, new_prefix("chaos"), options=options)
        api = GunicornConfig(spec.api_workers, threads=8, timeout_s=60, graceful_timeout_s=10)
        super().__init__(directory, config, api, spec.extra_config, logs=directory / "logs",
                         stop_timeout_s=spec.shutdown_timeout_s + 10)  # fmt: skip
        self.spec = spec
        self.bus_driver = bus_driver
        self.hosts = [self.host(i) for i in range(spec.agents)]

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the API and every agent; wait until the API answers and all agents beat."""
        self.start_api()
        for index in range(self.spec.agents):
            self.start_agent(index)
        self.wait_ready(timeout_s)

    def start_agent(
        self, index: int, options: Mapping[str, Any] | None = None, args: Sequence[str] = ()
    ) -> None:
        """Start agent ``index`` (again), its fake driver seeded from the run's seed.

        Its simulated hypervisor keeps its VMs in :meth:`vms_file` across restarts.
        """
        seed = self.spec.seed * 100 + index
        own = {"seed": seed, "fake_state_path": str(self.vms_file(index))}
        super().start_agent(index, {**own, **(options or {})}, args)

    def vms_file(self, index: int) -> Path:
        """Where agent ``index``'s fake driver keeps what runs on its nodes."""
        return self.dir / f"agent{index}.vms"
