"""/v2.1/os-keypairs in Nova's shapes by microversion, its rules, limit and errors.

The ledger's store is tried straight (name taken, the user's limit, ids) and
through the API (falcon's TestClient, noauth2 tokens ``user:project``).
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
from typing import Any
from urllib.parse import quote

import falcon.testing
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from qsched import exception
from qsched.compute.keypairs import generate_ssh_key, generate_x509_cert, ssh_fingerprint
from qsched.conf import LedgerOptions, QuotaOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import Keypair
from qsched.ledger.keypairs import RedisKeypairs
from tests.api.test_api import ADMIN, OTHER, USER, app, bus, client, fault
from tests.compute.test_compute import RecordingBus, make_app
from tests.raw import redis_store

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

#: Nova's api sample (os-keypairs/keypairs-import-post-req.json) and its fingerprint
NOVA_KEY = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDx8nkQv/zgGgB4rMYmIf+6A4l6Rr+o/6lHBQdW5aYd44bd8JttD"
    "CE/F/pNRr0lRE+PiqSPO8nDPHw0010JeMH9gYgnnFlyY3/OcJ02RhIPyyxYpv9FhY+2YiUkpwFOcLImyrxEsYXpD/"
    "0d3ac30bNH6Sw9JD9UZHYcpSxsIbECHw== Generated-by-Nova"
)
NOVA_FINGERPRINT = "1e:2c:9b:56:79:4b:45:77:f9:ca:7a:98:2c:b0:d5:3c"
V22 = {"OpenStack-API-Version": "compute 2.2"}
V210 = {"OpenStack-API-Version": "compute 2.10"}
V235 = {"OpenStack-API-Version": "compute 2.35"}
V275 = {"OpenStack-API-Version": "compute 2.75"}
ALICE_ADMIN_PROJECT = {"X-Auth-Token": "alice:pa", "X-Roles": "admin"}


def create(client, body: dict[str, Any], headers=None, user=USER) -> Any:
    return client.simulate_post(
        "/v2.1/os-keypairs", json={"keypair": body}, headers={**user, **(headers or {})}
    )


def names(result) -> list[str]:
    return [k["keypair"]["name"] for k in result.json["keypairs"]]


# -- keys and fingerprints --


def test_nova_sample_key_has_nova_fingerprint() -> None:
    assert ssh_fingerprint(NOVA_KEY) == NOVA_FINGERPRINT


@pytest.mark.parametrize("bad", ["", "ssh-rsa", "ssh-rsa AAAA", "not a key at all", "ssh-rsa ###"])
def test_a_key_that_does_not_parse_is_invalid(bad: str) -> None:
    with pytest.raises(exception.InvalidKeypair, match="failed to generate fingerprint"):
        ssh_fingerprint(bad)


def test_a_generated_ssh_key_pairs_with_its_public_key() -> None:
    private, public, fingerprint = generate_ssh_key()
    key = serialization.load_pem_private_key(private.encode(), password=None)
    mine = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert public.startswith(mine.decode() + " ")
    assert fingerprint == ssh_fingerprint(public)


def test_a_generated_certificate_is_a_pkcs12_bundle_for_the_user() -> None:
    private, pem, fingerprint = generate_x509_cert("alice")
    key, cert, _ = pkcs12.load_key_and_certificates(base64.b64decode(private), b"")
    assert key is not None and cert is not None
    assert cert.subject.rfc4514_string() == "CN=alice"
    assert cert.public_bytes(serialization.Encoding.PEM).decode() == pem
    assert len(fingerprint.split(":")) == 20


# -- the store --


def test_store_names_are_per_user_and_ids_grow(stores: Stores) -> None:
    first = stores.keypairs.create(Keypair("u1", "k", NOVA_KEY, NOVA_FINGERPRINT))
    second = stores.keypairs.create(Keypair("u2", "k", NOVA_KEY, NOVA_FINGERPRINT))
    assert second.id > first.id > 0
    with pytest.raises(exception.KeypairExists, match=r"Key pair 'k' already exists\."):
        stores.keypairs.create(Keypair("u1", "k", NOVA_KEY, NOVA_FINGERPRINT))
    assert stores.keypairs.get("u1", "k") == first
    stores.keypairs.delete("u1", "k")
    with pytest.raises(exception.KeypairNotFound):
        stores.keypairs.get("u1", "k")
    assert stores.keypairs.list_user("u2") == [second]


def test_store_limit_holds_under_parallel_creates(stores: Stores) -> None:
    limited = RedisKeypairs(redis_store(stores), limit=3)

    def one(n: int) -> bool:
        try:
            limited.create(Keypair("u", f"k{n}", NOVA_KEY, NOVA_FINGERPRINT))
        except exception.KeypairLimitExceeded:
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        made = list(pool.map(one, range(12)))
    assert made.count(True) == 3
    assert len(limited.list_user("u")) == 3


# -- the API, by microversion --


def test_generate_at_2_1(client) -> None:
    result = create(client, {"name": "k1"})
    assert result.status_code == 200, result.text
    keypair = result.json["keypair"]
    assert set(keypair) == {"name", "public_key", "fingerprint", "user_id", "private_key"}
    assert (keypair["name"], keypair["user_id"]) == ("k1", "alice")
    assert keypair["private_key"].startswith("-----BEGIN RSA PRIVATE KEY-----")
    shown = client.simulate_get("/v2.1/os-keypairs/k1", headers=USER).json["keypair"]
    assert "private_key" not in shown  # returned once, never kept
    assert set(shown) == {"name", "public_key", "fingerprint", "user_id", "created_at",
                          "deleted", "deleted_at", "id", "updated_at"}  # fmt: skip
    assert (shown["deleted"], shown["deleted_at"], shown["updated_at"]) == (False, None, None)
    assert isinstance(shown["id"], int) and shown["fingerprint"] == keypair["fingerprint"]


def test_import_at_2_2_has_a_type_and_201(client) -> None:
    result = create(client, {"name": "imported", "public_key": NOVA_KEY}, V22)
    assert result.status_code == 201, result.text
    assert result.json == {"keypair": {"name": "imported", "public_key": NOVA_KEY,
                                       "fingerprint": NOVA_FINGERPRINT, "user_id": "alice",
                                       "type": "ssh"}}  # fmt: skip
    listed = client.simulate_get("/v2.1/os-keypairs", headers={**USER, **V22}).json
    assert listed == {"keypairs": [{"keypair": {"name": "imported", "public_key": NOVA_KEY,
                                                "fingerprint": NOVA_FINGERPRINT,
                                                "type": "ssh"}}]}  # fmt: skip
    shown = client.simulate_get("/v2.1/os-keypairs/imported", headers={**USER, **V22})
    assert shown.json["keypair"]["type"] == "ssh"


def test_type_needs_2_2(client) -> None:
    result = create(client, {"name": "k", "type": "ssh"})
    assert "'type' was unexpected" in fault(result, 400, "badRequest")


def test_x509_generated_and_imported(client) -> None:
    made = create(client, {"name": "cert", "type": "x509"}, V22)
    assert made.status_code == 201, made.text
    keypair = made.json["keypair"]
    assert keypair["type"] == "x509" and keypair["public_key"].startswith("-----BEGIN CERT")
    again = create(client, {"name": "cert2", "type": "x509", "public_key": keypair["public_key"]},
                   V22)  # fmt: skip
    assert again.json["keypair"]["fingerprint"] == keypair["fingerprint"]
    bad = create(client, {"name": "c3", "type": "x509", "public_key": NOVA_KEY}, V22)
    assert "failed to generate X509 fingerprint" in fault(bad, 400, "badRequest")


def test_an_unparsable_public_key_is_400(client) -> None:
    result = create(client, {"name": "k", "public_key": "ssh-rsa nonsense"})
    assert fault(result, 400, "badRequest") == (
        "Keypair data is invalid: failed to generate fingerprint"
    )


@pytest.mark.parametrize("name", ["", " lead", "trail ", "a/b", "é", "x" * 256, "a.b", "a@b"])
def test_nova_name_rules(client, name: str) -> None:
    fault(create(client, {"name": name, "public_key": NOVA_KEY}), 400, "badRequest")


def test_names_nova_allows(client) -> None:
    for name in ("a b", "-_-", "x" * 255):
        assert create(client, {"name": name, "public_key": NOVA_KEY}).status_code == 200


def test_a_duplicate_name_is_409(client) -> None:
    create(client, {"name": "k", "public_key": NOVA_KEY})
    result = create(client, {"name": "k", "public_key": NOVA_KEY})
    assert fault(result, 409, "conflictingRequest") == "Key pair 'k' already exists."
    # another user may have the same name
    assert create(client, {"name": "k", "public_key": NOVA_KEY}, user=OTHER).status_code == 200


def test_quota_key_pairs(conf, ledger_url: str) -> None:
    conf.set_override("key_pairs", 2, group="quota")
    limited = open_stores(LedgerOptions.from_conf(conf), QuotaOptions.from_conf(conf), ledger_url)
    client = falcon.testing.TestClient(make_app(conf, limited, RecordingBus()))
    for n in range(2):
        assert create(client, {"name": f"k{n}", "public_key": NOVA_KEY}).status_code == 200
    result = create(client, {"name": "k3"})
    assert fault(result, 403, "forbidden") == "Quota exceeded, too many key pairs."
    assert names(client.simulate_get("/v2.1/os-keypairs", headers=USER)) == ["k0", "k1"]
    # the limit is per user
    assert create(client, {"name": "k3"}, user=OTHER).status_code == 200


def test_the_key_pairs_quota_of_the_project_binds(client) -> None:
    """A limit set through os-quota-sets is what a create is held to, per user."""
    quota = {"quota_set": {"key_pairs": 1}}
    assert (
        client.simulate_put("/v2.1/os-quota-sets/pa", json=quota, headers=ADMIN).status_code == 200
    )
    assert create(client, {"name": "k0", "public_key": NOVA_KEY}).status_code == 200
    result = create(client, {"name": "k1", "public_key": NOVA_KEY})
    assert fault(result, 403, "forbidden") == "Quota exceeded, too many key pairs."


def test_delete_202_at_2_1_and_204_at_2_2(client) -> None:
    create(client, {"name": "a", "public_key": NOVA_KEY})
    create(client, {"name": "b", "public_key": NOVA_KEY})
    assert client.simulate_delete("/v2.1/os-keypairs/a", headers=USER).status_code == 202
    result = client.simulate_delete("/v2.1/os-keypairs/b", headers={**USER, **V22})
    assert result.status_code == 204
    gone = client.simulate_get("/v2.1/os-keypairs/b", headers=USER)
    assert fault(gone, 404, "itemNotFound") == "Keypair b not found for user alice"
    fault(client.simulate_delete("/v2.1/os-keypairs/b", headers=USER), 404, "itemNotFound")


def test_keypairs_are_per_user(client) -> None:
    create(client, {"name": "mine", "public_key": NOVA_KEY})
    assert names(client.simulate_get("/v2.1/os-keypairs", headers=OTHER)) == []
    fault(client.simulate_get("/v2.1/os-keypairs/mine", headers=OTHER), 404, "itemNotFound")
    # the same user in another project sees them: keypairs belong to users
    other_project = {"X-Auth-Token": "alice:pz"}
    assert names(client.simulate_get("/v2.1/os-keypairs", headers=other_project)) == ["mine"]


def test_admin_acts_for_another_user_from_2_10(client) -> None:
    made = create(client, {"name": "forbob", "public_key": NOVA_KEY, "user_id": "bob"}, V210,
                  user=ADMIN)  # fmt: skip
    assert made.status_code == 201 and made.json["keypair"]["user_id"] == "bob"
    assert names(client.simulate_get("/v2.1/os-keypairs", headers=OTHER)) == ["forbob"]
    query = {"user_id": "bob"}
    listed = client.simulate_get("/v2.1/os-keypairs", params=query, headers={**ADMIN, **V210})
    assert names(listed) == ["forbob"]
    shown = client.simulate_get("/v2.1/os-keypairs/forbob", params=query,
                                headers={**ADMIN, **V210})  # fmt: skip
    assert shown.json["keypair"]["user_id"] == "bob"
    # a member may not act for another user
    for call in (
        create(client, {"name": "x", "public_key": NOVA_KEY, "user_id": "bob"}, V210),
        client.simulate_get("/v2.1/os-keypairs", params=query, headers={**USER, **V210}),
        client.simulate_delete("/v2.1/os-keypairs/forbob", params=query, headers={**USER, **V210}),
    ):
        fault(call, 403, "forbidden")
    # before 2.10, user_id is refused rather than ignored
    early = client.simulate_get("/v2.1/os-keypairs", params=query, headers={**ADMIN, **V22})
    assert "needs microversion 2.10" in fault(early, 400, "badRequest")
    deleted = client.simulate_delete("/v2.1/os-keypairs/forbob", params=query,
                                     headers={**ADMIN, **V210})  # fmt: skip
    assert deleted.status_code == 204
    assert names(client.simulate_get("/v2.1/os-keypairs", headers=OTHER)) == []


def test_admin_role_in_own_project_is_admin(client) -> None:
    made = create(client, {"name": "k", "public_key": NOVA_KEY, "user_id": "carol"}, V210,
                  user=ALICE_ADMIN_PROJECT)  # fmt: skip
    assert made.status_code == 201, made.text


def test_paging_from_2_35(client) -> None:
    for name in ("c", "a", "b"):
        create(client, {"name": name, "public_key": NOVA_KEY})
    headers = {**USER, **V235}
    page = client.simulate_get("/v2.1/os-keypairs", params={"limit": "2"}, headers=headers)
    assert names(page) == ["a", "b"]
    link = page.json["keypairs_links"][0]
    assert link["rel"] == "next" and link["href"].endswith("/v2.1/os-keypairs?limit=2&marker=b")
    rest = client.simulate_get("/v2.1/os-keypairs", params={"limit": "2", "marker": "b"},
                               headers=headers)  # fmt: skip
    assert names(rest) == ["c"] and "keypairs_links" not in rest.json
    everything = client.simulate_get("/v2.1/os-keypairs", headers=headers)
    assert names(everything) == ["a", "b", "c"] and "keypairs_links" not in everything.json
    unknown = client.simulate_get("/v2.1/os-keypairs", params={"marker": "zz"}, headers=headers)
    assert fault(unknown, 400, "badRequest") == "Marker zz could not be found."
    fault(client.simulate_get("/v2.1/os-keypairs", params={"limit": "-1"}, headers=headers),
          400, "badRequest")  # fmt: skip
    early = client.simulate_get("/v2.1/os-keypairs", params={"limit": "1"}, headers=USER)
    assert "needs microversion 2.35" in fault(early, 400, "badRequest")


def test_unknown_query_parameters_are_400_from_2_75(client) -> None:
    params = {"foo": "1"}
    assert client.simulate_get("/v2.1/os-keypairs", params=params, headers=USER).status_code == 200
    result = client.simulate_get("/v2.1/os-keypairs", params=params, headers={**USER, **V275})
    assert "'foo' was unexpected" in fault(result, 400, "badRequest")


def test_a_reader_may_not_act_on_another_users_keys(client) -> None:
    create(client, {"name": "k", "public_key": NOVA_KEY})
    result = client.simulate_get(
        "/v2.1/os-keypairs/k", params={"user_id": "alice"}, headers={**OTHER, **V210}
    )
    fault(result, 403, "forbidden")


@pytest.mark.parametrize("sample", ["keypairs-post-req.json", "keypairs-import-post-req.json"])
@pytest.mark.parametrize("version", ["2.1", "2.2", "2.10", "2.35"])
def test_nova_request_samples(client, sample: str, version: str) -> None:
    """Nova's own request bodies (doc/api_samples/os-keypairs) at each version."""
    body: dict[str, Any] = {"name": "keypair-sample"}
    if "import" in sample:
        body["public_key"] = NOVA_KEY
    if version != "2.1":
        body["type"] = "ssh"
    if version in ("2.10", "2.35"):
        body["user_id"] = "fake"
    result = create(client, body, {"OpenStack-API-Version": f"compute {version}"}, user=ADMIN)
    assert result.status_code == (200 if version == "2.1" else 201), result.text
    assert result.json["keypair"]["user_id"] == ("fake" if "user_id" in body else "admin")


