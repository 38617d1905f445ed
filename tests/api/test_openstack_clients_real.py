"""The clients operators and users type into, against qsched behind a real Keystone and Glance.

python-openstackclient runs as a user runs it (``openstack`` with ``OS_*`` variables,
the endpoint from Keystone's catalog), in a process of its own per command (forked
from one that imported the client, :mod:`tests.osc`), and every check reads the
command's output (``-f json`` where the command has it). The API serves
in this process on the port the catalog names for ``compute``, with two compute agents
on an in-process ledger and bus, so boots go ACTIVE and actions reach a virt driver.
openstacksdk negotiates the latest microversion qsched advertises; python-novaclient
speaks 2.1 and that version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.api import microversion
from qsched.api.wsgi import make_server
from qsched.bus.kombu import KombuBus
from qsched.ledger import Stores, open_stores
from qsched.stack.keystone import User
from tests.api.test_keystone_real import keystone_conf
from tests.conftest import GlanceCloud, KeystoneCloud
from tests.helpers import wait_until
from tests.images.test_images import _agent
from tests.osc import OpenStackRunner

pytestmark = pytest.mark.real

OPENSTACK = Path(sys.executable).parent / "openstack"
LATEST = microversion.text(microversion.MAX)


class Cloud:
    """The API under test, its ledger, and the clouds it lives in."""

    def __init__(
        self, keystone: KeystoneCloud, glance: GlanceCloud, stores: Stores, osc: OpenStackRunner
    ) -> None:
        self.keystone = keystone
        self.glance = glance
        self.stores = stores
        self.osc = osc

    def environ(self, user: str) -> dict[str, str]:
        """What a user exports before running ``openstack`` (an openrc file)."""
        account: User = self.keystone.users[user]
        return {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "OS_AUTH_URL": self.keystone.server.url,
            "OS_IDENTITY_API_VERSION": "3",
            "OS_USERNAME": account.name,
            "OS_PASSWORD": account.password,
            "OS_PROJECT_NAME": account.project,
            "OS_USER_DOMAIN_ID": "default",
            "OS_PROJECT_DOMAIN_ID": "default",
            "OS_INTERFACE": "public",
        }

    def run(self, user: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``openstack <args>`` as ``user``; fails the test on a non-zero exit if ``check``."""
        done = self.osc.run(args, self.environ(user))
        if check:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def json(self, user: str, *args: str) -> Any:
        """``openstack <args> -f json`` as ``user``, parsed."""
        return json.loads(self.run(user, *args, "-f", "json").stdout)

    def project_id(self, user: str) -> str:
        return self.keystone.users[user].project_id

    def wait_for(self, user: str, server: str, status: str, timeout_s: float = 30) -> Any:
        """``openstack server show`` until the server shows ``status``; what it showed."""
        deadline = time.monotonic() + timeout_s
        while True:
            shown = self.json(user, "server", "show", server)
            if shown["status"] == status or time.monotonic() > deadline:
                assert shown["status"] == status, shown
                return shown
            time.sleep(0.5)


def table(rows: list[dict[str, Any]], key: str, value: str) -> dict[str, Any]:
    """A two-column listing (``-f json``) as a mapping."""
    return {row[key]: row[value] for row in rows}


