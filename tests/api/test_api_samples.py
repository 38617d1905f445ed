"""Nova's api_samples as the specification of every resource qsched serves.

Nova ships its API sample templates in its package (``nova/tests/functional/
api_sample_tests/api_samples/<resource>/[v2.N/]<name>.json.tpl``); the Makefile
installs it without its dependencies, and nothing here imports it. A template in a
``v2.N`` directory is what that microversion changed; the others are 2.1. For each
served resource and each microversion up to :data:`qsched.api.microversion.MAX`:

- every request sample is sent at its microversion and answers what :data:`REQUESTS`
  or :data:`RESPONSES` says it must (accepted, or refused with the clear 400 of
  something qsched cannot do, such as block storage);
- every response sample is fetched (:data:`RESPONSES` says how) and our answer has
  every key of the sample, recursively, with a value of the same JSON type; the
  values of maps that hold data, not shapes (``metadata``, ``extra_specs``...), are not
  compared;
- a template of a served resource is in one of those tables or in :data:`NOT_SERVED`
  with the reason, so a resource cannot gain a sample nobody checks.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import falcon.testing
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agents.registration import register_nodes
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched.api import app as api_app
from qsched.api import microversion
from qsched.conf import APIOptions, LedgerOptions, SchedulerOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import Inventory, ProviderSpec, TaskState
from tests.compute.test_boot import SAMPLE_HOST
from tests.compute.test_compute import RecordingBus
from tests.samples import PLACEHOLDER, SAMPLES, mismatches, shape

Version = tuple[int, int]


if SAMPLES is None:
    pytest.skip(
        "nova's api_samples are not installed: pip install --no-deps nova", allow_module_level=True
    )

ADMIN = {"X-Auth-Token": "admin:pa", "X-Roles": "admin,member,reader"}  # an admin of pa
USER = {"X-Auth-Token": "alice:pa"}
IMAGE = "70a599e0-31e7-49b7-b260-868f441e862b"
NODE = FakeNodeSpec(vcpus=8, ram_mb=16384, disk_gb=100, traits=frozenset())


@functools.cache
def public_key() -> str:
    """An OpenSSH public key, as a keypair import sends one."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    encoded = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return f"{encoded.decode()} sample@qsched"


@dataclasses.dataclass(frozen=True)
class Call:
    """How to get the answer a sample shows: a request, as whom, and the status it gets.

    ``path`` names the scenario's objects in braces (:meth:`Scenario.names`);
    ``request``: the request template sent as the body (its own or the latest one at or
    below the call's microversion).
    """

    method: str
    path: str
    request: str | None = None
    status: int = 200
    admin: bool = True
    #: the microversion, when the template's name says it and its directory does not
    at: Version | None = None
    #: a step of :class:`Scenario` that must happen first (``stopped``...)
    setup: str | None = None
    #: placeholder values of this call's request, over the scenario's
    values: tuple[tuple[str, str], ...] = ()
    #: the microversion from which the status is another, and that status
    later_status: tuple[Version, int] | None = None
    #: the microversion from which the call asks for one item a page (the sample's links)
    paged_from: Version | None = None

    def status_at(self, version: Version) -> int:
        if self.later_status is not None and version >= self.later_status[0]:
            return self.later_status[1]
        return self.status