@pytest.mark.parametrize("odd", ["\ud800", "a\x00b", "x" * 300, "é", "%", " "])
def test_odd_text_anywhere_is_a_clear_4xx(client, odd: str) -> None:
    """Odd names, users and markers get Nova's 400/404, never a 500 or a surrogate back."""
    headers = {**USER, **V235, "OpenStack-API-Version": "compute 2.75"}
    calls = [
        client.simulate_get(f"/v2.1/os-keypairs/{quote(odd, errors='surrogatepass')}",
                            headers=headers),
        client.simulate_delete(f"/v2.1/os-keypairs/{quote(odd, errors='surrogatepass')}",
                               headers=headers),
        client.simulate_get("/v2.1/os-keypairs", headers=headers,
                            query_string=f"marker={quote(odd, errors='surrogatepass')}"),
        client.simulate_get("/v2.1/os-keypairs", headers={**ADMIN, **V275},
                            query_string=f"user_id={quote(odd, errors='surrogatepass')}"),
        client.simulate_get("/v2.1/os-keypairs", headers={**ADMIN, **V275},
                            query_string=f"{quote(odd, errors='surrogatepass')}=1"),
    ]  # fmt: skip
    for result in calls:
        assert result.status_code in (200, 400, 403, 404), result.text
        if result.status_code >= 400:
            message = json.loads(result.content.decode("utf-8"))  # strict UTF-8
            text = json.dumps(message, ensure_ascii=False)
            assert not any(0xD800 <= ord(c) <= 0xDFFF for c in text), text
