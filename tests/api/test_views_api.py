"""os-availability-zone and os-hypervisors over HTTP: Nova's shapes (its api_samples, as
the installed nova package ships them) at 2.1, 2.28, 2.33, 2.53 and 2.75, its errors and
policies, and what the views cost a member."""

from __future__ import annotations

import json
import re
import time
import uuid as uuidlib
from typing import Any

import falcon.testing
import pytest

from agents.registration import register_nodes
from agents.service import ComputeAgent
from agents.virt.fake import FakeChild, FakeDriver, FakeNodeSpec
from qsched.api import app as api_app
from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.ledger.base import State
from tests.agents.test_agent import make_agent
from tests.api.test_api import ADMIN, USER, at, fault
from tests.helpers import wait_until
from tests.samples import mismatches, samples_dir, shape

P1 = RequestContext.for_project("u1", "p1")
SAMPLES = samples_dir()


def sample(name: str) -> Any:
    """One of Nova's response samples, as :func:`tests.samples.shape` reads it."""
    return shape((SAMPLES / f"{name}.json.tpl").read_text())


#: Fields Nova's schema lets be null: ``host_ip`` (qsched's agents report none), the
#: ``hosts`` of an unavailable zone in the detail, an enabled service's reason.
NULLS = ("host_ip", "hosts", "disabled_reason")
#: Keys Nova leaves out when empty (``servers`` before 2.75): checked by the tests.
OPTIONAL = {"servers"}


def assert_shape(ours: Any, novas: Any) -> None:
    """Every key of Nova's sample and no other, each value of the sample's type (a null
    in the sample allows anything; ``cpu_info`` is the driver's, only its type counts)."""
    assert mismatches(ours, novas, exact=True, optional=OPTIONAL, nullable=NULLS) == []


@pytest.fixture
def client(conf, stores: Stores, bus, api: ComputeAPI) -> falcon.testing.TestClient:
    """Not tests.api.test_api's: on the conftest's in-process KombuBus, which the agents of
    ``cloud`` consume, beside ``api`` and its flavors."""
    app = api_app.create_app(
        stores, bus, APIOptions.from_conf(conf), SchedulerOptions.from_conf(conf)
    )
    return falcon.testing.TestClient(app)


@pytest.fixture
def cloud(conf, stores: Stores, bus, api: ComputeAPI, agents: list[ComputeAgent]) -> list[str]:
    """cn0 (zone nova, nodes cn0-0 and cn0-1) and cn1 (zone az1, one node), running
    three servers; their uuids."""
    agents.append(make_agent(conf, stores, bus, "cn0", nodes=2))
    conf.set_override("availability_zone", "az1", group="agent")
    agents.append(make_agent(conf, stores, bus, "cn1", nodes=1))
    booted = [api.boot(P1, f"vm{i}", "small").uuid for i in range(3)]
    assert wait_until(
        lambda: all(stores.instances.get(u).state == State.ACTIVE for u in booted), timeout_s=20
    )
    return booted


def get(client, path: str, version: str = "2.1", admin: bool = True, **query: str) -> Any:
    result = client.simulate_get(
        f"/v2.1{path}", params=query, headers=at(version, ADMIN if admin else USER)
    )
    assert result.status_code == 200, result.text
    return result.json


# -- os-hypervisors --


