"""The server create body by microversion: what qsched serves of it, what it refuses
and why, and the fields a server then shows (falcon's TestClient).

Nova's own create request samples (from the nova package, which ships them) are sent
at their microversion: accepted, or refused with the clear 400 of what qsched has not
(block storage, networking, image signing).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from typing import Any

import falcon.testing
import pytest

from qsched.ledger import Stores
from qsched.ledger.base import Inventory, ProviderSpec
from qsched.scheduling.records import BootDetails, ServerFields, details
from tests.api.test_api import ADMIN, IMAGE, OTHER, USER, Snapshot, at, bus, fault
from tests.compute.test_compute import RecordingBus, make_app
from tests.compute.test_keypairs import NOVA_KEY
from tests.samples import samples_dir

SAMPLES = samples_dir() / "servers"
OSC_BDM = {"uuid": IMAGE, "boot_index": 0, "source_type": "image",
           "destination_type": "local", "delete_on_termination": True}  # fmt: skip
USER_DATA = base64.b64encode(b"#!/bin/sh\necho hi\n").decode()
ZONE = "us-west"

__all__ = ["bus"]  # a fixture, see tests.api.test_api


@pytest.fixture
def client(conf, stores: Stores, bus: RecordingBus) -> falcon.testing.TestClient:
    """Not tests.api.test_api's: project pa has no limits and :data:`ZONE`, the samples'
    availability zone, is known before the API starts."""
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    stores.agents.add_zone(ZONE)
    return falcon.testing.TestClient(make_app(conf, stores, bus))


def boot(client, headers=USER, **fields: Any) -> Any:
    server = {"name": "vm", "flavorRef": "m1.small", "imageRef": IMAGE, **fields}
    return client.simulate_post("/v2.1/servers", json={"server": server}, headers=headers)


def boot_fields(client, stores: Stores, headers=USER, **fields: Any) -> tuple[Any, ServerFields]:
    result = boot(client, headers, **fields)
    assert result.status_code == 202, result.text
    record = stores.instances.get(result.json["server"]["id"])
    return result.json["server"], details(record).server


def shown(client, server_id: str, headers=USER) -> dict[str, Any]:
    result = client.simulate_get(f"/v2.1/servers/{server_id}", headers=headers)
    assert result.status_code == 200, result.text
    server: dict[str, Any] = result.json["server"]
    return server


# -- block devices --


def test_what_openstackclient_sends_for_an_image_boots(client, stores, bus) -> None:
    server, _ = boot_fields(client, stores, block_device_mapping_v2=[OSC_BDM])
    assert details(stores.instances.get(server["id"])).image_ref == IMAGE
    assert len(bus.boots) == 1


def test_the_image_may_come_from_the_block_device_alone(client, stores) -> None:
    other = str(uuid.uuid4())
    result = client.simulate_post(
        "/v2.1/servers",
        json={"server": {"name": "vm", "flavorRef": "m1.small",
                         "block_device_mapping_v2": [{**OSC_BDM, "uuid": other}]}},
        headers=USER,
    )  # fmt: skip
    assert result.status_code == 202, result.text
    assert details(stores.instances.get(result.json["server"]["id"])).image_ref == other
    assert shown(client, result.json["server"]["id"])["image"]["id"] == other


@pytest.mark.parametrize(
    "bdm, words",
    [
        ({**OSC_BDM, "source_type": "volume"}, "qsched has no block storage"),
        ({**OSC_BDM, "destination_type": "volume"}, "qsched has no block storage"),
        ({"source_type": "blank", "destination_type": "local", "boot_index": -1},
         "qsched has no block storage"),
        ({"source_type": "snapshot", "uuid": IMAGE, "boot_index": 0},
         "qsched has no block storage"),
        ({"volume_id": IMAGE, "boot_index": 0}, "qsched has no block storage"),
        ({**OSC_BDM, "delete_on_termination": False}, "qsched has no block storage"),
        ({**OSC_BDM, "volume_size": 1}, "remove ['volume_size']"),
        ({**OSC_BDM, "boot_index": 1}, "boot_index 0"),
        ({**OSC_BDM, "uuid": "cirros"}, "UUID of the image"),
        ({**OSC_BDM, "uuid": str(uuid.uuid4())}, "when both are given"),
        ({**OSC_BDM, "source_type": "disk"}, "Invalid input for field/attribute"),
    ],
)  # fmt: skip
def test_block_devices_qsched_cannot_serve(client, stores, bus, bdm, words: str) -> None:
    snap = Snapshot(stores, bus)
    assert words in fault(boot(client, block_device_mapping_v2=[bdm]), 400, "badRequest")
    assert snap.unchanged()


def test_a_second_block_device_and_the_legacy_mapping_are_refused(client) -> None:
    blank = {"source_type": "blank", "destination_type": "local", "boot_index": -1}
    message = fault(boot(client, block_device_mapping_v2=[OSC_BDM, blank]), 400, "badRequest")
    assert message.startswith("qsched has no block storage: a server boots one image")
    legacy = [{"volume_id": IMAGE, "device_name": "vda"}]
    message = fault(boot(client, block_device_mapping=legacy), 400, "badRequest")
    assert "legacy block_device_mapping" in message


def test_no_image_at_all_is_400(client) -> None:
    result = client.simulate_post(
        "/v2.1/servers", json={"server": {"name": "vm", "flavorRef": "m1.small"}}, headers=USER
    )
    assert "qsched boots from an image" in fault(result, 400, "badRequest")


# -- networks and security groups --


def test_networks_from_2_37_are_required_and_recorded(client, stores) -> None:
    assert "'networks' is a required property" in fault(boot(client, at("2.37")), 400,
                                                        "badRequest")  # fmt: skip
    for asked in ("none", "auto"):
        _, fields = boot_fields(client, stores, at("2.37"), networks=asked)
        assert fields.networks == asked
    server, fields = boot_fields(client, stores, at("2.37"), networks=[])
    assert fields.networks == "" and shown(client, server["id"])["addresses"] == {}


def test_before_2_37_networks_is_a_list(client, stores) -> None:
    _, fields = boot_fields(client, stores, networks=[])
    assert fields.networks == ""
    _, fields = boot_fields(client, stores)
    assert fields.networks is None
    fault(boot(client, networks="auto"), 400, "badRequest")


@pytest.mark.parametrize("version", ["2.1", "2.37"])
def test_a_list_of_networks_is_refused(client, version: str) -> None:
    for network in ({"uuid": str(uuid.uuid4())}, {"port": str(uuid.uuid4())}):
        result = boot(client, at(version), networks=[network])
        assert fault(result, 400, "badRequest").startswith("qsched has no networking")


def test_security_groups(client, stores) -> None:
    boot_fields(client, stores, security_groups=[{"name": "default"}])
    message = fault(boot(client, security_groups=[{"name": "web"}]), 400, "badRequest")
    assert message == (
        "qsched has no networking: only the security group 'default' can be asked for, not ['web']."
    )


# -- keys --


def test_key_name_must_be_one_of_the_callers_keypairs(client, stores) -> None:
    assert fault(boot(client, key_name="mine"), 400, "badRequest") == "Invalid key_name provided."
    created = client.simulate_post("/v2.1/os-keypairs",
                                   json={"keypair": {"name": "mine", "public_key": NOVA_KEY}},
                                   headers=USER)  # fmt: skip
    assert created.status_code == 200
    server, fields = boot_fields(client, stores, key_name="mine")
    assert (fields.key_name, fields.key_data) == ("mine", NOVA_KEY)
    assert shown(client, server["id"])["key_name"] == "mine"
    # another user's keypair of that name is not theirs
    stores.quota.set_limits("pb", instances=-1, cores=-1, ram_mb=-1)
    fault(boot(client, OTHER, key_name="mine"), 400, "badRequest")


# -- the fields a server shows --


def test_create_response_and_show(client, stores) -> None:
    server, fields = boot_fields(
        client, stores, at("2.1"), accessIPv4="1.2.3.4", accessIPv6="80fe::",
        **{"OS-DCF:diskConfig": "AUTO"}, config_drive=True, user_data=USER_DATA,
    )  # fmt: skip
    assert set(server) == {"id", "links", "OS-DCF:diskConfig", "security_groups", "adminPass"}
    assert server["OS-DCF:diskConfig"] == "AUTO"
    assert re.fullmatch(r"[A-Za-z0-9]{12}", server["adminPass"])
    view = shown(client, server["id"])
    assert (view["accessIPv4"], view["accessIPv6"]) == ("1.2.3.4", "80fe::")
    assert (view["OS-DCF:diskConfig"], view["config_drive"], view["key_name"]) == (
        "AUTO", "True", None,
    )  # fmt: skip
    assert "description" not in view and "tags" not in view
    assert "OS-EXT-SRV-ATTR:user_data" not in view  # an attribute of admins, from 2.3
    admin = shown(client, server["id"], at("2.3", ADMIN))
    assert admin["OS-EXT-SRV-ATTR:user_data"] == USER_DATA == fields.user_data
    assert "OS-EXT-SRV-ATTR:user_data" not in shown(client, server["id"], ADMIN)


def test_admin_pass_is_returned_once_and_never_kept(client, stores) -> None:
    server, _ = boot_fields(client, stores, adminPass="MySecretPass")
    assert server["adminPass"] == "MySecretPass"
    raw = json.dumps(stores.instances.get(server["id"]).extra)
    assert "MySecretPass" not in raw
    assert "adminPass" not in shown(client, server["id"])


def test_without_instance_passwords_none_is_returned(conf, stores) -> None:
    conf.set_override("enable_instance_password", False, group="api")
    stores.quota.set_limits("pa", instances=-1, cores=-1, ram_mb=-1)
    client = falcon.testing.TestClient(make_app(conf, stores, RecordingBus()))
    server, _ = boot_fields(client, stores, adminPass="x")
    assert "adminPass" not in server


@pytest.mark.parametrize(
    "field, value",
    [("accessIPv4", "1.2.3"), ("accessIPv4", "80fe::"), ("accessIPv6", "1.2.3.4"),
     ("OS-DCF:diskConfig", "auto"), ("user_data", "not base64!"), ("user_data", "abc"),
     ("config_drive", "maybe"), ("key_name", ""), ("description", "x"), ("tags", ["a"])],
)  # fmt: skip
def test_fields_validated_as_nova_does(client, stores, bus, field: str, value: Any) -> None:
    snap = Snapshot(stores, bus)
    fault(boot(client, **{field: value}), 400, "badRequest")
    assert snap.unchanged()


def test_description_from_2_19(client, stores) -> None:
    server, fields = boot_fields(client, stores, at("2.19"), description="my server")
    assert shown(client, server["id"], at("2.19"))["description"] == "my server"
    none, _ = boot_fields(client, stores, at("2.19"), description=None)
    assert shown(client, none["id"], at("2.19"))["description"] is None
    # before 2.19 Nova gives the server its name as description
    early, fields = boot_fields(client, stores)
    assert fields.description == "vm" and shown(client, early["id"], at("2.19"))["description"]
    for bad in ("x" * 256, "a\x00b"):
        fault(boot(client, at("2.19"), description=bad), 400, "badRequest")


def test_tags_from_2_52_shown_from_2_26(client, stores) -> None:
    early = boot(client, at("2.51"), networks="none", tags=["a"])
    assert "'tags' was unexpected" in fault(early, 400, "badRequest")
    server, fields = boot_fields(
        client, stores, at("2.52"), networks="none", tags=["a", "b c", "a"]
    )
    assert fields.tags == ("a", "b c")
    assert shown(client, server["id"], at("2.26"))["tags"] == ["a", "b c"]
    assert "tags" not in shown(client, server["id"], at("2.25"))
    for bad in (["a/b"], ["a,b"], [""], ["x" * 61], [f"t{n}" for n in range(51)]):
        fault(boot(client, at("2.52"), networks="none", tags=bad), 400, "badRequest")


def test_personality_up_to_2_56(client, stores) -> None:
    files = [{"path": "/etc/banner.txt", "contents": base64.b64encode(b"hi").decode()}]
    boot_fields(client, stores, at("2.56"), networks="none", personality=files)
    message = fault(boot(client, at("2.57"), networks="none", personality=files), 400,
                    "badRequest")  # fmt: skip
    assert "'personality' was unexpected" in message
    assert fault(boot(client, personality=files * 6), 403, "forbidden") == (
        "Personality file limit exceeded"
    )
    big = [{"path": "/f", "contents": base64.b64encode(b"x" * 10241).decode()}]
    assert "content exceeds maximum 10240" in fault(boot(client, personality=big), 403,
                                                    "forbidden")  # fmt: skip
    long_path = [{"path": "/" + "p" * 255, "contents": ""}]
    assert "path exceeds maximum 255" in fault(boot(client, personality=long_path), 403,
                                               "forbidden")  # fmt: skip


def test_injected_files_within_the_projects_quota(client, stores) -> None:
    """os-quota-sets sets the limits a create's injected files are checked against."""
    files = [{"path": f"/f{n}", "contents": base64.b64encode(b"hi").decode()} for n in range(3)]
    quota = {"quota_set": {"injected_files": 2, "injected_file_content_bytes": -1}}
    done = client.simulate_put("/v2.1/os-quota-sets/pa", json=quota, headers=ADMIN)
    assert done.status_code == 200, done.text
    assert fault(boot(client, personality=files), 403, "forbidden") == (
        "Personality file limit exceeded"
    )
    big = [{"path": "/f", "contents": base64.b64encode(b"x" * 20000).decode()}]
    boot_fields(client, stores, personality=big)  # no limit on the content now
    boot_fields(client, stores, personality=files[:2])


