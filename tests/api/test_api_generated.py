"""Generated requests on every endpoint of qsched-api: none may reach a 500 or leave a mark.

Each example builds the API afresh (its fakeredis ledger emptied, the embedded
``memory://`` bus, a server booted in two projects: the first example does it through
the API, the others restore the keys it left), then sends a few generated calls
as the admin, a user, another project's user or nobody. Three tests share the budget:
bodies on the routes that read one (arbitrary JSON with surrogates, huge numbers, NaN
and deep nesting; valid requests with one part mutated, so validation is exercised past
the schema; raw bytes), path parameters and query strings on any method of any route
(percent-encoded bytes: invalid UTF-8, encoded surrogates, control characters, long
text), and sequences of any calls, so that later calls meet what earlier ones stored.
After each call:

- the status is below 500 (but the uptime route's 501, Nova's answer for a driver that keeps
  no uptime), and a 4xx carries a Nova fault (``{"badRequest": {"code":
  400, "message": ...}}``);
- after a 4xx every key and value of the ledger is as it was before the call;
- every JSON answer is text a client can decode: valid UTF-8, no lone surrogate.

At the end of an example (what its calls stored is still there; once per run when the
calls left the ledger as it was made), the listings answer 200: servers in detail for
each project and for the admin in each project, each server,
the flavors in detail, each flavor and its extra specs, the aggregates and each of them,
the compute services, the limits and quotas, hypervisors and zones; and a boot of every
flavor in the catalog answers below 500 (a flavor whose extra specs cannot be encoded
once failed every boot of it).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import falcon.testing
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from agents.registration import register_nodes
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched import conf as qconf
from qsched.bus.kombu import KombuBus
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores
from tests.api.test_api import IMAGE
from tests.api.test_api_input import ledger_dump
from tests.compute.test_compute import make_app
from tests.compute.test_keypairs import NOVA_KEY
from tests.conftest import TEST_DURABILITY
from tests.raw import redis_store

GENERATED = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same examples on every run, in CI and on a laptop
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],  # no explain phase: fail faster
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TOKENS = {"admin": "admin", "alice": "alice:pa", "bob": "bob:pb", "carol": "carol:pc"}
TOKEN_OTHERS = ["admin", "alice:pa", "bob:pb", "carol:pc", None, "a b", "admin:admin"]
PROJECTS = ("pa", "pb", "pc", "admin")
FAULT_NAMES = {
    400: "badRequest",
    401: "unauthorized",
    403: "forbidden",
    404: "itemNotFound",
    405: "badMethod",
    409: "conflictingRequest",
    413: "overLimit",
    415: "badMediaType",
    501: "notImplemented",
}
ROUTES = [
    "/",
    "/v2.1",
    "/healthcheck",
    "/v2.1/servers",
    "/v2.1/servers/detail",
    "/v2.1/servers/{server}",
    "/v2.1/servers/{server}/metadata",
    "/v2.1/servers/{server}/metadata/{meta}",
    "/v2.1/servers/{server}/action",
    "/v2.1/servers/{server}/os-instance-actions",
    "/v2.1/servers/{server}/os-instance-actions/{request}",
    "/v2.1/servers/{server}/migrations",
    "/v2.1/servers/{server}/migrations/{migration}",
    "/v2.1/servers/{server}/migrations/{migration}/action",
    "/v2.1/os-migrations",
    "/v2.1/flavors",
    "/v2.1/flavors/detail",
    "/v2.1/flavors/{flavor}",
    "/v2.1/flavors/{flavor}/os-extra_specs",
    "/v2.1/flavors/{flavor}/os-extra_specs/{key}",
    "/v2.1/flavors/{flavor}/action",
    "/v2.1/flavors/{flavor}/os-flavor-access",
    "/v2.1/os-aggregates",
    "/v2.1/os-aggregates/{aggregate}",
    "/v2.1/os-aggregates/{aggregate}/action",
    "/v2.1/os-services",
    "/v2.1/os-services/{service}",
    "/v2.1/limits",
    "/v2.1/os-quota-sets/{project}",
    "/v2.1/os-quota-sets/{project}/detail",
    "/v2.1/os-quota-sets/{project}/defaults",
    "/v2.1/os-quota-class-sets/{quota_class}",
    "/v2.1/os-availability-zone",
    "/v2.1/os-availability-zone/detail",
    "/v2.1/os-hypervisors",
    "/v2.1/os-hypervisors/detail",
    "/v2.1/os-hypervisors/statistics",
    "/v2.1/os-hypervisors/{hypervisor}",
    "/v2.1/os-hypervisors/{hypervisor}/search",
    "/v2.1/os-hypervisors/{hypervisor}/servers",
    "/v2.1/os-hypervisors/{hypervisor}/uptime",
    "/v2.1/os-keypairs",
    "/v2.1/os-keypairs/{keypair}",
]
LISTS = ("/v2.1/servers", "/v2.1/servers/detail")
FLAVOR_IDS = ["m1.small", "large-id", "g1.gpu"]
META_KEYS = ["role", "a", "k 1"]
SPEC_KEYS = ["resources:CUSTOM_GPU", "trait:CUSTOM_FAST", "hw:cpu_policy", "resources:VCPU"]
ZONE = "az1"
HOSTS = ["cn1", "cn2"]  # registered compute services, for aggregates and os-services
KEYPAIR_NAMES = ["k1", "a b", "-_-"]
#: what ``openstack server create --image`` sends with imageRef
OSC_IMAGE_BDM = {"uuid": IMAGE, "boot_index": 0, "source_type": "image",
                 "destination_type": "local", "delete_on_termination": True}  # fmt: skip
SERVICE_IDS = ["enable", "disable", "disable-log-reason", "force-down", "@service"]

# -- text and JSON --

# Invalid UTF-8 (encoded surrogates first: Python's json once read them), a NUL, a BOM.
BAD_BYTES = [b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xff", b"\xc0\xaf", b"\x00", b"\xef\xbb\xbf"]
SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff"]  # each alone is no character
ODD_CHARACTERS = [
    *SURROGATES,
    *("\x00", "\x1f", "\x7f", "\u2028", "\ufeff", "\ufffd", "\uffff"),
    *("\U0001f600", "é", " ", "/", "%", "\\", '"'),
]
characters = st.one_of(
    st.characters(exclude_categories=()),  # surrogates included
    st.sampled_from(ODD_CHARACTERS),
)
texts = st.one_of(
    st.text(characters, max_size=12),
    st.sampled_from(["", "m1.small", "required", "forbidden", "1", "resources:VCPU"]),
    st.sampled_from([256, 70_000]).map(lambda n: "x" * n),  # a field too long, a body too
)
numbers = st.one_of(
    st.integers(),
    st.sampled_from([-1, 0, 1, 2**31 - 1, 2**31, 2**63, 10**255, 10**400, -(10**254)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
json_values = st.recursive(
    st.none() | numbers | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=10,
)


def deep(depth: int, shape: str) -> str:
    """JSON text nested ``depth`` levels deep (Python's json cannot write it)."""
    if shape == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


# Depths past the decoder's recursion limit first (Hypothesis leans towards the first).
DEPTHS = [10_000, 1001, 999, 200, 33, 32, 31]
deep_texts = st.builds(deep, st.sampled_from(DEPTHS), st.sampled_from(["[", "{"]))

# -- valid requests, then one part changed --

metadata_keys = st.from_regex(r"[a-zA-Z0-9_:. -]{1,20}", fullmatch=True)
valid_spec = st.one_of(
    st.tuples(st.sampled_from(["trait:CUSTOM_FAST", "trait:HW_CPU_X86_AVX2", "trait1:CUSTOM_X"]),
              st.sampled_from(["required", "forbidden"])),
    st.tuples(st.sampled_from(["resources:VCPU", "resources:CUSTOM_GPU", "resources1:VGPU"]),
              st.sampled_from(["0", "1", "2", "16"])),
    st.tuples(st.just("group_policy"), st.sampled_from(["isolate", "none"])),
    st.tuples(st.sampled_from(["hw:cpu_policy", "hw:mem_page_size"]), st.text(max_size=8)),
)  # fmt: skip
valid_specs = st.lists(valid_spec, max_size=3).map(dict)


def server_requests() -> st.SearchStrategy[dict[str, Any]]:
    server = st.fixed_dictionaries(
        {
            "name": st.from_regex(r"[a-z][a-z0-9 ._-]{0,10}[a-z0-9]", fullmatch=True),
            "flavorRef": st.sampled_from(FLAVOR_IDS),
            "imageRef": st.just(IMAGE),
        },
        optional={
            "availability_zone": st.just(ZONE),
            "metadata": st.dictionaries(metadata_keys, st.text(max_size=8), max_size=3),
            "min_count": st.just(1),
            "networks": st.just([]),
            "key_name": st.sampled_from(KEYPAIR_NAMES),
            "accessIPv4": st.just("1.2.3.4"),
            "accessIPv6": st.just("80fe::"),
            "OS-DCF:diskConfig": st.sampled_from(["AUTO", "MANUAL"]),
            "adminPass": st.text(max_size=8),
            "user_data": st.just("IyEvYmluL2Jhc2gK"),
            "config_drive": st.booleans(),
            "security_groups": st.just([{"name": "default"}]),
            "block_device_mapping_v2": st.just([OSC_IMAGE_BDM]),
        },
    )
    return st.builds(lambda s: {"server": s}, server)


def update_requests() -> st.SearchStrategy[dict[str, Any]]:
    server = st.fixed_dictionaries(
        {},
        optional={
            "name": st.from_regex(r"[a-z][a-z0-9 ._-]{0,10}[a-z0-9]", fullmatch=True),
            "description": st.text(max_size=8) | st.none(),
            "accessIPv4": st.just("10.0.0.1"),
            "accessIPv6": st.just("fe80::1"),
            "OS-DCF:diskConfig": st.sampled_from(["AUTO", "MANUAL"]),
        },
    )
    return st.builds(lambda s: {"server": s}, server)


def metadata_requests() -> st.SearchStrategy[dict[str, Any]]:
    items = st.dictionaries(metadata_keys, st.text(max_size=8), max_size=3)
    return st.builds(lambda m: {"metadata": m}, items)


def meta_item_requests() -> st.SearchStrategy[dict[str, Any]]:
    item = st.dictionaries(st.sampled_from(META_KEYS), st.text(max_size=8), min_size=1, max_size=1)
    return st.builds(lambda m: {"meta": m}, item)


def server_actions() -> st.SearchStrategy[dict[str, Any]]:
    """The server actions' bodies as Nova's samples send them: ``os-stop``, ``os-start``,
    ``reboot``, the moves and shelving."""
    bare = ["os-stop", "os-start", "shelve", "shelveOffload", "unshelve", "confirmResize",
            "revertResize", "migrate"]  # fmt: skip
    zone = st.sampled_from(["az1", "nova", "elsewhere"])
    host = st.sampled_from(["cn1", "cn2", "nowhere"]) | st.none()
    return st.one_of(
        st.builds(lambda name: {name: None}, st.sampled_from(bare)),
        st.builds(lambda kind: {"reboot": {"type": kind}}, st.sampled_from(["SOFT", "HARD"])),
        st.builds(lambda z: {"unshelve": {"availability_zone": z}}, zone),
        st.builds(lambda f: {"resize": {"flavorRef": f}}, st.sampled_from(["1", "2", "42"])),
        st.builds(lambda h: {"os-migrateLive": {"host": h, "block_migration": "auto"}}, host),
        st.builds(lambda h: {"evacuate": {} if h is None else {"host": h}}, host),
        st.builds(
            lambda name: {"rebuild": {"imageRef": IMAGE, "name": name}},
            st.sampled_from(["again", "vm"]),
        ),
    )


def flavor_requests() -> st.SearchStrategy[dict[str, Any]]:
    flavor = st.fixed_dictionaries(
        {
            "name": st.from_regex(r"[a-z][a-z0-9._-]{0,10}", fullmatch=True)
            | st.from_regex(r"[A-Za-zé][A-Za-zé0-9 +/]{0,8}[a-z0-9]", fullmatch=True),
            "ram": st.integers(1, 4096) | st.integers(1, 4096).map(str),
            "vcpus": st.integers(1, 8),
            "disk": st.integers(0, 40),
        },
        optional={
            "id": st.from_regex(r"[a-z0-9][a-z0-9._-]{0,10}", fullmatch=True) | st.none(),
            "extra_specs": valid_specs,
            "os-flavor-access:is_public": st.booleans() | st.sampled_from(["false", "yes"]),
            "swap": st.integers(0, 4096),
            "OS-FLV-EXT-DATA:ephemeral": st.integers(0, 40),
            "rxtx_factor": st.floats(0.1, 10) | st.sampled_from(["1.5", "2"]),
            "description": st.text(max_size=20) | st.none(),  # 2.55+
        },
    )
    return st.builds(lambda f: {"flavor": f}, flavor)


def flavor_actions() -> st.SearchStrategy[dict[str, Any]]:
    tenants = st.sampled_from(["pa", "pb", "pc"]) | st.text(min_size=1, max_size=8)
    name = st.sampled_from(["addTenantAccess", "removeTenantAccess"])
    return st.builds(lambda n, t: {n: {"tenant": t}}, name, tenants)


def flavor_updates() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda d: {"flavor": {"description": d}}, st.text(max_size=20) | st.none())


