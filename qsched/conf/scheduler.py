"""The [scheduler] section: deadlines, attempts and the front door's periodic tasks."""

from __future__ import annotations

import dataclasses

from oslo_config import cfg

from qsched.conf.base import Section

scheduler_opts = [
    cfg.FloatOpt(
        "reap_interval_s",
        default=5.0,
        min=0.0,
        help="Seconds between runs of the deadline reaper in the API service (it ends "
        "requests nobody placed in time); 0: off. Safe to run in every worker.",
    ),
    cfg.FloatOpt(
        "janitor_grace_s",
        default=10.0,
        min=0.0,
        help="How long the janitor must see an agent without a heartbeat before it takes "
        "over the agent's unfinished work. Counted from when it first saw the agent "
        "silent, so that after a ledger outage live agents can beat again first.",
    ),
    cfg.FloatOpt(
        "outbox_grace_s",
        default=10.0,
        min=1.0,
        help="A boot request recorded and not confirmed by the broker for this long (a "
        "front door killed in between, an agent that could not reschedule) is published "
        "by the janitor. Keep it above a publish's worst case (about connect_timeout_s + "
        "confirm_timeout_s): a copy published meanwhile is harmless, only wasted.",
    ),
    cfg.FloatOpt(
        "outbox_interval_s",
        default=2.0,
        min=0.0,
        help="Seconds between the janitor's passes over the outbox in the API service; "
        "0: off. Safe in every worker: two never take the same entry.",
    ),
    cfg.FloatOpt(
        "janitor_interval_s",
        default=10.0,
        min=0.0,
        help="Seconds between runs of the janitor in the API service (it releases and "
        "requeues the unfinished claims of agents whose heartbeat expired); 0: off.",
    ),
    cfg.FloatOpt(
        "build_timeout_s",
        default=300.0,
        min=1.0,
        help="How long a boot request may wait to be placed; past this deadline the instance "
        "ends in ERROR NoValidHost and its quota is returned.",
    ),
    cfg.IntOpt(
        "max_attempts",
        default=3,
        min=1,
        help="How many hosts may try to spawn one instance (the first try and reschedules) "
        "before it ends in ERROR (Nova's max_attempts).",
    ),
    # Nova's request filters: boots routed by host aggregate metadata (qsched.aggregates).
    cfg.BoolOpt(
        "limit_tenants_to_placement_aggregate",
        default=False,
        help="Restrict projects to their aggregates: a boot of a project that some host "
        "aggregate names in a filter_tenant_id metadata key (or filter_tenant_id<suffix>, "
        "one project per key) lands only on hosts of those aggregates. Projects no "
        "aggregate names are not restricted, unless "
        "placement_aggregate_required_for_tenants is set.",
    ),
    cfg.BoolOpt(
        "placement_aggregate_required_for_tenants",
        default=False,
        help="With limit_tenants_to_placement_aggregate, a boot of a project that no "
        "aggregate names ends ERROR at once (No valid host was found. No hosts available "
        "for tenant): set it when every project must be confined to aggregates.",
    ),
    cfg.BoolOpt(
        "allow_resize_to_same_host",
        default=False,
        help="Let a resize stay on the server's own host when it has room (Nova's "
        "[DEFAULT] allow_resize_to_same_host). The host then holds the larger of the two "
        "flavors per resource class until the resize is confirmed or reverted, never "
        "both (docs/moves.rst).",
    ),
    cfg.IntOpt(
        "resize_confirm_window",
        default=0,
        min=0,
        help="Seconds after which a resize or cold migration that waits for a confirm "
        "(VERIFY_RESIZE) is confirmed by the API service's reaper (Nova's [DEFAULT] "
        "resize_confirm_window); 0: never, the user confirms or reverts. The source's "
        "copy then goes within two minutes, when its agent sweeps its moves.",
    ),
    cfg.BoolOpt(
        "enable_isolated_aggregate_filtering",
        default=False,
        help="Keep aggregates to the boots that ask for them: an aggregate whose metadata "
        "has trait:<NAME>=required takes only boots whose flavor or image requires every "
        "such trait.",
    ),
]


@dataclasses.dataclass(frozen=True)
class SchedulerOptions(Section):
    """The ``[scheduler]`` options."""

    GROUPS = (("scheduler", scheduler_opts),)

    reap_interval_s: float
    janitor_grace_s: float
    outbox_grace_s: float
    outbox_interval_s: float
    janitor_interval_s: float
    build_timeout_s: float
    max_attempts: int
    limit_tenants_to_placement_aggregate: bool
    placement_aggregate_required_for_tenants: bool
    allow_resize_to_same_host: bool
    resize_confirm_window: int
    enable_isolated_aggregate_filtering: bool