def test_trusted_certificates_are_refused(client) -> None:
    certs = ["0b5d2c72-12cc-4ba6-a8d7-3ff5cc1d8cb8"]
    message = fault(boot(client, at("2.63"), networks="none", trusted_image_certificates=certs),
                    400, "badRequest")  # fmt: skip
    assert message.startswith("qsched does not verify image signatures")
    fault(boot(client, at("2.62"), networks="none", trusted_image_certificates=certs), 400,
          "badRequest")  # fmt: skip


# -- a requested host (2.74) and the host hints --


def test_an_admin_asks_for_a_host_from_2_74(client, stores, bus) -> None:
    stores.agents.register_service("cn1")
    made = boot(client, at("2.74", ADMIN), networks="none", host="cn1")
    assert made.status_code == 202, made.text
    record = stores.instances.get(made.json["server"]["id"])
    assert record.hosts is not None and record.hosts.only == ("cn1",)
    message = fault(boot(client, at("2.74"), networks="none", host="cn1"), 403, "forbidden")
    assert "compute:servers:create:requested_destination" in message
    assert fault(boot(client, at("2.74", ADMIN), networks="none", host="cn9"), 400,
                 "badRequest") == "Compute host cn9 could not be found."  # fmt: skip
    # before 2.74 the fields are not part of the body
    assert "host" in fault(boot(client, at("2.73", ADMIN), networks="none", host="cn1"), 400,
                           "badRequest")  # fmt: skip


