"""Logging: oslo.log's own options, set up once by each service's entry point.

The services (``qsched-api``, under gunicorn too, and ``qsched-agent``) log
through oslo.log as every OpenStack service does, with its option names in
``[DEFAULT]``: ``debug`` (``--debug``), ``log_file`` and ``log_dir``,
``use_journal``, ``use_json``, ``use_syslog``, ``default_log_levels``,
``log_config_append`` and the format strings. ``oslo-config-generator
--namespace oslo.log`` lists them. Without ``log_file`` a service logs to stdout.

oslo.log's options are command-line options as well, so they are registered
before the arguments are parsed: :func:`qsched.conf.load` with ``service=True``.
Only a service does that: oslo.log's registration gives the root logger a
handler when it has none, which would silence a tool's own ``basicConfig``.

A log line written while an API request is served names it as oslo.log's
context format does, ``[global_request_id request_id user project ...]``: the
API keeps each request's context in oslo.context's per-thread store
(:func:`qsched.context.start_request`), where oslo.log's formatter reads it.
"""

from __future__ import annotations

from oslo_config import cfg
from oslo_log import log

#: The product name oslo.log is set up with (what syslog and the journal see).
PRODUCT = "qsched"


def register_log_opts(conf: cfg.ConfigOpts) -> None:
    """Register oslo.log's options on ``conf``, before it parses any argument."""
    log.register_options(conf)


def setup_logging(conf: cfg.ConfigOpts) -> None:
    """Set the process's logging up from ``conf``'s oslo.log options (entry points only).

    Replaces the root logger's handlers; ``default_log_levels`` sets the libraries'.
    """
    log.setup(conf, PRODUCT)
