"""``transport_url`` in oslo.messaging's syntax, read by oslo.messaging, in kombu's terms.

OpenStack services name their RabbitMQ cluster as one URL listing every node::

    rabbit://USER:PASS@HOST1:5672,USER:PASS@HOST2:5672/VHOST?OPTION=VALUE&...

kombu reads one host per URL, and reads that form wrong without a word:
``amqp://u:p@h1:5672,u:p@h2:5672/`` is host ``h2`` with password
``p@h1:5672,u:p``. :func:`parse_transport_url` has oslo.messaging parse the
URL (``TransportURL.parse``) when its scheme is ``rabbit``, or ``amqp`` with
more than one host, and returns one kombu URL per host, in the order listed,
which the bus fails over across. Credentials are percent-decoded as
oslo.messaging decodes them (so ``%40`` is ``@``, ``%25`` is ``%``; a bare ``@``
or ``:`` in a password is kept, a ``,`` ``/`` ``?`` or ``#`` must be encoded),
then encoded again for kombu. A host with no port is on 5672, as in
oslo.messaging; ``rabbit:///`` is ``guest:guest@localhost:5672``. Every other
URL is kombu's own and is returned as it is (split at ``;``, kombu's own
failover list).

The query options are those of oslo.messaging's rabbit driver, typed and
checked by its own option types. Those with a meaning on qsched's bus are
honoured (:data:`HONOURED`); every other one is refused with the reason
(:data:`REFUSED`), never ignored. qsched reads no ``[oslo_messaging_rabbit]``
section: an option a deployment needs goes in the URL.

Why here and not in the bus: oslo.messaging's parser wants a ``ConfigOpts``. It
is handed a private empty one, read for nothing, and this package is the one
place below the entry points that may use oslo.config (``tests/test_layers.py``);
the bus, which parses whatever URL it is handed, stays free of it. oslo.messaging
is imported only for such a URL (it costs about half a second).
"""

from __future__ import annotations

import dataclasses
import re
import ssl as ssl_module
import urllib.parse
from collections.abc import Mapping
from typing import Any

from oslo_config import cfg

from qsched import exception

RABBIT_GROUP = "oslo_messaging_rabbit"
DEFAULT_PORT = 5672
ROUND_ROBIN, SHUFFLE = "round-robin", "shuffle"

#: The rabbit driver's options qsched honours, and what each sets.
HONOURED = {
    "ssl": "connect over TLS",
    "ssl_ca_file": "verify the broker's certificate, and its name, against this CA",
    "ssl_cert_file": "the client certificate",
    "ssl_key_file": "the client certificate's key",
    "kombu_failover_strategy": "round-robin or shuffle: the next host after a failure",
    "rabbit_login_method": "the SASL method (PLAIN, AMQPLAIN, EXTERNAL, RABBIT-CR-DEMO)",
    "heartbeat_timeout_threshold": "AMQP heartbeat of agent consumers, over [bus] heartbeat_s",
    "heartbeat_rate": "heartbeat checks per heartbeat_timeout_threshold",
}
#: Why the other options of the rabbit driver are refused; any not here: :data:`RPC_ONLY`.
REFUSED = {
    "ssl_version": "TLS negotiates the highest version both ends speak",
    "ssl_enforce_hostname_verification": "oslo.messaging deprecated it: it has no effect",
    "ssl_enforce_fips_mode": "oslo.messaging deprecated it: it has no effect",
    "rabbit_quorum_queue": "boot queues are always quorum queues",
    "rabbit_quorum_delivery_limit": "set [bus] delivery_limit instead",
    "rpc_conn_pool_size": "set [bus] publisher_pool_size instead",
    "rabbit_retry_interval": "the reconnect backoff is [bus] reconnect_max_delay_s",
    "rabbit_retry_backoff": "the reconnect backoff is [bus] reconnect_max_delay_s",
    "rabbit_interval_max": "set [bus] reconnect_max_delay_s instead",
    "rabbit_qos_prefetch_count": "an agent prefetches one message per queue",
    "amqp_durable_queues": "qsched's queues are always durable",
    "amqp_auto_delete": "qsched's queues are never auto-deleted",
    "kombu_compression": "qsched's messages are small msgpack: never compressed",
}
RPC_ONLY = "it shapes oslo.messaging's own RPC and notification queues, which qsched does not use"
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^:@\[\]]+)(:[0-9]+)?")  # host[:port], as listed
_LEAST = {"heartbeat_timeout_threshold": 0, "heartbeat_rate": 1}  # oslo.messaging sets no min
_SSL_FILES = {"ssl_ca_file": "ca_certs", "ssl_cert_file": "certfile", "ssl_key_file": "keyfile"}