def test_host_hints_name_servers_by_uuid(client, stores, bus) -> None:
    first = boot(client).json["server"]["id"]
    rp = str(uuid.uuid4())
    stores.ledger.register_providers([ProviderSpec(rp, "cn1", {"VCPU": Inventory(8)}, host="cn1")])
    stores.ledger.claim(first, {rp: {"VCPU": 1}}, "cn1", "cn1")
    body = {
        "server": {"name": "vm", "flavorRef": "m1.small", "imageRef": IMAGE},
        "os:scheduler_hints": {"different_host": first.replace("-", "").upper()},
    }
    made = client.simulate_post("/v2.1/servers", json=body, headers=USER)
    assert made.status_code == 202, made.text
    assert stores.instances.get(made.json["server"]["id"]).hosts.never == ("cn1",)
    body["os:scheduler_hints"] = {"same_host": [first]}
    made = client.simulate_post("/v2.1/servers", json=body, headers=OTHER)  # not theirs
    assert stores.instances.get(made.json["server"]["id"]).state == "ERROR"


# -- the record --


def test_server_fields_round_trip_field_by_field() -> None:
    full = ServerFields(
        key_name="k", key_data=NOVA_KEY, access_ipv4="1.2.3.4", access_ipv6="80fe::",
        disk_config="AUTO", description="d", tags=("a", "b"), user_data=USER_DATA,
        config_drive=True, networks="none",
    )  # fmt: skip
    assert ServerFields.from_dict(json.loads(json.dumps(full.to_dict()))) == full
    for field in ServerFields.__dataclass_fields__:
        one = ServerFields.from_dict({field: full.to_dict()[field]})
        assert getattr(one, field) == getattr(full, field), field
    assert ServerFields.from_dict({}) == ServerFields()
    boot_details = BootDetails("req-1", "m1.small", 3, server=full)
    assert BootDetails.from_extra(json.loads(json.dumps(boot_details.to_extra()))) == boot_details
    # a record made before the field existed
    old = {k: v for k, v in boot_details.to_extra().items() if k != "server"}
    assert BootDetails.from_extra(old).server == ServerFields()


