"""Authorisation through oslo.policy: Nova's personas by default, a policy.yaml overrides.

noauth2 callers here (``X-Roles`` picks a persona). tests/api/test_keystone_real.py
checks the personas, the all_tenants refusal and a policy.yaml override with real
Keystone tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import falcon.testing
import pytest

from qsched import conf as qconf
from qsched import policy as policy_module
from qsched.cmd.policy import config_args, get_enforcer
from qsched.conf.policy import policy_enforcer
from qsched.context import RequestContext
from qsched.ledger import Stores
from qsched.policies import list_rules
from qsched.policy import Policy
from tests.api.test_api import RecordingBus, app, bus, client, fault, post_server
from tests.compute.test_compute import make_app, place

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

MEMBER = {"X-Auth-Token": "alice:pa"}
READER = {"X-Auth-Token": "rita:pa", "X-Roles": "reader"}
OTHER = {"X-Auth-Token": "bob:pb"}
ADMIN = {"X-Auth-Token": "admin"}


def client_for(conf, stores: Stores, policy: Policy | None = None) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(make_app(conf, stores, RecordingBus(), policy))


def refused(result, rule: str) -> None:
    """Nova's 403 naming the rule."""
    assert fault(result, 403, "forbidden") == f"Policy doesn't allow {rule} to be performed."


def test_a_member_boots_lists_shows_and_deletes_in_its_project(client, stores) -> None:
    server = post_server(client, MEMBER).json["server"]["id"]
    listed = client.simulate_get("/v2.1/servers", headers=MEMBER).json["servers"]
    assert [s["id"] for s in listed] == [server]
    assert client.simulate_get(f"/v2.1/servers/{server}", headers=MEMBER).status_code == 200
    assert client.simulate_delete(f"/v2.1/servers/{server}", headers=MEMBER).status_code == 204


def test_a_reader_reads_but_cannot_boot_or_delete(client, stores) -> None:
    refused(post_server(client, READER), "os_compute_api:servers:create")
    server = post_server(client, MEMBER).json["server"]["id"]
    listed = client.simulate_get("/v2.1/servers/detail", headers=READER).json["servers"]
    assert [s["id"] for s in listed] == [server]
    assert client.simulate_get(f"/v2.1/servers/{server}", headers=READER).status_code == 200
    refused(client.simulate_delete(f"/v2.1/servers/{server}", headers=READER),
            "os_compute_api:servers:delete")  # fmt: skip
    assert stores.instances.get(server).state.value == "BUILD"


def test_another_project_sees_nothing(client) -> None:
    server = post_server(client, MEMBER).json["server"]["id"]
    assert client.simulate_get("/v2.1/servers", headers=OTHER).json["servers"] == []
    mine = client.simulate_get("/v2.1/servers", headers=OTHER, params={"project_id": "pa"})
    assert mine.json["servers"] == []  # a filter it may not use is ignored, as in Nova
    for call in (client.simulate_get, client.simulate_delete):
        fault(call(f"/v2.1/servers/{server}", headers=OTHER), 404, "itemNotFound")


def test_only_an_admin_lists_other_projects_and_sees_hosts(client, stores) -> None:
    server = post_server(client, MEMBER).json["server"]["id"]
    place(stores, server, "cn7")
    listed = client.simulate_get(
        "/v2.1/servers/detail", headers=ADMIN, params={"all_tenants": "1", "project_id": "pa"}
    )
    (shown,) = listed.json["servers"]
    assert shown["id"] == server and shown["OS-EXT-SRV-ATTR:host"] == "cn7"
    mine = client.simulate_get(f"/v2.1/servers/{server}", headers=MEMBER).json["server"]
    assert "OS-EXT-SRV-ATTR:host" not in mine


def test_only_an_admin_manages_flavors(client) -> None:
    body = {"flavor": {"name": "x1", "id": "x1", "vcpus": 1, "ram": 512, "disk": 1}}
    specs = {"extra_specs": {"hw:cpu_policy": "dedicated"}}
    for who in (MEMBER, READER):
        created = client.simulate_post("/v2.1/flavors", json=body, headers=who)
        refused(created, "os_compute_api:os-flavor-manage:create")
        path = "/v2.1/flavors/m1.small/os-extra_specs"
        spec = client.simulate_post(path, json=specs, headers=who)
        refused(spec, "os_compute_api:os-flavor-extra-specs:create")
        gone = client.simulate_delete("/v2.1/flavors/m1.small", headers=who)
        refused(gone, "os_compute_api:os-flavor-manage:delete")
    assert client.simulate_post("/v2.1/flavors", json=body, headers=ADMIN).status_code == 200
    result = client.simulate_post("/v2.1/flavors/x1/os-extra_specs", json=specs, headers=ADMIN)
    assert result.status_code == 200
    shown = client.simulate_get("/v2.1/flavors/x1/os-extra_specs", headers=READER)
    assert shown.json == specs  # readers read extra specs
    one = client.simulate_get("/v2.1/flavors/x1/os-extra_specs/hw:cpu_policy", headers=READER)
    assert one.json == {"hw:cpu_policy": "dedicated"}


