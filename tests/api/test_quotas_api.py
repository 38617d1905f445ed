"""/v2.1/limits and /v2.1/os-quota-sets in Nova's shapes, and that the limits set act.

The expected keys are those of Nova's api samples (``doc/api_samples/limits`` and
``doc/api_samples/os-quota-sets``, per microversion); a limit set through the API
must be the one the ledger's reservation, group creation and group membership use.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import pytest

from qsched import exception
from qsched.compute.quotas import QuotaAPI
from qsched.conf import LedgerOptions, QuotaOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import QUOTA_LIMITS
from qsched.policy import Policy
from tests.api.test_api import (
    ADMIN,
    OTHER,
    USER,
    app,
    at,
    bus,
    client,
    fault,
    post_server,
    server_body,
)
from tests.samples import mismatches, needs_samples, samples_dir

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

READER = {"X-Auth-Token": "carol:pa", "X-Roles": "reader"}
NETWORK_LIMITS = {"maxTotalFloatingIps", "maxSecurityGroups", "maxSecurityGroupRules",
                  "totalFloatingIpsUsed", "totalSecurityGroupsUsed"}  # fmt: skip
# limits/v2.57/limit-get-resp.json
ABSOLUTE_257 = {
    "maxServerGroupMembers", "maxServerGroups", "maxServerMeta", "maxTotalCores",
    "maxTotalInstances", "maxTotalKeypairs", "maxTotalRAMSize", "totalCoresUsed",
    "totalInstancesUsed", "totalRAMUsed", "totalServerGroupsUsed",
}  # fmt: skip
ABSOLUTE_239 = ABSOLUTE_257 | {"maxPersonality", "maxPersonalitySize"}
ABSOLUTE_236 = ABSOLUTE_239 | {"maxImageMeta"}
ABSOLUTE_21 = ABSOLUTE_236 | NETWORK_LIMITS
# os-quota-sets/v2.57/quotas-show-get-resp.json
QUOTAS_257 = {"cores", "instances", "key_pairs", "metadata_items", "ram",
              "server_group_members", "server_groups"}  # fmt: skip
QUOTAS_236 = QUOTAS_257 | {"injected_file_content_bytes", "injected_file_path_bytes",
                           "injected_files"}  # fmt: skip
QUOTAS_21 = QUOTAS_236 | {"fixed_ips", "floating_ips", "security_group_rules", "security_groups"}
# os-quota-sets/quotas-show-get-resp.json: Nova's defaults are qsched's
DEFAULTS_21 = {
    "cores": 20, "fixed_ips": -1, "floating_ips": -1, "injected_file_content_bytes": 10240,
    "injected_file_path_bytes": 255, "injected_files": 5, "instances": 10, "key_pairs": 100,
    "metadata_items": 128, "ram": 51200, "security_group_rules": -1, "security_groups": -1,
    "server_groups": 10, "server_group_members": 10,
}  # fmt: skip


def limits(client, headers=USER, query: str | None = None) -> dict[str, Any]:
    result = client.simulate_get("/v2.1/limits", headers=headers, query_string=query)
    assert result.status_code == 200, result.text
    assert result.json["limits"]["rate"] == []
    absolute: dict[str, Any] = result.json["limits"]["absolute"]
    return absolute


def make_group(client, policy: str = "affinity") -> Any:
    body = {"server_group": {"name": "g", "policies": [policy]}}
    return client.simulate_post("/v2.1/os-server-groups", json=body, headers=USER)


def put_quota(client, project: str, body: dict[str, Any], headers=ADMIN) -> Any:
    return client.simulate_put(
        f"/v2.1/os-quota-sets/{project}", json={"quota_set": body}, headers=headers
    )


# -- GET /limits --


@pytest.mark.parametrize(
    ("version", "keys"),
    [("2.1", ABSOLUTE_21), ("2.35", ABSOLUTE_21), ("2.36", ABSOLUTE_236), ("2.38", ABSOLUTE_236),
     ("2.39", ABSOLUTE_239), ("2.56", ABSOLUTE_239), ("2.57", ABSOLUTE_257),
     ("2.79", ABSOLUTE_257)],
)  # fmt: skip
def test_limits_keys_by_microversion(client, version: str, keys: set[str]) -> None:
    absolute = limits(client, at(version))
    assert set(absolute) == keys
    assert all(type(value) is int for value in absolute.values())


def test_limits_at_2_1_are_novas_sample(client) -> None:
    """limits/limit-get-resp.json, value for value: the defaults, nothing used."""
    assert limits(client) == {
        "maxImageMeta": 128, "maxPersonality": 5, "maxPersonalitySize": 10240,
        "maxSecurityGroupRules": -1, "maxSecurityGroups": -1, "maxServerMeta": 128,
        "maxTotalCores": 20, "maxTotalFloatingIps": -1, "maxTotalInstances": 10,
        "maxTotalKeypairs": 100, "maxTotalRAMSize": 51200, "maxServerGroups": 10,
        "maxServerGroupMembers": 10, "totalCoresUsed": 0, "totalInstancesUsed": 0,
        "totalRAMUsed": 0, "totalSecurityGroupsUsed": 0, "totalFloatingIpsUsed": 0,
        "totalServerGroupsUsed": 0,
    }  # fmt: skip


def test_limits_count_what_the_project_holds(client) -> None:
    for _ in range(2):
        assert post_server(client, flavorRef="large-id").status_code == 202
    assert make_group(client).status_code == 200
    absolute = limits(client)
    used = {k: v for k, v in absolute.items() if k.startswith("total") and v}
    assert used == {"totalInstancesUsed": 2, "totalCoresUsed": 8, "totalRAMUsed": 16384,
                    "totalServerGroupsUsed": 1}  # fmt: skip
    assert limits(client, OTHER)["totalInstancesUsed"] == 0  # another project's own


def test_limits_of_another_project_for_admins_only(client) -> None:
    assert post_server(client).status_code == 202
    assert limits(client, ADMIN, "tenant_id=pa")["totalInstancesUsed"] == 1
    assert limits(client, ADMIN)["totalInstancesUsed"] == 0
    result = client.simulate_get("/v2.1/limits", headers=OTHER, query_string="tenant_id=pa")
    assert "os_compute_api:limits:other_project" in fault(result, 403, "forbidden")
    own = client.simulate_get("/v2.1/limits", headers=USER, query_string="tenant_id=pa")
    fault(own, 403, "forbidden")  # Nova asks the rule whenever tenant_id is given


def test_limits_show_a_projects_own_limits(client) -> None:
    assert put_quota(client, "pa", {"instances": 3, "cores": -1}).status_code == 200
    absolute = limits(client)
    assert (absolute["maxTotalInstances"], absolute["maxTotalCores"]) == (3, -1)
    assert limits(client, OTHER)["maxTotalInstances"] == 10


def test_limits_query_strict_from_2_75(client) -> None:
    # Nova ignores unknown parameters before 2.75
    assert limits(client, at("2.74"), "x=1")["maxTotalInstances"] == 10
    result = client.simulate_get("/v2.1/limits", headers=at("2.75"), query_string="x=1")
    assert "Additional properties are not allowed" in fault(result, 400, "badRequest")
    assert limits(client, at("2.75", ADMIN), "tenant_id=pa")["maxTotalInstances"] == 10
    # reserved is in Nova's api-ref and OSC always sends it: nothing is reserved, so the
    # totals are the same with it or without
    assert limits(client, at("2.79"), "reserved=False") == limits(client, at("2.79"))


# -- os-quota-sets: shapes --


@pytest.mark.parametrize(
    ("version", "keys"),
    [("2.1", QUOTAS_21), ("2.36", QUOTAS_236), ("2.56", QUOTAS_236), ("2.57", QUOTAS_257),
     ("2.79", QUOTAS_257)],
)  # fmt: skip
def test_quota_set_keys_by_microversion(client, version: str, keys: set[str]) -> None:
    for path in ("/v2.1/os-quota-sets/pa", "/v2.1/os-quota-sets/pa/defaults"):
        result = client.simulate_get(path, headers=at(version))
        assert result.status_code == 200, result.text
        assert set(result.json["quota_set"]) == keys | {"id"}
        assert result.json["quota_set"]["id"] == "pa"
    detail = client.simulate_get("/v2.1/os-quota-sets/pa/detail", headers=at(version))
    assert set(detail.json["quota_set"]) == keys | {"id"}
    updated = put_quota(client, "pa", {"cores": 45}, at(version, ADMIN))
    assert set(updated.json["quota_set"]) == keys  # no id in an update's answer, as Nova


def test_show_and_defaults_are_novas_samples(client) -> None:
    shown = client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER).json
    assert shown == {"quota_set": {"id": "pa", **DEFAULTS_21}}
    defaults = client.simulate_get("/v2.1/os-quota-sets/pa/defaults", headers=OTHER).json
    assert defaults == {"quota_set": {"id": "pa", **DEFAULTS_21}}  # anyone may read defaults


def test_detail_counts_what_the_project_holds(client) -> None:
    assert post_server(client, flavorRef="large-id").status_code == 202
    detail = client.simulate_get("/v2.1/os-quota-sets/pa/detail", headers=USER).json["quota_set"]
    assert detail["cores"] == {"in_use": 4, "limit": 20, "reserved": 0}
    assert detail["ram"] == {"in_use": 8192, "limit": 51200, "reserved": 0}
    assert detail["instances"] == {"in_use": 1, "limit": 10, "reserved": 0}
    assert detail["floating_ips"] == {"in_use": 0, "limit": -1, "reserved": 0}
    assert detail["key_pairs"] == {"in_use": 0, "limit": 100, "reserved": 0}  # as Nova: 0


# -- os-quota-sets: update and delete --


def test_update_is_novas_sample_and_sticks(client) -> None:
    result = put_quota(client, "pa", {"cores": 45})
    assert result.status_code == 200, result.text
    assert result.json == {"quota_set": {**DEFAULTS_21, "cores": 45}}
    shown = client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER).json["quota_set"]
    assert shown["cores"] == 45
    other = client.simulate_get("/v2.1/os-quota-sets/pb", headers=OTHER).json["quota_set"]
    assert other["cores"] == 20


def test_update_takes_numbers_as_strings_and_every_key(client) -> None:
    body = {"instances": "7", "ram": 1024, "metadata_items": 3, "key_pairs": 0,
            "server_groups": 2, "server_group_members": 4, "injected_files": 1,
            "injected_file_content_bytes": 10, "injected_file_path_bytes": 20}  # fmt: skip
    result = put_quota(client, "pa", body)
    assert result.status_code == 200, result.text
    assert {k: result.json["quota_set"][k] for k in body} == {k: int(v) for k, v in body.items()}


def test_lowering_a_quota_refuses_the_next_boot(client, stores: Stores) -> None:
    """End to end: the limit set by the API is the one the ledger's reservation reads."""
    assert post_server(client).status_code == 202
    assert put_quota(client, "pa", {"instances": 1}).status_code == 200
    message = fault(post_server(client), 403, "forbidden")
    assert message == "Quota exceeded for instances: Requested 1, but already used 1 of 1 instances"
    assert stores.quota.get_usage("pa").instances == 1
    assert post_server(client, OTHER).status_code == 202  # another project: the default
    assert put_quota(client, "pa", {"instances": -1}).status_code == 200
    assert post_server(client).status_code == 202