#: response templates -> the call whose answer they describe
RESPONSES: dict[tuple[str, str], Call] = {
    ("versions", "versions-get-resp"): Call("GET", "/"),
    ("versions", "v21-version-get-resp"): Call("GET", "/v2.1"),
    ("versions", "v2-version-get-resp"): Call("GET", "/v2"),
    ("servers", "server-get-resp"): Call("GET", "/v2.1/servers/{server}"),
    ("servers", "servers-details-resp"): Call("GET", "/v2.1/servers/detail?limit=1"),
    ("servers", "servers-list-resp"): Call("GET", "/v2.1/servers?limit=1"),
    ("servers", "servers-list-status-resp"): Call("GET", "/v2.1/servers?status=active&limit=1"),
    ("servers", "server-create-resp"): Call(
        "POST", "/v2.1/servers", "server-create-req", 202, admin=False
    ),
    ("flavors", "flavor-get-resp"): Call("GET", "/v2.1/flavors/1"),
    ("flavors", "flavors-detail-resp"): Call("GET", "/v2.1/flavors/detail"),
    ("flavors", "flavors-list-resp"): Call("GET", "/v2.1/flavors"),
    ("flavor-manage", "flavor-create-post-resp"): Call(
        "POST", "/v2.1/flavors", "flavor-create-post-req"
    ),
    ("flavor-extra-specs", "flavor-extra-specs-create-resp"): Call(
        "POST", "/v2.1/flavors/1/os-extra_specs", "flavor-extra-specs-create-req"
    ),
    ("flavor-extra-specs", "flavor-extra-specs-list-resp"): Call(
        "GET", "/v2.1/flavors/{specced}/os-extra_specs"
    ),
    ("flavor-extra-specs", "flavor-extra-specs-get-resp"): Call(
        "GET", "/v2.1/flavors/{specced}/os-extra_specs/hw:numa_nodes"
    ),
    ("os-aggregates", "aggregate-post-resp"): Call(
        "POST", "/v2.1/os-aggregates", "aggregate-post-req"
    ),
    ("os-aggregates", "aggregates-get-resp"): Call("GET", "/v2.1/os-aggregates/{aggregate}"),
    ("os-aggregates", "aggregates-list-get-resp"): Call("GET", "/v2.1/os-aggregates"),
    ("os-aggregates", "aggregate-update-post-resp"): Call(
        "PUT", "/v2.1/os-aggregates/{aggregate}", "aggregate-update-post-req"
    ),
    ("os-aggregates", "aggregates-add-host-post-resp"): Call(
        "POST", "/v2.1/os-aggregates/{aggregate}/action", "aggregate-add-host-post-req"
    ),
    ("os-aggregates", "aggregates-metadata-post-resp"): Call(
        "POST", "/v2.1/os-aggregates/{aggregate}/action", "aggregate-metadata-post-req"
    ),
    ("os-aggregates", "aggregates-remove-host-post-resp"): Call(
        "POST", "/v2.1/os-aggregates/{hosting}/action", "aggregate-remove-host-post-req"
    ),
    ("os-server-groups", "server-groups-post-resp"): Call(
        "POST", "/v2.1/os-server-groups", "server-groups-post-req", admin=False
    ),
    ("os-server-groups", "server-groups-get-resp"): Call(
        "GET", "/v2.1/os-server-groups/{group}", admin=False
    ),
    ("os-server-groups", "server-groups-list-resp"): Call(
        "GET", "/v2.1/os-server-groups", admin=False
    ),
    ("os-services", "services-list-get-resp"): Call("GET", "/v2.1/os-services"),
    ("os-services", "service-disable-put-resp"): Call(
        "PUT", "{service_action:disable}", "service-disable-put-req"
    ),
    ("os-services", "service-disable-log-put-resp"): Call(
        "PUT", "{service_action:disable-log-reason}", "service-disable-log-put-req"
    ),
    ("os-services", "service-enable-put-resp"): Call(
        "PUT", "{service_action:enable}", "service-enable-put-req"
    ),
    ("os-services", "service-force-down-put-resp"): Call(
        "PUT", "{service_action:force-down}", "service-force-down-put-req"
    ),
    ("flavor-manage", "flavor-update-resp"): Call("PUT", "/v2.1/flavors/1", "flavor-update-req"),
    ("flavor-extra-specs", "flavor-extra-specs-update-resp"): Call(
        "PUT",
        "/v2.1/flavors/{specced}/os-extra_specs/hw:numa_nodes",
        "flavor-extra-specs-update-req",
    ),
    ("flavor-access", "flavor-access-list-resp"): Call(
        "GET", "/v2.1/flavors/{private}/os-flavor-access"
    ),
    ("flavor-access", "flavor-access-add-tenant-resp"): Call(
        "POST",
        "/v2.1/flavors/{private}/action",
        "flavor-access-add-tenant-req",
        values=(("tenant_id", "pc"),),
    ),
    ("flavor-access", "flavor-access-remove-tenant-resp"): Call(
        "POST", "/v2.1/flavors/{private}/action", "flavor-access-remove-tenant-req"
    ),
    ("servers", "server-update-resp"): Call("PUT", "/v2.1/servers/{server}", "server-update-req"),
    ("servers", "server-put-resp"): Call(
        "PUT", "/v2.1/servers/{server}", "server-put-req", admin=False
    ),
    ("servers", "servers-details-with-changes-before"): Call(
        "GET", "/v2.1/servers/detail?changes-before=2100-01-01T00:00:00Z"
    ),
    ("servers", "servers-list-with-changes-before"): Call(
        "GET", "/v2.1/servers?changes-before=2100-01-01T00:00:00Z"
    ),
    ("servers-sort", "server-sort-keys-list-resp"): Call(
        "GET", "/v2.1/servers?sort_key=display_name&sort_dir=asc", admin=False
    ),
    ("server-metadata", "server-metadata-all-resp"): Call(
        "PUT", "/v2.1/servers/{server}/metadata", "server-metadata-all-req", admin=False
    ),
    ("server-metadata", "server-metadata-resp"): Call(
        "PUT", "/v2.1/servers/{server}/metadata/foo", "server-metadata-req", admin=False
    ),
    ("limits", "limit-get-resp"): Call("GET", "/v2.1/limits", admin=False),
    ("os-keypairs", "keypairs-list-resp"): Call(
        "GET", "/v2.1/os-keypairs", admin=False, setup="keypairs", paged_from=(2, 35)
    ),
    ("os-keypairs", "keypairs-get-resp"): Call("GET", "/v2.1/os-keypairs/{keypair}", admin=False),
    ("os-keypairs", "keypairs-post-resp"): Call(
        "POST", "/v2.1/os-keypairs", "keypairs-post-req", admin=False, later_status=((2, 2), 201)
    ),
    ("os-keypairs", "keypairs-import-post-resp"): Call(
        "POST",
        "/v2.1/os-keypairs",
        "keypairs-import-post-req",
        admin=False,
        later_status=((2, 2), 201),
    ),
    ("os-keypairs", "keypairs-list-user1-resp"): Call(
        "GET", "/v2.1/os-keypairs?user_id=alice", setup="keypairs"
    ),
    ("os-keypairs", "keypairs-list-user2-resp"): Call(
        "GET", "/v2.1/os-keypairs?user_id=alice&limit=1", setup="keypairs"
    ),
    ("os-quota-sets", "quotas-show-get-resp"): Call("GET", "/v2.1/os-quota-sets/pa"),
    ("os-quota-sets", "quotas-show-detail-get-resp"): Call("GET", "/v2.1/os-quota-sets/pa/detail"),
    ("os-quota-sets", "quotas-show-defaults-get-resp"): Call(
        "GET", "/v2.1/os-quota-sets/pa/defaults"
    ),
    ("os-quota-sets", "quotas-update-post-resp"): Call(
        "PUT", "/v2.1/os-quota-sets/pa", "quotas-update-post-req"
    ),
    ("os-quota-sets", "quotas-update-force-post-resp"): Call(
        "PUT", "/v2.1/os-quota-sets/pa", "quotas-update-force-post-req"
    ),
    ("os-quota-class-sets", "quota-classes-show-get-resp"): Call(
        "GET", "/v2.1/os-quota-class-sets/default"
    ),
    ("os-quota-class-sets", "quota-classes-update-post-resp"): Call(
        "PUT", "/v2.1/os-quota-class-sets/default", "quota-classes-update-post-req"
    ),
    ("os-availability-zone", "availability-zone-list-resp"): Call(
        "GET", "/v2.1/os-availability-zone", admin=False
    ),
    ("os-availability-zone", "availability-zone-detail-resp"): Call(
        "GET", "/v2.1/os-availability-zone/detail"
    ),
    ("os-hypervisors", "hypervisors-list-resp"): Call(
        "GET", "/v2.1/os-hypervisors", paged_from=(2, 33)
    ),
    ("os-hypervisors", "hypervisors-detail-resp"): Call(
        "GET", "/v2.1/os-hypervisors/detail", paged_from=(2, 33)
    ),
    ("os-hypervisors", "hypervisors-show-resp"): Call("GET", "/v2.1/os-hypervisors/{hypervisor}"),
    ("os-hypervisors", "hypervisors-statistics-resp"): Call(
        "GET", "/v2.1/os-hypervisors/statistics"
    ),
    ("os-hypervisors", "hypervisors-search-resp"): Call("GET", "{hypervisor_search:search}"),
    ("os-hypervisors", "hypervisors-with-servers-resp"): Call("GET", "{hypervisor_search:servers}"),
    ("os-hypervisors", "hypervisors-without-servers-resp"): Call(
        "GET", "{hypervisor_search:without}"
    ),
    ("os-hypervisors", "hypervisors-detail-with-servers-resp"): Call(
        "GET", "/v2.1/os-hypervisors/detail?with_servers=true"
    ),
    ("os-hypervisors", "hypervisors-show-with-servers-resp"): Call(
        "GET", "/v2.1/os-hypervisors/{hypervisor}?with_servers=true"
    ),
    ("os-instance-actions", "instance-actions-list-resp"): Call(
        "GET", "/v2.1/servers/{server}/os-instance-actions"
    ),
    ("os-instance-actions", "instance-action-get-resp"): Call(
        "GET", "/v2.1/servers/{server}/os-instance-actions/{action}"
    ),
    ("os-instance-actions", "instance-action-get-non-admin-resp"): Call(
        "GET", "/v2.1/servers/{server}/os-instance-actions/{action}", admin=False
    ),
    ("os-instance-actions", "instance-actions-list-with-limit-resp"): Call(
        "GET", "/v2.1/servers/{server}/os-instance-actions?limit=1"
    ),
    ("os-instance-actions", "instance-actions-list-with-marker-resp"): Call(
        "GET", "/v2.1/servers/{server}/os-instance-actions?marker={action}"
    ),
    ("os-instance-actions", "instance-actions-list-with-changes-since"): Call(
        "GET", "/v2.1/servers/{server}/os-instance-actions?changes-since=2000-01-01T00:00:00Z"
    ),
    ("os-instance-actions", "instance-actions-list-with-changes-before"): Call(
        "GET", "/v2.1/servers/{server}/os-instance-actions?changes-before=2100-01-01T00:00:00Z"
    ),
    ("servers", "server-action-rebuild-resp"): Call(
        "POST",
        "/v2.1/servers/{server}/action",
        "server-action-rebuild",
        202,
        setup="admin_keypair",
        values=(
            ("pass", "seekr3t"),
            ("key_name", "kp-admin"),
            ("disk_config", "AUTO"),
            ("preserve_ephemeral", "false"),
        ),
    ),
    ("os-multiple-create", "multiple-create-post-resp"): Call(
        "POST", "/v2.1/servers", "multiple-create-post-req", 202, admin=False
    ),
    ("os-multiple-create", "multiple-create-no-resv-post-resp"): Call(
        "POST", "/v2.1/servers", "multiple-create-no-resv-post-req", 202, admin=False
    ),
}

