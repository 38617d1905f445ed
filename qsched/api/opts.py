"""Options of the API front door: the [api] and [scheduler] sections.

Registered on a ConfigOpts passed in (:func:`register_opts` is idempotent), and
listed by :func:`list_opts` for oslo-config-generator.
"""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

api_opts = [
    cfg.HostAddressOpt(
        "host",
        default="127.0.0.1",
        help="Address qsched-api listens on when it serves in process. Behind gunicorn "
        "the WSGI server's own bind setting applies instead.",
    ),
    cfg.PortOpt("port", default=8774, help="Port qsched-api listens on (Nova's 8774)."),
    cfg.StrOpt(
        "public_endpoint",
        help="Base URL put in links and Location headers, e.g. https://compute.example.com "
        "(Nova's osapi_compute_link_prefix). Unset: taken from each request's Host.",
    ),
    cfg.StrOpt(
        "auth_strategy",
        default="noauth2",
        choices=[("noauth2", "X-Auth-Token: 'admin' or '<user>:<project>', no Keystone")],
        help="How requests are authenticated.",
    ),
    cfg.IntOpt(
        "max_request_body_bytes",
        default=64 * 1024,
        min=1024,
        help="Largest request body accepted; a larger one gets 413 before it is parsed.",
    ),
    cfg.IntOpt(
        "max_limit",
        default=1000,
        min=1,
        help="Most items one list call returns, whatever ?limit= asks (Nova's max_limit).",
    ),
    cfg.MultiStrOpt(
        "flavor",
        default=[],
        help="A flavor to create at startup, one per line: "
        "name:vcpus:ram_mb[:disk_gb[:id]], e.g. 'flavor = m1.small:1:2048:20'. The id "
        "defaults to the name. Startup creates a missing one and rewrites a changed one; "
        "flavors created through the API are left alone.",
    ),
    cfg.MultiStrOpt(
        "flavor_extra_spec",
        default=[],
        help="An extra spec of a configured flavor, one per line: <flavor name>:<key>=<value> "
        "with the key in Nova syntax, e.g. 'flavor_extra_spec = "
        "m1.small:trait:CUSTOM_X=required' or 'flavor_extra_spec = g1.large:resources:VGPU=1'. "
        "Everything before the first ':' is the flavor name, everything after the first '=' "
        "the value.",
    ),
]

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
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register the [api] and [scheduler] options on ``conf`` (again is harmless)."""
    for group, opts in list_opts():
        conf.register_opts(opts, group=group)


def list_opts() -> list[tuple[str, list[Any]]]:
    """The options by section, for oslo-config-generator."""
    return [("api", api_opts), ("scheduler", scheduler_opts)]
