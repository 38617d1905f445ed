"""The keyspace has one home: Keyspace builds it, the scripts and docs/ledger.rst follow.

* no Lua script spells a key: no quoted key fragment, no use of the prefix ``P``,
  only builders ``K.<name>`` that Keyspace has;
* the generated Lua builders give the keys Keyspace gives (run on each backend);
* the keyspace table of docs/ledger.rst lists exactly Keyspace's keys;
* no Python module but keys.py spells the cell prefix.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from qsched.ledger import Stores
from qsched.ledger.keys import Keyspace, lua_prelude, templates
from tests.helpers import ROOT
from tests.raw import redis_store

LUA = sorted((ROOT / "qsched" / "ledger" / "lua").glob("*.lua"))
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')
NAMES = {t.name for t in templates()}
FRAGMENTS = sorted({piece for t in templates() for piece in t.literals})


def code_of(path: Path) -> str:
    """The script without its comments (they may name keys; code may not)."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


def spelled(literal: str) -> list[str]:
    """The key fragments a Lua string literal spells: a fragment with a separator
    (``inst:``, ``:held``, ``rp-names``) anywhere in it, or a whole key name."""
    return [f for f in FRAGMENTS if literal == f or ((":" in f or "-" in f) and f in literal)]


def test_there_are_scripts_and_fragments() -> None:
    assert len(LUA) > 10 and {"inst:", ":events", "outbox", "rp-names"} <= set(FRAGMENTS)


@pytest.mark.parametrize("path", LUA, ids=lambda p: p.name)
def test_no_script_spells_a_key(path: Path) -> None:
    code = code_of(path)
    literals = [a or b for a, b in STRING.findall(code)]
    assert [(lit, spelled(lit)) for lit in literals if spelled(lit)] == []
    assert not re.search(r"\bP\b", STRING.sub('""', code)), "builds a key from the prefix"
    assert set(re.findall(r"\bK\.(\w+)", code)) <= NAMES


def test_the_check_catches_a_spelled_key() -> None:
    assert all(spelled(lit) for lit in ("inst:", "x:held", "rp-names", "outbox"))
    assert not any(spelled(lit) for lit in ("deleting", "abandoned", "state", "u:", "traits"))


def test_the_lua_builders_give_the_python_keys(stores: Stores) -> None:
    store = redis_store(stores)
    calls = [f"K.{t.name}" + (f"({', '.join(repr(p) for p in t.params)})" if t.params else "")
             for t in templates()]  # fmt: skip
    script = lua_prelude() + f"return {{{', '.join(calls)}}}"
    got = [k.decode() for k in store.client.eval(script, 0, store.keys.prefix)]
    want = [_python_key(store.keys, t.name, t.params) for t in templates()]
    assert got == want


def _python_key(keys: Keyspace, name: str, params: tuple[str, ...]) -> str:
    member = getattr(keys, name)
    return member(*params) if params else member


def test_every_builder_is_a_template() -> None:
    public = {n for n in vars(Keyspace) if not n.startswith("_")}
    assert public == NAMES
    assert all(k.startswith(Keyspace("c").prefix) for k in _all_keys(Keyspace("c")))


def _all_keys(keys: Keyspace) -> list[str]:
    return [_python_key(keys, t.name, tuple("x" for _ in t.params)) for t in templates()]


def test_the_docs_table_lists_every_key_once() -> None:
    text = (ROOT / "docs" / "ledger.rst").read_text()
    section = text.split("Data model\n==========", 1)[1]
    table = re.search(r"^(=+  )+=+$\n.*?^(=+  )+=+$\n(.*?)^(=+  )+=+$", section, re.M | re.S)
    assert table is not None, "no keyspace table under Data model"
    rows = re.findall(r"^``([^`]+)``\s+(\w+)\s", table.group(3), flags=re.MULTILINE)
    assert [key for key, _ in rows] == [t.pattern for t in templates()]
    assert {kind for _, kind in rows} <= {"hash", "set", "zset", "list", "string"}


def test_only_keys_py_spells_the_prefix() -> None:
    found = []
    for path in sorted((ROOT / "qsched").rglob("*.py")):
        if path.name == "keys.py" and path.parent.name == "ledger":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and "qsched:{" in str(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
