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
import importlib
import inspect
import typing
from pathlib import Path

import pytest

from tests.helpers import ROOT

#: Floors, lowest first, by package. A module may import modules on its floor or below,
#: never above. The longest matching prefix gives a module's floor.
FLOORS: list[tuple[str, ...]] = [
    # support: what every part uses (errors, options, request context, the network)
    ("qsched", "qsched.exception", "qsched.resources", "qsched.conf", "qsched.net",
     "qsched.context", "qsched.policies", "qsched.urls", "qsched.periodic"),
    # vocabulary: the words everything above may name (the ledger's interfaces and
    # records, the images interface, flavors, aggregates, policy)
    ("qsched.flavors", "qsched.aggregates", "qsched.policy", "qsched.images",
     "qsched.ledger.base", "qsched.ledger.records", "qsched.ledger.keys"),
    ("qsched.scheduling",),  # the contract between the front door and the agents
    # the backends; and the API's metrics, which count what the bus did not publish
    ("qsched.ledger", "qsched.bus", "qsched.images.glance", "qsched.notifications",
     "qsched.metrics"),
    ("qsched.recovery",),  # what the API service and the agents both run
    ("qsched.compute", "agents"),  # the front door of a cell | the compute agent (APART)
    ("qsched.cells",),  # several cells behind one front door
    ("qsched.api", "qsched.admin"),  # the edges
    # entry points and harnesses: they read the configuration and build the rest
    ("agents.main", "qsched.embedded", "qsched.cmd", "qsched.stack", "qsched.bench",
     "qsched.chaos"),
]  # fmt: skip
#: Packages that never import each other, whatever their floors: the compute agent
#: (its entry point too) runs below the front door and knows nothing of it.
APART: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("agents", ("qsched.compute", "qsched.cells", "qsched.api", "qsched.admin")),
)
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
def imports(module: str, typing_too: bool = True) -> frozenset[str]:
    """The project modules ``module`` names in its import statements; without
    ``typing_too``, those that run (not the ones under ``if TYPE_CHECKING:``)."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree) if _typing_block(block)
                   for node in ast.walk(block)}  # fmt: skip
    for node in ast.walk(tree):
        if not typing_too and id(node) in typing_only:
            continue
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


def _typing_block(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: what it imports names types, nothing runs."""
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and (node.test.id == "TYPE_CHECKING")
    )


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
    for target in imports(module, typing_too=False):
        parts = target.split(".")
        found |= {".".join(parts[:n]) for n in range(1, len(parts) + 1)} - own - {module}
    return found


def test_every_module_imports() -> None:
    """A name an import statement asks of a moved module (``from qsched import message``
    after the boot request moved to qsched.scheduling) fails here, not at its first use."""
    failed = []
    for module in sorted(modules()):
        try:
            importlib.import_module(module)
        except Exception as exc:  # what each failed with, all at once
            failed.append(f"{module}: {exc!r}")
    assert not failed, "\n".join(failed)


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


def crossings() -> list[str]:
    """The imports that :data:`APART` forbids."""
    return [
        f"{module} imports {target}"
        for package, forbidden in APART
        for module in sorted(modules())
        if module == package or module.startswith(package + ".")
        for target in sorted(imports(module))
        if target.startswith(tuple(f"{f}." for f in forbidden)) or target in forbidden
    ]


def test_the_agent_imports_no_front_door() -> None:
    """Nothing under agents/ imports the compute front door, cells or the edges: what
    the agent shares with the API service (requeueing an orphan, the reaper) lives in
    qsched.recovery or below."""
    found = crossings()
    assert not found, "\n".join(found)


def test_the_apart_check_would_see_a_planted_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """agents.reconcile importing the janitor when the janitor imported cells (the chain
    agents.reconcile -> janitor -> cells -> compute of before), put back: it must fail."""
    real = imports.__wrapped__

    def planted(module: str, typing_too: bool = True) -> frozenset[str]:
        extra = {"qsched.cells.router"} if module == "agents.reconcile" else set()
        return real(module, typing_too) | extra

    monkeypatch.setattr(f"{__name__}.imports", planted)
    with pytest.raises(AssertionError, match=r"agents\.reconcile imports qsched\.cells\.router"):
        test_the_agent_imports_no_front_door()


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

    def with_circle(module: str, typing_too: bool = True) -> frozenset[str]:
        extra = {"qsched.bus.kombu.bus"} if module == "qsched.bus.kombu.consumer" else set()
        return real(module, typing_too) | extra

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


def front_door_calls() -> set[str]:
    """The public calls of the front door: :class:`FrontDoor`'s and those of the parts
    it declares (``keypairs``, ``aggregates``, ...)."""
    from qsched.compute.front_door import FrontDoor

    def public(cls: type) -> set[str]:
        return {n for n, v in inspect.getmembers(cls, callable) if not n.startswith("_")}

    parts = [
        part
        for part in typing.get_type_hints(FrontDoor).values()
        if inspect.isclass(part) and part.__module__.startswith("qsched.compute.")
    ]
    assert len(parts) >= 8, parts  # its keypairs, actions, ..., aggregates and quotas
    return public(FrontDoor).union(*(public(part) for part in parts))


def cells_classes() -> dict[str, type]:
    """Every class the cells package defines, by its qualified name."""
    found = {}
    for module in sorted(m for m in modules() if m.startswith("qsched.cells.")):
        loaded = importlib.import_module(module)
        for name, cls in vars(loaded).items():
            if inspect.isclass(cls) and cls.__module__ == module:
                found[f"{module}.{name}"] = cls
    return found


def twins(classes: dict[str, type]) -> list[str]:
    """The methods of ``classes`` that repeat a call of the front door by name."""
    calls = front_door_calls()
    return [
        f"{name}.{method} repeats the front door's {method}"
        for name, cls in sorted(classes.items())
        for method, value in vars(cls).items()
        if method in calls and callable(value)
    ]


def test_a_front_door_call_is_written_once() -> None:
    """One front door over the cells it targets (Nova's cells v2), not a cells class
    per call (cells v1): the cells package chooses a cell, maps, gathers and writes to
    every cell, and none of its classes has a method named as a call of the front
    door; ``boot_many`` is defined once, by the one implementation of the protocol."""
    from qsched.compute.api import ComputeAPI
    from qsched.compute.front_door import FrontDoor

    assert typing.Protocol in FrontDoor.__bases__
    for call in front_door_calls() & {n for n in vars(FrontDoor) if not n.startswith("_")}:
        declared = inspect.signature(getattr(FrontDoor, call)).parameters
        assert inspect.signature(getattr(ComputeAPI, call)).parameters.keys() == declared.keys()
    assert not twins(cells_classes()), "\n".join(twins(cells_classes()))
    defined = [
        module
        for module, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "boot_many"
    ]
    assert sorted(defined) == ["qsched.compute.api", "qsched.compute.front_door"]


def test_the_twin_check_would_see_a_cells_class_with_a_front_door_call() -> None:
    """CellsComputeAPI of before, a cells class with its own ``get`` and ``boot_many``."""

    class CellsComputeAPI:
        def get(self) -> None: ...

        def boot_many(self) -> None: ...

        def boot_into(self) -> None: ...  # about cells: not a call of the front door

    found = twins({"qsched.cells.planted.CellsComputeAPI": CellsComputeAPI})
    assert [line.split(" ")[0] for line in found] == [
        "qsched.cells.planted.CellsComputeAPI.get",
        "qsched.cells.planted.CellsComputeAPI.boot_many",
    ]
