"""Input that once reached a 500 (or was stored and broke later calls): each case gets
Nova's 400 and leaves the ledger exactly as it was.

The bus is the embedded ``memory://`` one, so a boot really encodes its message: a
flavor whose extra specs cannot be encoded would fail every later boot of it.
"""

from __future__ import annotations

import json
from typing import Any

import falcon.testing
import pytest

from qsched.compute.api import ComputeAPI
from qsched.conf import APIOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.ledger import Stores
from tests.api.test_api import ADMIN, IMAGE, USER, fault, server_body
from tests.compute.test_compute import make_app, place
from tests.raw import redis_store

DEEP = 30_000  # as reported; far past the decoder's recursion limit, under the body limit
SURROGATES = ["\ud800", "\udfff", "vm\udc00", "\udc00\ud800"]
SPECS_PATH = "/v2.1/flavors/m1.small/os-extra_specs"
FLAVOR = {"name": "f1", "ram": 512, "vcpus": 1, "disk": 0}


@pytest.fixture
def app(conf, stores: Stores, bus) -> falcon.App:
    """Not tests.api.test_api's: on the conftest's ``memory://`` bus, which encodes a boot."""
    return make_app(conf, stores, bus)


@pytest.fixture
def client(app: falcon.App) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(app)


def ledger_dump(stores: Stores) -> dict[bytes, Any]:
    """Every key of the ledger's database with its type and whole value.

    The outbox is left out: earlier boots leave it asynchronously (their
    confirmations are cleared in batches a moment after the 202), whatever the
    request under test does; a refused request cannot enter it.
    """
    client = redis_store(stores).client
    outbox = redis_store(stores).keys.outbox.encode()
    readers = {
        b"string": client.get,
        b"hash": client.hgetall,
        b"set": lambda key: sorted(client.smembers(key)),
        b"list": lambda key: client.lrange(key, 0, -1),
        b"zset": lambda key: client.zrange(key, 0, -1, withscores=True),
    }
    dump = {}
    for key in sorted(k for k in client.scan_iter(count=1000) if k != outbox):
        dump[key] = (kind := client.type(key), readers[kind](key))
    return dump


def post(client, path: str, body: bytes | str, headers=ADMIN):
    return client.simulate_post(
        path, body=body, headers={**headers, "Content-Type": "application/json"}
    )


def with_json(value: Any, replacement: str) -> str:
    """``value`` as JSON text, its one string ``"@"`` turned into ``replacement`` (raw JSON
    text, so it can be what Python's json would never write)."""
    text = json.dumps(value)
    assert text.count('"@"') == 1, text
    return text.replace('"@"', replacement)


def assert_refused(result, stores: Stores, before: dict[bytes, Any], *words: str) -> str:
    message = fault(result, 400, "badRequest")
    for word in words:
        assert word in message, message
    assert ledger_dump(stores) == before
    return message


def assert_listings_answer(client) -> None:
    """What one bad record used to break for its whole project, or for everyone."""
    for path, headers, query in [
        ("/v2.1/servers/detail", USER, None),
        ("/v2.1/servers/detail", ADMIN, "all_tenants=1&project_id=pa"),
        ("/v2.1/flavors/detail", USER, None),
        ("/v2.1/flavors/m1.small", USER, None),
        (SPECS_PATH, USER, None),
    ]:
        result = client.simulate_get(path, headers=headers, query_string=query)
        assert result.status_code == 200, (path, result.text)
    for server in client.simulate_get("/v2.1/servers", headers=USER).json["servers"]:
        shown = client.simulate_get(f"/v2.1/servers/{server['id']}", headers=USER)
        assert shown.status_code == 200, shown.text


def assert_boots(client) -> None:
    result = client.simulate_post("/v2.1/servers", json=server_body(), headers=USER)
    assert result.status_code == 202, result.text


def nested_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_objects(depth: int) -> str:
    depth //= 3  # five bytes a level: keep the body under its 64 KiB limit
    return '{"a":' * depth + "{}" + "}" * depth


