"""Images as a boot needs them: whether the caller may use one, what it needs of a host.

An :class:`ImageService` answers one question per boot, before anything is held:
the image a boot names, as the caller may see it. What a boot takes from it:

- ``min_ram`` and ``min_disk`` must fit the flavor (Nova's 400s);
- every ``trait:<NAME>=required`` property becomes a required trait of the
  request, so it takes part in the scheduling class and only agents whose
  nodes have the trait consume it ("traits in Glance", as Nova's scheduler has
  them).

:class:`OpaqueImages`, the embedded default, knows no images: ``imageRef`` is
an opaque id, as it is in qsched without Glance.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping

from qsched import exception
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.resources import check_trait

_TRAIT_PREFIX = "trait:"


class ImageNotFound(exception.Invalid):
    """An image the caller cannot use, in a boot request: 400, Nova's words."""

    msg_fmt = "Image {image} could not be found."


class FlavorMemoryTooSmall(exception.Invalid):
    msg_fmt = "Flavor's memory is too small for requested image."


class FlavorDiskTooSmall(exception.Invalid):
    msg_fmt = "Flavor's disk is too small for requested image."


@dataclasses.dataclass(frozen=True)
class Image:
    """What a boot needs to know of an image."""

    id: str
    min_ram_mb: int = 0
    min_disk_gb: int = 0
    required_traits: frozenset[str] = frozenset()

    @classmethod
    def from_properties(
        cls, image_id: str, min_ram_mb: int, min_disk_gb: int, properties: Mapping[str, object]
    ) -> Image:
        """An image from Glance's fields; ``trait:<NAME>=required`` properties are its traits.

        :raises Invalid: a ``trait:`` property naming no valid trait.
        """
        traits = frozenset(
            check_trait(key[len(_TRAIT_PREFIX) :])
            for key, value in properties.items()
            if key.startswith(_TRAIT_PREFIX) and value == "required"
        )
        return cls(image_id, int(min_ram_mb or 0), int(min_disk_gb or 0), traits)

    def check_fits(self, flavor: Flavor) -> None:
        """Refuse a flavor smaller than the image needs.

        A flavor without disk (``disk_gb`` 0) boots from a volume: only its memory is
        checked, as in Nova.

        :raises FlavorMemoryTooSmall, FlavorDiskTooSmall:
        """
        if self.min_ram_mb > flavor.ram_mb:
            raise FlavorMemoryTooSmall()
        if flavor.disk_gb and self.min_disk_gb > flavor.disk_gb:
            raise FlavorDiskTooSmall()


class ImageService(abc.ABC):
    """Where images are looked up for a boot."""

    @abc.abstractmethod
    def get(self, context: RequestContext, image_id: str) -> Image:
        """The image ``image_id`` as ``context``'s caller may use it.

        :raises ImageNotFound: no such image, or one the caller may not see (400).
        :raises BackendUnavailable: the image service did not answer (503).
        """


class OpaqueImages(ImageService):
    """No image service: an image is its id, with nothing to check or require."""

    def get(self, context: RequestContext, image_id: str) -> Image:
        return Image(image_id)
