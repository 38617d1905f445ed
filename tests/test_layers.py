"""The import structure: no circle, no upward import, config only at the entry points.

Read from the source (every ``import`` statement, in functions and under
``TYPE_CHECKING`` too), so a lazy or type-only import cannot hide a circle.
Importing ``a.b.c`` also runs ``a`` and ``a.b``: those edges count for the circle
check, except towards the importer's own packages (a package importing its own
modules is how a package is made).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Floors, lowest first. A module may import modules on its floor or below, never above.
#: The longest matching prefix gives a module's floor.
FLOORS: list[tuple[str, ...]] = [
    ("qsched", "qsched.exception", "qsched.resources", "qsched.conf", "qsched.net",
     "qsched.context", "qsched.policies", "qsched.urls"),
    # the ledger's interfaces and values, which everything above may name
    ("qsched.flavors", "qsched.ledger.base", "qsched.ledger.records", "qsched.ledger.keys",
     "qsched.ledger.backend", "qsched.ledger.inspection", "qsched.ledger.archive",
     "qsched.policy", "qsched.images", "qsched.aggregates"),
    ("qsched.scheduling", "qsched.message"),  # the contract between front door and agents
    # the backends; and the API's metrics, which count what the bus did not publish
    ("qsched.ledger", "qsched.bus", "qsched.glance", "qsched.notifications", "qsched.metrics"),
    ("qsched.reaper", "qsched.outbox", "qsched.janitor", "qsched.compute", "qsched.aggregate_api",
     "qsched.services", "qsched.server_groups", "qsched.quotas", "qsched.hypervisors",
     "qsched.zones", "qsched.keypairs", "qsched.server_list", "qsched.server_actions",
     "qsched.host_rules", "qsched.archive", "qsched.cells", "qsched.cells_api",
     "qsched.cells_groups", "qsched.cells_aggregates", "qsched.cells_adopt", "agents"),
    ("qsched.api", "qsched.admin"),  # the edges
    # entry points and harnesses: they read the configuration and build the rest
    ("agents.main", "qsched.embedded", "qsched.cmd", "qsched.stack", "qsched.bench",
     "qsched.chaos"),
]  # fmt: skip
#: Where oslo.config may be used: the options themselves and the entry points.
CONFIG_READERS = ("qsched.conf", "qsched.admin.context")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    paths = [*ROOT.joinpath("qsched").rglob("*.py"), *ROOT.joinpath("agents").rglob("*.py")]
    return {module_name(p): p for p in paths}


def resolve(name: str) -> str | None:
    """The project module ``name`` is or is in (``qsched.ledger.base.Instance`` -> its module)."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def imports(module: str) -> frozenset[str]:
    """The project modules ``module`` names in its import statements."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for name in names if (target := resolve(name)) and target != module}
    return frozenset(found)


def floor(module: str) -> int:
    best, level = "", -1
    for n, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, level = prefix, n
    assert level >= 0, f"{module} is on no floor: add it to FLOORS"
    return level


def runs(module: str) -> set[str]:
    """What importing the targets of ``module`` runs: each target and its packages,
    but not the packages ``module`` is itself in."""
    own = {module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)}
    found = set()
    for target in imports(module):
        parts = target.split(".")
        found |= {".".join(parts[:n]) for n in range(1, len(parts) + 1)} - own - {module}
    return found


def test_every_module_has_a_floor() -> None:
    for module in modules():
        floor(module)


def test_no_module_imports_one_above_its_floor() -> None:
    upward = [
        f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})"
        for module in sorted(modules())
        for target in sorted(imports(module))
        if floor(target) > floor(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circle() -> None:
    graph = {module: runs(module) for module in modules()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circle = [*path[path.index(target) :], target]
                pytest.fail("import circle: " + " -> ".join(circle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_circle_check_would_see_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old bus <-> consumer pair of the kombu bus, put back: the check must fail."""
    real = imports.__wrapped__

    def with_circle(module: str) -> frozenset[str]:
        extra = {"qsched.bus.kombu.bus"} if module == "qsched.bus.kombu.consumer" else set()
        return real(module) | extra

    monkeypatch.setattr(f"{__name__}.imports", with_circle)
    with pytest.raises(pytest.fail.Exception, match="import circle"):
        test_no_import_circle()


def test_only_the_options_and_the_entry_points_know_oslo_config() -> None:
    readers = sorted(
        module
        for module, path in modules().items()
        if "oslo_config" in path.read_text() and floor(module) < len(FLOORS) - 1
    )
    unexpected = [m for m in readers if not m.startswith(CONFIG_READERS)]
    assert not unexpected, f"below the entry points, only options are passed: {unexpected}"