# Where the deep part goes: the whole body, the resource's envelope, one of its fields.
DEEP_BODIES = {
    "/v2.1/servers": ({"server": "@"}, server_body(metadata="@")),
    "/v2.1/flavors": ({"flavor": "@"}, {"flavor": {**FLAVOR, "extra_specs": "@"}}),
    SPECS_PATH: ({"extra_specs": "@"}, {"extra_specs": {"hw:x": "@"}}),
}


def deep_body(path: str, where: str, inner: str) -> str:
    if where == "top":
        return inner
    envelope, field = DEEP_BODIES[path]
    return with_json(envelope if where == "envelope" else field, inner)


class TestDeepNesting:
    """``RecursionError`` in the JSON decoder was a 500 on every endpoint with a body."""

    @pytest.mark.parametrize("path", sorted(DEEP_BODIES))
    @pytest.mark.parametrize("shape", [nested_arrays, nested_objects])
    @pytest.mark.parametrize("where", ["top", "envelope", "field"])
    def test_refused(self, client, stores, path: str, shape, where: str) -> None:
        before = ledger_dump(stores)
        body = deep_body(path, where, shape(DEEP))
        message = assert_refused(post(client, path, body), stores, before, "levels deep")
        assert len(message) < 300
        assert_listings_answer(client)

    def test_shallow_nesting_still_reaches_the_schema(self, client, stores) -> None:
        before = ledger_dump(stores)
        body = with_json(server_body(metadata="@"), nested_objects(60))
        message = assert_refused(post(client, "/v2.1/servers", body, USER), stores, before)
        assert message.startswith("Invalid input for field/attribute server/metadata/a.")


class TestSurrogates:
    """A lone UTF-16 surrogate decodes to a str no UTF-8 encoder takes: Redis, the bus and the
    response renderer all failed on it, some after the record was written."""

    @pytest.mark.parametrize("text", SURROGATES)
    @pytest.mark.parametrize("field", ["name", "availability_zone", "flavorRef"])
    def test_boot_field(self, client, stores, field: str, text: str) -> None:
        stores.agents.add_zone("az1")
        before = ledger_dump(stores)
        body = json.dumps(server_body(**{field: text}))
        result = post(client, "/v2.1/servers", body, USER)
        message = assert_refused(result, stores, before, f"server/{field}", "surrogate")
        assert message.isascii()
        assert_listings_answer(client)

    @pytest.mark.parametrize("text", SURROGATES)
    def test_metadata_value(self, client, stores, text: str) -> None:
        before = ledger_dump(stores)
        body = json.dumps(server_body(metadata={"role": text}))
        result = post(client, "/v2.1/servers", body, USER)
        assert_refused(result, stores, before, "server/metadata/role", "surrogate")
        assert_listings_answer(client)

    @pytest.mark.parametrize("text", SURROGATES)
    def test_metadata_key(self, client, stores, text: str) -> None:
        before = ledger_dump(stores)
        body = json.dumps(server_body(metadata={text: "web"}))
        result = post(client, "/v2.1/servers", body, USER)
        assert_refused(result, stores, before, "server/metadata", "surrogate")
        assert_listings_answer(client)

    @pytest.mark.parametrize("text", SURROGATES)
    def test_extra_spec_value(self, client, stores, text: str) -> None:
        before = ledger_dump(stores)
        body = json.dumps({"extra_specs": {"hw:cpu_policy": text}})
        result = post(client, SPECS_PATH, body)
        assert_refused(result, stores, before, "extra_specs/hw:cpu_policy", "surrogate")
        assert_listings_answer(client)
        assert_boots(client)

    @pytest.mark.parametrize("text", SURROGATES)
    def test_extra_spec_key(self, client, stores, text: str) -> None:
        before = ledger_dump(stores)
        body = json.dumps({"extra_specs": {f"hw:{text}": "dedicated"}})
        assert_refused(post(client, SPECS_PATH, body), stores, before, "extra_specs", "surrogate")
        assert_listings_answer(client)
        assert_boots(client)

    @pytest.mark.parametrize("text", SURROGATES)
    def test_extra_spec_value_at_flavor_create(self, client, stores, text: str) -> None:
        before = ledger_dump(stores)
        body = json.dumps({"flavor": {**FLAVOR, "extra_specs": {"hw:x": text}}})
        result = post(client, "/v2.1/flavors", body)
        assert_refused(result, stores, before, "flavor/extra_specs/hw:x", "surrogate")
        assert_listings_answer(client)

    def test_a_valid_pair_is_a_character(self, client, stores) -> None:
        body = json.dumps(server_body(metadata={"mood": "\U0001f600"}))
        result = post(client, "/v2.1/servers", body, USER)
        assert result.status_code == 202, result.text
        server_id = result.json["server"]["id"]
        shown = client.simulate_get(f"/v2.1/servers/{server_id}", headers=USER).json
        assert shown["server"]["metadata"] == {"mood": "\U0001f600"}

    @pytest.mark.parametrize("field", ["name", "metadata"])
    def test_encoded_surrogate_bytes(self, client, stores, field: str) -> None:
        # Python's json reads bytes with "surrogatepass": UTF-8-encoded surrogates got through.
        before = ledger_dump(stores)
        value: Any = "@" if field == "name" else {"role": "@"}
        body = json.dumps(server_body(**{field: value})).encode().replace(b"@", b"\xed\xa0\x80")
        result = post(client, "/v2.1/servers", body, USER)
        assert_refused(result, stores, before, "not UTF-8", "0xed")
        assert_listings_answer(client)


