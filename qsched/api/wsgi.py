"""The in-process WSGI server: the standard library's, one thread per connection.

What serves the application where no WSGI server of production runs: ``qsched-api``
(:mod:`qsched.cmd.api`), the embedded default (:mod:`qsched.embedded`), the benches
and the tests. In production the same application runs under gunicorn
(``gunicorn qsched.api.app:wsgi_app``). It imports nothing of qsched's.

Each request's line from the server is logged at DEBUG here; the application's own
access line, with the request's ids, is :mod:`qsched.api.app`'s, at INFO.
"""

from __future__ import annotations

import logging
import socketserver
from collections.abc import Callable
from typing import Any
from wsgiref import simple_server

LOG = logging.getLogger(__name__)


class _Handler(simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # The application logs every request with its request id already.
        LOG.debug("%s " + format, self.address_string(), *args)


class ThreadingWSGIServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    """One thread per connection; a deep accept backlog so a burst is queued, not refused."""

    daemon_threads = True
    request_queue_size = 1024


def make_server(
    application: Callable[..., Any], host: str = "127.0.0.1", port: int = 8774
) -> ThreadingWSGIServer:
    """A threaded WSGI server bound to ``host:port`` (port 0: any free one, see
    ``server.server_port``); call ``serve_forever()`` on it, ``shutdown()`` from another
    thread to stop."""
    server = simple_server.make_server(
        host, port, application, server_class=ThreadingWSGIServer, handler_class=_Handler
    )
    assert isinstance(server, ThreadingWSGIServer)
    return server