@dataclasses.dataclass(frozen=True)
class Transport:
    """What a ``transport_url`` says to connect to, in kombu's terms.

    ``urls``: one kombu URL per broker host, in the order listed. ``safe_url``:
    the URL as given, passwords masked (None: a kombu URL, which kombu masks).
    ``ssl``, ``login_method``: kombu ``Connection`` arguments (None: not set, as
    for a kombu URL). ``heartbeat_s``: the URL's heartbeat, over ``[bus]
    heartbeat_s`` (None: not set); ``heartbeat_rate`` as kombu's
    ``heartbeat_check(rate=)``.
    """

    urls: tuple[str, ...]
    safe_url: str | None = None
    failover_strategy: str = ROUND_ROBIN
    ssl: bool | Mapping[str, Any] | None = None
    login_method: str | None = None
    heartbeat_s: int | None = None
    heartbeat_rate: int = 2  # kombu's default


def speaks_oslo(url: str) -> bool:
    """Whether ``url`` is oslo.messaging's syntax, which kombu cannot read: ``rabbit://``,
    or ``amqp://`` listing several hosts.

    An ``amqp://`` URL whose commas do not each end a ``host[:port]`` is kombu's,
    read as before: a password may hold a comma (``amqp://u:p,q@h//``).
    """
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "rabbit":
        return True
    parts = rest.partition("/")[0].partition("?")[0].split(",")
    hosts = [part.rpartition("@")[2] for part in parts]
    return scheme.lower() == "amqp" and len(parts) > 1 and all(map(_HOST.fullmatch, hosts))


def parse_transport_url(url: str) -> Transport:
    """The kombu URLs and connection arguments of ``url``.

    :raises Invalid: oslo.messaging cannot parse it, a port is out of range, or a
        query option is unknown, badly typed or cannot be honoured.
    """
    if not speaks_oslo(url):
        return Transport(tuple(part for part in url.split(";") if part))
    import oslo_messaging  # heavy (it loads oslo.service): only for URLs that need it

    try:
        parsed = oslo_messaging.TransportURL.parse(cfg.ConfigOpts(), url)
    except (ValueError, oslo_messaging.InvalidTransportURL) as exc:
        raise exception.Invalid(reason=f"transport_url cannot be parsed: {exc}") from None
    options = query_options(parsed.query, rabbit_opts())
    hosts = parsed.hosts or [oslo_messaging.TransportHost("localhost", None, "guest", "guest")]
    vhost = parsed.virtual_host or ""
    return Transport(
        urls=tuple(kombu_url(host, vhost) for host in hosts),
        safe_url=safe_url(parsed.transport, hosts, vhost),
        failover_strategy=options.get("kombu_failover_strategy", ROUND_ROBIN),
        ssl=ssl_params(options),
        login_method=options.get("rabbit_login_method"),
        heartbeat_s=options.get("heartbeat_timeout_threshold"),
        heartbeat_rate=options.get("heartbeat_rate", 2),
    )


def rabbit_opts() -> dict[str, cfg.Opt]:
    """oslo.messaging's rabbit driver options, by name."""
    from oslo_messaging import opts

    return {opt.dest: opt for opt in dict(opts.list_opts())[RABBIT_GROUP]}


def query_options(query: Mapping[str, str], known: Mapping[str, cfg.Opt]) -> dict[str, Any]:
    """The honoured options of a URL's ``query``, typed by their oslo.messaging options.

    :raises Invalid: an option unknown, refused, badly typed, or an ssl file without ssl.
    """
    values = {}
    for name, text in query.items():
        if name not in known:
            raise _refused(name, "it is not an option of oslo.messaging's rabbit driver")
        if name not in HONOURED:
            raise _refused(name, f"qsched cannot honour it: {REFUSED.get(name, RPC_ONLY)}")
        try:
            values[name] = known[name].type(text)
        except ValueError as exc:
            raise _refused(name, f"{text!r} is not a valid value: {exc}") from None
    for name in _SSL_FILES.keys() & values.keys():
        if not values.get("ssl"):
            raise _refused(name, "it needs ssl=true in the same URL")
    for name, least in _LEAST.items():
        if values.get(name, least) < least:
            raise _refused(name, f"{values[name]} is below {least}")
    return values