NUMBER_PLACES = {
    "flavor size": ("/v2.1/flavors", {"flavor": {**FLAVOR, "ram": "@"}}),
    "flavor extra spec": ("/v2.1/flavors", {"flavor": {**FLAVOR, "extra_specs": {"hw:x": "@"}}}),
    "extra spec": (SPECS_PATH, {"extra_specs": {"hw:cpu_policy": "@"}}),
    "boot": ("/v2.1/servers", server_body(flavorRef="@")),
}


class TestNumbers:
    """Python's json takes what JSON forbids; the extra-spec path stored it as text
    ("nan", "inf") and the rest answered with Python's words."""

    @pytest.mark.parametrize("place", sorted(NUMBER_PLACES))
    @pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
    def test_not_json(self, client, stores, place: str, literal: str) -> None:
        before = ledger_dump(stores)
        path, value = NUMBER_PLACES[place]
        result = post(client, path, with_json(value, literal))
        assert_refused(result, stores, before, f"{literal} is not a JSON value")
        assert_listings_answer(client)

    @pytest.mark.parametrize("place", sorted(NUMBER_PLACES))
    @pytest.mark.parametrize("literal", ["1e400", "-1.5e309"])
    def test_out_of_range(self, client, stores, place: str, literal: str) -> None:
        before = ledger_dump(stores)
        path, value = NUMBER_PLACES[place]
        result = post(client, path, with_json(value, literal))
        assert_refused(result, stores, before, f"the number {literal} is out of range")

    @pytest.mark.parametrize("place", sorted(NUMBER_PLACES))
    def test_too_many_digits(self, client, stores, place: str) -> None:
        before = ledger_dump(stores)
        path, value = NUMBER_PLACES[place]
        result = post(client, path, with_json(value, "9" * 5000))
        message = assert_refused(result, stores, before, "5000 digits")
        assert "sys." not in message and len(message) < 200


class TestEncoding:
    def test_not_utf8(self, client, stores) -> None:
        before = ledger_dump(stores)
        body = json.dumps(server_body()).encode().replace(b"vm1", b"vm\xff")
        result = post(client, "/v2.1/servers", body, USER)
        assert_refused(result, stores, before, "not UTF-8 (byte 0xff at offset 23)")

    def test_the_offset_counts_a_bom(self, client, stores) -> None:
        before = ledger_dump(stores)
        body = b"\xef\xbb\xbf" + json.dumps(server_body()).encode().replace(b"vm1", b"vm\xff")
        result = post(client, "/v2.1/servers", body, USER)
        assert_refused(result, stores, before, "(byte 0xff at offset 26)")

    def test_a_utf8_bom_is_ignored(self, client) -> None:
        body = b"\xef\xbb\xbf" + json.dumps(server_body()).encode()
        assert post(client, "/v2.1/servers", body, USER).status_code == 202


