"""The server create body, past its schema: what qsched can serve of it, and the fields
the record keeps.

:func:`parse` reads a body :data:`qsched.api.schemas.servers.SERVER_CREATE` accepted at the
request's microversion. qsched boots one image on the host's local disk, sized by the
flavor, and has no block storage and no networking, so it refuses with a clear 400
what would need them (rather than ignore it): a volume, snapshot or blank block device,
a legacy block device mapping, a list of networks or ports, a security group other
than ``default``. It also refuses what it cannot honour: signed-image certificates
(2.63). What it accepts:

* ``block_device_mapping_v2`` as ``openstack server create --image`` sends it: one
  image, ``destination_type`` local, ``boot_index`` 0 (with or without ``imageRef``;
  when both are given they must name the same image);
* ``networks`` (a list before 2.37, where only an empty one passes; ``none``, ``auto``
  or a list from 2.37, where it is required): recorded, nothing attached;
* ``personality`` (up to 2.56) within Nova's default limits (5 files, paths of 255
  bytes, 10240 bytes of content); Nova hands the files to the virt driver and keeps
  none, and qsched's fake driver ignores them;
* ``adminPass`` given or generated: returned once, never kept;
* ``host`` and ``hypervisor_hostname`` (2.74): handed on, for the host rule the claim
  holds (:mod:`qsched.compute.host_rules`).
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
from collections.abc import Callable
from typing import Any

from qsched import exception
from qsched.api.schemas import servers as schema
from qsched.api.schemas.parameter_types import to_bool
from qsched.api.schemas.validation import field_error
from qsched.compute.quotas import FileLimits
from qsched.scheduling.records import ServerFields

#: what an image block device may say; anything else is about a disk qsched has not
IMAGE_BDM_KEYS = frozenset(
    {"source_type", "destination_type", "boot_index", "uuid", "image_id",
     "delete_on_termination"}
)  # fmt: skip
_PASSWORD_LENGTH = 12  # Nova's [DEFAULT] password_length
_PASSWORD_GROUPS = ("23456789", "ABCDEFGHJKLMNPQRSTUVWXYZ", "abcdefghijkmnopqrstuvwxyz")
_NO_BLOCK_STORAGE = "qsched has no block storage: "
_NO_NETWORKING = "qsched has no networking: "


class PersonalityLimitExceeded(exception.QuotaExceeded):
    """Too many injected files, or one too large (Nova's 403 and words)."""

    msg_fmt = "{what}"


@dataclasses.dataclass(frozen=True)
class Boot:
    """A create body, read: the image it boots, what the record keeps, the password
    to return once (None: ``[api] enable_instance_password`` is off), the host and
    node asked for (2.74)."""

    image_ref: str
    fields: ServerFields
    admin_pass: str | None
    host: str | None = None
    node: str | None = None


def parse(
    server: dict[str, Any],
    version: tuple[int, int],
    enable_password: bool,
    file_limits: Callable[[], FileLimits] = FileLimits,
) -> Boot:
    """Read the ``server`` of a create body valid at ``version``; ``file_limits``: the
    caller's quotas on injected files, read only when the body injects some.

    :raises Invalid: what qsched cannot serve (see the module docstring), or no image.
    :raises PersonalityLimitExceeded: the injected files pass those limits (403).
    """
    _refuse_unserved(server)
    image_ref = image_of(server.get("block_device_mapping_v2") or [], server.get("imageRef"))
    files = server.get("personality") or []
    if files:
        _check_personality(files, file_limits())
    _check_security_groups(server.get("security_groups") or [])
    fields = ServerFields(
        key_name=server.get("key_name"),
        access_ipv4=server.get("accessIPv4", ""),
        access_ipv6=server.get("accessIPv6", ""),
        disk_config=server.get("OS-DCF:diskConfig", "MANUAL"),
        # Before 2.19 Nova gives a server its name as its description.
        description=server.get("description") if version >= (2, 19) else server["name"],
        tags=tuple(dict.fromkeys(server.get("tags") or ())),
        user_data=server.get("user_data"),
        config_drive=to_bool(server.get("config_drive", False)),
        networks=_networks(server.get("networks")),
    )
    password = server["adminPass"] if "adminPass" in server else generate_password()
    return Boot(image_ref, fields, password if enable_password else None,
                server.get("host"), server.get("hypervisor_hostname"))  # fmt: skip


def image_of(bdms: list[dict[str, Any]], image_ref: str | None) -> str:
    """The image a boot runs: ``imageRef``, or the one image block device.

    :raises Invalid: a block device qsched cannot serve, or no image at all.
    """
    if not bdms:
        if not image_ref:
            raise field_error(
                ["server", "imageRef"], image_ref, "It is required: qsched boots from an image "
                "(imageRef, or a block_device_mapping_v2 entry with source_type image).",
            )  # fmt: skip
        return image_ref
    if len(bdms) > 1:
        raise exception.Invalid(
            message=f"{_NO_BLOCK_STORAGE}a server boots one image on its host's local disk; "
            f"block_device_mapping_v2 has {len(bdms)} block devices (volumes, ephemeral or "
            "swap disks need block storage or flavor disks qsched does not serve)."
        )
    image = _image_device(bdms[0])
    if image_ref and image_ref != image:
        raise field_error(
            ["server", "imageRef"], image_ref,
            f"It must be the image of block_device_mapping_v2 ({image}) when both are given.",
        )  # fmt: skip
    return image


def _image_device(bdm: dict[str, Any]) -> str:
    """The image of a block device that boots one on the local disk."""
    source = bdm.get("source_type")
    destination = bdm.get("destination_type", "local" if source == "image" else None)
    if source != "image" or destination != "local":
        raise exception.Invalid(
            message=f"{_NO_BLOCK_STORAGE}a block device with source_type {source} and "
            f"destination_type {destination} cannot be served; boot from an image on the "
            "local disk (source_type image, destination_type local)."
        )
    others = sorted(set(bdm) - IMAGE_BDM_KEYS)
    if others:
        raise exception.Invalid(
            message="qsched boots the image on the host's local disk, sized by the flavor: "
            f"remove {others} from the block device."
        )
    if str(bdm.get("boot_index")) != "0":
        raise field_error(
            ["server", "block_device_mapping_v2", 0, "boot_index"], bdm.get("boot_index"),
            "The image block device must be the boot device: boot_index 0.",
        )  # fmt: skip
    if not to_bool(bdm.get("delete_on_termination", True)):
        raise exception.Invalid(
            message=f"{_NO_BLOCK_STORAGE}a local disk is deleted with its server; "
            "delete_on_termination false needs a volume."
        )
    image = bdm.get("uuid") or bdm.get("image_id")
    if not isinstance(image, str) or not schema.UUID_LIKE.is_valid(image):
        raise field_error(
            ["server", "block_device_mapping_v2", 0, "uuid"], image,
            "It must be the UUID of the image to boot.",
        )  # fmt: skip
    return image


def _refuse_unserved(server: dict[str, Any]) -> None:
    if "block_device_mapping" in server:
        raise exception.Invalid(
            message=f"{_NO_BLOCK_STORAGE}the legacy block_device_mapping (volumes and "
            "snapshots) cannot be served; boot from an image with imageRef."
        )
    if server.get("trusted_image_certificates") is not None:
        raise exception.Invalid(
            message="qsched does not verify image signatures: trusted_image_certificates "
            "cannot be honoured; leave them out."
        )


def _networks(networks: str | list[Any] | None) -> str | None:
    """What the boot asked of networking: ``auto``, ``none``, ``""`` (an empty list).

    :raises Invalid: a list of networks or ports (no networking to attach them to).
    """
    if isinstance(networks, list):
        if networks:
            raise exception.Invalid(
                message=f"{_NO_NETWORKING}a server cannot be attached to networks or ports; "
                "leave networks out, or from microversion 2.37 give 'none' or 'auto'."
            )
        return ""
    return networks


def _check_security_groups(groups: list[dict[str, Any]]) -> None:
    names = sorted({group.get("name", "") for group in groups} - {"default"})
    if names:
        raise exception.Invalid(
            message=f"{_NO_NETWORKING}only the security group 'default' can be asked for, "
            f"not {names}."
        )


def _check_personality(files: list[dict[str, Any]], limits: FileLimits) -> None:
    """The quotas on injected files, with Nova's words (its ``OnsetFile*LimitExceeded``)."""
    if _over(len(files), limits.files):
        raise PersonalityLimitExceeded(what="Personality file limit exceeded")
    for file in files:
        path_bytes = len(str(file.get("path", "")).encode("utf-8", "surrogatepass"))
        if _over(path_bytes, limits.path_bytes):
            raise PersonalityLimitExceeded(
                what=f"Personality file path exceeds maximum {limits.path_bytes}"
            )
        content = base64.decodebytes(str(file.get("contents", "")).encode("utf-8"))
        if _over(len(content), limits.content_bytes):
            raise PersonalityLimitExceeded(
                what=f"Personality file content exceeds maximum {limits.content_bytes}"
            )


def _over(value: int, limit: int) -> bool:
    return limit != -1 and value > limit


def generate_password() -> str:
    """A random password as Nova makes one: 12 characters, one of each group at least,
    none that reads as another (no 0, O, 1, l, I)."""
    alphabet = "".join(_PASSWORD_GROUPS)
    chars = [secrets.choice(group) for group in _PASSWORD_GROUPS]
    chars += [secrets.choice(alphabet) for _ in range(_PASSWORD_LENGTH - len(chars))]
    secrets.SystemRandom().shuffle(chars)
    return "".join(chars)