def test_ram_and_cores_limits_act(client) -> None:
    assert put_quota(client, "pa", {"ram": 4096, "cores": 10}).status_code == 200
    message = fault(post_server(client, flavorRef="large-id"), 403, "forbidden")
    assert message.startswith("Quota exceeded for ram: Requested 8192")


def test_server_group_limits_act(client) -> None:
    quota = {"server_groups": 1, "server_group_members": 1}
    assert put_quota(client, "pa", quota).status_code == 200
    made = make_group(client, "anti-affinity")
    assert made.status_code == 200, made.text
    again = make_group(client, "anti-affinity")
    assert fault(again, 403, "forbidden") == "Quota exceeded, too many server groups."
    hints = {"os:scheduler_hints": {"group": made.json["server_group"]["id"]}}
    first = client.simulate_post("/v2.1/servers", json={**server_body(), **hints}, headers=USER)
    assert first.status_code == 202, first.text
    second = client.simulate_post("/v2.1/servers", json={**server_body(), **hints}, headers=USER)
    assert "too many servers in group" in fault(second, 403, "forbidden")


def test_update_below_usage_needs_force(client) -> None:
    for _ in range(2):
        assert post_server(client).status_code == 202
    refused = put_quota(client, "pa", {"instances": 1, "cores": 30})
    message = fault(refused, 400, "badRequest")
    assert message == (
        "Quota limit 1 for instances must be greater than or equal to already used and reserved 2."
    )
    shown = client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER).json["quota_set"]
    assert (shown["instances"], shown["cores"]) == (10, 20)  # all or none
    ram = fault(put_quota(client, "pa", {"ram": 100}), 400, "badRequest")
    assert ram.startswith("Quota limit 100 for ram must be")
    # quotas-update-force-post-req.json
    forced = put_quota(client, "pa", {"force": "True", "instances": 1})
    assert forced.status_code == 200 and forced.json["quota_set"]["instances"] == 1
    assert fault(post_server(client), 403, "forbidden").startswith("Quota exceeded for instances")


