"""Nothing outside qsched/ledger/ touches a Redis client or a key (docs/ledger.rst).

An AST walk over qsched/ and agents/: no module outside the ledger package
imports ``redis``, ``fakeredis`` or ``lupa``, and none reaches through a
``.store`` for its ``.client`` or ``.keys``. Callers use the interfaces of
qsched.ledger.base.
"""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

LEDGER = ROOT / "qsched" / "ledger"
FORBIDDEN_IMPORTS = {"redis", "fakeredis", "lupa"}
FORBIDDEN_REACH = {"client", "keys"}  # as in stores.store.client, self.store.keys
#: test launchers that set up Redis servers of their own (CLUSTER and SENTINEL
#: commands to the servers they start), never a ledger's records: redis-py allowed
LAUNCHERS = {
    ROOT / "qsched" / "stack" / "redis_cluster.py",
    ROOT / "qsched" / "stack" / "sentinel.py",
}


def outside_modules() -> list[Path]:
    found = [*(ROOT / "qsched").rglob("*.py"), *(ROOT / "agents").rglob("*.py")]
    return sorted(p for p in found if LEDGER not in p.parents)


def violations(tree: ast.AST, may_import: bool = False) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        for name in names:
            if name.split(".")[0] in FORBIDDEN_IMPORTS and not may_import:
                yield f"line {node.lineno}: imports {name}"
        if (
            isinstance(node, ast.Attribute)
            and node.attr in FORBIDDEN_REACH
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "store"
        ):
            yield f"line {node.lineno}: uses .store.{node.attr}"


def test_the_walk_sees_the_packages() -> None:
    paths = outside_modules()
    assert (
        ROOT / "qsched" / "compute" / "api.py" in paths and ROOT / "agents" / "service.py" in paths
    )
    assert not any(LEDGER in p.parents for p in paths)


@pytest.mark.parametrize("path", outside_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_redis_outside_the_ledger(path: Path) -> None:
    found = list(violations(ast.parse(path.read_text(), str(path)), path in LAUNCHERS))
    assert found == [], f"{path.relative_to(ROOT)}: {found}"


@pytest.mark.parametrize(
    "source",
    [
        "import redis",
        "import fakeredis as fr",
        "from redis.connection import parse_url",
        "x = stores.store.client.ping()",
        "k = self.stack.stores.store.keys.agents",
    ],
)
def test_the_walk_catches_each_kind(source: str) -> None:
    assert list(violations(ast.parse(source)))


def test_the_walk_lets_the_interfaces_through() -> None:
    source = "from qsched.ledger import Stores\nstores.backend.ping()\nstores.inspector.keys()"
    assert list(violations(ast.parse(source))) == []


def test_a_ledger_client_is_not_held_to_redis_pys_hundred_connections() -> None:
    """redis-py 8 caps a pool at 100 connections and then raises: an embedded stack of
    50 agents, or an API with many threads, would fail on a busy moment."""
    from qsched.ledger import redis as ledger_redis

    for url in ("redis://127.0.0.1:6379/1", f"fakeredis://pool-{uuid.uuid4().hex}"):
        pool = ledger_redis.connect(url).connection_pool
        assert pool.max_connections == ledger_redis.MAX_CONNECTIONS > 1000, url
    asked = ledger_redis.connect("redis://127.0.0.1:6379/1?max_connections=7")
    assert asked.connection_pool.max_connections == 7  # the URL's own bound wins
