"""The WSGI application: its assembly, middleware, Nova-format errors and loading.

:func:`create_app` builds it from the ledger stores, a bus and the ``[api]`` and
``[scheduler]`` options (tests and the embedded demo pass their own);
:func:`create_cells_app` from the front door of several cells (``[cells]``,
docs/scale.rst), every route across them (the table of :mod:`qsched.api.routes`).
For a WSGI server, ``wsgi_app`` in this module is the application itself, built on
its first request from the files named in ``QSCHED_CONFIG`` (``os.pathsep``-separated)::

    QSCHED_CONFIG=/etc/qsched/qsched.conf gunicorn qsched.api.app:wsgi_app

and ``load_app`` is the same as a factory (``gunicorn 'qsched.api.app:load_app()'``).
With ``[api] auth_strategy = noauth2`` the application answers 403 to every peer that
is not loopback, however it is served (:mod:`qsched.api.auth`); deploy/gunicorn.conf.py
also refuses to start on such a bind.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import falcon

from qsched import conf as qconf
from qsched import exception
from qsched.api import PREFIX, FrontDoor, auth, health, keystone, microversion, routes
from qsched.api import metrics as metrics_edge
from qsched.api.versions import LEGACY_PREFIX
from qsched.bus.base import Bus, Publisher
from qsched.cells import housekeeping
from qsched.cells.opening import front_door, open_cells
from qsched.cells.router import CellsCompute
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, BusOptions, Options, SchedulerOptions
from qsched.conf.glance import set_options as glance_set_options
from qsched.conf.keystone import auth_token_conf
from qsched.conf.policy import policy_enforcer
from qsched.context import global_request_id, start_request
from qsched.images.base import ImageService, OpaqueImages
from qsched.ledger import Stores, open_stores
from qsched.metrics import MULTIPROC_ENV, APIMetrics, NoMetrics
from qsched.notifications import NULL, Notifier, open_notifier
from qsched.policy import Policy

LOG = logging.getLogger(__name__)
CONFIG_ENV = "QSCHED_CONFIG"
#: Who sends the API service's notifications (its reaper's), as ``nova-api`` is Nova's.
PUBLISHER = "qsched-api"

# Nova's fault names (nova/api/openstack/wsgi.py habit); anything else is computeFault.
_FAULT_NAMES = {
    400: "badRequest",
    401: "unauthorized",
    403: "forbidden",
    404: "itemNotFound",
    405: "badMethod",
    406: "notAcceptable",
    409: "conflictingRequest",
    413: "overLimit",
    415: "badMediaType",
    429: "overLimit",
    501: "notImplemented",
    503: "serviceUnavailable",
}
_DEFAULT_MESSAGES = {
    404: "The resource could not be found.",
    405: "The method is not allowed for this resource.",
}
# Domain errors by HTTP status, most specific first (looked up along the MRO).
_STATUS: dict[type[Exception], int] = {
    exception.Forbidden: 403,
    exception.QuotaExceeded: 403,
    exception.NotFound: 404,
    exception.Invalid: 400,
    exception.Conflict: 409,
    exception.BackendUnavailable: 503,  # every ledger call raises it for an outage
}
# Responses escape everything outside ASCII, as Nova's jsonutils does, so any stored text
# renders: falcon's default writes raw UTF-8, and one lone surrogate kept in a record (as
# the API took them before it refused them) made a 500 of every listing that showed it.
_JSON_RESPONSES = falcon.media.JSONHandler(dumps=json.dumps)


def create_app(
    stores: Stores,
    bus: Bus | Publisher,
    api: APIOptions | None = None,
    scheduler: SchedulerOptions | None = None,
    policy: Policy | None = None,
    images: ImageService | None = None,
    conf: Any = None,
    metrics: APIMetrics | None = None,
    notifier: Notifier = NULL,
) -> falcon.App:
    """The qsched-api WSGI application; writes the configured flavors to the ledger.

    ``api`` and ``scheduler``: the ``[api]`` and ``[scheduler]`` options (None: as
    shipped); ``policy``: the rules (None: Nova's defaults); ``images``: where boots
    look their image up (None: nowhere, ``imageRef`` is opaque); ``conf``: the entry
    point's parsed configuration, for oslo.middleware's healthcheck to read
    ``[healthcheck]`` (None: as shipped; :mod:`qsched.api.health`); ``metrics``: what
    it counts and serves on ``/metrics`` (None: new ones, or none if ``[api] metrics``
    is off); ``notifier``: where the deletes ended here are told
    (docs/notifications.rst; by default nowhere).

    :raises Invalid, FlavorExists: a bad ``[api] flavor`` line.
    :raises BackendUnavailable: the ledger is unreachable.
    """
    api = api or APIOptions.defaults()
    metrics = metrics or api_metrics(api)
    compute = ComputeAPI(stores, bus, scheduler, api, policy, images, metrics, notifier)
    return _app(compute, api, metrics, conf)


def create_cells_app(
    front: CellsCompute,
    api: APIOptions | None = None,
    conf: Any = None,
    metrics: APIMetrics | None = None,
) -> falcon.App:
    """The qsched-api WSGI application over several cells (:func:`qsched.cells.opening.front_door`);
    writes the configured flavors to every joined cell.

    ``front``: the cells (:func:`qsched.cells.opening.open_cells`, whose cells
    carry the scheduler options, policy, images, metrics and notifier); ``api``,
    ``conf``, ``metrics``: as :func:`create_app`'s.

    :raises Invalid, FlavorExists: a bad ``[api] flavor`` line.
    :raises BackendUnavailable: a joined cell's ledger is unreachable.
    """
    api = api or APIOptions.defaults()
    return _app(front_door(front), api, metrics or api_metrics(api), conf)


def _app(compute: FrontDoor, api: APIOptions, metrics: APIMetrics, conf: Any) -> falcon.App:
    compute.seed_flavors()
    table = routes.table(compute, api.public_endpoint, api.max_request_body_bytes)
    table += metrics_edge.routes(metrics)
    middleware: list[Any] = [
        *metrics_edge.middleware(metrics),
        RequestMiddleware(routes.collections(template for template, _ in table)),
        _auth_middleware(api, compute.policy),
    ]
    app = falcon.App(middleware=middleware)
    app.req_options.strip_url_path_trailing_slash = True
    app.req_options.auto_parse_qs_csv = False
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = _JSON_RESPONSES
    app.set_error_serializer(_serialize_error)
    app.add_error_handler(Exception, _unexpected_error)
    app.add_error_handler(tuple(_STATUS), _domain_error)
    healthcheck = health.Healthcheck(compute.check_health, qconf.load() if conf is None else conf)
    app.add_route("/healthcheck", healthcheck)
    for template, resource in table:
        app.add_route(template, resource)
    return app


def _auth_middleware(api: APIOptions, policy: Policy) -> Any:
    """The middleware that puts the caller's context on each request, as ``[api]
    auth_strategy`` says; noauth2's refuses peers not on this machine."""
    if api.auth_strategy == "keystone":
        return keystone.KeystoneMiddleware(policy)  # behind auth_token: see authenticated()
    return auth.NoAuthMiddleware(policy, any_peer=api.allow_noauth2_on_public_address)


class RequestMiddleware:
    """A request id on every response and log line; API version headers; an access log.

    ``collections``: the first path segments of the v2.1 routes
    (:func:`qsched.api.routes.collections`).
    The log lines name the request through the thread's current context
    (:func:`qsched.context.start_request`, then the caller's once authenticated).
    """

    def __init__(self, collections: frozenset[str]) -> None:
        self.collections = collections

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        rid = f"req-{uuid.uuid4()}"
        req.context.request_id = rid
        req.context.global_request_id = global_request_id(req.get_header("X-OpenStack-Request-ID"))
        req.context.started = time.monotonic()
        start_request(rid, req.context.global_request_id)
        _route_path(req, self.collections)
        _check_microversion(req)

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, params: Any
    ) -> None:
        # after authentication: a project id in the URL must be the caller's, as in Nova
        url_project = getattr(req.context, "url_project_id", None)
        context = getattr(req.context, "compute", None)
        if url_project is not None and context is not None and url_project != context.project_id:
            raise falcon.HTTPBadRequest(
                description=f"Malformed request URL: URL's project_id '{url_project}' doesn't "
                f"match Context's project_id '{context.project_id}'"
            )

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, req_succeeded: bool
    ) -> None:
        rid = getattr(req.context, "request_id", "-")
        resp.set_header("x-openstack-request-id", rid)
        resp.set_header("x-compute-request-id", rid)
        resp.set_headers(microversion.headers(req))
        if LOG.isEnabledFor(logging.INFO):
            elapsed = time.monotonic() - getattr(req.context, "started", time.monotonic())
            LOG.info(
                '%s "%s %s" status: %s time: %.4f',
                req.remote_addr, req.method, req.relative_uri, resp.status, elapsed,
            )  # fmt: skip


