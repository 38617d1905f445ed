"""The notifier role: send one versioned notification, never fail the caller.

A notification is sent after the ledger step it tells of, and only when that step
happened (the ledger's transitions say so), so a redelivered request or a second
caller sends nothing: at most once. A crash between the ledger step and the send
loses that one notification (docs/notifications.rst).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

INFO, ERROR = "INFO", "ERROR"


class Notifier(abc.ABC):
    """Sends versioned notifications (Nova's ``event_type`` and payload envelope)."""

    #: False: nothing is sent, so a caller need not build the payload at all.
    enabled: bool = True

    @abc.abstractmethod
    def notify(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        priority: str = INFO,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        """Send one notification: ``event_type`` (``instance.create.start``), the payload
        (its ``nova_object.*`` envelope, :mod:`qsched.notifications.payloads`), at
        ``priority`` (INFO or ERROR), with the request's ``context`` (ids, user, project).

        Never raises: a notification that cannot be sent is logged and dropped, since
        the step it tells of has happened anyway.
        """

    def close(self) -> None:  # noqa: B027 - a backend with nothing to close keeps this
        """Release the connection to the notification bus, if any. Idempotent."""


class NullNotifier(Notifier):
    """Sends nothing: notifications off (``[oslo_messaging_notifications] driver`` noop)."""

    enabled = False

    def notify(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        priority: str = INFO,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        return None


#: The notifier of a service with notifications off.
NULL = NullNotifier()


class RecordingNotifier(Notifier):
    """Keeps what it is told to send, in order: for tests and the embedded stack."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def notify(
        self,
        event_type: str,
        payload: Mapping[str, Any],
        priority: str = INFO,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        self.sent.append((priority, event_type, dict(payload)))