def one_spec_requests() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda s: dict([s]), valid_spec)


def spec_requests() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda s: {"extra_specs": s}, valid_specs)


aggregate_names = st.from_regex(r"[a-z][a-z0-9 ._-]{0,10}[a-z0-9]", fullmatch=True)
zones = st.sampled_from(["az-a", "az-b", ZONE]) | st.none()


def aggregate_requests() -> st.SearchStrategy[dict[str, Any]]:
    aggregate = st.fixed_dictionaries(
        {}, optional={"name": aggregate_names, "availability_zone": zones}
    )
    return st.builds(lambda a: {"aggregate": a}, aggregate)


def aggregate_actions() -> st.SearchStrategy[dict[str, Any]]:
    host = st.fixed_dictionaries({"host": st.sampled_from([*HOSTS, "cn9"])})
    metadata = st.dictionaries(
        st.sampled_from(["availability_zone", "filter_tenant_id", "trait:CUSTOM_FAST", "ssd"])
        | metadata_keys,
        st.sampled_from(["az-a", "pa", "required", "true", ""]) | st.none(),
        max_size=3,
    )
    return st.one_of(
        st.builds(lambda h: {"add_host": h}, host),
        st.builds(lambda h: {"remove_host": h}, host),
        st.builds(lambda m: {"set_metadata": {"metadata": m}}, metadata),
    )


