"""noauth2: Placement's test-and-demo authentication, without Keystone.

``X-Auth-Token: admin`` is the admin (user and project "admin", roles admin,
member and reader); ``X-Auth-Token: <user>:<project>`` is that user acting in
that project as a member (roles member and reader; ``X-Roles: reader`` makes it
a reader only). A token without ':' is a user whose project has the same name.
Anything else, or no token, is 401. Version documents, the health check and the
metrics need no token. Whether the caller is an admin is the policy's
``context_is_admin``.

Since anyone can write any token, noauth2 serves this machine only, unless told
loudly (``[api] allow_noauth2_on_public_address``): :func:`refuse_public_noauth2`
keeps an API from starting on an address other machines reach, where the entry point
knows its binds, and :class:`NoAuthMiddleware` refuses every request whose peer is not
on this machine (:func:`is_local_peer`), whatever WSGI server runs the application and
however it was started. A proxy on this machine makes every peer local: it must not
publish a noauth2 API.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

import falcon

from qsched.conf import APIOptions
from qsched.context import ADMIN, MEMBER, READER, RequestContext
from qsched.policy import Policy

ADMIN_TOKEN = "admin"
PUBLIC_PATHS = frozenset({"/", "/v2", "/v2.1", "/healthcheck", "/metrics"})


def is_public(path: str) -> bool:
    """Whether a path is served without a token (the trailing slash does not matter)."""
    return (path.rstrip("/") or "/") in PUBLIC_PATHS


# IDs end up in ledger keys and queue headers: keep them plain.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,254}$")


def context_from_token(token: str, request_id: str, roles: str | None = None) -> RequestContext:
    """The caller named by a noauth2 token; ``roles`` (``X-Roles``, comma-separated)
    replace a user's default roles.

    :raises HTTPUnauthorized: a malformed token or role.
    """
    if token == ADMIN_TOKEN:
        return RequestContext.for_project(
            ADMIN_TOKEN, ADMIN_TOKEN, (ADMIN, MEMBER, READER), request_id
        )
    user_id, _sep, project_id = token.partition(":")
    project_id = project_id or user_id
    if not (_ID.match(user_id) and _ID.match(project_id)):
        raise falcon.HTTPUnauthorized(
            description="Invalid X-Auth-Token: use 'admin' or '<user>:<project>' with letters, "
            "digits, '_', '.', '@' or '-'."
        )
    wanted = tuple(r.strip() for r in roles.split(",") if r.strip()) if roles else None
    if wanted is not None and not all(_ID.match(role) for role in wanted):
        raise falcon.HTTPUnauthorized(
            description="Invalid X-Roles: use role names, comma-separated."
        )
    return RequestContext.for_project(user_id, project_id, wanted or (MEMBER, READER), request_id)


class NoAuthMiddleware:
    """Puts the caller's :class:`RequestContext` on ``req.context.compute``, after it
    refused (403) a peer not on this machine unless ``any_peer``
    (``[api] allow_noauth2_on_public_address``): the public paths too."""

    def __init__(self, policy: Policy, any_peer: bool = False) -> None:
        self.policy = policy
        self.any_peer = any_peer

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if not self.any_peer:
            refuse_remote_peer(req.env.get("REMOTE_ADDR"))
        if is_public(req.path):
            return
        token = req.get_header("X-Auth-Token")
        if not token:
            raise falcon.HTTPUnauthorized(
                description="Authentication required: send X-Auth-Token: admin or <user>:<project>."
            )
        context = context_from_token(token, req.context.request_id, req.get_header("X-Roles"))
        context.global_request_id = req.context.global_request_id
        context.is_admin = self.policy.is_admin(context)
        req.context.compute = context


def refuse_remote_peer(remote_addr: str | None) -> None:
    """Refuse a noauth2 request from a peer not on this machine.

    ``remote_addr``: the WSGI environment's ``REMOTE_ADDR`` (None: absent).

    :raises HTTPForbidden: the peer is not local (:func:`is_local_peer`); the message
        says why and the fix.
    """
    if is_local_peer(remote_addr):
        return
    raise falcon.HTTPForbidden(
        description=f"This API has [api] auth_strategy = noauth2, which serves loopback "
        f"peers only, and this request came from {remote_addr}. Use auth_strategy = "
        "keystone, or set [api] allow_noauth2_on_public_address = true if everyone who "
        "reaches the port is to be admin."
    )


#: What WSGI servers put in ``REMOTE_ADDR`` for a unix socket's peer: gunicorn ''
#: (checked with gunicorn 27), waitress 'localhost'; an in-process caller such as
#: falcon's TestClient sends none at all.
_UNIX_PEERS = frozenset({"", "localhost"})


def is_local_peer(remote_addr: str | None) -> bool:
    """Whether a request's peer is on this machine, from the WSGI ``REMOTE_ADDR``.

    Local: a loopback address (127.0.0.0/8, ``::1``, and 127.0.0.0/8 written as
    IPv4-mapped IPv6, ``::ffff:127.0.0.1``, as a dual-stack socket reports an IPv4
    peer), and a unix socket's peer, which servers report as an empty or absent
    ``REMOTE_ADDR`` or ``localhost`` (a unix socket takes connections from this
    machine only, as a ``unix:`` bind counts as loopback in :func:`is_loopback`).
    Anything else is not, this machine's other addresses too: only loopback proves the
    peer is here. An absent ``REMOTE_ADDR`` counts as local because servers set it for
    every TCP peer (gunicorn, waitress and wsgiref do).

    The peer is the last hop: a proxy on this machine is a local peer whoever sent the
    request to it. ``X-Forwarded-For`` and the like are never read (a client writes them).
    """
    if remote_addr is None or remote_addr in _UNIX_PEERS:
        return True
    try:
        address = ipaddress.ip_address(remote_addr)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


# -- options that must not be served together --


class RefusedOptions(RuntimeError):
    """The API's options would be unsafe or cannot work together; the message says the fix."""