def test_a_policy_file_overrides_a_default(conf, stores, tmp_path: Path) -> None:
    """As an operator does it: [oslo_policy] policy_file in qsched.conf names the file."""
    rules = tmp_path / "policy.yaml"
    rules.write_text('"os_compute_api:servers:create": "rule:context_is_admin"\n'
                     '"context_is_admin": "role:admin or role:operator"\n')  # fmt: skip
    config = tmp_path / "qsched.conf"
    config.write_text(f"[oslo_policy]\npolicy_file = {rules}\n")
    client = client_for(conf, stores, Policy(policy_enforcer(qconf.load([], [str(config)]))))
    refused(post_server(client, MEMBER), "os_compute_api:servers:create")
    assert post_server(client, ADMIN).status_code == 202
    operator = {"X-Auth-Token": "olga:ops", "X-Roles": "operator"}
    assert post_server(client, operator).status_code == 202  # an admin, by the file's word


def test_the_enforcer_entry_point_knows_every_rule() -> None:
    enforcer = get_enforcer()
    enforcer.load_rules()
    assert {rule.name for rule in list_rules()} <= set(enforcer.rules)
    member = RequestContext.for_project("u", "p")
    assert enforcer.authorize("os_compute_api:servers:create", {"project_id": "p"}, member)
    assert not enforcer.authorize("os_compute_api:servers:create", {"project_id": "q"}, member)


def an_operators_config(directory: Path) -> Path:
    """A qsched.conf whose [oslo_policy] policy_file, beside it, lets only admins boot."""
    (directory / "operator.yaml").write_text('"os_compute_api:servers:create": "role:admin"\n')
    config = directory / "qsched.conf"
    config.write_text("[oslo_policy]\npolicy_file = operator.yaml\n")
    return config


def test_oslo_policys_generator_shows_the_override_the_config_file_names(tmp_path: Path) -> None:
    """``oslopolicy-policy-generator --config-file``: the effective rules, the file's first."""
    config = an_operators_config(tmp_path)
    tool = Path(sys.executable).parent / "oslopolicy-policy-generator"
    done = subprocess.run(
        [str(tool), "--namespace", "qsched", "--config-file", str(config)],
        cwd=tmp_path.parent, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert '"os_compute_api:servers:create": "role:admin"' in lines
    assert '"os_compute_api:servers:delete": "rule:project_member_or_admin"' in lines


def test_the_enforcer_entry_point_reads_the_config_files_of_its_command_line(
    tmp_path: Path,
) -> None:
    config = an_operators_config(tmp_path)
    argv = ["--namespace", "qsched", f"--config-file={config}", "--output-file", "x"]
    assert config_args(argv) == ["--config-file", str(config)]
    assert config_args(["--config-dir", "/d", "--config-file", "f"]) == [
        "--config-dir", "/d", "--config-file", "f",
    ]  # fmt: skip
    enforcer = get_enforcer(argv)
    member = RequestContext.for_project("u", "p")
    assert not enforcer.authorize("os_compute_api:servers:create", {"project_id": "p"}, member)
    assert enforcer.authorize("os_compute_api:servers:delete", {"project_id": "p"}, member)


def test_decisions_are_remembered_until_the_rules_are_looked_at_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed policy.yaml applies within RELOAD_S; in between, decisions are cached."""
    rules = tmp_path / "policy.yaml"
    rules.write_text('"os_compute_api:servers:create": "role:member"\n')
    config = tmp_path / "qsched.conf"
    config.write_text(f"[oslo_policy]\npolicy_file = {rules}\n")
    monkeypatch.setattr(policy_module, "RELOAD_S", 0.2)
    policy = Policy(policy_enforcer(qconf.load([], [str(config)])))
    member = RequestContext.for_project("u", "p")
    assert policy.allows(member, "os_compute_api:servers:create")
    rules.write_text('"os_compute_api:servers:create": "role:admin"\n')
    os.utime(rules, (time.time() + 5, time.time() + 5))  # a clearly newer file
    assert policy.allows(member, "os_compute_api:servers:create")  # still remembered
    time.sleep(0.25)
    assert not policy.allows(member, "os_compute_api:servers:create")
    reader = RequestContext.for_project("u", "p", ("reader",))
    assert policy.allows(reader, "os_compute_api:servers:show")  # keys tell callers apart
    assert not policy.allows(reader, "os_compute_api:servers:show", {"project_id": "q"})
