"""The Redis Cluster launcher and the ledger's cluster client: URLs, slots, shards."""

from __future__ import annotations

import itertools
import re
import uuid

import pytest
import redis

from qsched import exception
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, cluster, open_stores
from qsched.ledger.base import LedgerUnavailable
from qsched.ledger.durability import DurabilityRefused
from qsched.ledger.keys import Keyspace
from qsched.stack.redis_cluster import SLOTS, RedisClusterFailed, RedisClusterServers, slot_ranges
from tests.conftest import require_server
from tests.raw import redis_store


def test_slot_ranges_cover_every_slot_once() -> None:
    for masters in (1, 2, 3, 5):
        ranges = slot_ranges(masters)
        assert ranges[0][0] == 0 and ranges[-1][1] == SLOTS - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    assert slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)]  # redis-cli's split


@pytest.mark.parametrize(
    ("url", "nodes", "tls", "user", "password"),
    [
        ("redis+cluster://10.0.0.1:7000", (("10.0.0.1", 7000),), False, None, None),
        ("redis+cluster://a:7000,b:7001/", (("a", 7000), ("b", 7001)), False, None, None),
        ("rediss+cluster://:s%40cret@a:7000/0", (("a", 7000),), True, None, "s@cret"),
        ("redis+cluster://qs:pw@[::1]:7000", (("::1", 7000),), False, "qs", "pw"),
    ],
)
def test_cluster_urls(url, nodes, tls, user, password) -> None:
    assert cluster.is_cluster_url(url)
    assert cluster.ClusterURL.parse(url) == cluster.ClusterURL(nodes, tls, user, password)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://a:7000/1", "database 0 only"),
        ("redis+cluster://a:7000?max_connections=5", "no options"),
        ("redis+cluster://a", "not host:port"),
        ("redis+cluster://a:7000,b", "not host:port"),
        ("redis+cluster:///", "names no node"),
        ("redis+cluster://u:secret@a:99999", "not host:port"),
    ],
)
def test_bad_cluster_urls_say_why_and_hide_the_password(url, why) -> None:
    with pytest.raises(exception.Invalid, match=why) as err:
        cluster.ClusterURL.parse(url)
    assert "secret" not in str(err.value)


def test_plain_urls_are_not_cluster_urls() -> None:
    assert not any(map(cluster.is_cluster_url, ("redis://a:1/0", "fakeredis://", "unix:///s")))


@pytest.mark.real
def test_the_launcher_forms_a_cluster_of_three_masters(redis_cluster: RedisClusterServers):
    with redis_cluster.client(redis_cluster.ports[0]) as client:
        shards = client.execute_command("CLUSTER", "SHARDS")
    assert len(shards) == 3
    client = cluster.connect(redis_cluster.url, 2.0, 5.0, 10)
    try:
        owners = {cluster.cell_node(client, Keyspace(c).prefix).port
                  for c in ("cell1", "cell2", "cell3")}  # fmt: skip
    finally:
        client.close()
    assert owners == set(redis_cluster.ports), "cell1..3 are on the three masters"


def cluster_stores(conf, url: str, cell: str = "cell1") -> Stores:
    conf.set_override("cell", cell, group="ledger")
    return open_stores(LedgerOptions.from_conf(conf), url=url)


def scans_by_port(servers: RedisClusterServers) -> dict[int, int]:
    """SCAN calls each master has served so far."""
    found = {}
    for port in servers.ports:
        with servers.client(port) as client:
            found[port] = int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))
    return found


@pytest.mark.real
def test_admin_scans_walk_only_the_cells_master(conf, cluster_url, redis_cluster) -> None:
    stores = cluster_stores(conf, cluster_url, "cell2")
    stores.ledger.create_provider(str(uuid.uuid4()), "cn1")
    owner = cluster.cell_node(redis_store(stores).client, redis_store(stores).keys.prefix).port
    before = scans_by_port(redis_cluster)
    assert stores.inspector.consumers() == {} and stores.backend.forget_cell() == 3
    after = scans_by_port(redis_cluster)
    assert {p for p in after if after[p] > before[p]} == {owner}
    stores.backend.close()


@pytest.mark.real
def test_a_master_without_the_scripts_gets_them_again(conf, cluster_url, redis_cluster) -> None:
    """A heartbeat (a script inside a pipeline) after the master lost its script cache,
    as a master that took over or restarted has."""
    stores = cluster_stores(conf, cluster_url)
    stores.agents.heartbeat("cn1", 30)
    owner = cluster.cell_node(redis_store(stores).client, redis_store(stores).keys.prefix).port
    with redis_cluster.client(owner) as client:
        client.script_flush()
    stores.agents.heartbeat("cn1", 30)
    assert stores.agents.alive("cn1")
    stores.backend.close()


