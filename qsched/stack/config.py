"""The files a stack's processes read: the qsched INI file and gunicorn's settings.

A caller names only the options it sets; everything else keeps its default, as
in a deployment's file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: section -> option -> value; a list or tuple repeats the option (``flavor``)
Options = Mapping[str, Mapping[str, Any]]

POST_WORKER_INIT = """

def post_worker_init(worker):
    from qsched.api.app import wsgi_app

    wsgi_app.ensure_loaded(bind=worker.cfg.bind)
"""


@dataclasses.dataclass(frozen=True)
class CellConfig:
    """Where one stack's ledger and bus live, and the options its caller sets.

    ``prefix`` names the stack's queues and exchanges and ``cell`` (when set) its
    ledger keys, so that a stack on shared servers can remove exactly its own.
    """

    transport_url: str
    ledger_url: str
    prefix: str
    cell: str | None = None
    options: Options = dataclasses.field(default_factory=dict)

    def sections(self) -> dict[str, dict[str, Any]]:
        ledger: dict[str, Any] = {"url": self.ledger_url}
        if self.cell is not None:
            ledger["cell"] = self.cell
        where = {"DEFAULT": {"transport_url": self.transport_url}, "bus": {"prefix": self.prefix}}
        return merged({**where, "ledger": ledger}, self.options)

    def write(self, path: Path) -> Path:
        path.write_text(ini_text(self.sections()))
        return path


def ini_text(sections: Options) -> str:
    """An INI file oslo.config reads back to the same values."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for name, value in values.items():
            lines += [f"{name} = {one}" for one in _each(value)]
        lines.append("")
    return "\n".join(lines)


def merged(*layers: Options | None) -> dict[str, dict[str, Any]]:
    """The options of every layer, a later one winning option by option."""
    found: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in (layer or {}).items():
            found.setdefault(section, {}).update(values)
    return found


def _each(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


@dataclasses.dataclass(frozen=True)
class GunicornConfig:
    """The API's gunicorn settings (gthread workers); None leaves a setting to ``base``.

    ``load_at_start`` builds the application (and starts its reaper) as each
    worker starts rather than on its first request. ``base`` is a settings file
    read first, such as the deployment's ``deploy/gunicorn.conf.py``.
    """

    workers: int = 2
    threads: int = 8
    timeout_s: int | None = None
    graceful_timeout_s: int | None = None
    keepalive_s: int | None = None
    load_at_start: bool = False
    base: Path | None = None
    env: tuple[tuple[str, str], ...] = ()  # gunicorn's raw_env: set in the master

    def text(self, bind: str) -> str:
        settings = {
            "bind": bind,
            "workers": self.workers,
            "worker_class": "gthread",
            "threads": self.threads,
            "timeout": self.timeout_s,
            "graceful_timeout": self.graceful_timeout_s,
            "keepalive": self.keepalive_s,
            "raw_env": [f"{name}={value}" for name, value in self.env] or None,
        }
        lines = ["# gunicorn settings of one qsched stack, written by qsched.stack."]
        if self.base is not None:
            lines += [
                "import runpy",
                f"_base = runpy.run_path({str(self.base.resolve())!r})",
                "globals().update((k, v) for k, v in _base.items() if not k.startswith('__'))",
            ]
        lines += [f"{name} = {value!r}" for name, value in settings.items() if value is not None]
        return "\n".join(lines) + "\n" + (POST_WORKER_INIT if self.load_at_start else "")