def kombu_url(host: Any, vhost: str) -> str:
    """One host of a parsed URL as kombu's ``amqp://``, credentials and vhost encoded.

    :raises Invalid: the port is out of range.
    """
    port = host.port or DEFAULT_PORT
    if not 0 < port < 65536:
        reason = f"transport_url port {port} of {host.hostname} is not 1-65535"
        raise exception.Invalid(reason=reason)
    hostname = f"[{host.hostname}]" if ":" in host.hostname else host.hostname
    userinfo = f"{_quote(host.username or '')}:{_quote(host.password or '')}"
    return f"amqp://{userinfo}@{hostname}:{port}/{_quote(vhost)}"


def safe_url(scheme: str, hosts: list[Any], vhost: str) -> str:
    """The URL with its hosts and defaults, passwords masked, query left out."""
    netlocs = []
    for host in hosts:
        user = f"{_quote(host.username)}:**@" if host.username else ""
        hostname = f"[{host.hostname}]" if ":" in host.hostname else host.hostname
        netlocs.append(f"{user}{hostname}:{host.port or DEFAULT_PORT}")
    return f"{scheme}://{','.join(netlocs)}/{_quote(vhost)}"


def ssl_params(options: Mapping[str, Any]) -> bool | dict[str, Any]:
    """kombu's ``ssl`` argument, built as oslo.messaging's rabbit driver builds it.

    With a CA file the certificate is verified, and its name against the host
    connected to (``server_hostname`` None: kombu fills it in per connection).
    """
    if not options.get("ssl"):
        return False
    params: dict[str, Any] = {
        key: options[name] for name, key in _SSL_FILES.items() if options.get(name)
    }
    if "ca_certs" in params:
        params.update(cert_reqs=ssl_module.CERT_REQUIRED, server_hostname=None)
    return params or True


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _refused(name: str, reason: str) -> exception.Invalid:
    return exception.Invalid(reason=f"transport_url option {name!r}: {reason}")


def oslo_rabbit_url(url: str) -> str:
    """``url`` as oslo.messaging's rabbit driver takes it: ``rabbit://`` as given, and a
    kombu ``amqp://`` URL (or a ``;`` list of them) rewritten as one ``rabbit://`` URL
    listing its hosts (oslo.messaging has no ``amqp`` driver any more).

    :raises Invalid: not a RabbitMQ URL, a kombu URL with a query (kombu's options,
        which oslo.messaging would not read), hosts on different vhosts, or as
        :func:`parse_transport_url`.
    """
    scheme = url.partition("://")[0].lower()
    if scheme not in ("rabbit", "amqp", "pyamqp"):
        reason = f"the oslo.messaging bus needs a rabbit:// or amqp:// URL, not {scheme}://"
        raise exception.Invalid(reason=reason)
    parsed = parse_transport_url(url)
    if scheme == "rabbit":
        return url
    if "?" in url:
        raise exception.Invalid(reason="transport_url: write options as rabbit://...?OPTION=")
    netlocs, vhosts = [], set()
    for part in parsed.urls:
        split = urllib.parse.urlsplit(part)
        netlocs.append(split.netloc)
        vhosts.add(split.path[1:])
    if len(vhosts) > 1:
        raise exception.Invalid(reason="transport_url: every host must name the same vhost")
    return f"rabbit://{','.join(netlocs)}/{vhosts.pop()}"


def oslo_notification_transport(url: str, rabbit: Mapping[str, Any]) -> Any:
    """oslo.messaging's notification transport on ``url`` (``rabbit://``), its rabbit
    driver's options set to ``rabbit`` on a private ``ConfigOpts`` (imports oslo.messaging).

    :raises Invalid: an option of ``rabbit`` oslo.messaging does not know.
    """
    import oslo_messaging

    known = rabbit_opts()
    private = cfg.ConfigOpts()
    private.register_opts(list(known.values()), group=RABBIT_GROUP)
    private([], project="qsched", default_config_files=[])
    for name, value in rabbit.items():
        if name not in known:
            raise _refused(name, "it is not an option of oslo.messaging's rabbit driver")
        private.set_override(name, value, group=RABBIT_GROUP)
    return oslo_messaging.get_notification_transport(private, url=url)
