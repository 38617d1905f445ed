"""The loopback address, free ports and open ones, and this machine's address on its
network, for harnesses that start servers."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port nobody listens on now, on the loopback interface."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``host``:``port`` now."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


#: Where :func:`outward_address` pretends to send (TEST-NET-3, RFC 5737): nothing is sent.
_SOMEWHERE = ("203.0.113.1", 9)


def outward_address() -> str | None:
    """This machine's IPv4 address on the interface its default route leaves by, or None
    without such a route (loopback only). Connecting a UDP socket only picks the route:
    no packet leaves."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(_SOMEWHERE)
        except OSError:
            return None
        address = str(sock.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address