def test_server_groups_below_usage_refused(client) -> None:
    for _ in range(2):
        assert make_group(client).status_code == 200
    message = fault(put_quota(client, "pa", {"server_groups": 1}), 400, "badRequest")
    assert "for server_groups must be greater than or equal to already used" in message
    assert message.endswith("reserved 2.")


@pytest.mark.parametrize(
    ("body", "words"),
    [({"instances": -2}, "quota_set/instances"), ({"instances": "-2x"}, "quota_set/instances"),
     ({"instances": 2**31}, "quota_set/instances"), ({"cores": "2147483648"}, "quota_set/cores"),
     ({"instances": True}, "quota_set/instances"), ({"instances": None}, "quota_set/instances"),
     ({"networks": 1}, "'networks' was unexpected"), ({"force": "maybe"}, "quota_set/force"),
     ({"floating_ips": 10}, "qsched has no networking")],
)  # fmt: skip
def test_update_refuses_bad_values(client, body: dict[str, Any], words: str) -> None:
    assert words in fault(put_quota(client, "pa", body), 400, "badRequest")
    assert client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER).json == {
        "quota_set": {"id": "pa", **DEFAULTS_21}
    }


def test_update_keys_by_microversion(client) -> None:
    assert put_quota(client, "pa", {"floating_ips": -1}).status_code == 200  # as shown
    late = put_quota(client, "pa", {"floating_ips": -1}, at("2.36", ADMIN))
    assert "'floating_ips' was unexpected" in fault(late, 400, "badRequest")
    files = put_quota(client, "pa", {"injected_files": 3}, at("2.57", ADMIN))
    assert "'injected_files' was unexpected" in fault(files, 400, "badRequest")
    assert put_quota(client, "pa", {"injected_files": 3}, at("2.56", ADMIN)).status_code == 200


