"""The connection the stores of a cell share: the health ping and the harness chores.

Kept apart from the record interfaces (the other modules of :mod:`qsched.ledger.base`):
nothing here reads or writes a record, except :meth:`Backend.forget_cell`, which drops a
whole cell for a harness that shares a server.
"""

from __future__ import annotations

import abc

from qsched import exception

#: the categories of :class:`LedgerUnavailable`
TIMED_OUT = "timed out"
UNREACHABLE = "unreachable"
ERROR = "error"


class LedgerUnavailable(exception.BackendUnavailable):
    """The ledger did not answer a health ping.

    ``category`` is one word fit for a public health page: ``timed out``,
    ``unreachable`` or ``error``; ``reason`` is for logs only.
    """

    msg_fmt = "the ledger does not answer ({category}): {reason}"
    category: str
    reason: object  # the client's error


class Backend(abc.ABC):
    """The connection the stores of a cell share: its health, and the chores of harnesses."""

    @abc.abstractmethod
    def ping(self) -> None:
        """One round trip to the ledger's server: the health check (O(1)).

        :raises LedgerUnavailable: with the category of the failure.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Close this process's connections; the stores reconnect if used again.

        :raises: nothing.
        """

    @abc.abstractmethod
    def is_empty(self) -> bool:
        """True when the server holds nothing at all, of any cell (O(1)).

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def command_stats(self) -> dict[str, tuple[int, int]]:
        """Calls and microseconds so far of each command of the whole server; empty when
        the server does not tell (an embedded one, or INFO refused).

        :raises: nothing: no figures is not a failure.
        """

    @abc.abstractmethod
    def server_cpu_ms(self) -> float:
        """CPU milliseconds (user and system) the whole server has used so far; 0 when
        the server does not tell (an embedded one, or INFO refused).

        :raises: nothing: no figure is not a failure.
        """

    @abc.abstractmethod
    def forget_cell(self) -> int:
        """Delete every record of this cell, and nothing else; return how many keys went.

        For harnesses sharing a server (a benchmark's or a test's own cell); it scans.

        :raises BackendUnavailable:
        """