def test_list_and_detail_at_2_1(client, cloud, stores: Stores) -> None:
    listed = get(client, "/os-hypervisors")
    assert_shape(listed, sample("os-hypervisors/hypervisors-list-resp"))
    assert [(h["id"], h["hypervisor_hostname"]) for h in listed["hypervisors"]] == [
        (1, "cn0-0"), (2, "cn0-1"), (3, "cn1-0")
    ]  # fmt: skip
    assert {(h["state"], h["status"]) for h in listed["hypervisors"]} == {("up", "enabled")}
    detail = get(client, "/os-hypervisors/detail")
    assert_shape(detail, sample("os-hypervisors/hypervisors-detail-resp"))
    rows = detail["hypervisors"]
    assert sum(h["running_vms"] for h in rows) == 3
    assert sum(h["vcpus_used"] for h in rows) == 3
    for h in rows:
        provider = stores.ledger.get_provider(
            stores.ledger.hypervisor_uuid(h["id"]) or ""
        )  # the view is the ledger's root provider
        assert h["hypervisor_hostname"] == provider.name
        assert (h["vcpus"], h["memory_mb"]) == (4, 4096)
        assert h["memory_mb_used"] == provider.usages.get("MEMORY_MB", 0)
        assert h["free_ram_mb"] == 4096 - h["memory_mb_used"]
        assert h["running_vms"] == len(stores.ledger.provider_consumers(provider.uuid))
        assert h["hypervisor_type"] == "fake" and h["current_workload"] == 0
        assert isinstance(h["cpu_info"], str) and isinstance(json.loads(h["cpu_info"]), dict)
        service = stores.agents.service(h["hypervisor_hostname"].rsplit("-", 1)[0])
        assert h["service"] == {"host": service.host, "id": service.seq, "disabled_reason": None}


def test_cpu_info_is_an_object_from_2_28(client, cloud) -> None:
    shown = get(client, "/os-hypervisors/1", "2.28")
    assert_shape(shown, sample("os-hypervisors/v2.28/hypervisors-show-resp"))
    assert isinstance(shown["hypervisor"]["cpu_info"], dict)
    assert isinstance(get(client, "/os-hypervisors/1", "2.27")["hypervisor"]["cpu_info"], str)


def test_pages_from_2_33(client, cloud) -> None:
    first = get(client, "/os-hypervisors", "2.33", limit="2")
    assert_shape(first, sample("os-hypervisors/v2.33/hypervisors-list-resp"))
    assert [h["id"] for h in first["hypervisors"]] == [1, 2]
    link = first["hypervisors_links"][0]
    assert link["rel"] == "next" and link["href"].endswith("/v2.1/os-hypervisors?limit=2&marker=2")
    rest = get(client, "/os-hypervisors/detail", "2.33", limit="2", marker="2")
    assert [h["id"] for h in rest["hypervisors"]] == [3] and "hypervisors_links" not in rest
    result = client.simulate_get("/v2.1/os-hypervisors", params={"marker": "9"},
                                 headers=at("2.33", ADMIN))  # fmt: skip
    assert fault(result, 400, "badRequest") == "marker [9] not found"
    result = client.simulate_get(
        "/v2.1/os-hypervisors", params={"limit": "2"}, headers=at("2.32", ADMIN)
    )
    assert "('limit' was unexpected)" in fault(result, 400, "badRequest")


def test_uuids_and_query_parameters_from_2_53(client, cloud, stores: Stores) -> None:
    listed = get(client, "/os-hypervisors", "2.53", limit="1")
    assert_shape(listed, sample("os-hypervisors/v2.53/hypervisors-list-resp"))
    first = listed["hypervisors"][0]
    assert first["id"] == stores.ledger.hypervisor_uuid(1)
    assert listed["hypervisors_links"][0]["href"].endswith(f"marker={first['id']}")
    second = get(client, "/os-hypervisors", "2.53", limit="1", marker=first["id"])
    assert second["hypervisors"][0]["hypervisor_hostname"] == "cn0-1"

    with_servers = get(client, "/os-hypervisors/detail", "2.53", with_servers="true")
    assert_shape(with_servers, sample("os-hypervisors/v2.53/hypervisors-detail-with-servers-resp"))
    rows = with_servers["hypervisors"]
    shown = sorted(s["uuid"] for h in rows for s in h.get("servers", []))
    assert shown == sorted(cloud)
    assert all(h["service"]["id"] == stores.agents.service(h["service"]["host"]).id for h in rows)
    assert all(len(h.get("servers", [])) == h["running_vms"] for h in rows)

    found = get(client, "/os-hypervisors", "2.53", hypervisor_hostname_pattern="cn1")
    assert [h["hypervisor_hostname"] for h in found["hypervisors"]] == ["cn1-0"]
    assert "hypervisors_links" not in found
    paged = {"hypervisor_hostname_pattern": "cn", "limit": "1"}
    result = client.simulate_get("/v2.1/os-hypervisors", headers=at("2.53", ADMIN), params=paged)
    assert "Paging over hypervisors" in fault(result, 400, "badRequest")
    result = client.simulate_get("/v2.1/os-hypervisors", headers=at("2.53", ADMIN),
                                 params={"hypervisor_hostname_pattern": "zz"})  # fmt: skip
    assert fault(result, 404, "itemNotFound") == "No hypervisor matching 'zz' could be found."
    result = client.simulate_get("/v2.1/os-hypervisors", headers=at("2.53", ADMIN),
                                 params={"with_servers": "maybe"})  # fmt: skip
    assert "query parameters with_servers. Value: maybe" in fault(result, 400, "badRequest")


