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
    ``[ledger] durability = disk`` (the default) needs every node of the cluster,
    masters and replicas (a failover promotes a replica), to run
    :data:`~qsched.ledger.durability.DISK_SETTINGS`: each node the client knows
    is asked when the stores open, and the start is refused naming the nodes
    that do not (a node that does not answer stops the start too, as a single
    Redis that does not answer does). ``async`` needs nothing. ``replica`` is
    refused: its ``WAIT`` counts the replicas of one connection's server, and
    per-slot waits on a cluster's several masters are not built.
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
from qsched.ledger import durability
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


def check_durability(client: Any, mode: str) -> None:
    """Check every node of the cluster can keep ``[ledger] durability = mode``.

    :raises DurabilityRefused: ``replica``; ``disk`` with a node (master or
        replica) that lacks the settings: the message names each such node.
    :raises BackendUnavailable: a node did not answer; the message names it.
    """
    if mode == "replica":
        raise durability.DurabilityRefused(
            mode=mode,
            reason="not built for a Redis Cluster ledger (redis+cluster://): its WAIT "
            "counts the replicas of one server, and a cluster's writes go to several "
            "masters. Use durability = disk (every node with the settings of "
            f"{durability.RECIPE}, checked at start), or async",
        )
    if mode != "disk":
        return
    lacking = {}
    for node in sorted(client.get_nodes(), key=lambda n: n.name):
        found = _node_settings(client, node)
        mismatches = durability.disk_mismatches(found)
        if mismatches:
            lacking[f"{node.name} ({node.server_type})"] = durability.describe(mismatches)
    if lacking:
        named = "; ".join(f"{name}: {has}" for name, has in lacking.items())
        raise durability.DurabilityRefused(
            mode="disk",
            reason=f"every node of the Redis Cluster, replicas too (a failover promotes "
            "one), must write and fsync every write to its AOF before it answers, and "
            f"{len(lacking)} of {len(client.get_nodes())} do not ({named}): "
            f"{durability.the_fix()}",
        )


def _node_settings(client: Any, node: ClusterNode) -> dict[str, str]:
    """The node's answer to ``CONFIG GET`` of the disk settings.

    :raises DurabilityRefused: it refused the command (renamed, or not in the ACL).
    :raises BackendUnavailable: it did not answer.
    """
    down = (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError)
    try:
        found = client.config_get(*durability.DISK_SETTINGS, target_nodes=node)
    except redis.ResponseError as exc:
        if not isinstance(exc, down):  # CONFIG refused: renamed, or not in the user's ACL
            raise durability.refuse_unchecked(f"node {node.name}", exc) from exc
        raise _unanswered(node, exc) from exc
    except (redis.RedisError, RedisClusterException) as exc:
        raise _unanswered(node, exc) from exc
    return {_text(k): _text(v) for k, v in found.items()}


def _unanswered(node: ClusterNode, exc: Exception) -> exception.BackendUnavailable:
    return exception.BackendUnavailable(
        backend="Redis Cluster",
        url="ledger",
        reason=f"node {node.name} did not answer the durability check: {exc}",
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