#: request templates sent on their own -> the call and the status it must get
REQUESTS: dict[tuple[str, str], Call] = {
    ("flavor-access", "flavor-create-req"): Call("POST", "/v2.1/flavors", "flavor-create-req"),
    ("servers", "server-create-req-v237"): Call(
        "POST", "/v2.1/servers", "server-create-req-v237", 202, admin=False, at=(2, 37)
    ),
    ("servers", "server-create-req-v257"): Call(
        "POST", "/v2.1/servers", "server-create-req-v257", 202, admin=False, at=(2, 57)
    ),
    # 2.74's host and node: the Scenario's SAMPLE_HOST has a service and a node of that name
    **{
        ("servers", f"server-create-req-with-{kind}"): Call(
            "POST", "/v2.1/servers", f"server-create-req-with-{kind}", 202
        )
        for kind in ("host-and-node", "only-host", "only-node")
    },
    ("servers", "server-action-stop"): Call(
        "POST",
        "/v2.1/servers/{server}/action",
        "server-action-stop",
        202,
        admin=False,
        values=(("action", "os-stop"),),
    ),
    ("servers", "server-action-start"): Call(
        "POST",
        "/v2.1/servers/{server}/action",
        "server-action-start",
        202,
        admin=False,
        setup="stopped",
        values=(("action", "os-start"),),
    ),
    ("servers", "server-action-reboot"): Call(
        "POST",
        "/v2.1/servers/{server}/action",
        "server-action-reboot",
        202,
        admin=False,
        values=(("type", "SOFT"),),
    ),
    ("os-shelve", "os-shelve"): Call(
        "POST", "/v2.1/servers/{server}/action", "os-shelve", 202, admin=False,
        values=(("action", "shelve"),),
    ),
    ("os-shelve", "os-shelve-offload"): Call(
        "POST", "/v2.1/servers/{server}/action", "os-shelve-offload", 202, setup="shelved",
        values=(("action", "shelveOffload"),),
    ),
    ("os-shelve", "os-unshelve"): Call(
        "POST", "/v2.1/servers/{server}/action", "os-unshelve", 202, admin=False,
        setup="shelved", values=(("action", "unshelve"),),
    ),
}  # fmt: skip

