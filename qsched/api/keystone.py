"""Keystone identity: the caller as keystonemiddleware's ``auth_token`` validated them.

With ``[api] auth_strategy = keystone`` the entry point
(:func:`qsched.api.app.authenticated`) puts ``auth_token``, configured from the
``[keystone_authtoken]`` section, in front of the falcon application, in
``delay_auth_decision`` mode so that the refusal is qsched's own: Nova's 401
fault, with the ``WWW-Authenticate`` header ``auth_token`` adds to it.
:class:`PublicPaths` routes the version documents, the health check and the
metrics around ``auth_token``, as Nova's paste ``urlmap`` does.

:class:`KeystoneMiddleware` builds the :class:`~qsched.context.RequestContext`
from what ``auth_token`` put in the WSGI environment (user, project, roles,
domains, system scope, and the token's service catalog, which the Glance client
reads). It trusts those headers only when ``auth_token`` itself
vouches for them (``keystone.token_auth`` holds a valid user token, something no
client can send), so an application left without ``auth_token`` refuses everyone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import falcon

from qsched.api.auth import is_public
from qsched.context import RequestContext
from qsched.policy import Policy

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: The WSGI environment key auth_token fills (keystonemiddleware's documented name).
TOKEN_AUTH = "keystone.token_auth"
#: The header auth_token sets to the validated token's catalog (as a WSGI key).
SERVICE_CATALOG = "HTTP_X_SERVICE_CATALOG"


class PublicPaths:
    """A WSGI router: the public paths go to ``app`` itself, the rest through ``authenticated``."""

    def __init__(self, app: WSGIApp, authenticated: WSGIApp) -> None:
        self.app = app
        self.authenticated = authenticated

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        target = self.app if is_public(environ.get("PATH_INFO", "")) else self.authenticated
        return target(environ, start_response)


def context_from_environ(
    environ: dict[str, Any], request_id: str, global_request_id: str | None
) -> RequestContext | None:
    """The caller of a request auth_token validated, or None when it holds no valid token.

    :raises HTTPForbidden: a valid token not scoped to a project (system, domain,
        unscoped): every qsched resource belongs to a project.
    """
    token_auth = environ.get(TOKEN_AUTH)
    if token_auth is None or not token_auth.has_user_token:
        return None
    context = RequestContext.from_environ(
        environ, request_id=request_id, global_request_id=global_request_id,
        catalog_json=environ.get(SERVICE_CATALOG),
    )  # fmt: skip
    if not context.project_id:
        raise falcon.HTTPForbidden(
            description="qsched serves project-scoped tokens: ask Keystone for a token "
            "scoped to a project."
        )
    return context


class KeystoneMiddleware:
    """Puts the validated caller's :class:`RequestContext` on ``req.context.compute``;
    whether it is an admin is the policy's ``context_is_admin``."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if is_public(req.path):
            return
        context = context_from_environ(
            req.env, req.context.request_id, req.context.global_request_id
        )
        if context is None:
            raise falcon.HTTPUnauthorized(
                description="The request you have made requires authentication."
            )
        context.is_admin = self.policy.is_admin(context)
        req.context.compute = context
