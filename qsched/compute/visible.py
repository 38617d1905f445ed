"""A server the caller may see: the one rule every call about a server starts with.

A server of another project is not found (404) for a caller who is no admin, before
any policy rule is asked, so that a uuid tells nothing of servers the caller may not
see (Nova's ``instance_get_by_uuid`` under the project's context); a malformed uuid
is not found either, and a DELETED server only where a call shows deleted ones
(instance actions).
"""

from __future__ import annotations

from typing import Protocol

from qsched import exception
from qsched.context import RequestContext
from qsched.ledger.base import Instance, InstanceStore, State
from qsched.resources import check_uuid


class Owned(Protocol):
    """What belongs to a project: a server, a server group."""

    @property
    def project_id(self) -> str: ...


def may_see(context: RequestContext, owned: Owned) -> bool:
    """Whether the caller may see a server or a server group: its project's, or the
    caller is an admin."""
    return context.is_admin or owned.project_id == context.project_id


def visible(
    instances: InstanceStore, context: RequestContext, uuid: str, deleted: bool = False
) -> Instance:
    """The record of a server the caller may see; a DELETED one only if ``deleted``.
    One read.

    :raises InstanceNotFound: unknown, malformed uuid, deleted (unless ``deleted``), or
        another project's and the caller is no admin (404, as in Nova).
    """
    try:
        instance = instances.get(check_uuid(uuid, "Instance UUID"))
    except exception.InvalidUUID:
        raise exception.InstanceNotFound(instance=uuid) from None
    if (instance.state == State.DELETED and not deleted) or not may_see(context, instance):
        raise exception.InstanceNotFound(instance=uuid)
    return instance