def test_servers_always_listed_when_asked_from_2_75(client, cloud, stores: Stores) -> None:
    def servers(version: str) -> list[Any]:
        rows = get(client, "/os-hypervisors", version, with_servers="1")["hypervisors"]
        return [h.get("servers") for h in rows]

    counts = [len(stores.ledger.provider_consumers(u)) for _, u in stores.ledger.hypervisors()]
    assert [len(s) if s is not None else 0 for s in servers("2.75")] == counts
    assert None not in servers("2.75")
    if 0 in counts:  # before 2.75 a hypervisor without servers shows no key
        assert None in servers("2.74")
    rows = get(client, "/os-hypervisors", "2.75", with_servers="false")["hypervisors"]
    assert all("servers" not in h for h in rows)


def test_show(client, cloud, stores: Stores) -> None:
    uuid = stores.ledger.hypervisor_uuid(3)
    shown = get(client, f"/os-hypervisors/{uuid}", "2.53", with_servers="true")
    assert_shape(shown, sample("os-hypervisors/v2.53/hypervisors-show-with-servers-resp"))
    assert shown["hypervisor"]["hypervisor_hostname"] == "cn1-0"
    plain = get(client, f"/os-hypervisors/{uuid}", "2.53")
    assert_shape(plain, sample("os-hypervisors/v2.53/hypervisors-show-resp"))
    assert "servers" not in plain["hypervisor"]
    assert_shape(get(client, "/os-hypervisors/3"), sample("os-hypervisors/hypervisors-show-resp"))
    cases = [
        ("/os-hypervisors/1", "2.53", 400, "badRequest", "Invalid uuid 1"),
        (f"/os-hypervisors/{uuid}", "2.52", 404, "itemNotFound",
         f"Hypervisor with ID '{uuid}' could not be found."),
        ("/os-hypervisors/99", "2.1", 404, "itemNotFound",
         "Hypervisor with ID '99' could not be found."),
        ("/os-hypervisors/7b6c8b8e-6d57-4b9e-9d0a-5b7b1d1f6b1a", "2.53", 404, "itemNotFound",
         "Hypervisor with ID '7b6c8b8e-6d57-4b9e-9d0a-5b7b1d1f6b1a' could not be found."),
    ]  # fmt: skip
    for path, version, code, name, message in cases:
        result = client.simulate_get(f"/v2.1{path}", headers=at(version, ADMIN))
        assert fault(result, code, name) == message, path
    result = client.simulate_get("/v2.1/os-hypervisors/3", params={"with_servers": "1"},
                                 headers=at("2.52", ADMIN))  # fmt: skip
    assert "('with_servers' was unexpected)" in fault(result, 400, "badRequest")


def test_search_and_servers_routes_until_2_52(client, cloud) -> None:
    found = get(client, "/os-hypervisors/cn0/search")
    assert_shape(found, sample("os-hypervisors/hypervisors-search-resp"))
    assert [h["hypervisor_hostname"] for h in found["hypervisors"]] == ["cn0-0", "cn0-1"]
    servers = get(client, "/os-hypervisors/cn/servers", "2.52")
    assert_shape(servers, sample("os-hypervisors/hypervisors-with-servers-resp"))
    assert sorted(s["uuid"] for h in servers["hypervisors"] for s in h.get("servers", [])) == (
        sorted(cloud)
    )
    result = client.simulate_get("/v2.1/os-hypervisors/zz/search", headers=ADMIN)
    assert fault(result, 404, "itemNotFound") == "No hypervisor matching 'zz' could be found."
    for route in ("search", "servers"):
        result = client.simulate_get(f"/v2.1/os-hypervisors/cn0/{route}", headers=at("2.53", ADMIN))
        fault(result, 404, "itemNotFound")


