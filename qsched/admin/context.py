"""What every qsched-admin command shares: its configuration, the stores and bus it
opens on first use, the shared options, and expected failures as one-line errors.

Exit codes: 0 ok, 1 an error (unreachable Redis or broker, unknown id, a
conflict), 2 a usage error (bad option, unreadable config file, invalid value).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
from oslo_config import cfg

from qsched import conf as qconf
from qsched import exception
from qsched.admin import views
from qsched.bus import Bus, BusUnavailable, open_bus
from qsched.cells.join import UnknownCell, api_ledger, cell_ledger
from qsched.compute.api import ComputeAPI
from qsched.context import ADMIN, MEMBER, READER, RequestContext
from qsched.ledger import Stores, open_stores
from qsched.urls import masked

F = TypeVar("F", bound=Callable[..., Any])

# overwrite=False: made at import, it is no thread's current context (what logs name)
ADMIN_CONTEXT = RequestContext.for_project(
    "admin", "admin", (ADMIN, MEMBER, READER), "req-qsched-admin", overwrite=False
)

CONFIG_HELP = (
    "INI file(s) read with oslo.config, as the services read them; later files override "
    "earlier ones. Default: $QSCHED_CONFIG."
)


class AdminError(click.ClickException):
    """An expected failure: one line on stderr, no traceback, exit code 1."""

    exit_code = 1


class AdminUsageError(AdminError):
    """Bad input that got past the option parser (an invalid value): exit code 2."""

    exit_code = 2


def load_options(config_files: tuple[str, ...]) -> qconf.Options:
    """The options of one command run: the admin CLI's entry point reads them once.

    :raises AdminUsageError: a file that does not parse, or an option refused (a value
        out of range, a ``[cells]`` line that does not parse).
    """
    try:
        return qconf.load_options(config_files=config_files)
    except cfg.Error as exc:
        raise AdminUsageError(f"cannot read the configuration: {exc}") from None
    except exception.Invalid as exc:
        raise AdminUsageError(str(exc)) from None


class Admin:
    """The configuration of one command run and what it opens, opened on first use."""

    def __init__(self, config_files: tuple[str, ...]) -> None:
        self.config_files = config_files
        self.options = load_options(config_files)
        self.cell: str | None = None  # a [cells] cell this run works on (use_cell)
        self._stores: Stores | None = None
        self._api_stores: Stores | None = None
        self._bus: Bus | None = None

    def use_cell(self, name: str | None) -> None:
        """Work on the ``[cells] cell`` named ``name`` (None: ``[ledger] cell``): its
        line's ledger URL and name replace ``[ledger] url`` and ``cell`` for the stores
        of this run; those of a cell worked on before are closed.

        :raises AdminUsageError: no ``[cells] cell`` line names it.
        """
        if self._stores is not None:
            self._stores.backend.close()
            self._stores = None
        try:
            ledger = cell_ledger(self.options.cells, self.options.ledger, name)
        except UnknownCell:
            known = ", ".join(spec.name for spec in self.options.cells.specs())
            asked = (
                f"--cell {name}"
                if name is not None
                else f"[ledger] cell {self.options.ledger.cell}"
            )
            raise AdminUsageError(f"{asked}: no [cells] cell line names it ({self.where()}); "
                                  f"give --cell one of {known}") from None  # fmt: skip
        self.options = dataclasses.replace(self.options, ledger=ledger)
        self.cell = ledger.cell

    @property
    def api_stores(self) -> Stores:
        """The API keyspace's stores (``[cells] api_url``), with cells named.

        :raises AdminUsageError: ``[cells]`` names no cell.
        """
        if self._api_stores is None:
            try:
                ledger = api_ledger(self.options.cells, self.options.ledger)
            except exception.Invalid as exc:
                raise AdminUsageError(str(exc)) from None
            self._api_stores = open_stores(ledger, self.options.quota)
        return self._api_stores

    @property
    def stores(self) -> Stores:
        if self._stores is None:
            self._stores = open_stores(self.options.ledger, self.options.quota)
            self._warn_if_alone(self._stores)
        return self._stores

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            self._bus = open_bus(self.options.bus)
        return self._bus

    @functools.cached_property
    def compute(self) -> ComputeAPI:
        return ComputeAPI(self.stores, self.bus, self.options.scheduler, self.options.api)

    @property
    def max_attempts(self) -> int:
        return self.options.scheduler.max_attempts

    @staticmethod
    def now() -> float:
        return time.time()

    def close(self) -> None:
        if self._bus is not None:
            self._bus.close()

    def _warn_if_alone(self, stores: Stores) -> None:
        url = self.options.ledger.url
        if url.startswith("fakeredis://") and stores.backend.is_empty():
            click.echo(
                f"warning: [ledger] url is {url}, a ledger inside this command that nothing "
                "else shares, and it is empty. Pass --config-file with the deployment's "
                "qsched.conf (docs/admin.rst says how to inspect qsched-demo --serve).",
                err=True,
            )

    def where(self) -> str:
        return ", ".join(self.config_files) or "no --config-file: built-in defaults"


def explain(exc: Exception, admin: Admin, hint: str = "") -> AdminError:
    """An expected failure as a one-line error that says what to do."""
    if isinstance(exc, BusUnavailable):
        what = str(exc).rstrip(".")
        return AdminError(
            f"{what}. Check transport_url ({admin.where()}) and that the broker runs."
        )
    if isinstance(exc, exception.BackendUnavailable):
        url = masked(admin.options.ledger.url)
        reason = exc.kwargs.get("reason", exc)
        option = f"[cells] cell {admin.cell}" if admin.cell else "[ledger] url"
        return AdminError(
            f"the ledger (Redis at {url}) is unreachable: {str(reason).rstrip('.')}. "
            f"Check {option} ({admin.where()}) and that Redis runs."
        )
    if isinstance(exc, exception.NotFound):
        return AdminError(f"{exc} {hint}".strip())
    if isinstance(exc, exception.Invalid):
        return AdminUsageError(str(exc))
    return AdminError(str(exc))


EXPECTED = (exception.QschedError,)


def config_option(envvar: str | None = None) -> Callable[[F], F]:
    """``--config-file`` (repeatable), read from ``envvar`` when not given."""
    return click.option(
        "--config-file",
        "config_files",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False),
        envvar=envvar,
        help=CONFIG_HELP,
    )


def admin_command(not_found: str = "") -> Callable[[F], F]:
    """Give a command ``--config-file`` and an :class:`Admin` as first argument.

    ``not_found`` is appended to "not found" errors: where to look up the right id.
    Expected failures become :class:`AdminError`; the bus is closed in any case.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, config_files: tuple[str, ...], **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            files = config_files or (ctx.obj or {}).get("config_files", ())
            admin = Admin(tuple(files))
            try:
                return fn(admin, *args, **kwargs)
            except EXPECTED as exc:
                raise explain(exc, admin, not_found) from None
            finally:
                admin.close()

        return config_option()(run)  # type: ignore[return-value]

    return decorate


def output_option(*formats: str) -> Callable[[F], F]:
    """``--format`` / ``-f``: one of ``formats``, the first being the default."""
    choices = formats or views.FORMATS
    return click.option(
        "--format",
        "-f",
        "fmt",
        type=click.Choice(choices),
        default=choices[0],
        show_default=True,
        help="table for people; json (and csv for listings) for scripts.",
    )