#: templates of served resources qsched does not answer, and why
NOT_SERVED: dict[tuple[str, str], str] = {
    ("servers", "attach-interfaces-list-resp"): "no networking",
    ("servers", "attach-interfaces-show-resp"): "no networking",
    ("servers", "server-action-addfloatingip-req"): "no networking",
    ("servers", "server-action-removefloatingip-req"): "no networking",
    ("servers", "server-action-confirm-resize"): "no resize",
    ("servers", "server-action-resize"): "no resize",
    ("servers", "server-action-revert-resize"): "no resize",
    ("servers", "server-action-create-image"): "no snapshots: there is no image upload",
    ("servers", "server-action-create-image-resp"): "no snapshots: there is no image upload",
    ("servers", "server-action-trigger-crash-dump"): "no crash dumps in the virt driver",
    ("servers", "server-get-down-cell-resp"): "one cell, never down: 2.69's partial views",
    ("servers", "server-groups-post-req"): "a server group sample kept with the servers' (2.71)",
    ("servers", "server-groups-post-resp"): "a server group sample kept with the servers' (2.71)",
    ("servers", "lock-server-with-reason"): "no lock action",
    ("os-shelve", "os-unshelve-az"): "an unshelve to another availability zone (409: not "
    "served yet, docs/moves.rst)",
    ("os-hypervisors", "hypervisors-uptime-resp"): "answered 501, as Nova does for a virt driver "
    "that keeps no uptime",
    ("os-quota-sets", "user-quotas-show-get-resp"): "quotas are per project (user_id: 400)",
    ("os-quota-sets", "user-quotas-update-post-req"): "quotas are per project (user_id: 400)",
    ("os-quota-sets", "user-quotas-update-post-resp"): "quotas are per project (user_id: 400)",
}


