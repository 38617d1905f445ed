"""The ``[notifications]`` and ``[oslo_messaging_notifications]`` sections, by Nova's names.

``[notifications] notification_format`` and ``versioned_notifications_topics`` are
Nova's options; qsched has only versioned notifications (docs/notifications.rst),
so ``unversioned`` sends nothing and ``both`` is ``versioned``.
``[oslo_messaging_notifications]`` holds oslo.messaging's own options (``driver``,
``transport_url``, ``topics``, ``retry``) with its names, types and defaults. They are
registered here rather than by oslo.messaging so that a process with notifications
off (``driver`` empty or ``noop``, the default) never imports it (about half a
second): :func:`build_oslo_notifiers` imports it, and hands it a private
``ConfigOpts`` as :mod:`qsched.conf.transport` does, only when one is to send.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from oslo_config import cfg

from qsched.conf.base import Section

GROUP = "notifications"
OSLO_GROUP = "oslo_messaging_notifications"
VERSIONED, UNVERSIONED, BOTH = "versioned", "unversioned", "both"

notifications_opts = [
    cfg.StrOpt("notification_format", default=VERSIONED, choices=[
        (VERSIONED, "send versioned notifications (Nova's format), the only one qsched has"),
        (UNVERSIONED, "send none: qsched has no unversioned (legacy) notifications"),
        (BOTH, "the same as versioned"),
    ], help="Which notifications to send, if [oslo_messaging_notifications] driver sends "
            "any (Nova's option; Nova's default is unversioned, qsched's versioned)."),
    cfg.ListOpt("versioned_notifications_topics", default=["versioned_notifications"],
                help="The topics versioned notifications are sent on (Nova's option)."),
    cfg.StrOpt("notify_on_state_change", choices=[
        (None, "no instance.update notifications"),
        ("vm_state", "instance.update on each change of an instance's vm_state, with the "
                     "current task_state in both of its task fields"),
        ("vm_and_task_state", "instance.update on each change of its vm_state or "
                              "task_state"),
    ], help="Send instance.update on state changes (Nova's option and default, unset: "
            "none). One or two more messages a placement when set."),
]  # fmt: skip

#: ``[DEFAULT] control_exchange``, oslo.messaging's option, at the default Nova gives it:
#: consumers of Nova's notifications (Ceilometer) listen on the ``nova`` exchange.
exchange_opts = [
    cfg.StrOpt("control_exchange", default="nova",
               help="The exchange notifications are sent to (oslo.messaging's option, "
                    "at Nova's value, where Nova's consumers listen)."),
]  # fmt: skip

oslo_notifications_opts = [
    cfg.MultiStrOpt("driver", default=[],
                    help="oslo.messaging's notification drivers: messagingv2 sends them "
                         "on the bus, log logs them; empty or noop sends nothing."),
    cfg.StrOpt("transport_url", secret=True,
               help="The notification bus, in oslo.messaging's syntax "
                    "(rabbit://user:pass@host:5672/vhost). Unset: oslo.messaging's "
                    "default, rabbit://guest:guest@localhost:5672/ (qsched does not fall "
                    "back to [DEFAULT] transport_url, which may be a kombu URL)."),
    cfg.ListOpt("topics", default=["notifications"],
                help="oslo.messaging's topics for unversioned notifications: unused by "
                     "qsched, which sends on [notifications] versioned_notifications_topics."),
    cfg.IntOpt("retry", default=-1,
               help="How often to retry sending a notification on a connection error "
                    "(-1: without end, 0: never)."),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class NotificationOptions(Section):
    """The ``[notifications]`` and ``[oslo_messaging_notifications]`` options."""

    GROUPS = (
        (None, exchange_opts),
        (GROUP, notifications_opts),
        (OSLO_GROUP, oslo_notifications_opts),
    )

    control_exchange: str

    notification_format: str
    versioned_notifications_topics: tuple[str, ...]
    notify_on_state_change: str | None
    driver: tuple[str, ...]
    transport_url: str | None
    topics: tuple[str, ...]
    retry: int

    @property
    def enabled(self) -> bool:
        """Whether anything is sent: a driver other than noop, and versioned notifications."""
        drivers = [name for name in self.driver if name != "noop"]
        return bool(drivers) and self.notification_format != UNVERSIONED


def build_oslo_notifiers(options: NotificationOptions, publisher_id: str) -> list[Any]:
    """oslo.messaging's Notifiers for ``options``, one a driver (oslo.messaging takes
    the list from its own options only); none if off. Imports oslo.messaging.

    :raises InvalidTransportURL: from oslo.messaging, a malformed ``transport_url``.
    """
    if not options.enabled:
        return []
    import oslo_messaging

    # oslo.messaging's public way to set it, as Nova's own rpc module does: a default
    # of the process (one notifier a process), read when the transport is made
    oslo_messaging.set_transport_defaults(options.control_exchange)
    private = cfg.ConfigOpts()
    private([], project="qsched", default_config_files=[])
    transport = oslo_messaging.get_notification_transport(private, url=options.transport_url)
    topics = list(options.versioned_notifications_topics)
    return [
        oslo_messaging.Notifier(transport, publisher_id, driver=name, topics=topics,
                                retry=options.retry)
        for name in options.driver if name != "noop"
    ]  # fmt: skip
