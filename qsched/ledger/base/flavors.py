"""FlavorStore: the flavor catalog of a cell."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable

from qsched.flavors import Flavor


class FlavorStore(abc.ABC):
    """The flavors instances may be booted with."""

    @abc.abstractmethod
    def get(self, flavor_id: str) -> Flavor:
        """One flavor by id (O(1)).

        :raises FlavorNotFound:
        """

    @abc.abstractmethod
    def get_stored(self, flavor_id: str) -> tuple[Flavor, str]:
        """One flavor and the exact form it is stored in, for ``expect_flavor`` checks.

        :raises FlavorNotFound:
        """

    @abc.abstractmethod
    def list(self) -> builtins.list[Flavor]:
        """Every flavor, sorted by id.

        :raises BackendUnavailable:
        """

    @abc.abstractmethod
    def create(self, flavor: Flavor) -> Flavor:
        """Add a flavor.

        :raises FlavorExists: its id or its name is taken.
        :raises Invalid: the flavor does not pass :func:`~qsched.flavors.check_flavor`.
        """

    @abc.abstractmethod
    def put(self, flavor: Flavor) -> bool:
        """Create the flavor or replace the one with its id; False if it was already so.
        A replaced flavor keeps the projects granted it and, unless ``flavor`` has one,
        its description: the API manages those, the configuration does not.

        :raises FlavorExists: another flavor has its name.
        :raises Invalid: the flavor does not pass :func:`~qsched.flavors.check_flavor`.
        """

    @abc.abstractmethod
    def update(self, flavor_id: str, change: Callable[[Flavor], Flavor]) -> Flavor:
        """Replace a flavor by ``change(current)``, atomically; return the new one.

        :raises FlavorNotFound:
        :raises Invalid: the changed flavor does not pass :func:`~qsched.flavors.check_flavor`.
        :raises Conflict: the catalog kept changing under the update.
        """

    @abc.abstractmethod
    def delete(self, flavor_id: str) -> Flavor:
        """Remove a flavor (instances keep their own copy); return what was removed.

        :raises FlavorNotFound:
        """
