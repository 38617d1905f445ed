"""The scheduling class: what a request needs, as one queue and one definition.

The front door makes a :class:`SchedulingClass` from the flavor and the request's
constraints; its :attr:`~SchedulingClass.name` is the routing key of the queue the
request goes on, and its :meth:`~SchedulingClass.definition` is what the create
script publishes in the ledger's ``classes`` hash. Agents read the definitions
back with :meth:`~SchedulingClass.from_definition` and compile each into a fit
:class:`~qsched.scheduling.request.Request` once. Both ends live here.

A plain flavor's class is its name (or, for a name no queue may carry, its
:attr:`~qsched.flavors.Flavor.class_key`); constraints add ``+<hash>`` (a short digest,
stable across processes and releases), so requests that ask the same things
share a queue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from qsched import exception
from qsched.flavors import Constraints, Flavor
from qsched.scheduling.request import Request

_NO_CONSTRAINTS = Constraints()


def class_name(flavor_name: str, constraints: Constraints = _NO_CONSTRAINTS) -> str:
    """The class of a request: the flavor's name (its :attr:`~qsched.flavors.Flavor.class_key`),
    plus ``+<hash>`` when it adds constraints."""
    if not constraints:
        return flavor_name
    return f"{flavor_name}+{constraints.digest()}"


@dataclasses.dataclass(frozen=True)
class SchedulingClass:
    """A flavor plus the constraints a request adds: one queue, one fit request."""

    flavor: Flavor
    constraints: Constraints = _NO_CONSTRAINTS

    @property
    def name(self) -> str:
        return class_name(self.flavor.class_key, self.constraints)

    def definition(self) -> dict[str, Any]:
        """What agents read about the class (a JSON-able map, stored by the ledger)."""
        return {"flavor": self.flavor.to_dict(), "constraints": self.constraints.to_dict()}

    @classmethod
    def from_definition(cls, definition: Mapping[str, Any]) -> SchedulingClass:
        """The class a :meth:`definition` describes, its flavor fully checked.

        :raises Invalid: not a definition: a missing or mistyped part, or a flavor
            that does not check.
        """
        try:
            constraints = Constraints.from_dict(definition.get("constraints") or {})
            return cls(Flavor.from_dict(definition["flavor"]), constraints)
        except (AttributeError, KeyError, TypeError) as exc:
            raise exception.Invalid(reason=f"not a class definition: {exc!r}") from None

    def request(self) -> Request:
        """The fit request agents compile once per class.

        :raises Invalid: malformed extra specs.
        """
        return Request.from_flavor(self.flavor, self.constraints)