def test_statistics_and_service_state(client, cloud, stores: Stores) -> None:
    stats = get(client, "/os-hypervisors/statistics")
    assert_shape(stats, sample("os-hypervisors/hypervisors-statistics-resp"))
    assert stats["hypervisor_statistics"]["count"] == 3
    assert stats["hypervisor_statistics"]["vcpus"] == 12
    assert stats["hypervisor_statistics"]["running_vms"] == 3
    assert stats["hypervisor_statistics"]["vcpus_used"] == 3
    assert stats["hypervisor_statistics"]["free_ram_mb"] == 3 * 4096 - 3 * 1024
    stores.agents.update_service("cn0", disabled=True, disabled_reason="maintenance")
    stores.agents.update_service("cn1", forced_down=True)
    assert get(client, "/os-hypervisors/statistics")["hypervisor_statistics"]["count"] == 1
    rows = {h["hypervisor_hostname"]: h for h in get(client, "/os-hypervisors/detail")[
        "hypervisors"]}  # fmt: skip
    assert (rows["cn0-0"]["status"], rows["cn0-0"]["state"]) == ("disabled", "up")
    assert rows["cn0-0"]["service"]["disabled_reason"] == "maintenance"
    assert (rows["cn1-0"]["status"], rows["cn1-0"]["state"]) == ("enabled", "down")


def test_hypervisors_are_admin_only(client, cloud) -> None:
    for path in ("", "/detail", "/statistics", "/1", "/cn0/search", "/cn0/servers", "/1/uptime"):
        result = client.simulate_get(f"/v2.1/os-hypervisors{path}", headers=USER)
        assert "os-hypervisors" in fault(result, 403, "forbidden"), path


def test_uptime_is_not_kept_as_nova_answers_for_such_a_driver(client, cloud, stores) -> None:
    """501 for a known hypervisor (``openstack hypervisor show`` goes on without it),
    404 for an unknown one, by integer id and from 2.53 by uuid."""
    result = client.simulate_get("/v2.1/os-hypervisors/1/uptime", headers=ADMIN)
    assert fault(result, 501, "notImplemented") == "Virt driver does not implement uptime function."
    fault(client.simulate_get("/v2.1/os-hypervisors/99/uptime", headers=ADMIN), 404,
          "itemNotFound")  # fmt: skip
    uuid = stores.ledger.hypervisor_uuid(1)
    result = client.simulate_get(f"/v2.1/os-hypervisors/{uuid}/uptime", headers=at("2.53", ADMIN))
    assert result.status_code == 501, result.text


# -- os-availability-zone --


def zones(client, admin: bool = False, detail: bool = False) -> dict[str, Any]:
    kind = "detail" if detail else "list"
    found = get(client, "/os-availability-zone" + ("/detail" if detail else ""), admin=admin)
    novas = sample(f"os-availability-zone/availability-zone-{kind}-resp")
    assert_shape(found, novas)
    if detail:  # maps of names, which mismatches leaves alone: each service as Nova's first
        novas_service = services(novas)[0]
        for service in services(found):
            assert_shape(service, novas_service)
    return {z["zoneName"]: z for z in found["availabilityZoneInfo"]}


def services(detail: dict[str, Any]) -> list[Any]:
    """The services of a zone detail (``hosts``: host -> binary -> service), host by host."""
    rows = detail["availabilityZoneInfo"]
    return [s for z in rows for binaries in (z["hosts"] or {}).values() for s in binaries.values()]