def refusal(body: Any) -> str | None:
    """What qsched's 400 says to a request sample asking for something it cannot do
    (docs/api.rst lists them), or None when the sample must be accepted."""
    if not isinstance(body, dict):
        return None
    server = body.get("server") or {}
    devices = server.get("block_device_mapping_v2") or []
    if any(d.get("destination_type") == "volume" for d in devices):
        return "qsched has no block storage"
    if server.get("trusted_image_certificates"):
        return "trusted_image_certificates"
    rebuild = body.get("rebuild") or {}
    if rebuild.get("personality"):  # up to 2.56's samples
        return "qsched injects no personality files"
    if rebuild.get("trusted_image_certificates"):
        return "qsched verifies no trusted image certificates"
    return None


SERVED = sorted({resource for resource, _name in (*RESPONSES, *REQUESTS, *NOT_SERVED)})


def _version_of(directory: str) -> Version:
    if directory == "":
        return microversion.MIN
    major, minor = directory[1:].split(".")
    return (int(major), int(minor))


#: templates of a served resource that describe what qsched never answers, by version
NOT_SERVED_AT: dict[tuple[str, Version, str], str] = {
    ("servers", (2, 69), name): "2.69's partial answers of a down cell: one cell, never down"
    for name in ("server-get-resp", "servers-details-resp", "servers-list-resp")
}


def templates() -> Iterator[tuple[str, Version, str]]:
    """(resource, microversion, template name) of every sample of a served resource, up
    to the latest microversion qsched speaks."""
    assert SAMPLES is not None
    for resource in SERVED:
        for path in sorted((SAMPLES / resource).rglob("*.json.tpl")):
            relative = path.relative_to(SAMPLES / resource)
            version = _version_of(str(relative.parent) if relative.parent.parts else "")
            name = path.name.removesuffix(".json.tpl")
            if version <= microversion.MAX and (resource, version, name) not in NOT_SERVED_AT:
                yield resource, version, name


def template_text(resource: str, version: Version, name: str) -> str:
    """The template at ``version``, or the latest below it (a sample holds until a later
    microversion changes it)."""
    assert SAMPLES is not None
    found = [(v, n) for r, v, n in templates() if r == resource and n == name and v <= version]
    if not found:
        raise LookupError(f"no template {resource}/{name} at or below {version}")
    best = max(found)[0]
    directory = SAMPLES / resource
    if best != microversion.MIN:
        directory = directory / f"v{best[0]}.{best[1]}"
    return (directory / f"{name}.json.tpl").read_text()


def fill(text: str, values: dict[str, str]) -> Any:
    """A request template as JSON, its placeholders replaced by ``values``.

    :raises KeyError: a placeholder the scenario has no value for.
    """
    return json.loads(PLACEHOLDER.sub(lambda m: values[m.group(1)], text))