@pytest.mark.real
def test_replica_durability_is_refused_on_a_cluster(conf, cluster_url) -> None:
    conf.set_override("durability", "replica", group="ledger")
    with pytest.raises(DurabilityRefused, match="replica: not built for a Redis Cluster") as err:
        cluster_stores(conf, cluster_url)
    assert "Use durability = disk" in str(err.value)


@pytest.mark.real
def test_disk_durability_names_every_node_without_an_aof(
    conf, cluster_url, redis_cluster: RedisClusterServers
) -> None:
    """The session's cluster keeps nothing on disk: each of its masters is named."""
    conf.set_override("durability", "disk", group="ledger")
    with pytest.raises(DurabilityRefused) as err:
        cluster_stores(conf, cluster_url)
    message = str(err.value)
    assert "3 of 3 do not" in message and "appendonly no" in message
    assert all(f"127.0.0.1:{port} (primary)" in message for port in redis_cluster.ports)
    assert "appendfsync always" in message and "durability = replica" in message


@pytest.mark.real
def test_disk_durability_on_a_cluster_whose_nodes_fsync_always(conf, tmp_path) -> None:
    """A cluster of its own whose masters fsync before they answer: the default opens
    and writes; one node set back to everysec is refused by name, alone; a node that
    does not answer stops the start, named too."""
    servers = RedisClusterServers(tmp_path, masters=2, fsync="always")
    try:
        servers.start()
    except RedisClusterFailed as exc:
        require_server("Redis Cluster", servers.url, exc, "apt-get install redis-server")
    try:
        assert LedgerOptions.defaults().durability == "disk"
        conf.set_override("durability", "disk", group="ledger")
        stores = cluster_stores(conf, servers.url)
        assert stores.ledger.create_provider(str(uuid.uuid4()), "cn1").generation == 0
        stores.backend.close()
        lax, strict = servers.ports
        with servers.client(lax) as client:
            client.config_set("appendfsync", "everysec")
        named = re.escape(f"1 of 2 do not (127.0.0.1:{lax} (primary): appendfsync everysec)")
        with pytest.raises(DurabilityRefused, match=named):
            cluster_stores(conf, servers.url)
        servers.kill(lax)
        with pytest.raises(exception.BackendUnavailable, match=f"127.0.0.1:{lax} did not answer"):
            cluster_stores(conf, f"redis+cluster://127.0.0.1:{strict}")
    finally:
        servers.stop()


@pytest.mark.real
def test_command_figures_come_from_the_cells_master(conf, cluster_url) -> None:
    stores = cluster_stores(conf, cluster_url, "cell3")
    before = stores.backend.command_stats().get("evalsha", (0, 0))[0]
    for _ in range(3):
        stores.ledger.create_provider(str(uuid.uuid4()), f"cn-{uuid.uuid4().hex[:6]}")
    assert stores.backend.command_stats()["evalsha"][0] >= before + 3
    stores.backend.close()


@pytest.mark.real
def test_a_lost_master_fails_its_cells_calls_only(conf, tmp_path) -> None:
    """A cluster of its own (two masters), one master killed: the calls and the health
    ping of its cell fail as an outage, the other cell's go on; then both killed."""
    servers = RedisClusterServers(tmp_path, masters=2)
    servers.start()
    try:
        lost, kept = (
            cluster_stores(conf, servers.url, "cell1"),
            cluster_stores(conf, servers.url, "cell2"),
        )
        owners = [cluster.cell_node(redis_store(s).client, redis_store(s).keys.prefix).port
                  for s in (lost, kept)]  # fmt: skip
        assert owners == servers.ports  # slots 5286 and 9413: one master each
        servers.kill(owners[0])
        with pytest.raises(exception.BackendUnavailable):
            lost.ledger.create_provider(str(uuid.uuid4()), "cn1")
        with pytest.raises(LedgerUnavailable, match="unreachable"):
            lost.backend.ping()
        kept.backend.ping()
        assert kept.ledger.create_provider(str(uuid.uuid4()), "cn1").generation == 0
        servers.kill(owners[1])  # no node answers: the client's own error, mapped too
        # redis-py says "cannot be connected" once it gave up on every node, or the
        # node's connection error while it still tries one: either is the outage
        with pytest.raises(exception.BackendUnavailable,
                           match=r"cannot be connected|unreachable"):  # fmt: skip
            kept.agents.heartbeat("cn1", 30)
        with pytest.raises(LedgerUnavailable, match="unreachable"):
            kept.backend.ping()
    finally:
        servers.stop()
    for port in servers.ports:  # stop ended every master
        with servers.client(port) as client, pytest.raises(redis.ConnectionError):
            client.ping()