# -- Nova's request samples --

#: samples up to 2.79, with the microversion each is sent at
SAMPLE_VERSIONS = {
    "server-create-req.json.tpl": "2.1", "server-create-req-v237.json.tpl": "2.37",
    "server-create-req-v257.json.tpl": "2.57",
    **{f"v{v}/server-create-req.json.tpl": v
       for v in ("2.19", "2.32", "2.37", "2.42", "2.47", "2.52", "2.57", "2.63", "2.66",
                 "2.67", "2.69", "2.71", "2.73")},
    **{f"v2.74/server-create-req-{kind}.json.tpl": "2.74"
       for kind in ("with-host-and-node", "with-only-host", "with-only-node")},
}  # fmt: skip
#: the samples qsched refuses, and the words of the 400
REFUSED = {
    "v2.32/server-create-req.json.tpl": "qsched has no",
    "v2.42/server-create-req.json.tpl": "qsched has no",
    "v2.67/server-create-req.json.tpl": "qsched has no",
    "v2.63/server-create-req.json.tpl": "qsched does not verify image signatures",
    "v2.66/server-create-req.json.tpl": "qsched does not verify image signatures",
}  # fmt: skip
#: the compute host and node Nova's 2.74 samples ask for
SAMPLE_HOST = "openstack-node-01"