def test_body_must_be_a_quota_set(client) -> None:
    result = client.simulate_put("/v2.1/os-quota-sets/pa", json={"cores": 1}, headers=ADMIN)
    assert "'quota_set' is a required property" in fault(result, 400, "badRequest")


def test_delete_reverts_to_defaults(client) -> None:
    assert put_quota(client, "pa", {"instances": 1, "key_pairs": 5}).status_code == 200
    result = client.simulate_delete("/v2.1/os-quota-sets/pa", headers=ADMIN)
    assert result.status_code == 202 and not result.content
    shown = client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER).json["quota_set"]
    assert shown == {"id": "pa", **DEFAULTS_21}


# -- who may do what --


def test_members_read_only_their_own(client) -> None:
    assert client.simulate_get("/v2.1/os-quota-sets/pa", headers=READER).status_code == 200
    for path in ("/v2.1/os-quota-sets/pa", "/v2.1/os-quota-sets/pa/detail"):
        assert client.simulate_get(path, headers=OTHER).status_code == 403
        assert client.simulate_get(path, headers=ADMIN).status_code == 200
    assert put_quota(client, "pa", {"cores": 1}, USER).status_code == 403
    assert client.simulate_delete("/v2.1/os-quota-sets/pa", headers=USER).status_code == 403
    shown = client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER).json["quota_set"]
    assert shown["cores"] == 20


