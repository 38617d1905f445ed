"""Versioned notifications in Nova's format: a small interface, its backends, the payloads.

:mod:`qsched.notifications.base` is the interface (:class:`Notifier`, and
:class:`NullNotifier`, the default, which sends nothing and costs nothing);
:mod:`qsched.notifications.rabbit` writes oslo.messaging's ``messagingv2``
messages on RabbitMQ itself; :mod:`qsched.notifications.oslo` sends through
oslo.messaging's Notifier (any other driver or URL);
:mod:`qsched.notifications.payloads` builds Nova's payloads, pure. What is sent,
and when, is in docs/notifications.rst.
"""

from qsched.conf.notifications import NotificationOptions, build_oslo_notifiers
from qsched.notifications.base import NULL, Notifier, NullNotifier

__all__ = ["NULL", "Notifier", "NullNotifier", "open_notifier"]


def open_notifier(options: NotificationOptions, publisher_id: str) -> Notifier:
    """The notifier ``options`` describe, as ``publisher_id`` (``qsched-agent:HOST``):
    :data:`NULL` when they are off (the default, oslo.messaging not even imported);
    qsched's own sender for ``messagingv2`` alone on ``rabbit://``
    (:func:`qsched.notifications.rabbit.serves`); else oslo.messaging's Notifier;
    either wrapped to send ``instance.update`` too when ``notify_on_state_change`` is set
    (:mod:`qsched.notifications.updates`).

    :raises InvalidTransportURL: from oslo.messaging, a malformed ``transport_url``
        (``Invalid`` for one qsched's sender reads).
    """
    if not options.enabled:
        return NULL
    from qsched.notifications import rabbit

    notifier: Notifier
    if rabbit.serves(options):
        notifier = rabbit.open_rabbit_notifier(options, publisher_id)
    else:
        from qsched.notifications.oslo import OsloNotifier

        notifier = OsloNotifier(build_oslo_notifiers(options, publisher_id))
    if options.notify_on_state_change:
        from qsched.notifications.updates import StateChangeNotifier

        return StateChangeNotifier(notifier, options.notify_on_state_change)
    return notifier