def test_zones_of_agents_and_aggregates(client, cloud, stores: Stores) -> None:
    listed = zones(client)
    assert {name: z["zoneState"]["available"] for name, z in listed.items()} == {
        "nova": True, "az1": True
    }  # fmt: skip
    assert {z["hosts"] for z in listed.values()} == {None}
    empty = stores.aggregates.create("empty", "az-empty")
    assert zones(client)["az-empty"]["zoneState"] == {"available": False}
    stores.aggregates.add_host(empty.id, "cn0")  # seen at cn0's next heartbeat
    assert wait_until(lambda: zones(client)["az-empty"]["zoneState"]["available"], timeout_s=5)
    stores.agents.update_service("cn1", disabled=True)  # at once, not at a heartbeat
    assert zones(client)["az1"]["zoneState"] == {"available": False}
    names = list(zones(client))
    assert names == ["az-empty", "nova", "az1"]  # available first, as Nova lists them
    stores.agents.update_service("cn1", disabled=False)
    assert zones(client)["az1"]["zoneState"] == {"available": True}


def test_detail_lists_the_hosts_of_available_zones(client, cloud, stores: Stores) -> None:
    stores.agents.update_service("cn1", disabled=True)
    detail = zones(client, admin=True, detail=True)
    assert detail["az1"]["hosts"] is None
    (cn0,) = detail["nova"]["hosts"]
    service = detail["nova"]["hosts"][cn0]["nova-compute"]
    assert cn0 == "cn0" and (service["available"], service["active"]) == (True, True)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}", service["updated_at"])
    result = client.simulate_get("/v2.1/os-availability-zone/detail", headers=USER)
    assert "os-availability-zone:detail" in fault(result, 403, "forbidden")
    result = client.simulate_get("/v2.1/os-availability-zone", params={"x": "1"}, headers=USER)
    assert "('x' was unexpected)" in fault(result, 400, "badRequest")


def test_a_zone_goes_with_its_hosts_heartbeats(client, stores: Stores) -> None:
    stores.agents.register_service("h1", "az9")
    stores.agents.add_zone("az9")
    assert zones(client)["az9"]["zoneState"] == {"available": False}
    stores.agents.heartbeat("h1", ttl_s=0.5)
    assert zones(client)["az9"]["zoneState"] == {"available": True}
    stores.agents.update_service("h1", forced_down=True)
    assert zones(client)["az9"]["zoneState"] == {"available": False}
    stores.agents.update_service("h1", forced_down=False)
    assert zones(client)["az9"]["zoneState"] == {"available": True}
    time.sleep(0.6)
    assert zones(client)["az9"]["zoneState"] == {"available": False}


