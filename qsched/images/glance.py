"""Images from Glance, looked up with the token of the caller whose boot it is.

:class:`GlanceImages` asks Glance's v2 API for one image per boot
(``GET /v2/images/{id}``) through a keystoneauth adapter (the ``[glance]``
section, :func:`qsched.conf.glance.image_adapter`). The request carries the
caller's own token and the global request id, as Nova's image API does, so
Glance decides what the caller may see: another project's private image is a
404 there, and a 400 "could not be found" here, Nova's answer to a boot.

The endpoint comes from ``[glance] endpoint_override`` when it is set, otherwise
from the ``image`` entry of the service catalog that came with the caller's token
(keystonemiddleware passes it on), on the interfaces ``valid_interfaces`` lists.
It is Glance's root URL, as Glance is registered (``http://glance:9292``); a
catalog URL ending in ``/v2`` is taken the same.
"""

from __future__ import annotations

import re
from typing import Any

from keystoneauth1 import adapter, plugin
from keystoneauth1 import exceptions as ksa_exc
from keystoneauth1.access import service_catalog

from qsched import exception
from qsched.context import RequestContext
from qsched.images.base import Image, ImageNotFound, ImageService

_VERSIONED = re.compile(r"/v2(\.[0-9]+)?$")
#: Glance answers these for a lookup the caller may not make; Nova says "not found".
_NOT_FOUND = (403, 404)


class ImageNotActive(exception.Invalid):
    """An image that cannot be booted yet (queued, saving, deactivated): 400, Nova's words."""

    msg_fmt = "Image {image} is not active."


class ImageServiceUnavailable(exception.BackendUnavailable):
    """Glance did not answer, or answered with an error of its own: 503."""

    msg_fmt = "Image service at {url} is unavailable: {reason}"
    service = "the image service"


class CallerToken(plugin.BaseAuthPlugin):
    """keystoneauth's view of the caller: their token, and the catalog that came with it.

    The token was validated by auth_token a moment ago; it is passed on, never
    renewed (there is nothing to renew it with).
    """

    def __init__(self, token: str, catalog: list[dict[str, Any]]) -> None:
        super().__init__()
        self.token = token
        self.catalog = service_catalog.ServiceCatalogV2(catalog)

    def get_token(self, session: Any, **kwargs: Any) -> str | None:
        return self.token

    def get_endpoint(self, session: Any, **kwargs: Any) -> str | None:
        endpoint_override = kwargs.get("endpoint_override")
        if endpoint_override:
            return str(endpoint_override)
        return self.catalog.url_for(
            service_type=kwargs.get("service_type"),
            interface=kwargs.get("interface") or "public",
            region_name=kwargs.get("region_name"),
            service_name=kwargs.get("service_name"),
        )


class GlanceImages(ImageService):
    """An :class:`ImageService` on Glance (see the module docstring).

    :param images: the keystoneauth adapter of ``[glance]``, with no auth of its own.
    """

    def __init__(self, images: adapter.Adapter) -> None:
        self.adapter = images

    def get(self, context: RequestContext, image_id: str) -> Image:
        """The image as the caller may use it; an empty id is a boot from a volume.

        :raises ImageNotFound: Glance has no such image, or not for this caller (400).
        :raises ImageNotActive: the image exists but holds no bootable data yet (400).
        :raises Invalid: a ``trait:`` property naming no valid trait (400).
        :raises ImageServiceUnavailable: Glance did not answer, failed, or is not
            in the catalog (503; the reason is logged).
        """
        if not image_id:
            return Image(image_id)
        body = self._show(context, image_id)
        if body.get("status") != "active":
            raise ImageNotActive(image=image_id)
        return Image.from_properties(
            image_id, body.get("min_ram") or 0, body.get("min_disk") or 0, body
        )

    def _show(self, context: RequestContext, image_id: str) -> dict[str, Any]:
        auth = CallerToken(context.auth_token or "", context.service_catalog)
        endpoint = "(unknown)"
        try:
            endpoint = self.adapter.get_endpoint(auth=auth) or ""
            if not endpoint:
                raise ksa_exc.EndpointNotFound("no image endpoint")
            answer = self.adapter.get(
                f"{_root(endpoint)}/v2/images/{image_id}", auth=auth, raise_exc=False,
                global_request_id=context.global_id,
                headers={"Accept": "application/json"},
            )  # fmt: skip
        except ksa_exc.EndpointNotFound as exc:
            raise ImageServiceUnavailable(
                url="(none)",
                reason=f"no {self.adapter.service_type} endpoint on interfaces "
                f"{self.adapter.interface} in the caller's catalog ({exc}): register Glance "
                "in Keystone, or set [glance] endpoint_override",
            ) from None
        except ksa_exc.ClientException as exc:
            raise ImageServiceUnavailable(url=_root(endpoint), reason=str(exc)) from None
        if answer.status_code in _NOT_FOUND:
            raise ImageNotFound(image=image_id)
        if answer.status_code != 200:
            raise ImageServiceUnavailable(
                url=_root(endpoint),
                reason=f"GET image {image_id}: {answer.status_code} {answer.text[:200]}",
            )
        try:
            body = answer.json()
        except ValueError:
            raise ImageServiceUnavailable(
                url=_root(endpoint), reason=f"GET image {image_id}: not JSON"
            ) from None
        if not isinstance(body, dict):
            raise ImageServiceUnavailable(
                url=_root(endpoint), reason=f"GET image {image_id}: not an image"
            )
        return body


def _root(endpoint: str) -> str:
    """Glance's root URL: the catalog's, without a trailing ``/v2`` or ``/v2.N``."""
    return _VERSIONED.sub("", endpoint.rstrip("/"))