class Scenario:
    """An API on an empty embedded ledger with a server placed on host cn1 (zone az1);
    the other objects a call names are made when it first names them."""

    def __init__(self, conf, tmp: str) -> None:
        stores: Stores = open_stores(LedgerOptions.from_conf(conf), url=f"fakeredis://{tmp}")
        # 6: the flavor Nova's later create samples boot
        flavors = ["m1.tiny:1:512:1:1", "m1.small:1:2048:20:2", "m1.sample:1:512:1:6"]
        conf.set_override("flavor", flavors, group="api")
        self.stores = stores
        app = api_app.create_app(
            stores, RecordingBus(), APIOptions.from_conf(conf), SchedulerOptions.from_conf(conf)
        )
        self.client = falcon.testing.TestClient(app)
        roots = {}
        stores.agents.add_zone("az1")
        for host in ("cn1", "cn2"):  # cn2 runs nothing
            stores.agents.register_service(host, "az1")
            stores.agents.heartbeat(host, ttl_s=600)
            nodes = FakeDriver(1, NODE, host=host).nodes()
            register_nodes(stores.ledger, nodes, "az1", (), host=host)
            roots[host] = nodes[0]
        # the compute host and node Nova's 2.74 samples ask for, by their names
        stores.agents.register_service(SAMPLE_HOST, "az1")
        stores.ledger.register_providers(
            [ProviderSpec(str(uuid.uuid4()), SAMPLE_HOST, {"VCPU": Inventory(8)}, host=SAMPLE_HOST)]
        )
        self.server = self._boot()
        node = roots["cn1"]
        stores.ledger.claim(self.server, {node.root.uuid: {"VCPU": 1, "MEMORY_MB": 512}},
                            "cn1", node.name)  # fmt: skip
        stores.instances.set_active(self.server, "cn1", node.name)
        self.values = self._values()
        self._made: dict[str, str] = {"server": self.server}

    def _boot(self) -> str:
        """A server with what Nova's samples show of one: user data, access addresses."""
        body = {"server": {"name": "sample", "imageRef": IMAGE, "flavorRef": "1",
                           "user_data": base64.b64encode(b"#!/bin/sh\n").decode(),
                           "accessIPv4": "1.2.3.4", "accessIPv6": "80fe::",
                           "metadata": {"My Server Name": "Apache1"}}}  # fmt: skip
        return str(self._post("/v2.1/servers", body, USER)["server"]["id"])

    def _post(self, path: str, body: Any, headers: dict[str, str] = ADMIN) -> Any:
        result = self.client.simulate_post(path, json=body, headers=headers)
        assert result.status_code < 300, (path, result.text)
        return result.json

    def _get(self, path: str, version: Version, headers: dict[str, str] = ADMIN) -> Any:
        at = {**headers, "OpenStack-API-Version": f"compute {microversion.text(version)}"}
        result = self.client.simulate_get(path, headers=at)
        assert result.status_code == 200, (path, result.text)
        return result.json

    # -- the objects a call's path names, made on first use --

    def _make_aggregate(self, version: Version) -> str:
        return str(self._post("/v2.1/os-aggregates", {"aggregate": {"name": "a1"}})[
            "aggregate"]["id"])  # fmt: skip

    def _make_hosting(self, version: Version) -> str:
        made = self._post("/v2.1/os-aggregates", {"aggregate": {"name": "a2"}})["aggregate"]
        self._post(f"/v2.1/os-aggregates/{made['id']}/action", {"add_host": {"host": "cn1"}})
        return str(made["id"])

    def _make_group(self, version: Version) -> str:
        body = {"server_group": {"name": "g", "policies": ["anti-affinity"]}}
        return str(self._post("/v2.1/os-server-groups", body, USER)["server_group"]["id"])

    def _make_specced(self, version: Version) -> str:
        specs = {"extra_specs": {"hw:cpu_policy": "shared", "hw:numa_nodes": "1"}}
        self._post("/v2.1/flavors/2/os-extra_specs", specs)
        return "2"

    def _make_private(self, version: Version) -> str:
        body = {"flavor": {"name": "private", "ram": 512, "vcpus": 1, "disk": 1,
                           "id": "private", "os-flavor-access:is_public": False}}  # fmt: skip
        self._post("/v2.1/flavors", body)
        self._post("/v2.1/flavors/private/action", {"addTenantAccess": {"tenant": "pb"}})
        return "private"

    def _make_keypair(self, version: Version) -> str:
        made = self._post("/v2.1/os-keypairs", {"keypair": {"name": "kp"}}, USER)
        return str(made["keypair"]["name"])

    def _make_hypervisor(self, version: Version) -> str:
        listed = self._get("/v2.1/os-hypervisors", version)["hypervisors"]
        return str(listed[0]["id"])

    def _make_action(self, version: Version) -> str:
        listed = self._get(f"/v2.1/servers/{self.server}/os-instance-actions", version)
        return str(listed["instanceActions"][0]["request_id"])

    def _resolve(self, name: str, version: Version) -> str:
        if name not in self._made:
            self._made[name] = getattr(self, f"_make_{name}")(version)
        return self._made[name]

    # -- steps a call may need first --

    def keypairs(self) -> None:
        """Two keypairs of alice's."""
        for name in ("kp1", "kp2"):
            self._post("/v2.1/os-keypairs", {"keypair": {"name": name}}, USER)

    def admin_keypair(self) -> None:
        """A keypair of the admin's, who rebuilds with it."""
        self._post("/v2.1/os-keypairs", {"keypair": {"name": "kp-admin"}})

    def stopped(self) -> None:
        """The server stopped, as its agent would leave it after ``os-stop``."""
        self._post(f"/v2.1/servers/{self.server}/action", {"os-stop": None}, USER)
        self.stores.instances.step_action(
            self.server,
            "cn1",
            TaskState.POWERING_OFF,
            TaskState.NONE,
            "off",
            "compute_stop_instance",
            result="Success",
        )  # fmt: skip, as the host's agent settles a stop

    def shelved(self) -> None:
        """The server shelved on its host, as its agent would leave it after ``shelve``
        with ``shelved_offload_time`` -1."""
        self._post(f"/v2.1/servers/{self.server}/action", {"shelve": None}, USER)
        self.stores.instances.step_action(
            self.server,
            "cn1",
            TaskState.SHELVING,
            TaskState.NONE,
            "off",
            "compute_shelve_instance",
            True,
            result="Success",
        )  # fmt: skip, as the host's agent settles a shelve

    def _values(self) -> dict[str, str]:
        return {
            "image_id": IMAGE,
            "uuid": self.server,
            "flavor_id": f"sample-{uuid.uuid4().hex[:8]}",
            "flavor_name": f"sample-{uuid.uuid4().hex[:8]}",
            "name": "sample",
            "host_name": "cn1",
            "host": "cn1",
            "hostname": "cn1",
            "min_count": "2",
            "max_count": "3",
            "access_ip_v4": "1.2.3.4",
            "access_ip_v6": "80fe::",
            "availability_zone": "az1",
            "user_data": base64.b64encode(b"#!/bin/sh\necho hello\n").decode(),
            "description": "a description",
            "project_id": "pa",
            "tenant_id": "pb",
            "user_id": "alice",
            "binary": "nova-compute",
            "disabled_reason": "test2",
            "forced_down": "true",
            "value": "bar",
            "value1": "shared",
            "value2": "1",
            "keypair_name": f"kp-{uuid.uuid4().hex[:8]}",
            "keypair_type": "ssh",
            "public_key": public_key(),
        }

    def path(self, call: Call, version: Version) -> str:
        """The call's path with the scenario's objects, some by microversion: 2.53 names
        a service by id, and searches hypervisors with query parameters."""
        match = re.fullmatch(r"\{(service_action|hypervisor_search):([a-z-]+)\}", call.path)
        if match is None:
            return re.sub(r"\{(\w+)\}", lambda m: self._resolve(m.group(1), version), call.path)
        kind, what = match.groups()
        if kind == "service_action":
            if version >= (2, 53):
                return f"/v2.1/os-services/{self.stores.agents.service('cn1').id}"
            return f"/v2.1/os-services/{what}"
        pattern = "cn2" if what == "without" else "cn1"
        if version >= (2, 53):
            servers = "&with_servers=true" if what != "search" else ""
            return f"/v2.1/os-hypervisors?hypervisor_hostname_pattern={pattern}{servers}"
        return f"/v2.1/os-hypervisors/{pattern}/{'search' if what == 'search' else 'servers'}"

    def send(
        self, call: Call, version: Version, resource: str
    ) -> tuple[falcon.testing.Result, Any]:
        """The call's answer, and the body it sent."""
        if call.setup is not None:
            getattr(self, call.setup)()
        headers = {**(ADMIN if call.admin else USER),
                   "OpenStack-API-Version": f"compute {microversion.text(version)}"}  # fmt: skip
        body = None
        if call.request is not None:
            values = {**self.values, **dict(call.values)}
            text = template_text(resource, version, call.request)
            if "%(sg_uuid)s" in text:  # 2.71's group hint
                values["sg_uuid"] = self._resolve("group", version)
            body = fill(text, values)
        path, _sep, query = self.path(call, version).partition("?")
        if call.paged_from is not None and version >= call.paged_from:
            query = "&".join(part for part in (query, "limit=1") if part)
        result = self.client.simulate_request(
            call.method, path, json=body, headers=headers, query_string=query or None
        )
        return result, body


