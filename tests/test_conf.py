"""The options sections: each frozen value carries exactly the options of its section."""

from __future__ import annotations

import dataclasses

import pytest

from qsched import conf as qconf
from qsched.conf import (
    AgentOptions,
    APIOptions,
    BusOptions,
    CellsOptions,
    LedgerOptions,
    NotificationOptions,
    QuotaOptions,
    SchedulerOptions,
    glance,
)
from qsched.conf.base import Section
from qsched.conf.ledger import DEFAULT_DURABILITY, ledger_opts
from qsched.ledger.durability import Durability

SECTIONS = [
    AgentOptions, APIOptions, BusOptions, CellsOptions, LedgerOptions, NotificationOptions,
    QuotaOptions, SchedulerOptions,
]  # fmt: skip


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_fields_are_the_options_of_the_section(section: type[Section]) -> None:
    fields = [f.name for f in dataclasses.fields(section)]
    options = [opt.dest for _group, opts in section.GROUPS for opt in opts]
    assert fields == options  # nothing read that is not an option, no option left unread


def test_every_listed_option_is_carried_by_one_section() -> None:
    """Every option, but those keystoneauth reads itself ([glance], qsched.conf.glance)."""
    listed = {
        (group or "DEFAULT", o.dest)
        for group, opts in qconf.list_opts()
        if group != glance.GROUP
        for o in opts
    }
    carried = [(g or "DEFAULT", o.dest) for s in SECTIONS for g, opts in s.GROUPS for o in opts]
    assert sorted(carried) == sorted(listed)


def test_read_once_from_files_and_frozen(tmp_path) -> None:
    path = tmp_path / "qsched.conf"
    path.write_text(
        "[DEFAULT]\ntransport_url = amqp://guest:guest@mq:5672//\n"
        "[agent]\nhost = cn7\nnode_traits = HW_CPU_X86_AVX2,CUSTOM_A\n"
        "[api]\nflavor = m1.small:1:2048\nflavor = m1.large:4:8192\n"
        "[ledger]\nmax_conflict_retries = 3\n"
    )
    options = qconf.load_options(config_files=[str(path)])
    assert options.bus.transport_url == "amqp://guest:guest@mq:5672//"
    assert options.agent.host == "cn7"
    assert options.agent.node_traits == ("HW_CPU_X86_AVX2", "CUSTOM_A")
    assert options.api.flavor == ("m1.small:1:2048", "m1.large:4:8192")
    assert options.ledger.max_conflict_retries == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.agent.host = "other"  # type: ignore[misc]
    hash(options)  # lists became tuples: the whole value is immutable


def test_defaults_and_replace() -> None:
    shipped = SchedulerOptions.defaults()
    assert shipped.max_attempts == 3 and shipped.build_timeout_s == 300.0
    changed = shipped.replace(max_attempts=5)
    assert (changed.max_attempts, shipped.max_attempts) == (5, 3)
    with pytest.raises(TypeError):
        shipped.replace(no_such_option=1)


def test_the_ledger_loses_no_acknowledged_write_by_default() -> None:
    """[ledger] durability ships as disk, the setting that keeps nothing acknowledged
    from a machine crash on a plain Redis; the library's own default is the same."""
    assert LedgerOptions.defaults().durability == DEFAULT_DURABILITY == "disk"
    assert Durability().mode == DEFAULT_DURABILITY
    (opt,) = [o for o in ledger_opts if o.dest == "durability"]
    assert [name for name, _ in opt.type.choices.items()] == ["disk", "replica", "async"]
    assert "The default, disk, loses none on a plain Redis (replica would fail every write" \
        in opt.help  # fmt: skip
    helps = dict(opt.type.choices.items())
    assert helps["disk"].startswith("the default:") and "deploy/redis-ledger.conf" in helps["disk"]
    assert helps["async"].startswith("an opt-in:")
    assert "every write fails on a Redis without replicas" in helps["replica"]