@pytest.fixture(scope="module")
def cloud(
    keystone: KeystoneCloud, glance: GlanceCloud, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cloud]:
    if not OPENSTACK.exists():
        pytest.fail("python-openstackclient is missing from the virtual environment: make install")
    path = keystone_conf(
        keystone, tmp_path_factory.mktemp("clients"), image_service="glance",
        flavor=["m1.small:1:512:10", "m1.medium:2:1024:10"],
    )  # fmt: skip
    conf = qconf.load(config_files=[str(path)])
    conf.set_override("build_timeout_s", 10, group="scheduler")
    options = qconf.Options.from_conf(conf)
    stores = open_stores(options.ledger, options.quota, url=f"fakeredis://osc-{uuid.uuid4().hex}")
    bus = KombuBus("memory://", prefix=f"osc{uuid.uuid4().hex[:8]}")
    app = api_app.create_app(
        stores, bus, options.api, options.scheduler, images=api_app.image_service(options.api, conf)
    )
    server = make_server(api_app.authenticated(app, options.api, conf), port=keystone.api_port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    running = [_agent(stores, bus, host, frozenset()) for host in ("osc-cn1", "osc-cn2")]
    osc = OpenStackRunner()
    try:
        yield Cloud(keystone, glance, stores, osc)
    finally:
        osc.close()
        for agent in running:
            agent.stop(timeout_s=5)
        server.shutdown()
        server.server_close()
        bus.close()


def boot(cloud: Cloud, user: str, name: str, *more: str) -> dict[str, Any]:
    """``openstack server create ... --nic none --wait``: the server it shows."""
    shown: dict[str, Any] = cloud.json(
        user, "server", "create", "--image", cloud.glance.images["plain"], "--flavor",
        "m1.small", "--nic", "none", "--wait", *more, name,
    )  # fmt: skip
    return shown


# -- servers --


def test_server_create_wait_show_and_delete(cloud: Cloud) -> None:
    shown = boot(cloud, "member_a", "vm-create")
    assert shown["status"] == "ACTIVE" and shown["name"] == "vm-create"
    assert shown["flavor"]["original_name"] == "m1.small"  # the 2.47 embedded flavor
    again = cloud.json("member_a", "server", "show", shown["id"])
    assert again["id"] == shown["id"] and again["status"] == "ACTIVE"
    assert again["project_id"] == cloud.project_id("member_a")
    cloud.run("member_a", "server", "delete", "--wait", shown["id"])
    gone = cloud.run("member_a", "server", "show", shown["id"], check=False)
    assert gone.returncode != 0 and "No Server found" in gone.stderr


def test_server_list_by_name_long_and_all_projects(cloud: Cloud) -> None:
    mine = boot(cloud, "member_a", "vm-list-a")
    theirs = boot(cloud, "member_b", "vm-list-b")
    named = cloud.json("member_a", "server", "list", "--name", "^vm-list-a$")
    assert [s["ID"] for s in named] == [mine["id"]]
    assert cloud.json("member_a", "server", "list", "--name", "nomatch") == []
    long = cloud.json("member_a", "server", "list", "--long", "--name", "vm-list")
    assert [s["ID"] for s in long] == [mine["id"]]
    assert long[0]["Status"] == "ACTIVE" and long[0]["Flavor"] == "m1.small"
    assert long[0]["Host"] is None  # a member does not see where servers run
    everyone = cloud.json(
        "admin", "server", "list", "--all-projects", "--long", "--name", "vm-list"
    )
    assert {s["ID"] for s in everyone} == {mine["id"], theirs["id"]}
    assert all(s["Host"].startswith("osc-cn") for s in everyone)
    cloud.run("member_a", "server", "delete", "--wait", mine["id"])
    cloud.run("member_b", "server", "delete", "--wait", theirs["id"])


def test_server_set_name_stop_start_and_reboot(cloud: Cloud) -> None:
    shown = boot(cloud, "member_a", "vm-actions")
    cloud.run("member_a", "server", "set", "--name", "vm-renamed", shown["id"])
    assert cloud.json("member_a", "server", "show", shown["id"])["name"] == "vm-renamed"
    cloud.run("member_a", "server", "stop", shown["id"])
    stopped = cloud.wait_for("member_a", shown["id"], "SHUTOFF")
    assert stopped["OS-EXT-STS:power_state"] == 4  # SHUTDOWN; -f json shows the number
    cloud.run("member_a", "server", "start", shown["id"])
    cloud.wait_for("member_a", shown["id"], "ACTIVE")
    cloud.run("member_a", "server", "reboot", "--wait", shown["id"])
    rebooted = cloud.json("member_a", "server", "show", shown["id"])
    assert rebooted["status"] == "ACTIVE" and rebooted["OS-EXT-STS:power_state"] == 1
    cloud.run("member_a", "server", "delete", "--wait", shown["id"])


def test_server_resize_confirm_migrate_revert_and_live_migrate(cloud: Cloud) -> None:
    """The moves (docs/moves.rst) as users and operators type them."""
    shown = boot(cloud, "member_a", "vm-moves")
    source = cloud.json("admin", "server", "show", shown["id"])["OS-EXT-SRV-ATTR:host"]
    cloud.run("member_a", "server", "resize", "--flavor", "m1.medium", "--wait", shown["id"])
    resized = cloud.wait_for("member_a", shown["id"], "VERIFY_RESIZE")
    assert resized["flavor"]["original_name"] == "m1.medium"
    cloud.run("member_a", "server", "resize", "confirm", shown["id"])
    cloud.wait_for("member_a", shown["id"], "ACTIVE")
    moved = cloud.json("admin", "server", "show", shown["id"])["OS-EXT-SRV-ATTR:host"]
    assert moved != source
    cloud.run("admin", "server", "migrate", "--wait", shown["id"])  # cold, back again
    cloud.wait_for("admin", shown["id"], "VERIFY_RESIZE")
    cloud.run("admin", "server", "resize", "revert", shown["id"])
    cloud.wait_for("admin", shown["id"], "ACTIVE")
    assert cloud.json("admin", "server", "show", shown["id"])["OS-EXT-SRV-ATTR:host"] == moved
    cloud.run("admin", "server", "migrate", "--live-migration", "--wait", shown["id"])
    cloud.wait_for("admin", shown["id"], "ACTIVE")
    assert cloud.json("admin", "server", "show", shown["id"])["OS-EXT-SRV-ATTR:host"] == source
    listed = cloud.json("admin", "--os-compute-api-version", "2.59", "server", "migration",
                        "list", "--server", shown["id"])  # fmt: skip
    assert sorted((m.get("Type"), m["Status"]) for m in listed) == [
        ("live-migration", "completed"),
        ("migration", "reverted"),
        ("resize", "confirmed"),
    ]
    cloud.run("member_a", "server", "delete", "--wait", shown["id"])


def test_server_shelve_unshelve_and_evacuate(cloud: Cloud) -> None:
    """Shelving, and an evacuation from a host an operator forced down, as typed."""
    shown = boot(cloud, "member_a", "vm-shelved")
    cloud.run("member_a", "server", "shelve", "--wait", shown["id"])
    offloaded = cloud.wait_for("member_a", shown["id"], "SHELVED_OFFLOADED")
    assert offloaded["OS-EXT-STS:power_state"] == 0
    cloud.run("member_a", "server", "unshelve", "--wait", shown["id"])
    cloud.wait_for("member_a", shown["id"], "ACTIVE")
    source = cloud.json("admin", "server", "show", shown["id"])["OS-EXT-SRV-ATTR:host"]
    versioned = ("--os-compute-api-version", "2.11")
    cloud.run("admin", *versioned, "compute", "service", "set", "--down", source, "nova-compute")
    try:
        # no --wait: python-openstackclient 10.5 waits there for "ACTIVE" against the
        # lower-cased status osc-lib reads, which never comes, whatever the cloud
        cloud.run("admin", "server", "evacuate", shown["id"])
        evacuated = cloud.wait_for("admin", shown["id"], "ACTIVE")
        assert evacuated["OS-EXT-SRV-ATTR:host"] not in (None, source)
    finally:
        cloud.run("admin", *versioned, "compute", "service", "set", "--up", source,
                  "nova-compute")  # fmt: skip
    # back up, its agent reaps its copy and lets go of what was held for it
    assert wait_until(lambda: cloud.stores.ledger.held_claims(source) == {}, 60)
    listed = cloud.json("admin", "--os-compute-api-version", "2.59", "server", "migration",
                        "list", "--server", shown["id"])  # fmt: skip
    assert [(m.get("Type"), m["Status"]) for m in listed] == [("evacuation", "done")]
    cloud.run("member_a", "server", "delete", "--wait", shown["id"])


def test_keypair_create_list_boot_with_it_and_delete(cloud: Cloud, tmp_path: Path) -> None:
    private = tmp_path / "kp.pem"
    made = cloud.json("member_a", "keypair", "create", "--private-key", str(private), "kp-osc")
    assert made["name"] == "kp-osc" and made["fingerprint"]
    assert private.read_text().startswith("-----BEGIN")
    listed = cloud.json("member_a", "keypair", "list")
    assert [(k["Name"], k["Fingerprint"]) for k in listed] == [("kp-osc", made["fingerprint"])]
    assert cloud.json("member_b", "keypair", "list") == []
    shown = boot(cloud, "member_a", "vm-keyed", "--key-name", "kp-osc")
    assert cloud.json("member_a", "server", "show", shown["id"])["key_name"] == "kp-osc"
    refused = cloud.run(
        "member_b", "server", "create", "--image", cloud.glance.images["plain"], "--flavor",
        "m1.small", "--nic", "none", "--key-name", "kp-osc", "vm-not-keyed", check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "Invalid key_name provided" in refused.stderr
    cloud.run("member_a", "server", "delete", "--wait", shown["id"])
    cloud.run("member_a", "keypair", "delete", "kp-osc")
    assert cloud.json("member_a", "keypair", "list") == []


# -- flavors --


def test_flavor_list_show_create_set_and_delete(cloud: Cloud) -> None:
    names = {f["Name"] for f in cloud.json("member_a", "flavor", "list")}
    assert {"m1.small", "m1.medium"} <= names
    small = cloud.json("member_a", "flavor", "show", "m1.small")
    assert (small["vcpus"], small["ram"], small["disk"]) == (1, 512, 10)
    made = cloud.json(
        "admin", "flavor", "create", "--vcpus", "2", "--ram", "2048", "--disk", "20",
        "--description", "for the client test", "c1.osc",
    )  # fmt: skip
    assert made["name"] == "c1.osc" and made["description"] == "for the client test"
    cloud.run("admin", "flavor", "set", "--property", "hw:cpu_policy=shared", "c1.osc")
    shown = cloud.json("admin", "flavor", "show", "c1.osc")
    assert shown["properties"] == {"hw:cpu_policy": "shared"}
    cloud.run("admin", "flavor", "set", "--description", "changed", "c1.osc")
    assert cloud.json("admin", "flavor", "show", "c1.osc")["description"] == "changed"
    refused = cloud.run("member_a", "flavor", "delete", "c1.osc", check=False)
    assert refused.returncode != 0 and "os-flavor-manage:delete" in refused.stderr
    cloud.run("admin", "flavor", "delete", "c1.osc")
    assert "c1.osc" not in {f["Name"] for f in cloud.json("admin", "flavor", "list", "--all")}


def test_a_private_flavor_is_seen_and_booted_only_by_projects_given_it(cloud: Cloud) -> None:
    cloud.run(
        "admin", "flavor", "create", "--private", "--vcpus", "1", "--ram", "512", "--disk",
        "10", "p1.osc",
    )  # fmt: skip
    assert "p1.osc" not in {f["Name"] for f in cloud.json("member_a", "flavor", "list", "--all")}
    cloud.run("admin", "flavor", "set", "--project", cloud.project_id("member_a"), "p1.osc")
    assert "p1.osc" in {f["Name"] for f in cloud.json("member_a", "flavor", "list", "--all")}
    assert "p1.osc" not in {f["Name"] for f in cloud.json("member_b", "flavor", "list", "--all")}
    shown = cloud.json(
        "member_a", "server", "create", "--image", cloud.glance.images["plain"], "--flavor",
        "p1.osc", "--nic", "none", "--wait", "vm-private",
    )  # fmt: skip
    assert shown["status"] == "ACTIVE"
    cloud.run("member_a", "server", "delete", "--wait", shown["id"])
    cloud.run("admin", "flavor", "delete", "p1.osc")


# -- limits, quotas, zones, hypervisors, services --


def test_limits_and_quotas(cloud: Cloud) -> None:
    project = cloud.project_id("member_b")
    cloud.run("admin", "quota", "set", "--instances", "7", "--cores", "11", project)
    shown = table(cloud.json("admin", "quota", "show", project), "Resource", "Limit")
    assert (shown["instances"], shown["cores"]) == (7, 11)
    absolute = table(cloud.json("member_b", "limits", "show", "--absolute"), "Name", "Value")
    # openstacksdk's names for maxTotalInstances, maxTotalCores, totalInstancesUsed
    assert (absolute["instances"], absolute["total_cores"]) == (7, 11)
    assert absolute["instances_used"] == 0
    refused = cloud.run("member_b", "quota", "set", "--instances", "100", project, check=False)
    assert refused.returncode != 0 and "os-quota-sets:update" in refused.stderr


def test_availability_zones_hypervisors_and_services(cloud: Cloud) -> None:
    zones = cloud.json("member_a", "availability", "zone", "list", "--compute")
    assert [(z["Zone Name"], z["Zone Status"]) for z in zones] == [("nova", "available")]
    hypervisors = cloud.json("admin", "hypervisor", "list")
    names = sorted(h["Hypervisor Hostname"] for h in hypervisors)
    assert len(names) == 2 and all(n.startswith("osc-cn") for n in names)
    shown = cloud.json("admin", "hypervisor", "show", hypervisors[0]["ID"])
    assert shown["hypervisor_type"] == "fake" and shown["state"] == "up"
    stats = cloud.json("admin", "hypervisor", "stats", "show")
    assert stats["count"] == 2 and stats["vcpus"] == 8
    services = cloud.json("admin", "compute", "service", "list")
    assert sorted((s["Binary"], s["Host"], s["State"]) for s in services) == [
        ("nova-compute", "osc-cn1", "up"),
        ("nova-compute", "osc-cn2", "up"),
    ]
    refused = cloud.run("member_a", "hypervisor", "list", check=False)
    assert refused.returncode != 0 and "os-hypervisors:list" in refused.stderr


# -- the SDK and novaclient --


def test_openstacksdk_negotiates_the_latest_microversion(cloud: Cloud) -> None:
    import openstack

    account = cloud.keystone.users["member_a"]
    conn = openstack.connect(
        auth_url=cloud.keystone.server.url, username=account.name, password=account.password,
        project_name=account.project, user_domain_id="default", project_domain_id="default",
    )  # fmt: skip
    try:
        assert conn.compute.get_endpoint_data().max_microversion == microversion.MAX
        server = conn.compute.create_server(
            name="vm-sdk", image_id=cloud.glance.images["plain"], flavor_id="m1.small",
            networks="none",
        )  # fmt: skip
        server = conn.compute.wait_for_server(server, wait=60)
        assert server.status == "ACTIVE" and server.flavor.original_name == "m1.small"
        conn.compute.delete_server(server)
        conn.compute.wait_for_delete(server, wait=60)
    finally:
        conn.close()


@pytest.mark.parametrize("version", ["2.1", LATEST])
def test_novaclient_at_2_1_and_the_latest(cloud: Cloud, version: str) -> None:
    from keystoneauth1 import session as ks_session
    from keystoneauth1.identity import v3
    from novaclient import client as nova_client

    account = cloud.keystone.users["member_a"]
    auth = v3.Password(**account.auth_args(cloud.keystone.server.url))
    nova = nova_client.Client(version, session=ks_session.Session(auth=auth))
    flavor = nova.flavors.find(name="m1.small")
    nics = "none" if version != "2.1" else None
    made = nova.servers.create(f"vm-nova-{version}", cloud.glance.images["plain"], flavor,
                               nics=nics)  # fmt: skip
    assert nova.servers.get(made.id).name == f"vm-nova-{version}"
    assert made.id in {s.id for s in nova.servers.list()}
    assert nova.limits.get().absolute  # the limits answer at this version
    nova.servers.delete(made.id)
