"""The front door's quotas: limits, quota sets and what a project holds, in Nova's names.

No HTTP here (:mod:`qsched.api.quotas` renders Nova's shapes per microversion).
Limits live in the ledger's quota store: a project's own over the defaults (the default
quota class's over the ``[quota]`` options), read in one round trip, so every call here
is O(1) whatever the cloud's size.
The ledger enforces ``instances``, ``cores`` and ``ram`` in the reservation of a boot,
``server_groups`` when a group is created and ``server_group_members`` when a server
joins one, each reading the project's override in the same atomic step. The other
limits are checked by the code that takes what they count, through
:meth:`QuotaAPI.limit_for` (``key_pairs`` per user, ``metadata_items`` and the
``injected_file*`` limits per server).

qsched has no networking: Nova's network quotas (``fixed_ips``, ``floating_ips``,
``security_groups``, ``security_group_rules``, shown by Nova before 2.36) are shown
as Nova shows them with Neutron, -1 (no limit) with nothing in use; setting one to
anything but -1 is refused rather than stored and never acted on. Quotas are per
project: Nova's per-user quotas (``user_id``) are refused, not ignored.

The default quota class (``os-quota-class-sets/default``) sets the defaults of every
project without limits of its own, over the ``[quota]`` options; it is the only class
(Nova's others are stored and never read, so qsched refuses them).

Rules (:mod:`qsched.policies.quotas`): Nova's ``os_compute_api:limits``,
``os_compute_api:limits:other_project``, ``os_compute_api:os-quota-sets:*`` and
``os_compute_api:os-quota-class-sets:*``.
"""

from __future__ import annotations

import dataclasses

from qsched import exception
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.policies import quotas as rules
from qsched.policy import Policy

#: Nova's quota names of what qsched limits, and the ledger's name of each
LEDGER_NAMES = {
    "instances": "instances", "cores": "cores", "ram": "ram_mb",
    "server_groups": "server_groups", "server_group_members": "server_group_members",
    "key_pairs": "key_pairs", "metadata_items": "metadata_items",
    "injected_files": "injected_files",
    "injected_file_content_bytes": "injected_file_content_bytes",
    "injected_file_path_bytes": "injected_file_path_bytes",
}  # fmt: skip
#: Nova's network quotas: no limit here, nothing in use (qsched has no networking)
NETWORK = ("fixed_ips", "floating_ips", "security_groups", "security_group_rules")
#: every name of a quota set, as Nova's 2.1 shows them
NAMES = (*LEDGER_NAMES, *NETWORK)
#: what Nova counts for a project (key_pairs and server_group_members: 0 at project level)
COUNTED = ("instances", "cores", "ram", "server_groups")


@dataclasses.dataclass(frozen=True)
class FileLimits:
    """The quotas on injected files of the caller's project (Nova's ``injected_files``,
    ``injected_file_path_bytes``, ``injected_file_content_bytes``; -1: no limit); the
    defaults are Nova's."""

    files: int = 5
    path_bytes: int = 255
    content_bytes: int = 10240


class PerUserQuotasUnsupported(exception.Invalid):
    msg_fmt = (
        "Per-user quotas are not supported: qsched keeps quotas per project; leave out user_id."
    )


class NoNetworkQuota(exception.Invalid):
    msg_fmt = (
        "Quota {resource} can only be -1: qsched has no networking, so nothing counts against it."
    )


class OnlyDefaultQuotaClass(exception.Invalid):
    msg_fmt = (
        "Quota class {quota_class} would never apply: qsched has only the 'default' quota "
        "class, the defaults of every project without limits of its own."
    )


class InvalidProjectId(exception.Invalid):
    msg_fmt = "Project ID {project_id} is not a valid project."


@dataclasses.dataclass(frozen=True)
class QuotaUsage:
    """One quota of a project: its limit and what it holds (Nova's detail view)."""

    limit: int
    in_use: int
    reserved: int = 0  # Nova has no reservations since Pike and shows 0