def test_per_user_quotas_are_refused_not_ignored(client) -> None:
    for method, path in [("GET", ""), ("GET", "/detail"), ("PUT", ""), ("DELETE", "")]:
        result = client.simulate_request(
            method, f"/v2.1/os-quota-sets/pa{path}", headers=ADMIN, query_string="user_id=alice",
            json={"quota_set": {"cores": 1}} if method == "PUT" else None,
        )  # fmt: skip
        assert "Per-user quotas are not supported" in fault(result, 400, "badRequest")
    shown = client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER).json["quota_set"]
    assert shown["cores"] == 20


def test_quota_set_query_strict_from_2_75(client) -> None:
    early = client.simulate_get("/v2.1/os-quota-sets/pa", headers=USER, query_string="usage=1")
    assert early.status_code == 200
    result = client.simulate_get(
        "/v2.1/os-quota-sets/pa", headers=at("2.75"), query_string="usage=1"
    )
    assert "'usage' was unexpected" in fault(result, 400, "badRequest")


@pytest.mark.parametrize("project", ["%20", "a%00b", "x" * 256])
def test_a_project_id_no_project_can_have(client, project: str) -> None:
    result = client.simulate_get(f"/v2.1/os-quota-sets/{project}", headers=ADMIN)
    assert "is not a valid project" in fault(result, 400, "badRequest")


def test_project_id_in_the_url_as_older_catalogs(client) -> None:
    result = client.simulate_get("/v2.1/pa/os-quota-sets/pa", headers=USER)
    assert result.status_code == 200 and result.json["quota_set"]["id"] == "pa"
    assert client.simulate_get("/v2.1/pa/limits", headers=USER).status_code == 200


# -- os-quota-class-sets --

# os-quota-class-sets/quota-classes-show-get-resp.json, v2.50/..., v2.57/...
CLASS_21 = QUOTAS_21 - {"server_groups", "server_group_members"}
CLASS_250 = QUOTAS_236
CLASS_257 = QUOTAS_257


def put_class(client, body: dict[str, Any], headers=ADMIN, name: str = "default") -> Any:
    return client.simulate_put(
        f"/v2.1/os-quota-class-sets/{name}", json={"quota_class_set": body}, headers=headers
    )


@pytest.mark.parametrize(
    ("version", "keys"),
    [("2.1", CLASS_21), ("2.49", CLASS_21), ("2.50", CLASS_250), ("2.56", CLASS_250),
     ("2.57", CLASS_257), ("2.79", CLASS_257)],
)  # fmt: skip
def test_quota_class_keys_by_microversion(client, version: str, keys: set[str]) -> None:
    shown = client.simulate_get("/v2.1/os-quota-class-sets/default", headers=at(version, ADMIN))
    assert shown.status_code == 200, shown.text
    assert shown.json["quota_class_set"] == {
        "id": "default",
        **{k: v for k, v in DEFAULTS_21.items() if k in keys},
    }
    updated = put_class(client, {"cores": 50}, at(version, ADMIN))
    assert updated.status_code == 200, updated.text
    assert set(updated.json["quota_class_set"]) == keys


def test_default_class_sets_the_defaults_of_projects_without_their_own(client) -> None:
    # quota-classes-update-post-req.json (2.57)
    assert put_class(client, {"instances": 1, "cores": 50}).status_code == 200
    assert put_quota(client, "pb", {"instances": 3}).status_code == 200
    defaults = client.simulate_get("/v2.1/os-quota-sets/pa/defaults", headers=USER).json
    assert (defaults["quota_set"]["instances"], defaults["quota_set"]["cores"]) == (1, 50)
    assert limits(client)["maxTotalInstances"] == 1
    assert post_server(client).status_code == 202
    message = fault(post_server(client), 403, "forbidden")
    assert message.startswith("Quota exceeded for instances: Requested 1, but already used 1 of 1")
    for _ in range(3):  # pb's own limit wins over the class
        assert post_server(client, OTHER).status_code == 202
    assert post_server(client, OTHER).status_code == 403
    # a project's own limit dropped: the class applies again
    assert client.simulate_delete("/v2.1/os-quota-sets/pb", headers=ADMIN).status_code == 202
    assert limits(client, OTHER)["maxTotalInstances"] == 1


def test_default_class_sets_group_limits(client) -> None:
    assert put_class(client, {"server_groups": 0}, at("2.50", ADMIN)).status_code == 200
    assert fault(make_group(client), 403, "forbidden") == "Quota exceeded, too many server groups."


