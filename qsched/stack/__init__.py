"""Real qsched stacks as separate processes, for the harnesses and the real-server tests.

:class:`ProcessStack` starts ``qsched-api`` under gunicorn and agent processes
on a real Redis ledger and RabbitMQ or kombu's Redis transport, every process
reading the same INI file (:class:`CellConfig`) as a deployment would, and
removes the stack's queues (and its cell's keys, when it has its own cell)
afterwards: nothing is flushed. ``qsched-bench``, ``qsched-chaos`` and
``tests/cloud.py`` build on it.

Modules: :mod:`.config` (the INI and gunicorn files), :mod:`.processes` (the
processes, readiness, logs) and :mod:`.cleanup` (removing keys and queues).
"""

from qsched.net import LOOPBACK, free_port
from qsched.stack.config import CellConfig, GunicornConfig, Options, merged
from qsched.stack.processes import ProcessStack, StackFailed, http_call, new_prefix

__all__ = [
    "LOOPBACK",
    "CellConfig",
    "GunicornConfig",
    "Options",
    "ProcessStack",
    "StackFailed",
    "free_port",
    "http_call",
    "merged",
    "new_prefix",
]
