"""Versioned notifications in Nova's format: a small interface, its backends, the payloads.

:mod:`qsched.notifications.base` is the interface (:class:`Notifier`, and
:class:`NullNotifier`, the default, which sends nothing and costs nothing);
:mod:`qsched.notifications.oslo` sends through oslo.messaging's Notifier;
:mod:`qsched.notifications.payloads` builds Nova's payloads, pure. What is sent,
and when, is in docs/notifications.rst.
"""

from qsched.conf.notifications import NotificationOptions, build_oslo_notifiers
from qsched.notifications.base import NULL, Notifier, NullNotifier

__all__ = ["NULL", "Notifier", "NullNotifier", "open_notifier"]


def open_notifier(options: NotificationOptions, publisher_id: str) -> Notifier:
    """The notifier ``options`` describe: :data:`NULL` when they are off (the default,
    oslo.messaging not even imported), else oslo.messaging's, as ``publisher_id``
    (``qsched-agent:HOST``).

    :raises InvalidTransportURL: from oslo.messaging, a malformed ``transport_url``.
    """
    found = build_oslo_notifiers(options, publisher_id)
    if not found:
        return NULL
    from qsched.notifications.oslo import OsloNotifier

    return OsloNotifier(found)
