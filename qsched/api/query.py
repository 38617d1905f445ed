"""Query parameters a route does not read: ignored, or refused with Nova's 400.

Nova's query schemas let other parameters through (and drop them) until 2.75 and
refuse them from 2.75 (``additionalProperties`` false). Most routes here do the
same; the operators' views (hypervisors, availability zones, services) refuse them
at every microversion, where Nova ignores them before it defines a schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import falcon

from qsched import exception
from qsched.api import microversion
from qsched.api.microversion import Version

#: from here Nova refuses a query parameter a route does not read
STRICT: Version = (2, 75)


def refuse_unknown(req: falcon.Request, allowed: Iterable[str], since: Version = STRICT) -> None:
    """Refuse the query parameters of ``req`` not in ``allowed``, from microversion
    ``since`` on (:data:`STRICT` unless the route is stricter); before, they are
    left for the handler to ignore, as Nova does.

    :raises Invalid: one or more unknown parameters (400), in :func:`unknown_message`'s words.
    """
    if microversion.current(req) < since:
        return
    unknown = sorted(set(req.params) - set(allowed))
    if unknown:
        raise exception.Invalid(message=unknown_message(unknown))


def unknown_message(names: Sequence[str]) -> str:
    """What the 400 says of ``names`` (sorted): jsonschema's words, which Nova sends as
    they are for a parameter its query schema does not name (``repr`` shows a surrogate
    escaped)."""
    verb = "was" if len(names) == 1 else "were"
    return (
        f"Additional properties are not allowed ({', '.join(map(repr, names))} {verb} unexpected)"
    )