def _route_path(req: falcon.Request, collections: frozenset[str]) -> None:
    """Serve the legacy ``/v2`` API and URLs with a project id as the v2.1 routes.

    ``/v2/...`` is v2.1 at 2.1 with no version headers (Nova's v2.0 compatibility
    API, without its lenient body checks). ``/v2.1/{project_id}/servers`` (the
    catalog form of older deployments; optional since 2.18) is ``/v2.1/servers``,
    and the project id is checked against the caller's once authenticated;
    ``collections`` tell a project id (never one of them) from a collection.
    """
    path = req.path
    if path.startswith(LEGACY_PREFIX + "/"):
        path = PREFIX + path[len(LEGACY_PREFIX) :]
        req.context.legacy_v2 = True
    if path.startswith(PREFIX + "/"):
        parts = path[len(PREFIX) + 1 :].split("/", 2)
        if len(parts) > 1 and parts[0] not in collections and parts[1] in collections:
            req.context.url_project_id = parts[0]
            path = f"{PREFIX}/{'/'.join(parts[1:])}"
    req.path = path


def _check_microversion(req: falcon.Request) -> None:
    """The request's microversion (``req.context.microversion``, and the response's
    version headers): 2.1 to :data:`qsched.api.microversion.MAX`; any other is 406,
    as Nova answers. The legacy ``/v2`` API reads no header and sends none."""
    if getattr(req.context, "legacy_v2", False):
        req.context.microversion = microversion.BASE
        microversion.answer(req, None)
        return
    version = microversion.requested(req)
    req.context.microversion = version
    microversion.answer(req, version)


