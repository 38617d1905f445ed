"""The embedded ledger (fakeredis://) and what an install without its extra does."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from agents import main as agent_main
from agents.virt.fake import FakeNodeSpec
from qsched import conf as qconf
from qsched.cmd import api as api_cmd
from qsched.conf import LedgerOptions
from qsched.context import RequestContext
from qsched.embedded import SharedState, embedded_options, start_stack
from qsched.ledger import embedded, open_stores
from qsched.ledger.base import Instance, State
from qsched.ledger.durability import DurabilityRefused
from qsched.ledger.embedded import EmbeddedNotInstalled
from qsched.net import free_port
from tests.helpers import wait_until


def test_one_server_per_name(conf) -> None:
    name = f"fakeredis://e-{uuid.uuid4().hex}"
    one, same, other = (
        open_stores(LedgerOptions.from_conf(conf), url=url) for url in (name, name, f"{name}-2")
    )
    one.agents.add_zone("az1")
    assert same.agents.has_zone("az1") and not other.agents.has_zone("az1")


def test_the_scripts_run(conf) -> None:
    stores = open_stores(LedgerOptions.from_conf(conf), url=f"fakeredis://e-{uuid.uuid4().hex}")
    flavor = {"name": "small", "vcpus": 1, "ram_mb": 512}
    record = Instance(str(uuid.uuid4()), "p1", "u1", "vm", flavor, State.BUILD)
    assert stores.instances.create(record, deadline=1e12).state == State.BUILD


@pytest.mark.parametrize("missing", ["fakeredis", "lupa"])
def test_without_the_extra_the_error_says_what_to_install(
    conf, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # import fails, find_spec finds nothing
    with pytest.raises(EmbeddedNotInstalled, match=r"pip install 'qsched\[embedded\]'"):
        open_stores(LedgerOptions.from_conf(conf), url="fakeredis://nothing")
    with pytest.raises(EmbeddedNotInstalled, match=r"pip install 'qsched\[embedded\]'"):
        embedded.tcp_server("127.0.0.1", 0)


def test_a_redis_ledger_never_imports_fakeredis() -> None:
    """The services open a redis:// ledger without loading fakeredis (a production
    install does not have it)."""
    code = (
        "import sys, qsched.cmd.api, agents.main\n"
        "from qsched.conf import LedgerOptions\n"
        "from qsched.ledger import open_stores\n"
        "from qsched.exception import BackendUnavailable\n"
        "try:\n"  # the default, disk, asks the server for its settings: none answers there
        "    open_stores(LedgerOptions.defaults(), url='redis://127.0.0.1:1/0')\n"
        "except BackendUnavailable:\n"
        "    pass\n"
        "sys.exit(3 if 'fakeredis' in sys.modules or 'lupa' in sys.modules else 0)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_redis_client_is_not_embedded() -> None:
    import redis

    assert not embedded.is_embedded(redis.Redis())
    assert embedded.is_embedded(embedded.connect(f"fakeredis://e-{uuid.uuid4().hex}"))


def test_a_script_is_compiled_once_and_called_with_each_calls_arguments() -> None:
    """As Redis does per SHA: the embedded server compiles a script's source once; KEYS
    and ARGV are each call's, and errors are the ones fakeredis reports."""
    import redis

    client = embedded.connect(f"fakeredis://compiled-{uuid.uuid4().hex}")
    server = client.connection_pool.connection_kwargs["server"]
    runtime = server._lua_runtime
    assert isinstance(runtime, embedded.CompiledScripts)
    echo = client.register_script("local n = #ARGV\nreturn {KEYS[1], ARGV[1], n}")
    assert echo(keys=["a"], args=["x"]) == [b"a", b"x", 1]
    assert echo(keys=["b"], args=["y", "z"]) == [b"b", b"y", 2]
    compiled = len(runtime._compiled)
    echo(keys=["c"], args=["w"])
    assert len(runtime._compiled) == compiled  # no new compilation for the same source
    for source in ("return redis.call('NOSUCH')", "return (", "return KEYS[1] .. nil"):
        with pytest.raises(redis.ResponseError):
            client.register_script(source)(keys=["k"])


@pytest.mark.timeout(60)
def test_the_embedded_stack_publishes_a_parked_request_again() -> None:
    """The embedded stack runs the API's housekeeping, the outbox pass among it: a request
    an agent parked (every host refused it for a while, as a hard server group does)
    is published again and placed, not left to its deadline."""
    options = embedded_options(
        outbox_grace_s=("scheduler", 1.0),
        outbox_interval_s=("scheduler", 0.2),
        heartbeat_interval_s=("agent", 0.2),
    )
    spec = FakeNodeSpec(vcpus=8, ram_mb=8192, disk_gb=100, cpu_allocation_ratio=1.0)
    stack = start_stack(options, hosts=1, agents=1, node_spec=spec)
    try:
        stores, agent = stack.stores, stack.agents[0]
        stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
        stores.agents.update_service("cn0", disabled=True, disabled_reason="test")
        assert wait_until(lambda: not agent.gate.enabled, 10)
        server = stack.compute_api().boot(RequestContext.for_project("u1", "p1"), "vm", "m1.tiny")
        assert stack.bus.purge_queue("m1.tiny") == 1  # the outbox is its only way on now
        assert stores.instances.park(server.uuid, "cn0", "test")
        stores.agents.update_service("cn0", disabled=False)
        assert wait_until(lambda: stores.instances.get(server.uuid).state == State.ACTIVE, 15)
        reasons = [event.detail.get("reason") for event in stores.instances.events(server.uuid)]
        assert "stranded in the outbox" in reasons
    finally:
        stack.stop()


def test_the_embedded_stack_says_async_and_the_shipped_default_is_refused_on_it() -> None:
    """The embedded ledger keeps nothing past its process: the embedded stack's options
    say async, and open; the shipped options (disk, fakeredis://) are refused with what
    to set, never silently run async."""
    options = embedded_options()
    assert options.ledger.durability == "async"
    open_stores(options.ledger, options.quota).backend.ping()
    with pytest.raises(DurabilityRefused, match="durability = disk: needs a real Redis") as err:
        open_stores(LedgerOptions.defaults())
    assert "or durability = async to run on the embedded ledger" in str(err.value)


def test_the_demos_admin_config_opens_its_served_ledger(tmp_path: Path) -> None:
    """qsched-demo --serve writes qsched-demo.conf for qsched-admin: its ledger is the
    demo's fakeredis served over TCP, so the file says async too."""
    shared = SharedState(free_port())
    try:
        options = embedded_options(url=("ledger", shared.ledger_url))
        path = tmp_path / "qsched-demo.conf"
        shared.write_config(options, str(path))
        read = qconf.load_options(config_files=[str(path)]).ledger
        assert (read.url, read.durability) == (shared.ledger_url, "async")
        open_stores(read).backend.ping()
    finally:
        shared.stop()


def test_the_services_on_the_shipped_options_say_the_refusal_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """qsched-api and qsched-agent with no [ledger] at all (fakeredis://, disk): each
    refuses to start with the durability message and its fix, and nothing else."""
    config = tmp_path / "qsched.conf"
    config.write_text("[DEFAULT]\ntransport_url = memory://\n")
    assert api_cmd.main(["--config-file", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("qsched-api: [ledger] durability = disk: needs a real Redis")
    result = CliRunner().invoke(agent_main.main, ["--config-file", str(config)])
    assert result.exit_code == 1, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: [ledger] durability = disk") and line.endswith("tests do")
