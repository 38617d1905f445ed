"""qsched-api: serve the compute API in this process.

``qsched-api --config-file /etc/qsched/qsched.conf`` listens on ``[api] host`` and
``[api] port`` with the threaded WSGI server of the standard library
(:mod:`qsched.api.wsgi`): enough for the embedded default and a laptop. In production
run the same application under gunicorn (``QSCHED_CONFIG=... gunicorn
qsched.api.app:wsgi_app``), several workers behind a load balancer. SIGTERM or SIGINT
stops it after the requests in flight. It logs through oslo.log
(:mod:`qsched.conf.log`): ``--debug`` or ``[DEFAULT] debug = true`` logs at DEBUG,
each request's line from the WSGI server too.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.api import auth
from qsched.api.wsgi import make_server
from qsched.ledger.durability import DurabilityRefused

LOG = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """``qsched-api [--config-file FILE]... [--debug] [oslo.log's other options]``."""
    conf = qconf.load(sys.argv[1:] if argv is None else argv, service=True)
    try:
        options = api_app.read_options(conf)
        application, bus = api_app.serve(conf, api_app.default_bus, [options.api.host])
    except auth.RefusedOptions as exc:  # refused before logging is set up: said on stderr
        print(f"qsched-api: {exc}", file=sys.stderr)
        return 2
    except DurabilityRefused as exc:  # the ledger's server cannot keep the promise: the fix
        print(f"qsched-api: {exc}", file=sys.stderr)
        return 2
    server = make_server(application, options.api.host, options.api.port)

    def stop(signum: int, frame: FrameType | None) -> None:
        LOG.info("signal %s: stopping", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if options.bus.transport_url.startswith("memory://"):
        LOG.warning("transport_url is memory://: only agents in this process see the requests")
    LOG.info("qsched-api listening on http://%s:%s/v2.1", options.api.host, server.server_port)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        bus.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
