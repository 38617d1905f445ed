"""Every qsched option by section, for oslo-config-generator (``--namespace qsched``)."""

from __future__ import annotations

from typing import Any

from qsched.conf import (
    agent,
    api,
    bus,
    cells,
    glance,
    ledger,
    notifications,
    quota,
    scheduler,
)


def list_opts() -> list[tuple[str | None, list[Any]]]:
    """The options by section, in the order the sample config shows them."""
    return [
        (None, [*bus.default_opts, *notifications.exchange_opts, *agent.shelve_opts]),
        ("api", api.api_opts),
        ("scheduler", scheduler.scheduler_opts),
        ("agent", agent.agent_opts),
        ("bus", bus.bus_opts),
        ("ledger", ledger.ledger_opts),
        (cells.GROUP, cells.cells_opts),
        ("quota", quota.quota_opts),
        (glance.GROUP, glance.glance_opts()),
        (notifications.GROUP, notifications.notifications_opts),
        (notifications.OSLO_GROUP, notifications.oslo_notifications_opts),
    ]