def service_requests() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "host": st.sampled_from(HOSTS),
            "binary": st.just("nova-compute"),
            "disabled_reason": st.text(max_size=8),
            "forced_down": st.booleans(),
            "status": st.sampled_from(["enabled", "disabled"]),
        },
    )


quota_values = (
    st.integers(-2, 30)
    | st.integers(-2, 30).map(str)
    | st.sampled_from([2**31, "2147483648", "", "1e3", None, True])
)
QUOTA_NAMES = ["instances", "cores", "ram", "server_groups", "server_group_members", "key_pairs",
               "metadata_items", "injected_files", "floating_ips", "fixed_ips"]  # fmt: skip


def quota_requests() -> st.SearchStrategy[dict[str, Any]]:
    quota_set = st.dictionaries(st.sampled_from(QUOTA_NAMES), quota_values, max_size=4)
    force = st.fixed_dictionaries({}, optional={"force": st.sampled_from([True, "True", "no"])})
    return st.builds(lambda q, f: {"quota_set": {**q, **f}}, quota_set, force)


def quota_class_requests() -> st.SearchStrategy[dict[str, Any]]:
    quota_set = st.dictionaries(st.sampled_from(QUOTA_NAMES), quota_values, max_size=4)
    return st.builds(lambda q: {"quota_class_set": q}, quota_set)