@pytest.fixture
def scenario(conf) -> Scenario:
    return Scenario(conf, f"samples-{uuid.uuid4().hex}")


def _response_cases() -> list[Any]:
    cases = []
    for resource, version, name in templates():
        if (resource, name) in RESPONSES:
            label = f"{resource}/{microversion.text(version)}/{name}"
            cases.append(pytest.param(resource, version, name, id=label))
    return cases


@pytest.mark.parametrize(("resource", "version", "name"), _response_cases())
def test_responses_carry_every_key_of_nova_s_samples(scenario, resource, version, name) -> None:
    call = RESPONSES[(resource, name)]
    result, body = scenario.send(call, version, resource)
    refused = refusal(body)
    if refused is not None:
        assert result.status_code == 400 and refused in result.text, result.text
        return
    assert result.status_code == call.status_at(version), result.text
    sample = shape(template_text(resource, version, name))
    if call.path.startswith("/v2.1") or call.path.startswith("{"):
        assert result.headers["OpenStack-API-Version"] == f"compute {microversion.text(version)}"
    assert mismatches(result.json, sample) == []


def _request_cases() -> list[Any]:
    cases = []
    for resource, version, name in templates():
        call = REQUESTS.get((resource, name))
        if call is not None:
            at = call.at or version
            label = f"{resource}/{microversion.text(at)}/{name}"
            cases.append(pytest.param(resource, at, name, id=label))
    return cases