class UnreadableOptions(RefusedOptions):
    """An option that cannot be read: a value out of range, a ``[cells]`` line that does
    not parse; the message names it and how to write it."""


class PublicNoAuth2(RefusedOptions):
    """An API with noauth2 was to listen on an address that is not loopback."""


class GlanceNeedsKeystone(RefusedOptions):
    """Glance lookups carry the caller's Keystone token; noauth2 has none."""


class GlanceUnused(RefusedOptions):
    """``[glance]`` is configured but ``[api] image_service = opaque`` would ignore it."""


def refuse_bad_options(
    api: APIOptions, binds: Iterable[str], glance_options: Sequence[str] = ()
) -> None:
    """Everything an API refuses to start with, before it opens anything.

    ``glance_options``: the ``[glance]`` options the configuration sets
    (:func:`qsched.conf.glance.set_options`).

    :raises PublicNoAuth2: see :func:`refuse_public_noauth2`.
    :raises GlanceNeedsKeystone: ``[api] image_service = glance`` (or a configured
        ``[glance]``) without ``auth_strategy = keystone``.
    :raises GlanceUnused: ``[api] image_service = opaque`` with ``[glance]`` options
        set, which it would ignore.
    """
    refuse_public_noauth2(api, binds)
    if api.image_service == "glance" and api.auth_strategy != "keystone":
        raise GlanceNeedsKeystone(
            "refusing [api] image_service = glance with auth_strategy = "
            f"{api.auth_strategy}: each image lookup carries the caller's Keystone token. "
            "Set auth_strategy = keystone, or image_service = opaque (and no [glance] "
            "options)."
        )
    if api.image_service == "opaque" and glance_options:
        raise GlanceUnused(
            f"refusing [api] image_service = opaque with [glance] {', '.join(glance_options)} "
            "set: no image would be looked up in Glance. Remove image_service = opaque (a "
            "configured [glance] turns lookups on) or set it to glance, or remove the "
            "[glance] options."
        )


def refuse_public_noauth2(api: APIOptions, binds: Iterable[str]) -> None:
    """Refuse to serve noauth2 where others can reach it.

    ``binds``: where the API listens, as ``[api] host`` or gunicorn's ``bind``
    entries (``host``, ``host:port``, ``[v6]:port``, ``unix:/path``).

    :raises PublicNoAuth2: the strategy is noauth2, some bind is not loopback and
        ``[api] allow_noauth2_on_public_address`` is not set.
    """
    if api.auth_strategy != "noauth2" or api.allow_noauth2_on_public_address:
        return
    public = [bind for bind in binds if not is_loopback(bind)]
    if public:
        raise PublicNoAuth2(
            f"refusing to serve [api] auth_strategy = noauth2 on {', '.join(public)}: noauth2 "
            "makes anyone who reaches the port admin. Use auth_strategy = keystone, listen on "
            "127.0.0.1, or set [api] allow_noauth2_on_public_address = true if you mean it."
        )


def is_loopback(bind: str) -> bool:
    """Whether a listening address only takes connections from this machine."""
    if bind.startswith("unix:"):
        return True
    host = bind
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # any other name may resolve to a public address
