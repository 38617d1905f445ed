"""``transport_url`` in oslo.messaging's syntax: parsed by oslo.messaging, read by kombu.

No server: each kombu URL made is read back by kombu itself, which is what the
bus connects with; the failover across hosts is in ``tests/bus/test_bus_failover.py``.
"""

from __future__ import annotations

import ssl

import kombu
import pytest

from qsched import exception
from qsched.bus import open_bus
from qsched.bus.kombu.wire import KombuOptions, KombuWire
from qsched.conf import BusOptions
from qsched.conf.transport import (
    HONOURED,
    REFUSED,
    Transport,
    parse_transport_url,
    rabbit_opts,
    speaks_oslo,
)


def kombu_reads(url: str) -> tuple[str, int, str, str, str]:
    """(host, port, user, password, vhost) as kombu reads ``url``."""
    connection = kombu.Connection(url)
    return (
        connection.hostname,
        connection.port,
        connection.userid,
        connection.password,
        connection.virtual_host,
    )


def hosts_read(url: str) -> list[tuple[str, int, str, str, str]]:
    return [kombu_reads(part) for part in parse_transport_url(url).urls]


# -- which URLs oslo.messaging parses --


@pytest.mark.parametrize(
    ("url", "oslo"),
    [
        ("rabbit://u:p@h:5672/", True),
        ("RABBIT://u:p@h/", True),
        ("rabbit:///", True),
        ("amqp://u:p@h1:5672,u:p@h2:5672/", True),
        ("amqp://u:p@h:5672//", False),
        ("amqp://h1,h2:5673/", True),
        ("amqp://u:p@[::1]:5672,u:p@[::2]/", True),
        ("amqp://u:p,q@h:5672//", False),  # a comma in a password: kombu's, as before
        ("amqp://u:p@h:5672/a,b", False),  # a comma in the vhost only: one host
        ("memory://", False),
        ("redis://h:6379/0", False),
        ("pyamqp://u:p@h//", False),
    ],
)
def test_which_urls_are_oslo_messaging_s(url: str, oslo: bool) -> None:
    assert speaks_oslo(url) == oslo


@pytest.mark.parametrize(
    "url", ["memory://", "amqp://u:p@h:5672//", "redis://:pw@h:6379/3", "rediss://h:6380/0"]
)
def test_kombu_urls_are_kept_as_they_are(url: str) -> None:
    assert parse_transport_url(url) == Transport((url,))


def test_a_comma_in_a_kombu_url_password_is_still_the_password() -> None:
    (url,) = parse_transport_url("amqp://u:p,q@h:5672//").urls
    assert kombu_reads(url) == ("h", 5672, "u", "p,q", "/")


def test_kombu_s_own_failover_list_is_split() -> None:
    url = "amqp://u:p@h1:5672//;amqp://u:p@h2:5672//"
    assert parse_transport_url(url).urls == ("amqp://u:p@h1:5672//", "amqp://u:p@h2:5672//")


# -- hosts, credentials, vhost --


def test_the_multi_host_form_kombu_misread_is_two_hosts() -> None:
    url = "amqp://u:p@h1:5672,u:p@h2:5672/"
    assert kombu_reads(url)[:4] == ("h2", 5672, "u", "p@h1:5672,u:p")  # what the issue saw
    assert hosts_read(url) == [("h1", 5672, "u", "p", "/"), ("h2", 5672, "u", "p", "/")]


def test_several_hosts_in_the_order_listed_each_with_its_credentials() -> None:
    url = "rabbit://a:pa@h1:5672,b:pb@h2:5673,c:pc@h3:5674/nova"
    assert hosts_read(url) == [
        ("h1", 5672, "a", "pa", "nova"),
        ("h2", 5673, "b", "pb", "nova"),
        ("h3", 5674, "c", "pc", "nova"),
    ]


