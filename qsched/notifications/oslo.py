"""Notifications sent through oslo.messaging's Notifier (``messagingv2``, ``log``, ...).

Features: Nova's wire form (oslo.messaging's ``messagingv2`` envelope around the
``nova_object.*`` payload) on the ``[notifications] versioned_notifications_topics``,
``publisher_id`` ``qsched-agent:HOST`` as Nova's ``nova-compute:HOST``.

Connection String: ``[oslo_messaging_notifications] transport_url``, in
oslo.messaging's syntax (``rabbit://user:pass@host:5672/vhost``). The entry point
builds oslo.messaging's Notifier (:func:`qsched.conf.notifications.build_oslo_notifiers`)
and hands it here: this module never imports oslo.messaging itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from qsched.notifications.base import INFO, Notifier

LOG = logging.getLogger(__name__)


class OsloNotifier(Notifier):
    """A :class:`Notifier` over ``oslo_messaging.Notifier`` objects, one a driver (their
    ``info``/``error``); they share one transport."""

    def __init__(self, notifiers: Sequence[Any]) -> None:
        self._notifiers = list(notifiers)

    def notify(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        priority: str = INFO,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        for notifier in self._notifiers:
            send = getattr(notifier, priority.lower())
            try:
                send(dict(context or {}), event_type, dict(payload))
            except Exception:  # the step it tells of happened: never fail it for this
                LOG.exception("could not send notification %s", event_type)

    def close(self) -> None:
        if self._notifiers:
            self._notifiers[0].transport.cleanup()
            self._notifiers = []