# -- errors --


def nova_fault(resp: falcon.Response, code: int, message: str) -> None:
    """Write ``{"<faultName>": {"code": ..., "message": ...}}`` with that status."""
    resp.status = code
    resp.content_type = falcon.MEDIA_JSON
    name = _FAULT_NAMES.get(code, "computeFault")
    resp.text = json.dumps({name: {"code": code, "message": message}})


def _serialize_error(req: falcon.Request, resp: falcon.Response, error: falcon.HTTPError) -> None:
    code = falcon.http_status_to_code(error.status)
    nova_fault(resp, code, error.description or _DEFAULT_MESSAGES.get(code) or error.title)


def _domain_error(
    req: falcon.Request, resp: falcon.Response, error: Exception, params: Any
) -> None:
    code = next(_STATUS[c] for c in type(error).__mro__ if c in _STATUS)
    if code != 503:
        nova_fault(resp, code, str(error))
        return
    # Say what is down, not where it is: the full reason goes to the log only.
    LOG.warning("503: %s", error)
    what = error.service if isinstance(error, exception.BackendUnavailable) else "a service"
    message = f"The service is temporarily unavailable: {what} did not answer. Try again later."
    nova_fault(resp, 503, message)
    resp.set_header("Retry-After", "5")


def _unexpected_error(
    req: falcon.Request, resp: falcon.Response, error: Exception, params: Any
) -> None:
    if isinstance(error, falcon.HTTPError | falcon.HTTPStatus):
        raise error  # falcon's own handlers render these
    rid = getattr(req.context, "request_id", "-")
    LOG.exception("unexpected error in %s %s", req.method, req.path)
    nova_fault(resp, 500, f"Unexpected API Error. See the qsched-api log for request {rid}.")


