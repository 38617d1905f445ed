# gunicorn settings for qsched-api (see deploy/systemd/qsched-api.service).
# The application reads its own config from the files in QSCHED_CONFIG; that
# file sets [api] auth_strategy = keystone (see deploy/qsched.conf), since this
# binds every address. With noauth2 on such a bind qsched-api refuses to start.
import contextlib
import glob
import multiprocessing
import os
import tempfile

bind = "0.0.0.0:8774"
# Threads, not processes, carry the concurrency: a request mostly waits on Redis
# and the broker's publisher confirm.
workers = max(2, multiprocessing.cpu_count())
worker_class = "gthread"
threads = 16
# A boot waits for at most one publisher confirm ([bus] confirm_timeout_s).
timeout = 30
graceful_timeout = 20
keepalive = 5
max_requests = 100000
max_requests_jitter = 10000
accesslog = "-"

# Prometheus (docs/metrics.rst): each worker counts in its own files in one directory
# and a scrape of /metrics on any worker sums them all. prometheus_client reads
# PROMETHEUS_MULTIPROC_DIR when it is imported, so the master sets it before it
# imports qsched: a directory of its own unless the environment names one (e.g.
# systemd's RuntimeDirectory). A new master counts from zero.
_OWN_METRICS = "qsched-api-metrics-"


def _clear_metrics():
    for path in glob.glob(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], "*.db")):
        os.remove(path)


def on_starting(server):
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix=_OWN_METRICS)
    _clear_metrics()
    # Refuse noauth2 on a public bind in the master, before any worker starts.
    from qsched.api.app import check_bind

    try:
        check_bind(server.cfg.bind)
    except Exception:
        on_exit(server)
        raise


def post_worker_init(worker):
    # Build the application (and start the reaper and janitor) when the worker
    # starts, not on its first request.
    from qsched.api.app import wsgi_app

    wsgi_app.ensure_loaded(bind=worker.cfg.bind)


def child_exit(server, worker):
    # A worker's counters stay in the sums (they must never go back); its live gauges go.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    _clear_metrics()
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    if os.path.basename(directory).startswith(_OWN_METRICS):
        with contextlib.suppress(OSError):
            os.rmdir(directory)
