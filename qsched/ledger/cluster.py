"""The ledger on a Redis Cluster, through redis-py's cluster client.

Features
    Every key of a cell carries the hash tag ``{cell}`` (:mod:`qsched.ledger.keys`),
    so a cell lives in one hash slot, on one master: every script, pipeline and
    multi-key command of a cell runs on that shard, and a claim never spans
    shards. Each script is called with a key of its cell, which is what routes
    its ``EVALSHA`` to the master of the slot; the keys it builds inside Lua
    from the cell's prefix are in the same slot, which Redis 7's cluster mode
    accepts undeclared. (A key on another master is refused as a non-local
    key; Redis 7.0 serves one of another slot on the same master, but only
    until a resharding moves either slot, so no script builds such a key.)
    Several cells of one deployment share the cluster: each is one slot, so
    the cells spread over the masters by their names' hash slots.
    The admin scans (the inspector, the audit, forgetting a cell) walk only the
    master that owns the cell's slot.

Connection string
    ``redis+cluster://[[user]:password@]host:port[,host:port...][/0]``, or
    ``rediss+cluster://...`` for TLS: one or more startup nodes, from which
    the client learns the whole slot map (and follows ``MOVED``/``ASK``
    redirections after a resharding or a failover). A cluster has database 0
    only; a URL naming another, or giving query options, is refused rather
    than half obeyed.

Outages
    The client reads the slot map when the stores open: a process started while
    no startup node answers fails then with BackendUnavailable (a single Redis
    is connected at the first call instead). Later, a master that does not
    answer makes the calls of its cells fail with BackendUnavailable, and the
    health ping of a cell asks that master, while the cells of the other
    masters go on.

Durability
    ``[ledger] durability = async`` only: ``replica`` sends ``WAIT`` on the
    connection of each write, and ``disk`` checks one server's settings, and
    neither is built for a cluster's several masters yet; both are refused
    when the stores open, with that reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from qsched import exception
from qsched.urls import masked

SCHEMES = {"redis+cluster": False, "rediss+cluster": True}  # scheme -> TLS


def is_cluster_url(url: str) -> bool:
    """True when ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in SCHEMES


@dataclasses.dataclass(frozen=True)
class ClusterURL:
    """A ``redis+cluster://`` URL, parsed: its startup nodes and credentials."""

    nodes: tuple[tuple[str, int], ...]
    tls: bool = False
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> ClusterURL:
        """:raises Invalid: not such a URL, no node, a node without a port, a
        database other than 0, or query options; the message gives the form."""
        form = "redis+cluster://[user:password@]host:port[,host:port...][/0]"
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise _invalid(url, f"it is not a cluster URL; use {form}")
        if parts.query or parts.fragment:
            raise _invalid(url, f"a cluster URL takes no options (?...); use {form}")
        if parts.path not in ("", "/", "/0"):
            raise _invalid(url, "a Redis Cluster has database 0 only: end the URL with / or /0")
        credentials, _, hosts = parts.netloc.rpartition("@")
        username, _, password = credentials.partition(":")
        nodes = tuple(_node(url, one, form) for one in hosts.split(",") if one.strip())
        if not nodes:
            raise _invalid(url, f"it names no node; use {form}")
        return cls(nodes, SCHEMES[scheme], unquote(username) or None,
                   unquote(password) if credentials else None)  # fmt: skip


def _node(url: str, text: str, form: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _invalid(url, f"node {text!r} is not host:port; use {form}")
    return host.strip("[]"), int(port)


def _invalid(url: str, why: str) -> exception.Invalid:
    return exception.Invalid(reason=f"[ledger] url {masked(url)!r}: {why}")


def connect(
    url: str, connect_timeout_s: float, timeout_s: float, max_connections: int
) -> RedisCluster:
    """A cluster client for ``url``; it reads the slot map from the first node that answers.

    :raises Invalid: a malformed URL (see :meth:`ClusterURL.parse`).
    :raises BackendUnavailable: no startup node answered.
    """
    parsed = ClusterURL.parse(url)
    try:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in parsed.nodes],
            username=parsed.username,
            password=parsed.password,
            ssl=parsed.tls,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=timeout_s,
            health_check_interval=30,
            max_connections=max_connections,
        )
    except (redis.RedisError, RedisClusterException) as exc:
        raise exception.BackendUnavailable(
            backend="Redis Cluster", url="ledger", reason=exc
        ) from exc


def is_outage(exc: BaseException) -> bool:
    """True for the cluster client's error when no node of the cluster answers (it is a
    RedisClusterException, no RedisError; others of that class are mistakes of the
    caller, such as keys of several slots in one command)."""
    return isinstance(exc, RedisClusterException) and "cannot be connected" in str(exc)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def cell_node(client: RedisCluster, prefix: str) -> ClusterNode:
    """The master that owns the slot of the cell whose keys begin with ``prefix``."""
    return client.get_node_from_key(prefix)


def scan_cell(client: Any, prefix: str, pattern: str, count: int) -> Iterator[Any]:
    """``SCAN MATCH pattern`` over the keys of the cell of ``prefix``: on a cluster, only
    on the master that owns the cell's slot (the cell's keys are all there)."""
    if is_cluster(client):
        return iter(client.scan_iter(pattern, count=count, target_nodes=cell_node(client, prefix)))
    return iter(client.scan_iter(pattern, count=count))


def load_script(client: Any, prefix: str, source: str) -> None:
    """SCRIPT LOAD ``source`` on the master of the cell of ``prefix`` only: loading it
    on every master, as redis-py does, would fail while any one of them is down."""
    client.execute_command("SCRIPT LOAD", source, target_nodes=cell_node(client, prefix))


def ping_cell(client: Any, prefix: str) -> None:
    """PING the server that holds the cell of ``prefix`` (on a cluster, the master that
    owns its slot: another master's answer says nothing of the cell).

    :raises redis.RedisError: it did not answer.
    """
    if is_cluster(client):
        client.ping(target_nodes=cell_node(client, prefix))
    else:
        client.ping()


def cell_info(client: Any, prefix: str, section: str) -> dict[str, Any]:
    """``INFO section`` of the server that holds the cell of ``prefix``: on a cluster,
    the master that owns its slot (not whichever node the client would pick)."""
    if is_cluster(client):
        found: dict[str, Any] = client.info(section, target_nodes=cell_node(client, prefix))
        return found
    plain: dict[str, Any] = client.info(section)
    return plain


def key_count(client: Any) -> int:
    """Keys of the whole server: on a cluster, summed over every master."""
    if is_cluster(client):
        counts = client.dbsize(target_nodes=RedisCluster.PRIMARIES)
        return sum(counts.values()) if isinstance(counts, dict) else int(counts)
    return int(client.dbsize())


def close(client: Any) -> None:
    """Close ``client``'s connections; it opens new ones when used again. A cluster
    client's own ``close`` forgets the slot map too, after which it cannot be used, so
    there each node's connections are dropped instead."""
    if not is_cluster(client):
        client.close()
        return
    for node in client.get_nodes():
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()


def refuse_durability(mode: str) -> None:
    """:raises Invalid: ``mode`` is not ``async``, the one a cluster ledger keeps."""
    if mode != "async":
        raise exception.Invalid(
            reason=f"[ledger] durability = {mode} is not built for a Redis Cluster ledger "
            "(redis+cluster://): its WAIT and settings checks address one server; use "
            "durability = async, or a single Redis for replica or disk"
        )