class TestNumbersAsFields:
    """Numbers JSON allows but the fields do not: refused by name, not stored."""

    @pytest.mark.parametrize("place", ["flavor extra spec", "extra spec"])
    @pytest.mark.parametrize("number", [10**400, 10**255, -(10**254)])
    def test_spec_value_longer_than_255_as_text(self, client, stores, place, number) -> None:
        before = ledger_dump(stores)
        path, value = NUMBER_PLACES[place]
        result = post(client, path, with_json(value, str(number)))
        assert_refused(result, stores, before, "extra_specs/hw:", "at most 255 characters")
        assert_listings_answer(client)

    def test_spec_value_of_255_digits_is_text(self, client) -> None:
        number = 10**254
        body = with_json({"extra_specs": {"hw:cpu_policy": "@"}}, str(number))
        assert post(client, SPECS_PATH, body).json == {
            "extra_specs": {"hw:cpu_policy": str(number)}
        }

    @pytest.mark.parametrize("field", ["ram", "vcpus", "disk"])
    @pytest.mark.parametrize("size", ["2147483648", "9999999999", 2**31, 10**400])
    def test_flavor_size_over_the_maximum(self, client, stores, field, size) -> None:
        before = ledger_dump(stores)
        body = with_json({"flavor": {**FLAVOR, field: "@"}}, json.dumps(size))
        result = post(client, "/v2.1/flavors", body)
        assert_refused(result, stores, before, f"flavor/{field}", "2147483647")

    @pytest.mark.parametrize("size", ["2147483647", 2147483647])
    def test_flavor_size_at_the_maximum(self, client, size) -> None:
        result = client.simulate_post(
            "/v2.1/flavors", json={"flavor": {**FLAVOR, "ram": size}}, headers=ADMIN
        )
        assert result.status_code == 200 and result.json["flavor"]["ram"] == 2147483647

    @pytest.mark.parametrize(
        "change",
        [
            {"vcpus": True},
            {"disk": 0.5},
            {"ram": "1.5"},
            {"vcpus": "-1"},
            {"extra_specs": {"resources:VCPU": True}},
            {"extra_specs": {"resources:VCPU": 1.5}},
            {"extra_specs": {"resources:VCPU": -1}},
        ],
    )
    def test_wrong_kind_of_number(self, client, stores, change) -> None:
        before = ledger_dump(stores)
        body = json.dumps({"flavor": {**FLAVOR, **change}})
        assert_refused(post(client, "/v2.1/flavors", body), stores, before)


# Percent-encoded invalid UTF-8, an encoded surrogate, control characters, absurd length.
BAD_URL_TEXT = ["%ff", "%c0%af", "%ed%a0%80", "%00", "%0a%1b%7f", "x" * 20_000, "%25ff"]


def short_id(value: object) -> str:
    text = str(value)
    return text if len(text) <= 16 else f"{text[:8]}...({len(text)})"


class TestQuery:
    @pytest.mark.parametrize(
        "limit",
        ["²", "%d9%a3", "9" * 5000, "-1", "1.5", "1e3", "0x10", "2147483648", " 1", ""],
        ids=short_id,
    )
    @pytest.mark.parametrize("path", ["/v2.1/servers", "/v2.1/servers/detail"])
    def test_limit_not_a_whole_number(self, client, stores, path: str, limit: str) -> None:
        before = ledger_dump(stores)
        result = client.simulate_get(path, query_string=f"limit={limit}", headers=USER)
        message = fault(result, 400, "badRequest")
        assert message.startswith("Invalid input for query parameters limit. Value: ")
        assert "at most 2147483647" in message and len(message) < 250
        assert ledger_dump(stores) == before

    @pytest.mark.parametrize("limit", ["0", "1", "2147483647", "0000000001"])
    def test_limit_whole_number(self, client, limit: str) -> None:
        assert_boots(client)
        result = client.simulate_get("/v2.1/servers", query_string=f"limit={limit}", headers=USER)
        assert result.status_code == 200 and len(result.json["servers"]) == min(int(limit), 1)

    @pytest.mark.parametrize("text", BAD_URL_TEXT, ids=short_id)
    @pytest.mark.parametrize("name", ["marker", "status", "project_id", "tenant_id", "other"])
    @pytest.mark.parametrize("headers", [USER, ADMIN], ids=["user", "admin"])
    def test_other_parameters(self, client, stores, headers, name: str, text: str) -> None:
        assert_boots(client)
        before = ledger_dump(stores)
        for path in ("/v2.1/servers", "/v2.1/servers/detail", "/v2.1/flavors/detail"):
            result = client.simulate_get(path, query_string=f"{name}={text}", headers=headers)
            assert result.status_code in (200, 400), result.text
            if result.status_code == 400:
                fault(result, 400, "badRequest")
        assert ledger_dump(stores) == before