def keypair_requests() -> st.SearchStrategy[dict[str, Any]]:
    # Imports mostly: generating an RSA key costs far more than any other call.
    keypair = st.fixed_dictionaries(
        {
            "name": st.sampled_from(KEYPAIR_NAMES),
            "public_key": st.sampled_from([NOVA_KEY] * 4 + ["ssh-rsa AAAA", ""]),
        },
        optional={
            "type": st.sampled_from(["ssh", "x509"]),
            "user_id": st.sampled_from(["alice", "bob", "fake"]),
        },
    )
    return st.builds(lambda k: {"keypair": k}, keypair)


def paths_in(document: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value in ``document`` (its root included)."""
    yield path
    if isinstance(document, dict):
        for key, value in document.items():
            yield from paths_in(value, (*path, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from paths_in(value, (*path, index))


def replaced(document: Any, path: tuple[Any, ...], change: Any) -> Any:
    """A copy of ``document`` with the value at ``path`` given to ``change``."""
    if not path:
        return change(document)
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[path[0]] = replaced(document[path[0]], path[1:], change)
    return copy


# Hypothesis leans towards the first of a list: what broke the API comes first.
MUTATIONS = ["odd text", "raw odd text"] * 3 + ["deep", "deep", "literal", "literal"]
MUTATIONS += ["value", "value", "drop", "add"]
LITERALS = ["NaN", "Infinity", "-Infinity", "1e400", "9" * 2000, "-0", "1E2", "true", "null"]


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> bytes:
    """A valid request with one part replaced, dropped, added to, given an odd character (a
    string or a key: most often), or written as JSON Python would not write; sent as raw
    UTF-8 (a surrogate as its three bytes, CESU-8) or with escapes (``\\ud800``)."""
    document = draw(valid)
    how = draw(st.sampled_from(MUTATIONS))
    raw = how == "raw odd text" or draw(st.sampled_from([False, True]))
    # Values three times as often as keys: a key the schema does not know stops there.
    places = [p for p in string_places(document) for _ in range(1 if p[1] else 3)]
    if how in ("odd text", "raw odd text") and places:
        path, is_key = draw(st.sampled_from(places))
        odd, at = draw(st.sampled_from(SURROGATES * 8 + ODD_CHARACTERS)), draw(st.integers(0, 3))
        return dumps(with_odd_text(document, path, is_key, odd, at), raw)
    path = draw(st.sampled_from(list(paths_in(document))))
    if how == "drop" and path:
        return dumps(replaced(document, path[:-1], lambda parent: _without(parent, path[-1])), raw)
    if how == "add":
        key, value = draw(texts), draw(json_values)
        return dumps(replaced(document, path, lambda old: _with(old, key, value)), raw)
    if how in ("literal", "deep"):
        literal = deep(draw(st.sampled_from(DEPTHS)), "[") if how == "deep" else None
        literal = literal or draw(st.sampled_from(LITERALS))
        text = json.dumps(replaced(document, path, lambda _old: "@@"), ensure_ascii=not raw)
        return text.replace('"@@"', literal, 1).encode("utf-8", "surrogatepass")
    return dumps(replaced(document, path, lambda _old: draw(json_values)), raw)


def dumps(document: Any, raw: bool) -> bytes:
    """JSON as raw UTF-8 (surrogates passed through as bytes) or escaped to ASCII."""
    return json.dumps(document, ensure_ascii=not raw).encode("utf-8", "surrogatepass")


def string_places(
    document: Any, path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], bool]]:
    """The path of every string of ``document`` and of every key, with whether it is a key."""
    if isinstance(document, str):
        yield path, False
    elif isinstance(document, dict):
        for key, value in document.items():
            yield (*path, key), True
            yield from string_places(value, (*path, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from string_places(value, (*path, index))


def with_odd_text(document: Any, path: tuple[Any, ...], is_key: bool, odd: str, at: int) -> Any:
    """``document`` with ``odd`` put into the string, or the key, at ``path``."""
    if not is_key:
        return replaced(document, path, lambda old: _inserted(old, odd, at))
    key = path[-1]
    new = _inserted(key, odd, at)
    return replaced(document, path[:-1], lambda parent: _renamed(parent, key, new))


def _inserted(text: str, odd: str, at: int) -> str:
    return text[:at] + odd + text[at:]


def _renamed(parent: dict[str, Any], key: str, new: str) -> dict[str, Any]:
    return {(new if k == key else k): v for k, v in parent.items()}


def _without(parent: Any, key: Any) -> Any:
    if isinstance(parent, dict):
        return {k: v for k, v in parent.items() if k != key}
    return [v for i, v in enumerate(parent) if i != key]


def _with(old: Any, key: str, value: Any) -> Any:
    if isinstance(old, dict):
        return {**old, key: value}
    if isinstance(old, list):
        return [*old, value]
    return [old, value]


def corrupted(text: str, noise: bytes, at: int) -> bytes:
    raw = bytearray(text.encode())
    at %= len(raw) or 1
    raw[at : at + len(noise)] = noise
    return bytes(raw)


BODY_KINDS = ["mutated"] * 6 + ["valid"] * 2 + ["junk", "corrupted"]


@st.composite
def bodies_for(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> str | bytes | None:
    """A body around one kind of valid request: as is, mutated (most), or anything at all."""
    kind = draw(st.sampled_from(BODY_KINDS))
    if kind == "valid":
        return json.dumps(draw(valid))
    if kind == "mutated":
        return draw(mutated(valid))
    if kind == "corrupted":
        noise = draw(st.sampled_from(BAD_BYTES) | st.binary(min_size=1, max_size=4))
        return corrupted(json.dumps(draw(valid)), noise, draw(st.integers(0, 400)))
    return draw(any_bodies)


any_bodies = st.one_of(st.none(), json_values.map(json.dumps), deep_texts, st.binary(max_size=40))
valid_requests = st.one_of(server_requests(), flavor_requests(), spec_requests())
ROUTE_BODIES = {
    "/v2.1/servers": bodies_for(server_requests()),
    "/v2.1/flavors": bodies_for(flavor_requests()),
    "/v2.1/flavors/{flavor}/os-extra_specs": bodies_for(spec_requests()),
    "/v2.1/flavors/{flavor}/action": bodies_for(flavor_actions()),
    "/v2.1/os-aggregates": bodies_for(aggregate_requests()),
    "/v2.1/os-aggregates/{aggregate}/action": bodies_for(aggregate_actions()),
    "/v2.1/os-keypairs": bodies_for(keypair_requests()),
    "/v2.1/servers/{server}/metadata": bodies_for(metadata_requests()),
    "/v2.1/servers/{server}/action": bodies_for(server_actions()),
    "/v2.1/servers/{server}/migrations/{migration}/action": bodies_for(
        st.just({"force_complete": None})
    ),
}
#: Routes that read a body on PUT (ROUTE_BODIES are POSTed).
PUT_BODIES = {
    "/v2.1/flavors/{flavor}": bodies_for(flavor_updates()),
    "/v2.1/flavors/{flavor}/os-extra_specs/{key}": bodies_for(one_spec_requests()),
    "/v2.1/os-aggregates/{aggregate}": bodies_for(aggregate_requests()),
    "/v2.1/os-services/{service}": bodies_for(service_requests()),
    "/v2.1/servers/{server}": bodies_for(update_requests()),
    "/v2.1/servers/{server}/metadata": bodies_for(metadata_requests()),
    "/v2.1/servers/{server}/metadata/{meta}": bodies_for(meta_item_requests()),
    "/v2.1/os-quota-sets/{project}": bodies_for(quota_requests()),
    "/v2.1/os-quota-class-sets/{quota_class}": bodies_for(quota_class_requests()),
}
OTHER_BODIES = st.one_of(valid_requests.map(json.dumps), any_bodies)

# -- URLs --

url_bytes = st.one_of(
    st.text(characters, max_size=10).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=10),
    st.sampled_from([*BAD_BYTES, b"x" * 5000, b"..", b"."]),
)
url_texts = url_bytes.map(lambda raw: quote(raw, safe=""))


QUERY_NAMES = ["limit"] * 4 + ["marker"] * 2 + [
    "status", "project_id", "tenant_id", "x", "user_id", "with_servers",
    "hypervisor_hostname_pattern",
]  # fmt: skip
QUERY_NAMES += ["is_public", "minRam", "sort_key", "sort_dir"]  # the flavor listings
QUERY_NAMES += ["all_tenants", "name", "changes-since", "flavor", "host", "locked", "tags", "ip",
                "deleted"]  # the server listings  # fmt: skip
# Hypothesis leans towards the first of a list: the values that broke things come first.
QUERY_VALUES = ["%C2%B2", "9" * 5000, "\xc2\xb2", "%D9%A3", "-1", "1.5", "", "2147483648",
                "2147483647", "0", "1", "BUILD", "ACTIVE", "pa", "@server", "none",
                "memory_mb", "desc", "@flavor", "(", "asc", "display_name", "host",
                "2020-01-01T00:00:00Z", "DELETED"]  # fmt: skip
# ("\xc2\xb2" is "²" sent as raw UTF-8: a WSGI server hands its bytes over as Latin-1.)


@st.composite
def queries(draw: st.DrawFn, route: str) -> str:
    """A query string of list parameters (and others), edge values most often; lists of
    servers, which read them, always get one."""
    pairs = []
    for _ in range(draw(st.integers(1 if route in LISTS else 0, 3))):
        kind = draw(st.sampled_from(["edge"] * 3 + ["odd", "number"]))
        name = draw(st.sampled_from(QUERY_NAMES) if kind != "odd" else url_texts)
        value = draw({"edge": st.sampled_from(QUERY_VALUES), "odd": url_texts,
                      "number": st.integers().map(str)}[kind])  # fmt: skip
        pairs.append(f"{name}={value}")
    return "&".join(pairs)


SERVER, FLAVOR = "/v2.1/servers/{server}", "/v2.1/flavors/{flavor}"
AGGREGATE, ACTION = "/v2.1/os-aggregates/{aggregate}", "/v2.1/os-aggregates/{aggregate}/action"
SPEC = "/v2.1/flavors/{flavor}/os-extra_specs/{key}"
# Every method on every route once, and what changes state more often, so that one
# example's calls build on each other (boot, then show or delete it; add specs, then drop).
EVERY_CALL = [(method, route) for route in ROUTES for method in ("GET", "POST", "PUT", "DELETE")]
KINDS = [
    *EVERY_CALL,
    *[("POST", route) for route in ROUTE_BODIES] * 8,
    *[("GET", SERVER), ("DELETE", SERVER), ("DELETE", SPEC), ("GET", SPEC)] * 2,
    *[("GET", route) for route in LISTS] * 6,
    ("DELETE", FLAVOR),
    *[("PUT", route) for route in PUT_BODIES] * 3,
    *[("POST", ACTION), ("GET", AGGREGATE), ("DELETE", AGGREGATE)] * 2,
]


def likely_token(method: str, route: str) -> str:
    """Whom a call is most often made as: the admin for flavor changes, aggregates,
    services, hypervisors and quota changes, a user otherwise."""
    if route.startswith(("/v2.1/os-aggregates", "/v2.1/os-services", "/v2.1/os-hypervisors")):
        return "admin"
    if route.startswith("/v2.1/os-quota-class-sets"):
        return "admin"
    if route.startswith("/v2.1/os-quota-sets") and method in ("PUT", "DELETE"):
        return "admin"
    return "admin" if route.startswith("/v2.1/flavors") and method != "GET" else "alice:pa"


def call(
    draw: st.DrawFn, method: str, route: str, params: st.SearchStrategy[str]
) -> dict[str, Any]:
    """One request on ``route``: its parameters from ``params`` (or the example's own server
    and flavors), a query, a token, a content type and a body."""
    path = route.format(
        server=draw(st.sampled_from(["@server"]) | st.uuids().map(str) | params),
        flavor=draw(st.sampled_from(["@flavor", *FLAVOR_IDS]) | params),
        key=draw(st.sampled_from(SPEC_KEYS) | params),
        aggregate=draw(st.sampled_from(["@aggregate", "1", "0", "99"]) | params),
        service=draw(st.sampled_from(SERVICE_IDS) | params),
        meta=draw(st.sampled_from(META_KEYS) | params),
        project=draw(st.sampled_from(PROJECTS) | params),
        quota_class=draw(st.sampled_from(["default", "gold"]) | params),
        hypervisor=draw(st.sampled_from(["@hypervisor", "1", "0", *HOSTS, "cn"]) | params),
        keypair=draw(st.sampled_from(KEYPAIR_NAMES) | params),
        request=draw(st.sampled_from(["@request", "req-none"]) | params),
        migration=draw(st.sampled_from(["1", "2", "0", "99"]) | params),
    )
    bodies = PUT_BODIES if method == "PUT" and route in PUT_BODIES else ROUTE_BODIES
    body = draw(bodies.get(route, OTHER_BODIES))
    return {
        "method": method,
        "route": route,
        "path": path,
        "query": draw(queries(route)),
        "token": draw(st.sampled_from([likely_token(method, route)] * 20 + TOKEN_OTHERS)),
        "content_type": draw(st.sampled_from(["application/json"] * 18 + ["text/plain", None])),
        "body": body if method in ("POST", "PUT") else draw(st.none() | st.just(body)),
        "pick": draw(st.integers(0, 20)),  # which server or flavor "@server", "@flavor" is
        "version": draw(st.sampled_from([None] * 4 + ["2.6", "2.55", "2.61", "2.75", "latest"])),
    }


@st.composite
def calls(draw: st.DrawFn) -> dict[str, Any]:
    """Any request, those that change state more often."""
    method, route = draw(st.sampled_from(KINDS))
    return call(draw, method, route, url_texts)


@st.composite
def body_calls(draw: st.DrawFn) -> dict[str, Any]:
    """A POST to a route that reads a body, with the example's own server and flavors."""
    return call(draw, "POST", draw(st.sampled_from(list(ROUTE_BODIES))), st.nothing())


@st.composite
def url_calls(draw: st.DrawFn) -> dict[str, Any]:
    """Any method on any route, path parameters most often generated."""
    method, route = draw(st.sampled_from(EVERY_CALL + [("GET", route) for route in LISTS] * 4))
    return call(draw, method, route, st.one_of(*[url_texts] * 3))  # 3 to 1 against known ones


# -- the API under test --


@dataclasses.dataclass(frozen=True)
class _Made:
    """A cloud as :class:`Cloud` first made it: every key (DUMP form, TTL), and the ids."""

    keys: list[tuple[bytes, bytes, int]]
    services: tuple[str, ...]
    hypervisors: tuple[str, ...]
    aggregates: tuple[str, ...]
    servers: tuple[str, ...]


#: ledger url -> the cloud made on it first; later examples restore it (a new API each)
_MADE: dict[str, _Made] = {}


class Cloud:
    """One API on an emptied ledger, a server in two projects; the servers booted so far.

    The first example of a module makes it through the API; the others restore its keys
    (much cheaper than registering and booting again) under an API of their own.
    """

    def __init__(self, ledger_url: str, bus: KombuBus) -> None:
        conf = qconf.load()
        conf.set_override("durability", TEST_DURABILITY, group="ledger")
        self.stores: Stores = open_stores(LedgerOptions.from_conf(conf), url=ledger_url)
        client = redis_store(self.stores).client
        client.flushall()  # the test's own fakeredis server
        made = _MADE.get(ledger_url)
        if made is not None:  # the ledger as the first example made it, key for key
            for key, value, ttl_ms in made.keys:
                client.restore(key, max(ttl_ms, 0), value)
            self.client = falcon.testing.TestClient(make_app(conf, self.stores, bus))
            self.services, self.hypervisors = list(made.services), list(made.hypervisors)
            self.aggregates, self.servers = list(made.aggregates), list(made.servers)
            return
        self._make(conf, bus)
        keys = [(k, client.dump(k), client.pttl(k)) for k in client.scan_iter(count=1000)]
        _MADE[ledger_url] = _Made(keys, tuple(self.services), tuple(self.hypervisors),
                                  tuple(self.aggregates), tuple(self.servers))  # fmt: skip

    def _make(self, conf: Any, bus: KombuBus) -> None:
        self.stores.agents.add_zone(ZONE)
        self.services = []
        for host in HOSTS:  # compute services that aggregates and os-services act on
            self.stores.agents.heartbeat(host, 3600)
            self.services.append(self.stores.agents.register_service(host).id)
            nodes = FakeDriver(1, FakeNodeSpec(vcpus=4, ram_mb=4096, disk_gb=10), host=host)
            register_nodes(self.stores.ledger, nodes.nodes(), None, (), host=host)
        self.hypervisors = [uuid for _, uuid in self.stores.ledger.hypervisors()]
        self.client = falcon.testing.TestClient(make_app(conf, self.stores, bus))
        self.aggregates = [str(self.stores.aggregates.create("seed", "az-a").id)]
        self.servers: list[str] = []
        for token in ("alice:pa", "bob:pb"):  # so that server routes have servers to act on
            body = {"server": {"name": "seed", "flavorRef": "m1.small", "imageRef": IMAGE}}
            self.send({"method": "POST", "path": "/v2.1/servers", "query": "", "token": token,
                       "content_type": None, "body": json.dumps(body), "pick": 0})  # fmt: skip

    def send(self, call: dict[str, Any]) -> falcon.testing.Result:
        headers = {"X-Auth-Token": call["token"], "Content-Type": call["content_type"]}
        if call.get("version"):
            headers["OpenStack-API-Version"] = f"compute {call['version']}"
        servers, flavors = self.servers or ["none"], self.flavor_ids()
        path = call["path"].replace("@server", servers[call["pick"] % len(servers)])
        path = path.replace("@flavor", quote(flavors[call["pick"] % len(flavors)], safe=""))
        path = path.replace("@aggregate", self.aggregates[call["pick"] % len(self.aggregates)])
        path = path.replace("@service", self.services[call["pick"] % len(self.services)])
        path = path.replace("@hypervisor", self.hypervisors[call["pick"] % len(self.hypervisors)])
        if "@request" in path:  # an action of the server the path names, if it has one
            path = path.replace("@request", self.request_id(path.split("/")[3]))
        result = self.client.simulate_request(
            call["method"],
            path,
            query_string=call["query"]
            .replace("@server", servers[call["pick"] % len(servers)])
            .replace("@flavor", quote(flavors[call["pick"] % len(flavors)], safe="")),
            headers={k: v for k, v in headers.items() if v is not None},
            body=call["body"],
        )
        if result.status_code == 202 and call["method"] == "POST" and "server" in result.json:
            self.servers.append(result.json["server"]["id"])
        created = call["path"] == "/v2.1/os-aggregates" and call["method"] == "POST"
        if created and result.status_code == 200:
            self.aggregates.append(str(result.json["aggregate"]["id"]))
        return result

    def request_id(self, server: str) -> str:
        """The request id of a server's newest instance action, as the admin lists them."""
        result = self.client.simulate_get(
            f"/v2.1/servers/{server}/os-instance-actions", headers={"X-Auth-Token": "admin"}
        )
        found = result.json.get("instanceActions") if result.status_code == 200 else None
        return str(found[0]["request_id"]) if found else "req-none"

    def get(self, path: str, token: str = "admin", query: str | None = None) -> Any:
        """A listing that must answer 200 with decodable JSON; its document."""
        result = self.client.simulate_get(path, headers={"X-Auth-Token": token}, query_string=query)
        assert result.status_code == 200, (path, query, token, result.text[:500])
        return decodable(result)

    def flavor_ids(self) -> list[str]:
        """Every flavor, private ones too."""
        found = self.get("/v2.1/flavors/detail", query="is_public=none")["flavors"]
        return [f["id"] for f in found] or ["none"]


def decodable(result: falcon.testing.Result) -> Any:
    """The JSON document of an answer, checked to be what any client can decode."""
    text = result.content.decode("utf-8")  # strict: an encoded surrogate fails here
    document = json.loads(text, parse_constant=_no_constant)
    for string in _strings(document):
        assert not any(0xD800 <= ord(c) <= 0xDFFF for c in string), (result.text[:300], string)
    return document


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in an answer: not JSON")


def _strings(document: Any) -> Iterator[str]:
    if isinstance(document, str):
        yield document
    elif isinstance(document, dict):
        for key, value in document.items():
            yield key
            yield from _strings(value)
    elif isinstance(document, list):
        for value in document:
            yield from _strings(value)


def check_answer(call: dict[str, Any], result: falcon.testing.Result) -> None:
    where = f"{call['method']} {call['path'][:200]}?{call['query'][:200]}"
    # Nova's 501 for a hypervisor's uptime (no driver keeps one) is the only 5xx by design
    uptime = call.get("route", "").endswith("/uptime") and result.status_code == 501
    assert result.status_code < 500 or uptime, (where, call["body"], result.text[:500])
    if result.status_code >= 400:
        fault = decodable(result)
        name = FAULT_NAMES[result.status_code]
        assert list(fault) == [name], (where, result.text[:500])
        assert fault[name]["code"] == result.status_code
        assert isinstance(fault[name]["message"], str) and fault[name]["message"]
    elif result.content and result.headers.get("content-type", "").startswith("application/json"):
        decodable(result)


def check_listings(cloud: Cloud) -> None:
    """What one bad record once broke for its project, or for every caller."""
    for name, token in TOKENS.items():
        if name != "admin":
            cloud.get("/v2.1/servers/detail", token)
    for project in PROJECTS:
        found = cloud.get("/v2.1/servers/detail", "admin", f"all_tenants=1&project_id={project}")
        for server in found["servers"]:
            cloud.get(f"/v2.1/servers/{server['id']}")
    for flavor_id in cloud.flavor_ids():
        if flavor_id != "none":
            cloud.get(f"/v2.1/flavors/{quote(flavor_id, safe='')}")
            cloud.get(f"/v2.1/flavors/{quote(flavor_id, safe='')}/os-extra_specs")
    # a member's flavor views at their newest (description, extra specs, swap 0)
    headers = {"X-Auth-Token": "alice:pa", "OpenStack-API-Version": "compute 2.75"}
    result = cloud.client.simulate_get("/v2.1/flavors/detail", headers=headers)
    assert result.status_code == 200, result.text[:500]
    decodable(result)
    for aggregate in cloud.get("/v2.1/os-aggregates")["aggregates"]:
        cloud.get(f"/v2.1/os-aggregates/{aggregate['id']}")
    cloud.get("/v2.1/os-services")
    for token in TOKENS.values():
        project = token.partition(":")[2] or "admin"
        cloud.get("/v2.1/limits", token)
        cloud.get(f"/v2.1/os-quota-sets/{project}/detail", token)
    cloud.get("/v2.1/os-hypervisors/detail")
    cloud.get("/v2.1/os-availability-zone/detail")
    for token in ("alice:pa", "bob:pb"):
        cloud.get("/v2.1/os-keypairs", token)


def check_every_flavor_boots(cloud: Cloud) -> None:
    for flavor_id in cloud.flavor_ids():
        body = {"server": {"name": "probe", "flavorRef": flavor_id, "imageRef": IMAGE}}
        result = cloud.client.simulate_post(
            "/v2.1/servers", json=body, headers={"X-Auth-Token": "dave:pd"}
        )
        check_answer({"method": "POST", "path": "/v2.1/servers", "query": ""}, result)


@pytest.fixture(scope="module")
def bus() -> Iterator[KombuBus]:
    bus = KombuBus("memory://", prefix=f"g{uuid.uuid4().hex[:10]}")
    yield bus
    bus.close()


@pytest.fixture(scope="module")
def ledger_url() -> str:
    """A fakeredis server for this module's examples, emptied by each."""
    return f"fakeredis://generated-{uuid.uuid4().hex}"


#: whether the listings of a cloud as Cloud() makes it were checked in this process
_FRESH_CLOUD_CHECKED: list[bool] = []


def run(ledger_url: str, bus: KombuBus, sequence: list[dict[str, Any]]) -> None:
    """Send the calls to a new cloud, checking each answer and what it left behind.

    The listings and boots at the end read only the ledger: when the calls left it as
    Cloud() made it, they are checked once in the process, not again per example.
    """
    cloud = Cloud(ledger_url, bus)
    fresh = known = ledger_dump(cloud.stores)
    for one in sequence:
        before = known if known is not None else ledger_dump(cloud.stores)
        result = cloud.send(one)
        event(f"{one['method']} {one['route']}: {result.status_code}")
        check_answer(one, result)
        known = None  # a call that succeeded may have changed anything
        if 400 <= result.status_code < 500:
            known = ledger_dump(cloud.stores)
            assert known == before, (one, result.text[:300])
    state = known if known is not None else ledger_dump(cloud.stores)
    if state == fresh and _FRESH_CLOUD_CHECKED:
        return
    check_listings(cloud)
    check_every_flavor_boots(cloud)
    if state == fresh:
        _FRESH_CLOUD_CHECKED.append(True)


@pytest.mark.timeout(300)  # 300 examples; on a loaded machine they took over the default 120 s
@GENERATED
@given(st.lists(body_calls(), min_size=1, max_size=3))
def test_bodies(ledger_url: str, bus: KombuBus, sequence: list[dict[str, Any]]) -> None:
    """Generated bodies, valid and nearly so, on the routes that read one."""
    run(ledger_url, bus, sequence)


@settings(GENERATED, max_examples=150)
@given(st.lists(url_calls(), min_size=1, max_size=3))
def test_urls(ledger_url: str, bus: KombuBus, sequence: list[dict[str, Any]]) -> None:
    """Generated path parameters and query strings, any method on any route."""
    run(ledger_url, bus, sequence)


@settings(GENERATED, max_examples=100)
@given(st.lists(calls(), min_size=1, max_size=6))
def test_every_endpoint(ledger_url: str, bus: KombuBus, sequence: list[dict[str, Any]]) -> None:
    """Sequences of any calls, so that later calls meet what earlier ones stored."""
    run(ledger_url, bus, sequence)