def sample(name: str, group: str) -> dict[str, Any]:
    """A create request sample with its placeholders filled for this cloud."""
    values = {"access_ip_v4": "1.2.3.4", "access_ip_v6": "80fe::", "availability_zone": ZONE,
              "image_id": IMAGE, "name": "new-server-test", "user_data": USER_DATA,
              "host": "http://openstack.example.com", "uuid": str(uuid.uuid4()),
              "sg_uuid": group}  # fmt: skip
    text = re.sub(r"%\((\w+)\)s", lambda m: values[m.group(1)], (SAMPLES / name).read_text())
    body: dict[str, Any] = json.loads(text)
    flavor = str(body["server"]["flavorRef"])
    body["server"]["flavorRef"] = re.sub(r"[^/]+$", "m1.small", flavor)  # the test's flavor
    return body


def test_every_sample_up_to_2_79_is_tried() -> None:
    found = {str(p.relative_to(SAMPLES)) for p in SAMPLES.glob("**/server-create-req*.tpl")}
    ours = {p for p in found if "/" not in p or tuple(map(int, p[1:].split("/")[0].split(".")))
            <= (2, 79)}  # fmt: skip
    assert ours == set(SAMPLE_VERSIONS)


@pytest.mark.parametrize("name", sorted(SAMPLE_VERSIONS))
def test_nova_create_samples(client, stores, bus, name: str) -> None:
    asked_group = {"server_group": {"name": "g", "policies": ["affinity"]}}
    made = client.simulate_post("/v2.1/os-server-groups", headers=USER, json=asked_group)
    group = made.json["server_group"]["id"]
    body = sample(name, group)
    same_host = body.get("OS-SCH-HNT:scheduler_hints", {}).get("same_host")
    if "v2.74" in name:  # the host and node the samples ask for
        stores.agents.register_service(SAMPLE_HOST)
        stores.ledger.register_providers(
            [ProviderSpec(str(uuid.uuid4()), SAMPLE_HOST, {"VCPU": Inventory(8)}, host=SAMPLE_HOST)]
        )
    headers = at(SAMPLE_VERSIONS[name], ADMIN if "v2.74" in name else USER)
    snap = Snapshot(stores, bus)
    result = client.simulate_post("/v2.1/servers", json=body, headers=headers)
    if name in REFUSED:
        assert REFUSED[name] in fault(result, 400, "badRequest")
        assert snap.unchanged()
        return
    assert result.status_code == 202, result.text
    server = result.json["server"]
    assert {"id", "links", "OS-DCF:diskConfig", "security_groups", "adminPass"} <= set(server)
    record = stores.instances.get(server["id"])
    if same_host:  # a server that is on no host: NoValidHost at once, as Nova's filter
        assert (record.state, record.fault["details"]["filter"]) == ("ERROR", "host rule")
    if "v2.74" in name:
        assert record.hosts is not None and record.hosts.only == (SAMPLE_HOST,)
    view = shown(client, server["id"], headers)
    asked = body["server"]
    assert view["accessIPv4"] == asked.get("accessIPv4", "")
    assert view["OS-DCF:diskConfig"] == asked.get("OS-DCF:diskConfig", "MANUAL")
    if "description" in asked:
        assert view["description"] == asked["description"]
    if "tags" in asked:
        assert view["tags"] == asked["tags"]
