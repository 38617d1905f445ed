"""The ledger on a Redis Sentinel set: its URL, and a client that follows a failover.

Features
    The client (redis-py's :meth:`redis.sentinel.Sentinel.master_for`) asks the
    sentinels for the master of the service each time it opens a connection. A
    connection to a master that went away fails (and is retried on a new one, which
    asks again), and a connection to a master that was demoted is dropped at its
    first ``READONLY`` answer, so the ledger follows a failover by itself. The Lua
    scripts are loaded again on the new master at their first ``NOSCRIPT``
    (:meth:`~qsched.ledger.redis.RedisStore.run`). While there is no master, or
    the sentinels still name the one that died, a call fails with
    :class:`~qsched.exception.BackendUnavailable`, as when a plain Redis is down.

Connection string
    ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db]``
    ``[?option=value&...]``: the sentinels (port 26379 if none is given), the
    ``sentinel monitor`` name of the master, the database (0 if none). The
    password (percent-encoded) is the master's and its replicas'
    (``requirepass``). Options, every other one refused:

    ``sentinel_password``, ``sentinel_username``
        the sentinels' own credentials (their ``requirepass``), when they have any;
    ``sentinel_timeout_s``
        how long one question to a sentinel may take, opening its connection
        included (default: ``[ledger] connect_timeout_s``);
    ``min_other_sentinels``
        trust a sentinel's answer only if it sees at least this many other
        sentinels (default 0), so that a sentinel cut off with an old master is
        not believed.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from typing import Any, NoReturn

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from qsched import exception
from qsched.urls import masked

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379
#: the query options of a sentinel URL, and what each sets (every other one is refused)
OPTIONS = {
    "sentinel_password": "the sentinels' password",
    "sentinel_username": "the sentinels' user (Redis ACL)",
    "sentinel_timeout_s": "seconds one question to a sentinel may take",
    "min_other_sentinels": "how many other sentinels a sentinel must see to be believed",
}
FORM = f"{SCHEME}://[:password@]host:port[,host:port...]/service_name/db"
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::([0-9]+))?$")


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SCHEME


@dataclasses.dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    sentinel_timeout_s: float | None = None
    min_other_sentinels: int = 0

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """:raises Invalid: not of the form, or an option unknown or out of range;
        the message gives the form."""
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() != SCHEME:
            _refuse(url, f"the scheme must be {SCHEME}")
        rest, _, query = rest.partition("?")
        netloc, _, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        username, password = _credentials(userinfo) if at else (None, None)
        return cls(
            _sentinels(url, hosts),
            *_path(url, path),
            username,
            password,
            **_options(url, query),
        )

    def safe(self) -> str:
        """The URL without its passwords, for logs and errors."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        user = f"{self.username or ''}:***@" if self.password else ""
        return f"{SCHEME}://{user}{hosts}/{self.service}/{self.db}"


def _refuse(url: str, why: str) -> NoReturn:
    raise exception.Invalid(
        reason=f"[ledger] url {masked(url)!r}: {why}; write it as {FORM} "
        f"(options: {', '.join(OPTIONS)})"
    )


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    if not colon:  # "secret@host": a password alone, as redis-py reads redis://secret@
        user, password = "", user
    unquote = urllib.parse.unquote
    return (unquote(user) or None), (unquote(password) or None)


def _sentinels(url: str, hosts: str) -> tuple[tuple[str, int], ...]:
    found = []
    for item in hosts.split(","):
        match = _HOST.match(item.strip())
        if match is None:
            _refuse(url, f"{item.strip()!r} is not a host[:port] of a sentinel")
        port = int(match.group(2) or DEFAULT_PORT)
        if not 0 < port < 65536:
            _refuse(url, f"port {port} of {match.group(1)} is out of range")
        found.append((match.group(1).strip("[]"), port))
    return tuple(found)


def _path(url: str, path: str) -> tuple[str, int]:
    parts = path.split("/")
    if len(parts) > 2 or not parts[0]:
        _refuse(url, "the path must name the master's service (sentinel monitor), then the db")
    service = urllib.parse.unquote(parts[0])
    db = parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        _refuse(url, f"the database {db!r} is not a number")
    return service, int(db)


def _options(url: str, query: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name not in OPTIONS:
            _refuse(url, f"option {name!r} is not one qsched reads")
        if name in found:
            _refuse(url, f"option {name!r} is given twice")
        found[name] = _option_value(url, name, value)
    return found


def _option_value(url: str, name: str, value: str) -> Any:
    if name == "sentinel_timeout_s":
        try:
            seconds = float(value)
        except ValueError:
            seconds = 0.0
        if not seconds > 0:
            _refuse(url, f"sentinel_timeout_s={value!r} must be a number of seconds above 0")
        return seconds
    if name == "min_other_sentinels":
        if not value.isdigit():
            _refuse(url, f"min_other_sentinels={value!r} must be a whole number >= 0")
        return int(value)
    return value or None


def connect(url: str, connect_timeout_s: float, timeout_s: float, **pool: Any) -> redis.Redis:
    """A client of the master the sentinels at ``url`` name, following its failovers.

    ``pool``: more arguments of each connection and of the pool (``max_connections``,
    ``health_check_interval``). Nothing is asked of the sentinels until the first call.

    :raises Invalid: a malformed URL (the message gives the form).
    """
    parsed = SentinelURL.parse(url)
    asking = parsed.sentinel_timeout_s or connect_timeout_s
    sentinel = Sentinel(
        list(parsed.sentinels),
        min_other_sentinels=parsed.min_other_sentinels,
        sentinel_kwargs={
            "socket_connect_timeout": asking,
            "socket_timeout": asking,
            "username": parsed.sentinel_username,
            "password": parsed.sentinel_password,
        },
    )
    client: redis.Redis = sentinel.master_for(
        parsed.service,
        db=parsed.db,
        username=parsed.username,
        password=parsed.password,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=timeout_s,
        **pool,
    )
    return client


def close(client: redis.Redis) -> None:
    """Close ``client``'s connections, and those to its sentinels if it has any."""
    pool = client.connection_pool
    client.close()
    if isinstance(pool, SentinelConnectionPool):
        pool.sentinel_manager.close()
