"""/v2.1/limits, /v2.1/os-quota-sets and /v2.1/os-quota-class-sets, in Nova's shapes
up to 2.79.

The shapes by microversion, as Nova's: before 2.36 both show the network quotas
(``maxTotalFloatingIps``, ``maxSecurityGroups``, ``maxSecurityGroupRules`` and their
used counts in limits; ``fixed_ips``, ``floating_ips``, ``security_groups``,
``security_group_rules`` in quota sets); 2.39 drops ``maxImageMeta``; 2.57 drops
``maxPersonality``, ``maxPersonalitySize`` and the ``injected_file*`` quotas; from
2.75 a query parameter these routes do not read is refused (400) instead of ignored.
Quota classes show the network quotas until 2.50, and the server group quotas from
2.50 on (before, Nova left them out).
What each quota means here and what qsched enforces: :mod:`qsched.compute.quotas`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import falcon

from qsched.api import Handler, context_of, microversion, read_json
from qsched.api.query import refuse_unknown
from qsched.api.schemas import quotas as schema
from qsched.api.schemas.parameter_types import MAX_INT, to_bool
from qsched.api.schemas.validation import field_error, validate
from qsched.compute.quotas import NETWORK, PerUserQuotasUnsupported, QuotaUsage

#: Nova's names in ``limits.absolute`` for each quota (views/limits.py)
ABSOLUTE = {
    "ram": ("maxTotalRAMSize",), "instances": ("maxTotalInstances",),
    "cores": ("maxTotalCores",), "key_pairs": ("maxTotalKeypairs",),
    "floating_ips": ("maxTotalFloatingIps",),
    "metadata_items": ("maxServerMeta", "maxImageMeta"),
    "injected_files": ("maxPersonality",), "injected_file_content_bytes": ("maxPersonalitySize",),
    "security_groups": ("maxSecurityGroups",),
    "security_group_rules": ("maxSecurityGroupRules",),
    "server_groups": ("maxServerGroups",), "server_group_members": ("maxServerGroupMembers",),
}  # fmt: skip
#: ... and for what a project holds
USED = {
    "totalRAMUsed": "ram", "totalCoresUsed": "cores", "totalInstancesUsed": "instances",
    "totalFloatingIpsUsed": "floating_ips", "totalSecurityGroupsUsed": "security_groups",
    "totalServerGroupsUsed": "server_groups",
}  # fmt: skip
FILES = ("injected_files", "injected_file_content_bytes", "injected_file_path_bytes")


class Limits(Handler):
    """``/v2.1/limits``: the caller's project's absolute limits and what it holds."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        version = microversion.current(req)
        # reserved: Nova's api-ref documents it (include reserved resources in the
        # totals); nothing is ever reserved here (nor in Nova since Pike), so the totals
        # are the same either way. OSC always sends it.
        refuse_unknown(req, ("tenant_id", "reserved"))
        quotas = self.compute.quotas.absolute(context_of(req), req.get_param("tenant_id"))
        resp.media = {"limits": {"rate": [], "absolute": absolute_view(quotas, version)}}


class QuotaSet(Handler):
    """``/v2.1/os-quota-sets/{project_id}``: show, update, and delete (back to defaults)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, project_id: str) -> None:
        refuse_unknown(req, ("user_id",))
        _refuse_user(req)
        limits = self.compute.quotas.show(context_of(req), project_id)
        resp.media = {"quota_set": {"id": project_id, **_shown(limits, req)}}

    def on_put(self, req: falcon.Request, resp: falcon.Response, project_id: str) -> None:
        version = microversion.current(req)
        refuse_unknown(req, ("user_id",))
        _refuse_user(req)
        validator = next(v for since, v in schema.QUOTA_SET_UPDATE if version >= since)
        body = dict(validate(validator, read_json(req, self.max_body))["quota_set"])
        force = to_bool(body.pop("force", False))
        changes = {name: _limit(name, value) for name, value in body.items()}
        limits = self.compute.quotas.update(context_of(req), project_id, changes, force)
        resp.media = {"quota_set": _shown(limits, req)}  # no id, as Nova's

    def on_delete(self, req: falcon.Request, resp: falcon.Response, project_id: str) -> None:
        refuse_unknown(req, ("user_id",))
        _refuse_user(req)
        self.compute.quotas.revert(context_of(req), project_id)
        resp.status = falcon.HTTP_202  # Nova's, though nothing is left to wait for


class QuotaSetDetail(Handler):
    """``/v2.1/os-quota-sets/{project_id}/detail``: each quota's limit, in_use, reserved."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, project_id: str) -> None:
        refuse_unknown(req, ("user_id",))
        _refuse_user(req)
        quotas = self.compute.quotas.detail(context_of(req), project_id)
        detail = {name: _usage(q) for name, q in _shown(quotas, req).items()}
        resp.media = {"quota_set": {"id": project_id, **detail}}