def test_the_member_list_reads_no_host(client, stores: Stores, monkeypatch) -> None:
    """O(number of zones): listing and services are never read on a member's path."""
    for i in range(20):
        stores.agents.register_service(f"h{i}", f"az{i % 2}")
        stores.agents.add_zone(f"az{i % 2}")
        stores.agents.heartbeat(f"h{i}", ttl_s=30)

    def scan(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a member's zone list scanned the hosts")

    for name in ("list", "services", "alive", "service", "last_seen"):
        monkeypatch.setattr(stores.agents, name, scan)
    listed = zones(client)
    assert {name: z["zoneState"]["available"] for name, z in listed.items()} == {
        "az0": True, "az1": True
    }  # fmt: skip


# -- os-services --


@pytest.mark.parametrize("version", ["2.1", "2.11", "2.53"])
def test_services_as_novas_samples(client, cloud, stores: Stores, version: str) -> None:
    """Every agent a nova-compute service, with its state, status and zone; a host in an
    aggregate's zone shows that zone, as Nova shows it."""
    folder = "" if version == "2.1" else f"v{version}/"
    listed = get(client, "/os-services", version)
    assert_shape(listed, sample(f"os-services/{folder}services-list-get-resp"))
    rows = {s["host"]: s for s in listed["services"]}
    assert {(s["binary"], s["state"], s["status"]) for s in rows.values()} == {
        ("nova-compute", "up", "enabled")
    }  # fmt: skip
    assert (rows["cn0"]["zone"], rows["cn1"]["zone"]) == ("nova", "az1")
    zoned = stores.aggregates.create("zoned", "az2")
    stores.aggregates.add_host(zoned.id, "cn0")
    rows = {s["host"]: s for s in get(client, "/os-services", version)["services"]}
    assert (rows["cn0"]["zone"], rows["cn1"]["zone"]) == ("az2", "az1")


# -- the ledger's indexes behind them --


def test_a_hosts_roots_get_integer_ids_once(stores: Stores) -> None:
    spec = FakeNodeSpec(vcpus=4, ram_mb=4096, disk_gb=0, traits=frozenset({"HW_CPU_X86_AVX2"}),
                        children=(FakeChild("gpu0", {"VGPU": 2}),))  # fmt: skip
    nodes = FakeDriver(2, spec, host="h1").nodes()
    register_nodes(stores.ledger, nodes, None, (), host="h1")
    register_nodes(stores.ledger, nodes, None, (), host="h1")  # a restart: the same ids
    stores.ledger.create_provider(str(uuidlib.uuid4()), "no-host")  # no host: no hypervisor
    roots = [node.root.uuid for node in nodes]
    assert stores.ledger.hypervisors() == [(1, roots[0]), (2, roots[1])]
    assert stores.ledger.hypervisors(after=1, limit=5) == [(2, roots[1])]
    assert stores.ledger.hypervisors(limit=1) == [(1, roots[0])]
    child = nodes[0].providers[1].uuid
    assert stores.ledger.hypervisor_ids([roots[1], child]) == {roots[1]: 2}
    assert (stores.ledger.hypervisor_uuid(2), stores.ledger.hypervisor_uuid(3)) == (roots[1], None)
    assert stores.ledger.get_provider(roots[0]).host == "h1"
    assert stores.ledger.get_provider(child).host is None
    for provider in reversed(nodes[1].providers):  # children first
        stores.ledger.delete_provider(
            provider.uuid, stores.ledger.get_provider(provider.uuid).generation
        )
    assert stores.ledger.hypervisors() == [(1, roots[0])]


def test_hypervisor_cpu_info_names_the_cpu_traits(client, stores: Stores) -> None:
    traits = frozenset({"HW_CPU_X86_AVX2", "HW_CPU_X86_SSE42", "CUSTOM_X"})
    spec = FakeNodeSpec(vcpus=4, ram_mb=4096, disk_gb=0, traits=traits)
    stores.agents.register_service("h1")
    register_nodes(stores.ledger, FakeDriver(1, spec, host="h1").nodes(), None, (), host="h1")
    shown = get(client, "/os-hypervisors/1", "2.28")["hypervisor"]
    assert shown["cpu_info"] == {"features": ["avx2", "sse42"]}
    assert (shown["state"], shown["running_vms"], shown["local_gb"]) == ("down", 0, 0)


def test_a_hypervisor_whose_host_has_no_service_is_left_out(client, stores: Stores) -> None:
    spec = FakeNodeSpec(vcpus=4, ram_mb=4096, disk_gb=0)
    register_nodes(stores.ledger, FakeDriver(1, spec, host="h1").nodes(), None, (), host="h1")
    assert get(client, "/os-hypervisors")["hypervisors"] == []
    result = client.simulate_get("/v2.1/os-hypervisors/1", headers=ADMIN)
    assert fault(result, 404, "itemNotFound") == "Hypervisor with ID '1' could not be found."


def test_a_page_is_full_when_nodes_without_a_service_are_left_out(client, stores) -> None:
    spec = FakeNodeSpec(vcpus=4, ram_mb=4096, disk_gb=0)
    for host in ("h1", "h2", "h3"):
        register_nodes(stores.ledger, FakeDriver(1, spec, host=host).nodes(), None, (), host=host)
    for host in ("h1", "h3"):
        stores.agents.register_service(host)
    page = get(client, "/os-hypervisors", "2.33", limit="2")
    assert [h["id"] for h in page["hypervisors"]] == [1, 3]
    assert page["hypervisors_links"][0]["href"].endswith("marker=3")
    assert get(client, "/os-hypervisors", "2.33", marker="3")["hypervisors"] == []