def test_only_the_default_class(client) -> None:
    refused = put_class(client, {"cores": 1}, name="gold")
    assert "qsched has only the 'default' quota class" in fault(refused, 400, "badRequest")
    gold = client.simulate_get("/v2.1/os-quota-class-sets/gold", headers=ADMIN)
    assert gold.json["quota_class_set"] == {
        "id": "gold",
        **{k: v for k, v in DEFAULTS_21.items() if k in CLASS_21},
    }  # a class without limits of its own: the defaults, as Nova shows it


def test_quota_classes_are_for_admins(client) -> None:
    shown = client.simulate_get("/v2.1/os-quota-class-sets/default", headers=USER)
    assert "os_compute_api:os-quota-class-sets:show" in fault(shown, 403, "forbidden")
    fault(put_class(client, {"cores": 1}, USER), 403, "forbidden")
    assert limits(client)["maxTotalCores"] == 20


@pytest.mark.parametrize(
    ("body", "words"),
    [({"cores": -2}, "quota_class_set/cores"), ({"force": True}, "'force' was unexpected"),
     ({"cores": "99999999999"}, "quota_class_set/cores"),
     ({"floating_ips": 5}, "qsched has no networking")],
)  # fmt: skip
def test_quota_class_update_refuses_bad_values(client, body: dict[str, Any], words: str) -> None:
    assert words in fault(put_class(client, body), 400, "badRequest")
    late = put_class(client, {"floating_ips": -1}, at("2.50", ADMIN))
    assert "'floating_ips' was unexpected" in fault(late, 400, "badRequest")
    assert limits(client)["maxTotalCores"] == 20


# -- for the checks other code makes --


def test_limit_for_is_the_projects_limit(client, stores: Stores) -> None:
    quotas = QuotaAPI(stores, Policy())
    assert quotas.limit_for("pa", "metadata_items") == 128
    assert put_quota(client, "pa", {"metadata_items": 2, "ram": 7}).status_code == 200
    assert (quotas.limit_for("pa", "metadata_items"), quotas.limit_for("pa", "ram")) == (2, 7)
    assert quotas.limit_for("pa", "security_groups") == -1
    assert quotas.limit_for("pb", "key_pairs") == 100
    with pytest.raises(KeyError):
        quotas.limit_for("pa", "gigabytes")


# -- the quota store (every ledger backend) --


def test_store_refuses_what_it_cannot_keep(stores: Stores) -> None:
    for changes in ({"gigabytes": 1}, {"cores": -2}, {"cores": True}, {"cores": "3"}):
        with pytest.raises(exception.Invalid):
            stores.quota.update_limits("pa", changes)  # type: ignore[arg-type]
    assert stores.quota.limits("pa") == stores.quota.default_limits()


def test_store_defaults_are_the_options(conf, ledger_url: str) -> None:
    options = QuotaOptions.defaults().replace(key_pairs=3, server_groups=0, ram=1)
    stores = open_stores(LedgerOptions.from_conf(conf), options, url=ledger_url)
    defaults = stores.quota.default_limits()
    assert set(defaults) == set(QUOTA_LIMITS)
    assert (defaults["key_pairs"], defaults["server_groups"], defaults["ram_mb"]) == (3, 0, 1)
    assert defaults["injected_file_path_bytes"] == 255
    stores.quota.update_limits("pa", {"key_pairs": 9})
    assert stores.quota.limits("pa") == {**defaults, "key_pairs": 9}
    stores.quota.clear_limits("pa")
    assert stores.quota.limits("pa") == defaults
    stores.quota.update_default_limits({"key_pairs": 4, "cores": -1})
    assert stores.quota.default_limits() == {**defaults, "key_pairs": 4, "cores": -1}
    assert stores.quota.limits("pa") == stores.quota.default_limits()
    assert stores.quota.get_limits("pa").cores == -1
    with pytest.raises(exception.Invalid):
        stores.quota.update_default_limits({"cores": -3})