class QuotaAPI:
    """Quotas of one cell: its quota store and the rules of who may see and set them."""

    def __init__(self, stores: Stores, policy: Policy) -> None:
        self.stores = stores
        self.policy = policy

    def limit_for(self, project_id: str, key: str) -> int:
        """``project_id``'s limit on ``key`` (a name of :data:`NAMES`; -1: no limit),
        for the code that enforces it. O(1); no policy (the caller already decided).

        :raises KeyError: an unknown name.
        """
        if key in NETWORK:
            return -1
        return self.stores.quota.limits(project_id)[LEDGER_NAMES[key]]

    def show(self, context: RequestContext, project_id: str) -> dict[str, int]:
        """The project's limits by Nova's name (``os-quota-sets:show``).

        :raises Forbidden: the rule refuses the caller (another project's, for a member).
        :raises InvalidProjectId: a project id no project can have.
        """
        self._authorize(context, rules.QUOTA_SHOW, project_id)
        return _nova(self.stores.quota.limits(project_id))

    def detail(self, context: RequestContext, project_id: str) -> dict[str, QuotaUsage]:
        """The project's limits with what it holds (``os-quota-sets:detail``).

        :raises Forbidden, InvalidProjectId: as :meth:`show`.
        """
        self._authorize(context, rules.QUOTA_DETAIL, project_id)
        return self._usage(project_id)

    def defaults(self, context: RequestContext, project_id: str) -> dict[str, int]:
        """The configured defaults (``os-quota-sets:defaults``).

        :raises Forbidden, InvalidProjectId: as :meth:`show`.
        """
        self._authorize(context, rules.QUOTA_DEFAULTS, project_id)
        return _nova(self.stores.quota.default_limits())

    def update(
        self, context: RequestContext, project_id: str, changes: dict[str, int], force: bool
    ) -> dict[str, int]:
        """Set some of the project's limits (``os-quota-sets:update``), all or none;
        return every limit after.

        :raises Forbidden, InvalidProjectId: as :meth:`show`.
        :raises NoNetworkQuota: a network quota set to anything but -1.
        :raises QuotaBelowUsage: unless ``force``, a limit under what the project holds.
        :raises Invalid: an unknown name or a value below -1.
        """
        self._authorize(context, rules.QUOTA_UPDATE, project_id)
        ledger = _ledger_changes(changes)
        return _nova(self.stores.quota.update_limits(project_id, ledger, force))

    def revert(self, context: RequestContext, project_id: str) -> None:
        """Drop the project's own limits: the defaults apply again (``os-quota-sets:delete``).

        :raises Forbidden, InvalidProjectId: as :meth:`show`.
        """
        self._authorize(context, rules.QUOTA_DELETE, project_id)
        self.stores.quota.clear_limits(project_id)

    def show_class(self, context: RequestContext, quota_class: str) -> dict[str, int]:
        """A quota class's limits (``os-quota-class-sets:show``): the defaults, for
        ``default`` as for any other name (a class without limits of its own, as Nova).

        :raises Forbidden: the rule refuses the caller.
        """
        self.policy.authorize(context, rules.CLASS_SHOW, {})
        return _nova(self.stores.quota.default_limits())

    def update_class(
        self, context: RequestContext, quota_class: str, changes: dict[str, int]
    ) -> dict[str, int]:
        """Set some limits of the default quota class (``os-quota-class-sets:update``):
        the defaults of every project without its own. Nothing is checked against what
        projects hold, as in Nova; return the defaults after.

        :raises Forbidden: the rule refuses the caller.
        :raises OnlyDefaultQuotaClass: a class other than ``default``: Nova stores it
            and never reads it.
        :raises NoNetworkQuota, Invalid: as :meth:`update`.
        """
        self.policy.authorize(context, rules.CLASS_UPDATE, {})
        if quota_class != "default":
            raise OnlyDefaultQuotaClass(quota_class=repr(quota_class)[:260])
        ledger = _ledger_changes(changes)
        return _nova(self.stores.quota.update_default_limits(ledger))

    def absolute(self, context: RequestContext, tenant_id: str | None) -> dict[str, QuotaUsage]:
        """What ``GET /limits`` shows: the caller's project's quotas with their usage,
        or ``tenant_id``'s for those ``limits:other_project`` allows.

        :raises Forbidden: ``os_compute_api:limits`` or, for ``tenant_id``,
            ``limits:other_project`` refuses the caller.
        :raises InvalidProjectId: a project id no project can have.
        """
        self.policy.authorize(context, rules.LIMITS, {})
        project_id = context.project_id
        if tenant_id is not None:
            self.policy.authorize(context, rules.LIMITS_OTHER_PROJECT)
            project_id = _checked(tenant_id)
        return self._usage(project_id)

    def _usage(self, project_id: str) -> dict[str, QuotaUsage]:
        limits = _nova(self.stores.quota.limits(project_id))
        held = _nova(self.stores.quota.in_use(project_id), network=0)
        return {name: QuotaUsage(limit, held.get(name, 0)) for name, limit in limits.items()}

    def _authorize(self, context: RequestContext, rule: str, project_id: str) -> None:
        self.policy.authorize(context, rule, {"project_id": project_id})
        _checked(project_id)


def _ledger_changes(changes: dict[str, int]) -> dict[str, int]:
    """Changes by Nova's names as the ledger's, without the network quotas.

    :raises NoNetworkQuota: a network quota set to anything but -1.
    :raises Invalid: an unknown name.
    """
    for name in NETWORK:
        if changes.get(name, -1) != -1:
            raise NoNetworkQuota(resource=name)
    for name in changes:
        if name not in NAMES:
            raise exception.Invalid(reason=f"{name!r} is no quota; use one of {NAMES}")
    return {LEDGER_NAMES[k]: v for k, v in changes.items() if k in LEDGER_NAMES}


def _nova(by_ledger_name: dict[str, int], network: int = -1) -> dict[str, int]:
    """Ledger names to Nova's, and the network quotas at ``network`` (-1: a limit,
    0: a count)."""
    nova = {name: by_ledger_name[ledger] for name, ledger in LEDGER_NAMES.items()
            if ledger in by_ledger_name}  # fmt: skip
    return {**nova, **dict.fromkeys(NETWORK, network)}


def _checked(project_id: str) -> str:
    """A project id as Keystone could issue one: 1 to 255 printable characters.

    qsched does not ask Keystone whether the project exists (Nova does when it can);
    a limit set for a project that does not exist is kept and harms no one.
    """
    printable = project_id.isprintable() and not any(c.isspace() for c in project_id)
    if not 0 < len(project_id) <= 255 or not printable or _surrogates(project_id):
        raise InvalidProjectId(project_id=repr(project_id)[:260])
    return project_id


def _surrogates(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)
