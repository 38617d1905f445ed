"""The ``redis+sentinel://`` URL of ``[ledger] url``: what it names, and what it refuses.

No server: the client a sentinel URL gives asks the sentinels nothing until its
first call (tests/ledger/test_ledger_sentinel_real.py runs it on a real set).
"""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from qsched import exception
from qsched.ledger import redis as ledger_redis
from qsched.ledger.sentinel import SentinelURL

PARSED = [
    ("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/ledger/3",
     SentinelURL((("10.0.0.1", 26379), ("10.0.0.2", 26380)), "ledger", 3)),
    ("redis+sentinel://h1,[::1]/ledger",  # default port and db
     SentinelURL((("h1", 26379), ("::1", 26379)), "ledger", 0)),
    ("redis+sentinel://:p%40ss%2Fw@h1:1/svc/0",  # a password alone, percent-decoded
     SentinelURL((("h1", 1),), "svc", 0, None, "p@ss/w")),
    ("redis+sentinel://qsched:pw@h1:1/svc/0?sentinel_password=s3&sentinel_username=mon"
     "&sentinel_timeout_s=0.5&min_other_sentinels=1",
     SentinelURL((("h1", 1),), "svc", 0, "qsched", "pw", "mon", "s3", 0.5, 1)),
]  # fmt: skip


@pytest.mark.parametrize(("url", "parsed"), PARSED)
def test_a_sentinel_url_names_sentinels_service_db_and_credentials(url, parsed) -> None:
    assert SentinelURL.parse(url) == parsed


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://h1:26379", "must name the master's service"),
        ("redis+sentinel://h1:26379/", "must name the master's service"),
        ("redis+sentinel://h1:26379/svc/0/extra", "must name the master's service"),
        ("redis+sentinel://h1:26379/svc/zero", "'zero' is not a number"),
        ("redis+sentinel://h1:port/svc", "is not a host"),
        ("redis+sentinel://h1:26379,,h2/svc", "'' is not a host"),
        ("redis+sentinel://h1:70000/svc", "out of range"),
        ("redis+sentinel://h1/svc?socket_timeout=1", "'socket_timeout' is not one qsched reads"),
        ("redis+sentinel://h1/svc?sentinel_timeout_s=0", "above 0"),
        ("redis+sentinel://h1/svc?sentinel_timeout_s=x", "above 0"),
        ("redis+sentinel://h1/svc?min_other_sentinels=-1", "whole number"),
        ("redis+sentinel://h1/svc?min_other_sentinels=1&min_other_sentinels=2", "given twice"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_with_its_form(url: str, why: str) -> None:
    with pytest.raises(exception.Invalid) as raised:
        SentinelURL.parse(url)
    message = str(raised.value)
    assert why in message
    assert "redis+sentinel://[:password@]host:port[,host:port...]/service_name/db" in message


def test_a_refusal_does_not_show_the_passwords() -> None:
    url = "redis+sentinel://u:hunter2@h1/svc/x?sentinel_password=swordfish"
    with pytest.raises(exception.Invalid) as raised:
        SentinelURL.parse(url)
    assert "hunter2" not in str(raised.value) and "swordfish" not in str(raised.value)
    parsed = SentinelURL.parse(url.replace("/x?", "/1?"))
    assert "hunter2" not in parsed.safe() and "swordfish" not in parsed.safe()


def test_connect_gives_a_client_of_the_named_master_with_the_ledger_timeouts() -> None:
    url = "redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/svc/4?sentinel_timeout_s=0.25"
    client = ledger_redis.connect(url, connect_timeout_s=1.5, timeout_s=7.0)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "svc"
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"]) == (4, "pw")
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (1.5, 7.0)
    assert pool.max_connections == ledger_redis.MAX_CONNECTIONS
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
    assert sentinels[0].connection_pool.connection_kwargs["socket_timeout"] == 0.25
    ledger_redis.sentinel.close(client)


def test_a_plain_redis_url_is_still_read_by_redis_py() -> None:
    client = ledger_redis.connect("redis://127.0.0.1:1/2")
    assert not isinstance(client.connection_pool, SentinelConnectionPool)
    with pytest.raises(ValueError):
        ledger_redis.connect("redis+proxy://h1/0")