def test_lowering_races_no_reservation_past_it(stores: Stores) -> None:
    """Reservations and a lowering in parallel: once the lower limit is written, the
    project never holds more than it, because the check and the write are one step."""
    lowered: list[bool] = []

    def reserve(worker: int) -> None:
        for n in range(15):
            with contextlib.suppress(exception.QuotaExceeded):
                stores.quota.reserve("pa", f"h{worker}-{n}", 1, 1)

    def lower() -> None:
        for _ in range(30):
            try:
                stores.quota.update_limits("pa", {"instances": 6})
            except exception.QuotaBelowUsage:
                continue
            lowered.append(True)
            return

    threads = [threading.Thread(target=reserve, args=(w,)) for w in range(4)]
    threads.append(threading.Thread(target=lower))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    held = stores.quota.in_use("pa")["instances"]
    assert held <= stores.quota.limits("pa")["instances"]
    if lowered:
        assert held <= 6


# -- Nova's api samples, as the nova package ships them --


def nova_sample(name: str) -> Any:
    """One of Nova's api sample templates (nova is installed for them, never imported),
    with its values: not :func:`tests.samples.shape`, as the answers must equal them."""
    text = (samples_dir() / f"{name}.json.tpl").read_text().replace("%(set_id)s", "default")
    return json.loads(text)


SAMPLE_VERSIONS = {"": "2.1", "v2.36/": "2.36", "v2.39/": "2.39", "v2.50/": "2.50",
                   "v2.57/": "2.57"}  # fmt: skip


def without_id(document: dict[str, Any]) -> dict[str, Any]:
    ((key, body),) = document.items()
    return {key: {k: v for k, v in body.items() if k != "id"}}


@needs_samples
@pytest.mark.parametrize("folder", ["", "v2.36/", "v2.39/", "v2.57/"])
def test_limits_sample(client, folder: str) -> None:
    sample = nova_sample(f"limits/{folder}limit-get-resp")
    answer = client.simulate_get("/v2.1/limits", headers=at(SAMPLE_VERSIONS[folder])).json
    assert answer == sample  # nothing used and Nova's defaults: value for value


@needs_samples
@pytest.mark.parametrize("folder", ["", "v2.36/", "v2.57/"])
def test_quota_set_samples(client, folder: str) -> None:
    headers = at(SAMPLE_VERSIONS[folder], ADMIN)
    for path, name in [("", "quotas-show-get-resp"), ("/detail", "quotas-show-detail-get-resp"),
                       ("/defaults", "quotas-show-defaults-get-resp")]:  # fmt: skip
        sample = nova_sample(f"os-quota-sets/{folder}{name}")
        answer = client.simulate_get(f"/v2.1/os-quota-sets/pa{path}", headers=headers).json
        assert mismatches(answer, sample, exact=True) == [], name
        assert without_id(answer) == without_id(sample), name
    for name in ("quotas-update-post", "quotas-update-force-post"):
        request = nova_sample(f"os-quota-sets/{folder}{name}-req")
        result = client.simulate_put("/v2.1/os-quota-sets/pa", json=request, headers=headers)
        assert result.status_code == 200, (name, result.text)
        assert result.json == nova_sample(f"os-quota-sets/{folder}{name}-resp"), name
        assert client.simulate_delete("/v2.1/os-quota-sets/pa", headers=ADMIN).status_code == 202
    # per-user quotas are refused, not applied to the project
    request = nova_sample(f"os-quota-sets/{folder}user-quotas-update-post-req")
    result = client.simulate_put(
        "/v2.1/os-quota-sets/pa", json=request, headers=headers, query_string="user_id=fake"
    )
    fault(result, 400, "badRequest")


@needs_samples
@pytest.mark.parametrize("folder", ["", "v2.50/", "v2.57/"])
def test_quota_class_samples(client, folder: str) -> None:
    headers = at(SAMPLE_VERSIONS[folder], ADMIN)
    shown = client.simulate_get("/v2.1/os-quota-class-sets/default", headers=headers).json
    assert shown == nova_sample(f"os-quota-class-sets/{folder}quota-classes-show-get-resp")
    request = nova_sample(f"os-quota-class-sets/{folder}quota-classes-update-post-req")
    result = client.simulate_put("/v2.1/os-quota-class-sets/default", json=request,
                                 headers=headers)  # fmt: skip
    assert result.status_code == 200, result.text
    assert result.json == nova_sample(f"os-quota-class-sets/{folder}quota-classes-update-post-resp")
