# gunicorn settings for qsched-api (see deploy/systemd/qsched-api.service).
# The application reads its own config from the files in QSCHED_CONFIG.
import multiprocessing

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


def post_worker_init(worker):
    # Build the application (and start the reaper and janitor) when the worker
    # starts, not on its first request.
    from qsched.api.app import wsgi_app

    wsgi_app.ensure_loaded()
