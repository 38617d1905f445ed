"""/v2.1/os-aggregates: host aggregates in Nova's 2.1 shapes (admin only, by default).

Create, show, list, update (name, zone), delete, and the ``add_host``,
``remove_host`` and ``set_metadata`` actions, with Nova's status codes: 200 for
every success (Nova keeps 200 for compatibility), 409 for a taken name or a host
already there or in another zone, 400 for other refused changes, 404 for an
unknown aggregate or host.

The front door's ``aggregates`` (:class:`qsched.compute.aggregates.Aggregates`) keeps
every aggregate in every cell, a host's membership in the host's cell.
"""

from __future__ import annotations

from typing import Any

import falcon

from qsched import exception
from qsched.aggregates import (
    Aggregate,
    AggregateHostNotFound,
    InvalidAggregateAction,
)
from qsched.api import Handler, context_of, microversion, read_json, usage_time
from qsched.api.microversion import Version
from qsched.api.schemas import aggregates as schema
from qsched.api.schemas.parameter_types import MAX_INT
from qsched.api.schemas.validation import validate

UUID_SHOWN: Version = (2, 41)  # the aggregate's uuid in every view


def _id(aggregate_id: str) -> int:
    """The integer id of the path, as Nova validates it (400 otherwise)."""
    try:
        value = int(aggregate_id)
    except ValueError:
        value = -1
    if value < 0 or value > MAX_INT or not aggregate_id.strip().isdigit():
        raise exception.Invalid(message=f"Invalid input received: id must be an integer, not "
                                f"{aggregate_id[:40]!r}.")  # fmt: skip
    return value


class Aggregates(Handler):
    """``/v2.1/os-aggregates``: list and create."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        found = self.compute.aggregates.list(context_of(req))
        resp.media = {"aggregates": [view(a, microversion.current(req)) for a in found]}

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = validate(schema.AGGREGATE_CREATE, read_json(req, self.max_body))
        wanted = body["aggregate"]
        made = self.compute.aggregates.create(
            context_of(req), wanted["name"], wanted.get("availability_zone")
        )
        shown = view(made, microversion.current(req))
        del shown["hosts"], shown["metadata"]  # as Nova's create answers
        resp.media = {"aggregate": shown}


class AggregateItem(Handler):
    """``/v2.1/os-aggregates/{aggregate_id}``: show, update, delete."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, aggregate_id: str) -> None:
        found = self.compute.aggregates.get(context_of(req), _id(aggregate_id))
        resp.media = {"aggregate": view(found, microversion.current(req))}

    def on_put(self, req: falcon.Request, resp: falcon.Response, aggregate_id: str) -> None:
        body = validate(schema.AGGREGATE_UPDATE, read_json(req, self.max_body))
        changed = self.compute.aggregates.update(
            context_of(req), _id(aggregate_id), body["aggregate"]
        )
        resp.media = {"aggregate": view(changed, microversion.current(req))}

    def on_delete(self, req: falcon.Request, resp: falcon.Response, aggregate_id: str) -> None:
        self.compute.aggregates.delete(context_of(req), _id(aggregate_id))


class AggregateAction(Handler):
    """``/v2.1/os-aggregates/{aggregate_id}/action``: add_host, remove_host, set_metadata."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, aggregate_id: str) -> None:
        body = read_json(req, self.max_body)
        action = next(iter(body), None) if isinstance(body, dict) and len(body) == 1 else None
        validator = schema.AGGREGATE_ACTIONS.get(str(action))
        if validator is None:
            raise exception.Invalid(
                message="Invalid action: send one of add_host, remove_host, set_metadata."
            )
        body = validate(validator, body)
        acted = self._act(req, str(action), _id(aggregate_id), body)
        resp.media = {"aggregate": view(acted, microversion.current(req))}

    def _act(self, req: falcon.Request, action: str, aggregate_id: int, body: Any) -> Aggregate:
        aggregates, context = self.compute.aggregates, context_of(req)
        if action == "set_metadata":
            return aggregates.set_metadata(context, aggregate_id, body[action]["metadata"])
        host = body[action]["host"]
        if action == "add_host":
            try:
                return aggregates.add_host(context, aggregate_id, host)
            except InvalidAggregateAction as exc:
                raise falcon.HTTPConflict(description=str(exc)) from None  # Nova's 409
        try:
            return aggregates.remove_host(context, aggregate_id, host)
        except (AggregateHostNotFound, exception.ComputeHostNotFound):
            raise falcon.HTTPNotFound(
                description=f"Cannot remove host {host} in aggregate {aggregate_id}"
            ) from None


def view(aggregate: Aggregate, version: Version = microversion.BASE) -> dict[str, Any]:
    """An aggregate as Nova shows it at ``version`` (``uuid`` comes with 2.41)."""
    shown = {
        "availability_zone": aggregate.availability_zone,
        "created_at": usage_time(aggregate.created_at),
        "deleted": False,
        "deleted_at": None,
        "hosts": sorted(aggregate.hosts),
        "id": aggregate.id,
        "metadata": dict(aggregate.metadata),
        "name": aggregate.name,
        "updated_at": usage_time(aggregate.updated_at),
    }
    if version >= UUID_SHOWN:
        shown["uuid"] = aggregate.uuid
    return shown