@pytest.mark.parametrize(("resource", "version", "name"), _request_cases())
def test_request_samples_are_answered_as_they_must_be(scenario, resource, version, name) -> None:
    call = REQUESTS[(resource, name)]
    result, body = scenario.send(call, version, resource)
    refused = refusal(body)
    if refused is not None:
        assert result.status_code == 400 and refused in result.text, result.text
        return
    assert result.status_code == call.status_at(version), result.text


def test_every_sample_of_a_served_resource_is_checked_or_said_not_served() -> None:
    sent = {(resource, call.request) for (resource, _), call in (*RESPONSES.items(),
                                                               *REQUESTS.items())}  # fmt: skip
    unchecked = sorted(
        f"{resource}/{microversion.text(version)}/{name}"
        for resource, version, name in templates()
        if (resource, name) not in RESPONSES
        and (resource, name) not in REQUESTS
        and (resource, name) not in sent
        and (resource, name) not in NOT_SERVED
    )
    assert unchecked == []


def test_the_comparison_catches_a_missing_key_and_a_wrong_type() -> None:
    sample = shape('{"server": {"id": "%(id)s", "progress": 0, "links": [{"rel": "self"}],'
                   ' "metadata": {"k": "v"}, "fault": null}}')  # fmt: skip
    good = {"server": {"id": "x", "progress": 0, "links": [{"rel": "self"}], "metadata": {},
                       "fault": {"code": 500}}}  # fmt: skip
    assert mismatches(good, sample) == []
    assert mismatches({"server": {"id": "x", "links": []}}, sample) == [
        ".server.progress: missing",
        ".server.metadata: missing",
        ".server.fault: missing",
    ]
    assert mismatches({"server": {**good["server"], "progress": "0"}}, sample) == [
        ".server.progress: '0' is not like the sample's 0"
    ]
    assert mismatches({"server": {**good["server"], "progress": True}}, sample) != []


def test_the_exact_comparison_catches_more_and_allows_what_it_is_told() -> None:
    sample = shape('{"hypervisors": [{"id": "%(int:id)s", "ratio": 1.5, "servers": '
                   '[{"uuid": "%(uuid)s"}], "metadata": {"k": "v"}}], "count": 0}')  # fmt: skip
    row = {"id": 1, "ratio": 1.5, "servers": [{"uuid": "u"}], "metadata": {"a": 1}}
    good = {"hypervisors": [row, {**row, "id": 2}], "count": 3}
    assert mismatches(good, sample, exact=True) == []
    odd = {**row, "ratio": 1, "servers": [], "extra": True}
    assert mismatches({"hypervisors": [row, odd], "count": 3.0}, sample) == []
    assert mismatches({"hypervisors": [row, odd], "count": 3.0}, sample, exact=True) == [
        ".hypervisors[1].ratio: 1 is not like the sample's 1.5",
        ".hypervisors[1].servers: empty, the sample's is not",
        ".hypervisors[1].extra: not in the sample",
        ".count: 3.0 is not like the sample's 0",
    ]
    bare = {"id": 3, "ratio": 0.5, "servers": None}
    assert mismatches({"hypervisors": [bare], "count": 0}, sample, exact=True) == [
        ".hypervisors[0].servers: NoneType, not a list",
        ".hypervisors[0].metadata: missing",
    ]
    allowed = mismatches({"hypervisors": [bare], "count": 0}, sample, exact=True,
                         optional={"metadata"}, nullable={"servers"})  # fmt: skip
    assert allowed == []
