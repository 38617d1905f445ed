"""Who asks: the caller of one request, as the authentication in front of the API found it.

:class:`RequestContext` is oslo.context's request context, as Nova's is: user,
project, roles, domains, system scope, this request's id and the global request
id a caller sent (``X-OpenStack-Request-ID``). Policy checks read it through
``to_policy_values()``. keystonemiddleware's ``auth_token`` puts the validated
token's identity in the WSGI environment and :meth:`RequestContext.from_environ`
reads it; noauth2 (:mod:`qsched.api.auth`) builds one from its test token.

A context made for a request is this thread's current one in oslo.context's
store, where oslo.log's formatter finds it: every log line written while the
request is served names its ids, user and project. :func:`start_request` names
the request there before anyone is authenticated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from oslo_context import context

#: The roles of the secure-RBAC personas, as Keystone's bootstrap makes them.
ADMIN, MEMBER, READER = "admin", "member", "reader"


class RequestContext(context.RequestContext):
    """The caller of one request (see the module docstring).

    Behind either authentication a context always names a user and a project.
    ``catalog_json``: the service catalog that came with a Keystone token
    (keystonemiddleware's ``X-Service-Catalog``), read when a client of another
    service needs it (:attr:`service_catalog`).
    """

    user_id: str
    project_id: str
    is_admin: bool

    def __init__(self, *args: Any, catalog_json: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.catalog_json = catalog_json

    @property
    def service_catalog(self) -> list[dict[str, Any]]:
        """The token's service catalog, in the v2 form auth_token passes on; [] without one."""
        if not self.catalog_json:
            return []
        try:
            catalog = json.loads(self.catalog_json)
        except ValueError:
            return []
        return (
            [entry for entry in catalog if isinstance(entry, dict)]
            if isinstance(catalog, list)
            else []
        )

    @classmethod
    def for_project(
        cls,
        user_id: str,
        project_id: str,
        roles: Sequence[str] = (MEMBER, READER),
        request_id: str | None = None,
        **kwargs: Any,
    ) -> RequestContext:
        """A user acting in a project with ``roles`` (default: a project member).

        ``is_admin`` follows the roles (``admin``), as Nova's ``context_is_admin``
        rule does by default, unless given.
        """
        kwargs.setdefault("is_admin", ADMIN in roles)
        context = cls(
            user_id=user_id, project_id=project_id, roles=list(roles), request_id=request_id,
            **kwargs,
        )  # fmt: skip
        return context


def start_request(request_id: str, global_request_id: str | None) -> None:
    """Make ``request_id`` (and the caller's global id) this thread's current context.

    Until the caller's :class:`RequestContext` replaces it, once authenticated, log
    lines of the request name its ids alone (a public path, a refused token). It
    stays the thread's current context until the thread's next request.
    """
    context.RequestContext(
        request_id=request_id, global_request_id=global_request_id, overwrite=False
    ).update_store()


# oslo.middleware's request_id habit: a global request id is only ever req-<uuid>.
_GLOBAL_REQUEST_ID = re.compile(
    r"^req-[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}$"
)


def global_request_id(header: str | None) -> str | None:
    """The ``X-OpenStack-Request-ID`` a caller sent, if it is a ``req-<uuid>``; else None.

    Anything else is dropped (not refused), as oslo.middleware does, so that no
    caller can put arbitrary text in the logs and the boot messages.
    """
    if header and _GLOBAL_REQUEST_ID.match(header.strip()):
        return header.strip()
    return None