@pytest.mark.parametrize(
    ("userinfo", "user", "password"),
    [
        ("u:p@ss", "u", "p@ss"),  # a bare @: oslo.messaging splits at the last one
        ("u:p:a:ss", "u", "p:a:ss"),  # a bare ':' after the first: the password's
        ("u%3Ax:p%3Ay", "u:x", "p:y"),
        ("u%40x:p%40y", "u@x", "p@y"),
        ("u:100%25", "u", "100%"),
        ("u:%2C%2F%3F%23", "u", ",/?#"),  # what must be encoded
        ("u:p%2540", "u", "p%40"),  # decoded once, as oslo.messaging does
        ("%C3%A9t%C3%A9:s%C3%BBr", "été", "sûr"),
    ],
)
def test_credentials_are_decoded_as_oslo_messaging_decodes_them(
    userinfo: str, user: str, password: str
) -> None:
    (host,) = hosts_read(f"rabbit://{userinfo}@h:5672/")
    assert host == ("h", 5672, user, password, "/")


@pytest.mark.parametrize(
    ("path", "vhost"),
    [("", "/"), ("/", "/"), ("//", "/"), ("/nova", "nova"), ("/a%2Fb", "a/b"), ("/%2F", "/")],
)
def test_virtual_host(path: str, vhost: str) -> None:
    (host,) = hosts_read(f"rabbit://u:p@h:5672{path}")
    assert host[4] == vhost


def test_default_port_and_host() -> None:
    assert hosts_read("rabbit://u:p@h1,u:p@h2:5673/") == [
        ("h1", 5672, "u", "p", "/"),
        ("h2", 5673, "u", "p", "/"),
    ]
    assert hosts_read("rabbit:///") == [("localhost", 5672, "guest", "guest", "/")]


def test_ipv6_host() -> None:
    (url,) = parse_transport_url("rabbit://u:p@[::1]:5673/").urls
    assert url == "amqp://u:p@[::1]:5673/"


def test_safe_url_masks_every_password_and_keeps_the_syntax() -> None:
    url = "rabbit://u:s3cret@h1,v:s3cret%40@h2:5673/nova?heartbeat_rate=4"
    safe = parse_transport_url(url).safe_url
    assert safe == "rabbit://u:**@h1:5672,v:**@h2:5673/nova"
    assert KombuWire(url).safe_url == safe


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("rabbit://u:p@h:70000/", "port 70000 of h is not 1-65535"),
        ("rabbit://u:p@h:x/", "cannot be parsed"),
    ],
)
def test_bad_urls_are_refused(url: str, words: str) -> None:
    with pytest.raises(exception.Invalid, match=words):
        parse_transport_url(url)


# -- query options --


def test_ssl_and_its_files_as_oslo_messaging_builds_them() -> None:
    assert parse_transport_url("rabbit://u:p@h/").ssl is False
    assert parse_transport_url("rabbit://u:p@h/?ssl=true").ssl is True
    query = "ssl=1&ssl_ca_file=/etc/ca.pem&ssl_cert_file=/etc/c.pem&ssl_key_file=/etc/k.pem"
    assert parse_transport_url(f"rabbit://u:p@h1,u:p@h2/?{query}").ssl == {
        "ca_certs": "/etc/ca.pem",
        "certfile": "/etc/c.pem",
        "keyfile": "/etc/k.pem",
        "cert_reqs": ssl.CERT_REQUIRED,
        "server_hostname": None,  # kombu puts in the host each connection reaches
    }
    assert parse_transport_url("rabbit://h/?ssl=true&ssl_cert_file=/c").ssl == {"certfile": "/c"}


def test_the_wire_hands_kombu_a_fresh_ssl_copy_and_the_login_method() -> None:
    wire = KombuWire("rabbit://u:p@h/?ssl=true&ssl_ca_file=/ca&rabbit_login_method=PLAIN")
    first, second = (wire._connection(url, 0) for url in wire._urls * 2)
    assert first.ssl == wire.transport.ssl and first.ssl is not second.ssl
    assert first.login_method == "PLAIN"
    plain = KombuWire("amqp://u:p@h:5672//")._connection("amqp://u:p@h:5672//", 0)
    assert (plain.ssl, plain.login_method) == (False, None)  # a kombu URL: as before


