"""qsched.urls.masked: every URL's password masked, as each of its callers shows it
(the [cells] and [ledger] refusals, the admin CLI's errors, the benchmarks' reports)."""

from __future__ import annotations

import pytest

from qsched.urls import masked


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://u:s3cret@h:6379/9", "redis://u:***@h:6379/9"),
        ("redis://:s3cret@127.0.0.1:1/0", "redis://:***@127.0.0.1:1/0"),
        ("redis://h:6379/9", "redis://h:6379/9"),
        ("fakeredis://test-1", "fakeredis://test-1"),
        ("redis+sentinel://:s3cret@h1:1,h2:2/qsched/0?sentinel_password=s3cret",
         "redis+sentinel://:***@h1:1,h2:2/qsched/0?sentinel_password=***"),
        ("redis+sentinel://s3cret@h1:26379/qsched/0", "redis+sentinel://***@h1:26379/qsched/0"),
        ("redis+cluster://u:s3cret@a:7000,b:7000", "redis+cluster://u:***@a:7000,b:7000"),
        ("redis://h:1/0?password=s3cret&db=1", "redis://h:1/0?password=***&db=1"),
        ("redis://u:s3@cret@h/0", "redis://u:***@h/0"),  # an unencoded @: the last one ends it
        ("amqp://guest:s3cret@127.0.0.1:5672//", "amqp://guest:***@127.0.0.1:5672//"),
        ("amqp://u:s3cret@h1:5672,u:s3cret@h2:5672/", "amqp://u:***@h2:5672/"),
        ("c1 redis://:s3cret@h:6379/0 c1", "c1 redis://:***@h:6379/0 c1"),  # a [cells] line
        ("c1 redis://a:s3cret@h/0 p1, c2 redis://b:s3cret@h2/0 p2",
         "c1 redis://a:***@h/0 p1, c2 redis://b:***@h2/0 p2"),
    ],
)  # fmt: skip
def test_every_password_is_masked_and_the_rest_kept(text: str, shown: str) -> None:
    assert masked(text) == shown
    assert "s3cret" not in masked(text) and "cret" not in masked(text)
