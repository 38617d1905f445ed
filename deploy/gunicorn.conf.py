# gunicorn settings for qsched-api (see deploy/systemd/qsched-api.service).
# The application reads its own config from the files in QSCHED_CONFIG; that
# file sets [api] auth_strategy = keystone (see deploy/qsched.conf), since this
# binds every address. With noauth2 on such a bind qsched-api refuses to start.
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


def on_starting(server):
    # Refuse noauth2 on a public bind in the master, before any worker starts.
    from qsched.api.app import check_bind

    check_bind(server.cfg.bind)


def post_worker_init(worker):
    # Build the application (and start the reaper and janitor) when the worker
    # starts, not on its first request.
    from qsched.api.app import wsgi_app

    wsgi_app.ensure_loaded(bind=worker.cfg.bind)