# -- loading --


def load_app(
    config_files: Sequence[str] | None = None,
    open_bus: Callable[[BusOptions], Bus] | None = None,
    bind: Sequence[str] = (),
) -> keystone.WSGIApp:
    """Build the application from config files (default: ``$QSCHED_CONFIG``).

    The entry point of a WSGI server: the options are read here, once.
    ``bind``: where the server listens (gunicorn's ``bind`` setting).

    :raises RefusedOptions: options the API refuses to serve with (see :func:`check_bind`).
    """
    conf = qconf.load(config_files=_config_files(config_files), service=True)
    app, _bus = serve(conf, open_bus or default_bus, bind)
    return app


def check_bind(bind: Sequence[str], config_files: Sequence[str] | None = None) -> None:
    """Refuse a WSGI server's ``bind`` before it starts a worker (gunicorn's ``on_starting``).

    :raises RefusedOptions: options the API refuses to serve with
        (:func:`qsched.api.auth.refuse_bad_options`): noauth2 on a bind that is not
        loopback without ``[api] allow_noauth2_on_public_address``, Glance without Keystone,
        ``image_service = opaque`` with ``[glance]`` options set; or an option that
        cannot be read (:func:`read_options`).
    """
    conf = qconf.load(config_files=_config_files(config_files))
    options = read_options(conf)
    auth.refuse_bad_options(options.api, bind, glance_set_options(conf))


def read_options(conf: Any) -> Options:
    """Every section of ``conf``, the entry point's parsed configuration.

    :raises UnreadableOptions: an option that cannot be read (a value out of range, a
        ``[cells]`` line that does not parse), refused as the API refuses unsafe ones.
    """
    try:
        return qconf.read_options(conf)
    except exception.Invalid as exc:
        raise auth.UnreadableOptions(str(exc)) from None


def _config_files(config_files: Sequence[str] | None) -> Sequence[str]:
    if config_files is None:
        return [f for f in os.environ.get(CONFIG_ENV, "").split(os.pathsep) if f]
    return config_files


def authenticated(app: falcon.App, api: APIOptions, conf: Any) -> keystone.WSGIApp:
    """``app`` behind the configured authentication (an entry point's step).

    ``conf``: the entry point's parsed configuration. With ``auth_strategy =
    keystone`` it goes to keystonemiddleware's ``auth_token``
    (:func:`qsched.conf.keystone.auth_token_conf`), which registers and reads
    ``[keystone_authtoken]`` there; the decision is delayed so that the 401 is
    Nova's fault (:mod:`qsched.api.keystone`). noauth2 is in ``app`` already.
    """
    if api.auth_strategy != "keystone":
        return app
    from keystonemiddleware import auth_token  # only a keystone API loads it

    settings = auth_token_conf(conf, delay_auth_decision=True)
    validated = auth_token.AuthProtocol(app, settings)
    return keystone.PublicPaths(app, validated)


