"""The routes table: every URI template the application serves under ``/v2.1`` (and
``/``, ``/v2``), and the handler that answers it.

:func:`table` is the one table; :mod:`qsched.api.app` adds it to the application
(with ``/healthcheck`` and ``/metrics``) and reads :func:`collections` from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from qsched.api import PREFIX, FrontDoor
from qsched.api import aggregates as aggregate_handlers
from qsched.api import availability_zones as zone_handlers
from qsched.api import flavors as flavor_handlers
from qsched.api import hypervisors as hypervisor_handlers
from qsched.api import keypairs as keypair_handlers
from qsched.api import migrations as migration_handlers
from qsched.api import quotas as quota_handlers
from qsched.api import server_actions as action_handlers
from qsched.api import server_groups as group_handlers
from qsched.api import servers as server_handlers
from qsched.api import services as service_handlers
from qsched.api.versions import CURRENT, LEGACY, LEGACY_PREFIX, Versions

#: a route: its URI template and the resource that answers it
Route = tuple[str, object]


def table(compute: FrontDoor, endpoint: str | None, max_body: int) -> list[Route]:
    """Every route the application serves: the one table (:func:`collections` reads it too)."""
    args = (compute, endpoint, max_body)
    server, flavor = f"{PREFIX}/servers/{{server_id}}", f"{PREFIX}/flavors/{{flavor_id}}"
    quota_set = f"{PREFIX}/os-quota-sets/{{project_id}}"
    return [
        ("/", Versions(endpoint)),
        (LEGACY_PREFIX, Versions(endpoint, single=LEGACY)),
        (PREFIX, Versions(endpoint, single=CURRENT)),
        (f"{PREFIX}/servers", server_handlers.Servers(*args)),
        (f"{PREFIX}/servers/detail", server_handlers.ServersDetail(*args)),
        (server, server_handlers.Server(*args)),
        (f"{server}/metadata", server_handlers.Metadata(*args)),
        (f"{server}/metadata/{{key}}", server_handlers.MetadataItem(*args)),
        (f"{server}/action", action_handlers.ServerAction(*args)),
        (f"{server}/os-instance-actions", action_handlers.InstanceActions(*args)),
        (f"{server}/os-instance-actions/{{request_id}}", action_handlers.InstanceAction(*args)),
        (f"{server}/migrations", migration_handlers.ServerMigrations(*args)),
        (f"{server}/migrations/{{migration_id}}", migration_handlers.ServerMigration(*args)),
        (
            f"{server}/migrations/{{migration_id}}/action",
            migration_handlers.ServerMigrationAction(*args),
        ),
        (f"{PREFIX}/flavors", flavor_handlers.Flavors(*args)),
        (f"{PREFIX}/flavors/detail", flavor_handlers.FlavorsDetail(*args)),
        (flavor, flavor_handlers.FlavorItem(*args)),
        (f"{flavor}/action", flavor_handlers.FlavorAction(*args)),
        (f"{flavor}/os-flavor-access", flavor_handlers.FlavorAccess(*args)),
        (f"{flavor}/os-extra_specs", flavor_handlers.ExtraSpecs(*args)),
        (f"{flavor}/os-extra_specs/{{key}}", flavor_handlers.ExtraSpec(*args)),
        (f"{PREFIX}/os-services", service_handlers.Services(*args)),
        (f"{PREFIX}/os-services/{{service_id}}", service_handlers.ServiceItem(*args)),
        *_grouping_routes(args),
        (f"{PREFIX}/limits", quota_handlers.Limits(*args)),
        (quota_set, quota_handlers.QuotaSet(*args)),
        (f"{quota_set}/detail", quota_handlers.QuotaSetDetail(*args)),
        (f"{quota_set}/defaults", quota_handlers.QuotaSetDefaults(*args)),
        (f"{PREFIX}/os-quota-class-sets/{{quota_class}}", quota_handlers.QuotaClassSet(*args)),
        *_view_routes(args),
    ]


def _grouping_routes(args: tuple[FrontDoor, str | None, int]) -> list[Route]:
    """Aggregates and server groups, for one cell and over several
    (:mod:`qsched.cells.aggregates`, :mod:`qsched.cells.groups`)."""
    aggregate = f"{PREFIX}/os-aggregates/{{aggregate_id}}"
    return [
        (f"{PREFIX}/os-aggregates", aggregate_handlers.Aggregates(*args)),
        (aggregate, aggregate_handlers.AggregateItem(*args)),
        (f"{aggregate}/action", aggregate_handlers.AggregateAction(*args)),
        (f"{PREFIX}/os-server-groups", group_handlers.ServerGroups(*args)),
        (f"{PREFIX}/os-server-groups/{{group_id}}", group_handlers.ServerGroup(*args)),
    ]


def _view_routes(args: tuple[FrontDoor, str | None, int]) -> list[Route]:
    """The operators' read-only views (availability zones, hypervisors, migrations) and
    keypairs."""
    zones, hypervisors = f"{PREFIX}/os-availability-zone", f"{PREFIX}/os-hypervisors"
    item = f"{hypervisors}/{{hypervisor_id}}"  # a pattern in /search and /servers
    return [
        (zones, zone_handlers.AvailabilityZones(*args)),
        (f"{zones}/detail", zone_handlers.AvailabilityZonesDetail(*args)),
        (hypervisors, hypervisor_handlers.Hypervisors(*args)),
        (f"{hypervisors}/detail", hypervisor_handlers.HypervisorsDetail(*args)),
        (f"{hypervisors}/statistics", hypervisor_handlers.HypervisorStatistics(*args)),
        (item, hypervisor_handlers.HypervisorItem(*args)),
        (f"{item}/search", hypervisor_handlers.HypervisorSearch(*args)),
        (f"{item}/servers", hypervisor_handlers.HypervisorServers(*args)),
        (f"{item}/uptime", hypervisor_handlers.HypervisorUptime(*args)),
        (f"{PREFIX}/os-migrations", migration_handlers.Migrations(*args)),
        (f"{PREFIX}/os-keypairs", keypair_handlers.Keypairs(*args)),
        (f"{PREFIX}/os-keypairs/{{keypair_name}}", keypair_handlers.KeypairItem(*args)),
    ]


def collections(templates: Iterable[str]) -> frozenset[str]:
    """The first path segments of the templates under ``/v2.1`` (``servers``,
    ``os-keypairs``...): what a project id in a URL may precede, and never replaces."""
    under = PREFIX + "/"
    return frozenset(t[len(under) :].split("/", 1)[0] for t in templates if t.startswith(under))
