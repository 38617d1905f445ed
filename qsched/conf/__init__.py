"""Configuration: one module per section, read once at an entry point.

Each section module holds its oslo.config options and a frozen
:class:`~qsched.conf.base.Section` value of them (``LedgerOptions``,
``AgentOptions``, ...). An entry point (``qsched-api``'s app loader,
``qsched-agent``, the embedded stack, ``qsched-admin``) parses one
``cfg.ConfigOpts`` with :func:`load`, builds :class:`Options` from it and hands
each service the sections it needs. Nothing below an entry point holds a
``ConfigOpts``; nothing here keeps a global. A service's entry point also sets
its logging up from the same ``ConfigOpts`` (:mod:`qsched.conf.log`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Self

from oslo_config import cfg

from qsched import exception
from qsched.conf.agent import AgentOptions
from qsched.conf.api import APIOptions
from qsched.conf.bus import BusOptions
from qsched.conf.cells import CellsOptions
from qsched.conf.ledger import LedgerOptions
from qsched.conf.log import register_log_opts, setup_logging
from qsched.conf.notifications import NotificationOptions
from qsched.conf.opts import list_opts
from qsched.conf.quota import QuotaOptions
from qsched.conf.scheduler import SchedulerOptions

__all__ = [
    "APIOptions",
    "AgentOptions",
    "BusOptions",
    "CellsOptions",
    "LedgerOptions",
    "NotificationOptions",
    "Options",
    "QuotaOptions",
    "SchedulerOptions",
    "list_opts",
    "load",
    "load_options",
    "read_options",
    "register_opts",
    "setup_logging",
]


@dataclasses.dataclass(frozen=True)
class Options:
    """Every section, as one service's entry point read them."""

    api: APIOptions
    scheduler: SchedulerOptions
    agent: AgentOptions
    bus: BusOptions
    ledger: LedgerOptions
    quota: QuotaOptions
    notifications: NotificationOptions
    cells: CellsOptions

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> Self:
        """Read every section of a ConfigOpts made by :func:`load`."""
        return cls(
            api=APIOptions.from_conf(conf),
            scheduler=SchedulerOptions.from_conf(conf),
            agent=AgentOptions.from_conf(conf),
            bus=BusOptions.from_conf(conf),
            ledger=LedgerOptions.from_conf(conf),
            quota=QuotaOptions.from_conf(conf),
            notifications=NotificationOptions.from_conf(conf),
            cells=CellsOptions.from_conf(conf),
        )

    @classmethod
    def defaults(cls) -> Self:
        """Every section as shipped."""
        return cls.from_conf(load())


def register_opts(conf: cfg.ConfigOpts) -> None:
    """Register every qsched option on ``conf``, one group per section."""
    for group, opts in list_opts():
        conf.register_opts(opts, group=group)


def load(
    args: Sequence[str] = (), config_files: Sequence[str] = (), service: bool = False
) -> cfg.ConfigOpts:
    """Return a new ConfigOpts with qsched's options, parsed from ``args`` and files.

    ``service``: the entry point of a long-running service, which takes oslo.log's
    options too (``--debug``, ``[DEFAULT] log_file``, ...) for :func:`setup_logging`.
    """
    conf = cfg.ConfigOpts()
    register_opts(conf)
    if service:
        register_log_opts(conf)
    conf(list(args), project="qsched", default_config_files=list(config_files))
    return conf


def read_options(conf: cfg.ConfigOpts) -> Options:
    """:meth:`Options.from_conf` for an entry point, which reports a refused option in
    one line: every refusal an :class:`~qsched.exception.Invalid` naming the option,
    a value oslo.config refuses (out of range, not a number) as one a section refuses
    (a ``[cells]`` line that does not parse).

    :raises Invalid: an option that cannot be read.
    """
    try:
        return Options.from_conf(conf)
    except cfg.Error as exc:
        raise exception.Invalid(reason=str(exc)) from None


def load_options(args: Sequence[str] = (), config_files: Sequence[str] = ()) -> Options:
    """:func:`load`, then every section read once."""
    return Options.from_conf(load(args, config_files))