def serve(
    conf: Any, open_bus: Callable[[BusOptions], Bus], bind: Sequence[str]
) -> tuple[keystone.WSGIApp, Bus]:
    """What every entry point serves: the application behind its authentication, on
    the configured ledger and bus (returned, for the caller to close), its policy
    and periodic tasks; ``conf`` is the entry point's parsed configuration, with
    oslo.log's options (:func:`qsched.conf.load` with ``service=True``).

    The process logs as ``conf`` says from here on (:func:`qsched.conf.setup_logging`).

    :raises RefusedOptions: options the API refuses to serve with, before anything
        is opened or logging is set up (:func:`qsched.api.auth.refuse_bad_options`,
        :func:`read_options`).
    """
    options = read_options(conf)
    auth.refuse_bad_options(options.api, bind, glance_set_options(conf))
    qconf.setup_logging(conf)
    stores = open_stores(options.ledger, options.quota)
    bus = open_bus(options.bus)
    policy = Policy(policy_enforcer(conf))
    images = image_service(options.api, conf)
    metrics = api_metrics(options.api, os.environ.get(MULTIPROC_ENV))
    notifier = open_notifier(options.notifications, f"{PUBLISHER}:{socket.gethostname()}")
    front = cells_front(options, open_bus, policy=policy, images=images, metrics=metrics,
                        notifier=notifier)  # fmt: skip
    if front is None:
        app = create_app(
            stores, bus, options.api, options.scheduler, policy, images, conf=conf,
            metrics=metrics, notifier=notifier,
        )  # fmt: skip
    else:  # every route across the cells [cells] names (docs/scale.rst)
        app = create_cells_app(front, options.api, conf, metrics)
    housekeeping.start_periodic_tasks(options.scheduler, stores, bus, metrics, notifier, front,
                                 options.cells)  # fmt: skip
    return authenticated(app, options.api, conf), bus


def cells_front(
    options: Options, open_bus: Callable[[BusOptions], Bus], **compute: Any
) -> CellsCompute | None:
    """The front door of the cells ``[cells]`` names, which the application serves
    (:func:`create_cells_app`) and whose quota mover the janitor runs; None with no
    cell named (one cell: nothing opened, the application serves the ``[ledger]``
    cell). ``compute``: the other arguments of each :class:`~qsched.compute.cell.Cell`.

    A cell whose ledger does not answer is not joined yet (:func:`open_cells`): no boot
    goes there until the janitor joins it.

    :raises BackendUnavailable: a ledger did not answer its opening (:func:`open_cells`).
    """
    if not options.cells.enabled:
        return None
    front = open_cells(options.cells, options.ledger, options.bus, open_bus, options.quota,
                       scheduler=options.scheduler, api=options.api, **compute)  # fmt: skip
    every = options.cells.mover_interval_s
    waiting = ", ".join(sorted(front.unjoined))
    LOG.info("cells %s behind the API keyspace%s; the janitor moves their quota %s",
             ", ".join(front.cells), f" (not joined yet: {waiting})" if waiting else "",
             f"every {every:.1f}s" if every else "not here")  # fmt: skip
    return front


def api_metrics(api: APIOptions, multiprocess_dir: str | None = None) -> APIMetrics:
    """The metrics ``[api] metrics`` asks for; ``multiprocess_dir``: gunicorn's workers'
    (``$PROMETHEUS_MULTIPROC_DIR``), None in one process."""
    return APIMetrics(multiprocess_dir) if api.metrics else NoMetrics()


def image_service(api: APIOptions, conf: Any) -> ImageService:
    """The configured image service: Glance through ``[glance]``, or none (opaque ids)."""
    if api.image_service != "glance":
        return OpaqueImages()
    from qsched.conf.glance import image_adapter  # keystoneauth's loaders
    from qsched.images.glance import GlanceImages

    return GlanceImages(image_adapter(conf))


def default_bus(options: BusOptions) -> Bus:
    """The configured bus (``transport_url`` and ``[bus]``); kombu loads only when serving."""
    from qsched.bus import open_bus

    return open_bus(options)


class LazyApp:
    """A WSGI application built on its first request (after a server forks its workers)."""

    def __init__(self, load: Callable[..., Callable[..., Iterable[bytes]]]) -> None:
        self._load = load
        self._app: Callable[..., Iterable[bytes]] | None = None
        self._lock = threading.Lock()

    def ensure_loaded(self, bind: Sequence[str] | None = None) -> None:
        """Build the application now (a server's worker start hook), not on a request.

        ``bind``: where the server listens, for a loader that takes it (:func:`load_app`).
        """
        if self._app is None:
            with self._lock:
                if self._app is None:
                    self._app = self._load(bind=bind) if bind else self._load()

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        app = self._app
        if app is None:
            with self._lock:
                if self._app is None:
                    self._app = self._load()
                app = self._app
        return app(environ, start_response)


wsgi_app = LazyApp(load_app)