class QuotaSetDefaults(Handler):
    """``/v2.1/os-quota-sets/{project_id}/defaults``: the configured defaults."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, project_id: str) -> None:
        # Nova reads no parameter here and refuses none before 2.102: nothing to check
        limits = self.compute.quotas.defaults(context_of(req), project_id)
        resp.media = {"quota_set": {"id": project_id, **_shown(limits, req)}}


class QuotaClassSet(Handler):
    """``/v2.1/os-quota-class-sets/{quota_class}``: show and update (``default`` only)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, quota_class: str) -> None:
        # Nova reads no parameter here and refuses none before 2.102: nothing to check
        limits = self.compute.quotas.show_class(context_of(req), quota_class)
        resp.media = {"quota_class_set": {"id": quota_class, **_class_shown(limits, req)}}

    def on_put(self, req: falcon.Request, resp: falcon.Response, quota_class: str) -> None:
        version = microversion.current(req)
        validator = next(v for since, v in schema.QUOTA_CLASS_UPDATE if version >= since)
        body = validate(validator, read_json(req, self.max_body))["quota_class_set"]
        changes = {name: _limit(name, value, "quota_class_set") for name, value in body.items()}
        limits = self.compute.quotas.update_class(context_of(req), quota_class, changes)
        resp.media = {"quota_class_set": _class_shown(limits, req)}  # no id, as Nova's


def _class_shown(quotas: Mapping[str, int], req: falcon.Request) -> dict[str, int]:
    """A quota class as Nova shows it: the networks until 2.50, when the server group
    quotas appear (Nova's bug 1693168), the injected files until 2.57."""
    version = microversion.current(req)
    dropped = {*NETWORK} if version >= (2, 50) else {"server_groups", "server_group_members"}
    if version >= (2, 57):
        dropped.update(FILES)
    return {name: value for name, value in quotas.items() if name not in dropped}


def absolute_view(quotas: Mapping[str, QuotaUsage], version: tuple[int, int]) -> dict[str, int]:
    """``limits.absolute`` as Nova builds it at ``version``."""
    dropped = _dropped(version, ("injected_files", "injected_file_content_bytes"))
    shown: dict[str, int] = {}
    for quota, names in ABSOLUTE.items():
        if quota in quotas and quota not in dropped:
            shown.update((name, quotas[quota].limit) for name in names)
    if version >= (2, 39):
        shown.pop("maxImageMeta", None)
    for name, quota in USED.items():
        if quota in quotas and quota not in dropped:
            shown[name] = quotas[quota].in_use
    return shown


def _dropped(version: tuple[int, int], files: Iterable[str]) -> set[str]:
    """The quotas Nova no longer shows at ``version``: networks at 2.36, files at 2.57."""
    dropped = set(NETWORK) if version >= (2, 36) else set()
    return dropped | set(files) if version >= (2, 57) else dropped


def _shown(quotas: Mapping[str, Any], req: falcon.Request) -> dict[str, Any]:
    dropped = _dropped(microversion.current(req), FILES)
    return {name: value for name, value in quotas.items() if name not in dropped}


def _usage(quota: QuotaUsage) -> dict[str, int]:
    return {"in_use": quota.in_use, "limit": quota.limit, "reserved": quota.reserved}


def _limit(name: str, value: int | str, key: str = "quota_set") -> int:
    """A quota value the schema passed, as a number: Nova takes ``"10"`` for ``10``.

    :raises Invalid: a string out of range (the schema bounds only numbers).
    """
    number = int(value)
    if not -1 <= number <= MAX_INT:
        raise field_error(
            [key, name], value, f"It must be a whole number from -1 (no limit) to "
            f"{MAX_INT}.",
        )  # fmt: skip
    return number


def _refuse_user(req: falcon.Request) -> None:
    """Nova's per-user quotas (``?user_id=``) are not kept here: refused, not ignored."""
    if req.get_param("user_id") is not None:
        raise PerUserQuotasUnsupported()