def test_failover_strategy_login_and_heartbeats() -> None:
    parsed = parse_transport_url(
        "rabbit://h/?kombu_failover_strategy=shuffle&rabbit_login_method=EXTERNAL"
        "&heartbeat_timeout_threshold=10&heartbeat_rate=4"
    )
    assert parsed.failover_strategy == "shuffle"
    assert parsed.login_method == "EXTERNAL"
    assert (parsed.heartbeat_s, parsed.heartbeat_rate) == (10, 4)
    plain = parse_transport_url("rabbit://h/")
    assert (plain.failover_strategy, plain.login_method) == ("round-robin", None)
    assert (plain.heartbeat_s, plain.heartbeat_rate) == (None, 2)


def test_the_url_s_heartbeat_wins_over_the_bus_options() -> None:
    options = KombuOptions(heartbeat_s=30)
    assert KombuWire("rabbit://h/?heartbeat_timeout_threshold=0", options=options).options == (
        KombuOptions(heartbeat_s=0)
    )
    assert KombuWire("rabbit://h/", options=options).options == options


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("nope=1", "'nope': it is not an option of oslo.messaging's rabbit driver"),
        ("ssl=maybe", "'ssl': 'maybe' is not a valid value"),
        ("ssl=true&ssl=false", "'ssl': 'true,false' is not a valid value"),
        ("kombu_failover_strategy=random", "Valid values are \\[round-robin, shuffle\\]"),
        ("rabbit_login_method=OAUTH", "'rabbit_login_method': 'OAUTH' is not a valid value"),
        ("heartbeat_rate=0", "'heartbeat_rate': 0 is below 1"),
        ("heartbeat_timeout_threshold=-1", "'heartbeat_timeout_threshold': -1 is below 0"),
        ("ssl_ca_file=/ca", "'ssl_ca_file': it needs ssl=true in the same URL"),
        ("ssl=false&ssl_key_file=/k", "'ssl_key_file': it needs ssl=true"),
        ("rabbit_quorum_delivery_limit=5", "set \\[bus\\] delivery_limit instead"),
        ("rabbit_qos_prefetch_count=10", "an agent prefetches one message per queue"),
        ("ssl_version=TLSv1_2", "TLS negotiates the highest version"),
        ("use_queue_manager=true", "oslo.messaging's own RPC and notification queues"),
    ],
)
def test_query_options_that_cannot_be_honoured_are_refused(query: str, words: str) -> None:
    with pytest.raises(exception.Invalid, match=words):
        parse_transport_url(f"rabbit://u:p@h1,u:p@h2/?{query}")


def test_no_option_of_the_rabbit_driver_is_ignored() -> None:
    """Each one is honoured or refused: none is accepted and then dropped."""
    opts = rabbit_opts()
    assert set(HONOURED) <= set(opts) and set(REFUSED) <= set(opts)
    for name in sorted(set(opts) - set(HONOURED)):
        with pytest.raises(exception.Invalid, match=f"'{name}': qsched cannot honour it"):
            parse_transport_url(f"rabbit://h/?{name}=1")


def test_open_bus_takes_a_rabbit_url() -> None:
    url = "rabbit://guest:guest@127.0.0.1:1,guest:guest@127.0.0.1:2/"
    bus = open_bus(BusOptions.defaults().replace(transport_url=url, prefix="qconf"))
    assert (
        bus.wire.amqp and bus.wire.safe_url == "rabbit://guest:**@127.0.0.1:1,guest:**@127.0.0.1:2/"
    )
    assert bus.wire._urls == ["amqp://guest:guest@127.0.0.1:1/", "amqp://guest:guest@127.0.0.1:2/"]
    bus.close()
