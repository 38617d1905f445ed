"""The cloud of a run without servers: the embedded default, all in this process.

:func:`qsched.embedded.start_stack` on fakeredis and ``memory://``, agents as
threads, the API on a local port. For machines without Redis or RabbitMQ and
for the test suite; its figures are not comparable with a deployment's.
"""

from __future__ import annotations

import time
from typing import Any

from agents.virt.fake import FakeChild, FakeNodeSpec, check_children
from qsched.bench.stack import Cloud, CloudSpec, registration_summary
from qsched.bench.timing import REGISTRATION, PhaseTimer, peak_rss_kb
from qsched.embedded import embedded_options, start_stack


class EmbeddedCloud(Cloud):
    """Everything in this process on fakeredis and memory:// (no servers needed)."""

    mode = "embedded"

    def __init__(self, spec: CloudSpec) -> None:
        if spec.notification_url is not None:
            raise ValueError("an embedded cloud sends no notifications: they need RabbitMQ")
        self.spec = spec
        options = embedded_options(
            flavor=("api", [f.config_line for f in spec.flavors]),
            instances=("quota", -1),
            cores=("quota", -1),
            ram=("quota", -1),
            server_groups=("quota", -1),
            server_group_members=("quota", -1),
            build_timeout_s=("scheduler", spec.build_timeout_s),
            heartbeat_interval_s=("agent", spec.heartbeat_interval_s),
            class_poll_interval_s=("agent", spec.class_poll_interval_s),
            reconcile_interval_s=("agent", spec.reconcile_interval_s),
            reconcile_batch=("agent", spec.reconcile_batch),
            flavor_extra_spec=("api", [line for f in spec.flavors for line in f.spec_lines]),
            metrics=("api", spec.metrics),  # the agents' own need ports: not in this process
            **{name: ("scheduler", value) for name, value in spec.scheduler},
        )
        node = FakeNodeSpec(
            spec.node_vcpus,
            spec.node_ram_mb,
            spec.node_disk_gb,
            cpu_allocation_ratio=spec.cpu_allocation_ratio,
            children=check_children([FakeChild.parse(line) for line in spec.node_providers]),
        )
        timer = PhaseTimer()
        timer.wrap("registration", REGISTRATION)
        began_at = time.time()
        try:
            self.stack = start_stack(options, spec.hosts, sum(spec.agent_hosts()), node)
        finally:
            timer.restore()
        phase = timer.phases["registration"]
        report = {
            "host": "all agents (in this process, one after another)",
            "nodes": spec.hosts,
            "start_s": time.time() - began_at,
            "phases": timer.to_dict(),
        }
        self.registration = registration_summary(spec.hosts, [report], began_at)
        self.registration["agents"] = sum(spec.agent_hosts())
        self.registration["note"] = "agents registered one after another in one process"
        assert phase.calls
        self._open(options, self.stack.stores)
        self.api_url = self.stack.url

    def hosts_of_agents(self) -> list[str]:
        return [agent.host for agent in self.stack.agents]

    def peak_rss(self) -> dict[str, Any]:
        return {
            "scope": "the whole bench process (embedded: agents, API and load generator)",
            "per_agent_kb": {},
            "max_kb": peak_rss_kb(),
            "nodes_per_agent": max(self.spec.node_counts()),
        }

    def stop(self) -> list[dict[str, Any]]:
        counters = [{"host": a.host, "counters": dict(a.counters)} for a in self.stack.agents]
        self.stack.stop()
        return counters