class TestPathParameters:
    @pytest.mark.parametrize("text", BAD_URL_TEXT, ids=short_id)
    @pytest.mark.parametrize(
        "template",
        [
            "/v2.1/servers/{}",
            "/v2.1/flavors/{}",
            "/v2.1/flavors/{}/os-extra_specs",
            "/v2.1/flavors/{}/os-extra_specs/hw:x",
            "/v2.1/flavors/g1.gpu/os-extra_specs/{}",
        ],
    )
    @pytest.mark.parametrize("method", ["GET", "DELETE", "POST", "PUT"])
    def test_not_found_or_refused(self, client, stores, method, template, text) -> None:
        before = ledger_dump(stores)
        body = {"extra_specs": {"hw:x": "1"}} if "os-extra_specs" in template else None
        result = client.simulate_request(method, template.format(text), json=body, headers=ADMIN)
        assert result.status_code in (400, 404, 405), result.text
        assert list(result.json) == [{400: "badRequest", 404: "itemNotFound",
                                      405: "badMethod"}[result.status_code]]  # fmt: skip
        assert ledger_dump(stores) == before


class TestKeptFromBefore:
    """Records the API took before it refused surrogates still render, escaped as Nova does."""

    def test_listings_show_a_kept_surrogate(self, conf, client, stores, bus) -> None:
        compute = ComputeAPI(
            stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf)
        )
        kept = compute.boot(RequestContext.for_project("alice", "pa"), "vm", "m1.small", IMAGE,
                            metadata={"role": "web\ud800"})  # fmt: skip
        assert_listings_answer(client)
        for headers, query in [(USER, None), (ADMIN, "all_tenants=1&project_id=pa")]:
            result = client.simulate_get(
                "/v2.1/servers/detail", headers=headers, query_string=query
            )
            assert result.text.isascii() and "web\\ud800" in result.text
            assert result.json["servers"][0]["metadata"] == {"role": "web\ud800"}
        shown = client.simulate_get(f"/v2.1/servers/{kept.uuid}", headers=USER)
        assert shown.status_code == 200 and shown.text.isascii()

    def test_a_kept_surrogate_stays_through_updates(self, conf, client, stores, bus) -> None:
        compute = ComputeAPI(
            stores, bus, SchedulerOptions.from_conf(conf), APIOptions.from_conf(conf)
        )
        kept = compute.boot(RequestContext.for_project("alice", "pa"), "vm", "m1.small", IMAGE,
                            metadata={"role": "web\ud800"})  # fmt: skip
        place(stores, kept.uuid)
        path = f"/v2.1/servers/{kept.uuid}"
        added = client.simulate_post(f"{path}/metadata", json={"metadata": {"b": "2"}},
                                     headers=USER)  # fmt: skip
        assert added.status_code == 200 and added.text.isascii(), added.text
        assert added.json["metadata"] == {"b": "2", "role": "web\ud800"}
        renamed = client.simulate_put(path, json={"server": {"name": "vm2"}}, headers=USER)
        assert renamed.status_code == 200, renamed.text
        shown = client.simulate_get(path, headers=USER).json["server"]
        assert (shown["name"], shown["metadata"]["role"]) == ("vm2", "web\ud800")

    def test_text_outside_ascii_is_escaped(self, client) -> None:
        result = client.simulate_post(
            "/v2.1/servers", json=server_body(metadata={"city": "Zürich"}), headers=USER
        )
        server_id = result.json["server"]["id"]
        shown = client.simulate_get(f"/v2.1/servers/{server_id}", headers=USER)
        assert (
            '"Z\\u00fcrich"' in shown.text and shown.json["server"]["metadata"]["city"] == "Zürich"
        )
