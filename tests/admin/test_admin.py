"""qsched-admin against the embedded stack (memory bus, fakeredis), through click's CliRunner.

The CLI runs in the test's process, so it shares the stack's in-process broker
and ledger: it is pointed at them with a config file, as an operator would.
"""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from agents.virt.fake import FakeNodeSpec
from qsched.admin import queries, schemas
from qsched.admin.cli import cli
from qsched.compute.api import ComputeAPI
from qsched.context import RequestContext
from qsched.embedded import Stack, embedded_options, start_stack
from qsched.ledger import Stores
from qsched.ledger.base import State
from qsched.recovery.reaper import reap_expired
from qsched.scheduling.message import BootRequest
from qsched.scheduling.records import record_for
from tests.conftest import DURABILITY_LINE
from tests.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

USER = RequestContext.for_project("u1", "p1")
SPEC = FakeNodeSpec(vcpus=2, ram_mb=4096, disk_gb=20, cpu_allocation_ratio=1.0)


def config_file(path: Path, stack: Stack) -> str:
    options = stack.options
    path.write_text(
        f"[DEFAULT]\ntransport_url = {options.bus.transport_url}\n"
        f"[bus]\nprefix = {options.bus.prefix}\n"
        f"[ledger]\nurl = {options.ledger.url}\n{DURABILITY_LINE}"
        f"[scheduler]\nbuild_timeout_s = {options.scheduler.build_timeout_s}\n"
    )
    return str(path)


class Admin:
    """Runs qsched-admin with one config file."""

    def __init__(self, config: str) -> None:
        self.config = config
        self.runner = CliRunner()

    def __call__(self, *args: str, code: int = 0, stdin: str | None = None) -> Result:
        result = self.runner.invoke(cli, ["--config-file", self.config, *args], input=stdin)
        assert result.exit_code == code, (result.output, result.exception)
        return result

    def json(self, schema: dict[str, Any], *args: str) -> Any:
        document = json.loads(self(*args, "--format", "json").stdout)
        jsonschema.validate(document, schema)
        return document


def make_stack(tmp: Path, agents: int, hosts: int, timeout_s: float, **driver: Any) -> Stack:
    conf = embedded_options(
        build_timeout_s=("scheduler", timeout_s),
        class_poll_interval_s=("agent", 0.05),
        heartbeat_interval_s=("agent", 0.1),
    )
    stack = start_stack(conf, hosts, agents, SPEC, **driver)
    stack.stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    return stack


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Admin, ComputeAPI]]:
    """Two agents driving two nodes each (2 VCPU, 4 GiB, 20 GB)."""
    tmp = tmp_path_factory.mktemp("admin")
    stack = make_stack(tmp, agents=2, hosts=4, timeout_s=60)
    admin = Admin(config_file(tmp / "qsched.conf", stack))
    yield stack, admin, stack.compute_api()
    stack.stop()


def boot(api: ComputeAPI, flavor: str, state: State | None = State.ACTIVE) -> str:
    uuid_ = api.boot(USER, f"vm-{flavor}", flavor).uuid
    if state is not None:
        assert wait_until(lambda: api.cell.stores.instances.get(uuid_).state == state, 10)
    return uuid_


def events_of(stores: Stores, uuid_: str, name: str) -> list[Any]:
    return [e for e in stores.instances.events(uuid_) if e.event == name]


# -- listings -----------------------------------------------------------------------------


def test_services_list_and_set(cloud) -> None:
    stack, admin, api = cloud
    listed = admin.json(schemas.SERVICES, "service", "list")
    hosts = [s["host"] for s in listed]
    assert len(hosts) == 2 and {s["state"] for s in listed} == {"up"}
    host = hosts[0]
    try:
        off = admin.json(schemas.SERVICE, "service", "set", host, "--disable",
                         "--disable-reason", "new disks")  # fmt: skip
        assert (off["status"], off["disabled_reason"], off["state"]) == (
            "disabled", "new disks", "up",
        )  # fmt: skip
        table = admin("service", "list", "--host", host).stdout
        assert "disabled" in table and "new disks" in table
        drained = boot(api, "m1.tiny")  # the disabled host drains: another takes it
        assert stack.stores.instances.get(drained).host == hosts[1]
        down = admin.json(schemas.SERVICE, "service", "set", host, "nova-compute", "--down")
        assert (down["status"], down["forced_down"], down["state"]) == ("disabled", True, "down")
    finally:
        back = admin.json(schemas.SERVICE, "service", "set", host, "--enable", "--up")
    assert (back["status"], back["disabled_reason"], back["state"]) == ("enabled", None, "up")
    assert "--disable-reason needs --disable" in admin(
        "service", "set", host, "--disable-reason", "x", code=2).output  # fmt: skip
    assert "nothing to change" in admin("service", "set", host, code=2).output
    gone = admin("service", "set", "no-such-host", "--disable", code=1).output
    assert "Could not find binary nova-compute on host no-such-host." in gone
    assert "qsched-admin service list" in gone
    assert "Only nova-compute services" in admin(
        "service", "set", host, "nova-scheduler", "--disable", code=2).output  # fmt: skip


def test_queues_agents_and_providers(cloud) -> None:
    stack, admin, api = cloud
    boot(api, "m1.tiny")
    assert wait_until(lambda: _consumers(admin, "m1.tiny") == 2, 5)
    rows = {r["class"]: r for r in admin.json(schemas.QUEUES, "queues")}
    assert rows["m1.tiny"]["ready"] == 0 and rows["m1.tiny"]["waiting"] == 0
    assert rows[None]["queue"] == f"{stack.options.bus.prefix}.dead"
    assert "CLASS" in admin("queues").stdout and "(dead letters)" in admin("queues").stdout

    agents = {a["host"]: a for a in admin.json(schemas.AGENTS, "agents") if a["alive"]}
    assert set(agents) == {"cn0", "cn1"}
    assert sum(a["free"]["VCPU"] for a in agents.values()) <= 7
    assert agents["cn0"]["largest_free"]["VCPU"]["amount"] == 2

    assert queries.all_providers(stack.stores) == stack.stores.ledger.list_providers()
    providers = admin.json(schemas.PROVIDERS, "providers")
    assert [p["name"] for p in providers] == ["cn0-0", "cn0-1", "cn1-0", "cn1-1"]
    listed = admin("providers", "--host", "cn1", "-f", "csv").stdout
    mine = list(csv.DictReader(io.StringIO(listed)))
    assert [p["name"] for p in mine] == ["cn1-0", "cn1-1"] and mine[0]["VCPU"].endswith("/2")
    assert admin("providers", "--trait", "CUSTOM_NONE").stdout.strip() == "no provider matches"
    shown = admin.json(schemas.PROVIDER, "provider", "show", "cn1-1")
    assert shown["inventories"]["VCPU"]["capacity"] == 2
    assert "FREE" in admin("provider", "show", shown["uuid"]).stdout


def test_zones(cloud) -> None:
    stack, admin, _ = cloud
    stack.stores.agents.add_zone("az9")  # its agents are gone: the zone stays
    expected = [{"zone": "az9", "agents": 0}, {"zone": "nova", "agents": 2}]
    assert admin.json(schemas.ZONES, "zones") == expected
    assert admin("zones").stdout.split() == ["ZONE", "AGENTS", "az9", "0", "nova", "2"]
    assert admin("zones", "-f", "csv").stdout.splitlines() == ["zone,agents", "az9,0", "nova,2"]


def _consumers(admin: Admin, cls: str) -> int | None:
    rows = json.loads(admin("queues", "-f", "json").stdout)
    return next((r["agents"] for r in rows if r["class"] == cls), None)


def test_a_placed_server_shows_and_explains(cloud) -> None:
    _, admin, api = cloud
    placed = boot(api, "m1.small")
    shown = admin.json(schemas.SERVER, "server", "show", placed)
    assert [e["event"] for e in shown["events"]] == ["accepted", "claimed", "active"]
    assert "history:" in admin("server", "show", placed).stdout
    why = admin.json(schemas.WHY, "server", "why", placed)
    assert why["outcome"] == "placed" and why["verdict"].startswith(f"placed on {why['host']}")
    assert "claimed" in admin("server", "why", placed).stdout

    held = admin.json(schemas.ALLOCATIONS, "allocations", placed)
    assert {a["resource_class"]: a["amount"] for a in held["allocations"]} == {
        "DISK_GB": 20, "MEMORY_MB": 2048, "VCPU": 1,
    }  # fmt: skip
    listed = admin.json(schemas.SERVERS, "server", "list", "--project", "p1", "--status", "active")
    assert placed in {s["uuid"] for s in listed}
    usages = admin.json(schemas.USAGES, "usages", "--project", "p1")
    assert {u["resource_class"] for u in usages["usages"]} == {"DISK_GB", "MEMORY_MB", "VCPU"}


def test_quota_show_and_set(cloud) -> None:
    _, admin, _ = cloud
    admin("quota", "set", "p9", "--cores", "40", "--instances", "-1")
    shown = admin.json(schemas.QUOTA, "quota", "show", "p9")
    limits = {r["resource"]: r["limit"] for r in shown["resources"]}
    assert limits == {"instances": -1, "cores": 40, "ram_mb": 51200}
    assert "unlimited" in admin("quota", "show", "p9").stdout
    assert "at least one" in admin("quota", "set", "p9", code=2).output
    assert admin("quota", "set", "p9", "--cores", "-5", code=2)


def test_flavor_commands(cloud) -> None:
    _, admin, _ = cloud
    made = admin.json(schemas.FLAVOR, "flavor", "create", "g1", "--vcpus", "2", "--ram-mb", "1024",
                      "--spec", "resources:CUSTOM_GPU=1")  # fmt: skip
    assert made["extra_specs"] == {"resources:CUSTOM_GPU": "1"}
    admin("flavor", "set-spec", "g1", "trait:HW_CPU_X86_AVX2=required")
    shown = admin.json(schemas.FLAVOR, "flavor", "show", "g1")
    assert shown["extra_specs"]["trait:HW_CPU_X86_AVX2"] == "required"
    admin("flavor", "unset-spec", "g1", "resources:CUSTOM_GPU")
    assert "g1" in {f["id"] for f in admin.json(schemas.FLAVORS, "flavor", "list")}
    assert "already exists" in admin("flavor", "create", "g1", "--vcpus", "1", "--ram-mb", "1",
                                     code=1).output  # fmt: skip
    assert "KEY=VALUE" in admin("flavor", "set-spec", "g1", "nonsense", code=2).output
    assert "Invalid input" in admin("flavor", "set-spec", "g1", "trait:X=maybe", code=2).output
    assert "deleted flavor g1" in admin("flavor", "delete", "g1").stdout
    line = _one_line_error(admin("flavor", "delete", "g1", code=1))
    assert (
        line == "Error: Flavor g1 could not be found. List flavors with: qsched-admin flavor list."
    )


# -- dead letters and queues --------------------------------------------------------------


def test_dead_letters_list_show_requeue_purge(cloud) -> None:
    stack, admin, api = cloud
    wire = stack.bus.wire
    wire.publish(wire.boot_entity("m1.tiny"), b"\x93garbage")  # an agent dead-letters it
    waiting = boot(api, "m1.large", state=None)  # 4 VCPU: fits no node, waits
    request = BootRequest.create(waiting, "p1", "u1", api.get_flavor("m1.large"))
    wire.publish_dead(request.encode(), "test: lost on the way", wire.boot_entity("m1.large"))
    assert wait_until(lambda: len(admin.json(schemas.DEAD_LETTERS, "dead-letters", "list")) == 2, 5)
    letters = {d["kind"]: d for d in admin.json(schemas.DEAD_LETTERS, "dead-letters", "list")}
    assert "not msgpack" in letters[None]["reason"] and letters[None]["class"] == "m1.tiny"
    assert letters["boot"]["instance"] == waiting
    assert len(admin.json(schemas.DEAD_LETTERS, "dead-letters", "list")) == 2  # reading kept them

    poison = admin.json(schemas.DEAD_LETTER, "dead-letters", "show", letters[None]["id"])
    assert poison["body_hex"] == b"\x93garbage".hex() and poison["problem"]
    assert "Poison message" in admin("dead-letters", "show", letters[None]["id"]).stdout
    admin("dead-letters", "show", "0123456789ab", code=1)

    outcome = admin.json(schemas.OUTCOMES, "dead-letters", "requeue", "--all")
    results = {o["instance"]: o["result"] for o in outcome}
    assert results[waiting] == "requeued" and results[None].startswith("not requeued: Poison")
    assert [d["kind"] for d in admin.json(schemas.DEAD_LETTERS, "dead-letters", "list")] == [None]
    assert stack.bus.queue_stats("m1.large").ready >= 1

    admin("dead-letters", "purge", "--all", stdin="n\n", code=1)  # not confirmed: aborted
    admin("dead-letters", "purge", "--all", "--yes")
    assert admin("dead-letters", "list").stdout.strip() == "no dead letters"
    admin("dead-letters", "requeue", code=2)  # ids or --all


def test_queue_purge_asks_then_drops(cloud) -> None:
    stack, admin, api = cloud
    boot(api, "m1.medium", state=None)  # 40 GB disk: fits no node
    assert wait_until(lambda: stack.bus.queue_stats("m1.medium").ready == 1, 5)
    admin("queue", "purge", "m1.medium", stdin="n\n", code=1)
    assert stack.bus.queue_stats("m1.medium").ready == 1
    out = admin("queue", "purge", "m1.medium", "--yes").stdout
    assert out.startswith("dropped 1 message(s)")
    assert stack.bus.queue_stats("m1.medium").ready == 0


def test_top_prints_frames(cloud) -> None:
    _, admin, _ = cloud
    out = admin("top", "--iterations", "2", "--interval", "0.05", "-f", "json").stdout
    frames = [json.loads(line) for line in out.splitlines()]
    for frame in frames:
        jsonschema.validate(frame, schemas.TOP_FRAME)
    assert frames[0]["placements_per_s"] is None and frames[1]["placements_per_s"] is not None
    assert frames[1]["agents_alive"] == 2 and frames[1]["fill"]["VCPU"] > 0
    table = admin("top", "--iterations", "1", "--no-fill").stdout
    assert "agents 2 alive of 2" in table and "RATE/S" in table


def test_janitor_requeues_what_a_dead_agent_left(cloud) -> None:
    stack, admin, api = cloud
    stores = stack.stores
    stores.agents.heartbeat("ghost", ttl_s=0.05)
    flavor = api.get_flavor("m1.tiny")
    request = BootRequest.create(str(uuid.uuid4()), "p1", "u1", flavor, timeout_s=30)
    orphan = stores.instances.create(record_for(request, "vm-ghost"), request.deadline).uuid
    rp = stores.ledger.list_providers()[0].uuid
    stores.ledger.claim(orphan, {rp: {"VCPU": 1}}, "ghost", "ghost-0")
    assert wait_until(lambda: not stores.agents.alive("ghost"), 2)

    seen = admin.json(schemas.JANITOR, "janitor", "run", "--dry-run")
    assert seen["dry_run"] and seen["dead_agents"] == ["ghost"] and seen["requeued"] == [orphan]
    assert stores.instances.get(orphan).host == "ghost"
    assert "dead_agents  ghost" in admin("janitor", "run").stdout
    assert wait_until(lambda: stores.instances.get(orphan).state == State.ACTIVE, 10)
    assert admin.json(schemas.JANITOR, "janitor", "run")["requeued"] == []


# -- why, on requests that were not placed ------------------------------------------------


def test_why_a_request_refused_by_two_hosts_then_timed_out(tmp_path: Path) -> None:
    stack = make_stack(tmp_path, agents=2, hosts=2, timeout_s=60)
    try:
        admin = Admin(config_file(tmp_path / "qsched.conf", stack))
        api = stack.compute_api()
        _fill_behind_the_agents_backs(stack.stores)
        uuid_ = boot(api, "m1.tiny", state=None)
        refused = lambda: {e.host for e in events_of(stack.stores, uuid_, "refused")}  # noqa: E731
        assert wait_until(lambda: refused() == {"cn0", "cn1"}, 10)
        assert wait_until(lambda: _consumers(admin, "m1.tiny") == 0, 5)

        why = admin.json(schemas.WHY, "server", "why", uuid_)
        assert why["outcome"] == "waiting" and why["now"]["consumers"] == []
        assert {r["host"] for r in why["refusals"]} == {"cn0", "cn1"}
        assert {r["kind"] for r in why["refusals"]} == {"capacity"} and why["conflicts"]
        assert "no live agent consumes class m1.tiny: no node has 1 VCPU free" in why["verdict"]
        assert "(largest free: 0 VCPU on cn" in why["verdict"]
        assert why["now"]["fit"]["short"][0]["resource_class"] == "VCPU"

        # Its deadline passes: what the reaper does then, without waiting for it.
        assert reap_expired(stack.stores, now=time.time() + 61) == 1
        assert stack.stores.instances.get(uuid_).state == State.ERROR
        text = admin("server", "why", uuid_).stdout
        assert "No valid host was found" in text and "before its deadline" in text
        verdict = next(line for line in text.splitlines() if line.startswith("why: "))
        for host in ("cn0", "cn1"):  # in the order they refused
            assert f"{host} (not enough VCPU on {host}-0: 0 free of 1 needed)" in verdict
            assert f"{host} refused it" in text
        assert "refused by cn" in verdict and "ended in ERROR" in text
        why = admin.json(schemas.WHY, "server", "why", uuid_)
        assert why["outcome"] == "error" and why["fault"]["details"]["reason"] == "deadline"
    finally:
        stack.stop()


def _fill_behind_the_agents_backs(stores: Stores) -> None:
    """Take every VCPU in the ledger directly: the agents' indexes still see room."""
    for provider in stores.ledger.list_providers():
        allocation = {provider.uuid: {"VCPU": provider.inventories["VCPU"].capacity}}
        stores.ledger.put_allocations(str(uuid.uuid4()), allocation, None, "other", "other")


def test_why_every_spawn_failed(tmp_path: Path) -> None:
    stack = make_stack(tmp_path, agents=2, hosts=2, timeout_s=30, failure_rate=1.0)
    try:
        admin = Admin(config_file(tmp_path / "qsched.conf", stack))
        uuid_ = boot(stack.compute_api(), "m1.tiny", State.ERROR)
        why = admin.json(schemas.WHY, "server", "why", uuid_)
        assert why["outcome"] == "error" and len(why["spawn_failures"]) == 3
        assert "Every attempt failed: 3 spawns failed" in why["verdict"]
        assert "3 of 3 attempts used" in why["verdict"]
        assert "spawn failed on cn" in admin("server", "why", uuid_).stdout
    finally:
        stack.stop()


# -- failures: one line, the right exit code ----------------------------------------------


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], Admin]:
    def write(body: str) -> Admin:
        path = tmp_path / f"{uuid.uuid4().hex}.conf"
        path.write_text(body)
        return Admin(str(path))

    return write


def _one_line_error(result: Result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_unreachable_redis_is_one_line(write_config) -> None:
    admin = write_config("[ledger]\nurl = redis://:secret@127.0.0.1:1/0\n")
    line = _one_line_error(admin("agents", code=1))
    assert "the ledger (Redis at redis://:***@127.0.0.1:1/0) is unreachable" in line
    assert "Check [ledger] url" in line and "secret" not in line
    _one_line_error(admin("server", "why", str(uuid.uuid4()), code=1))


def test_unreachable_sentinels_are_one_line_without_a_password(write_config) -> None:
    url = "redis+sentinel://:secret@127.0.0.1:1,127.0.0.1:2/qsched/0?sentinel_password=hush"
    admin = write_config(f"[ledger]\nurl = {url}\nconnect_timeout_s = 0.2\n")
    line = _one_line_error(admin("agents", code=1))
    shown = "redis+sentinel://:***@127.0.0.1:1,127.0.0.1:2/qsched/0?sentinel_password=***"
    assert f"the ledger (Redis at {shown}) is unreachable" in line
    assert "No master found for 'qsched'" in line
    assert "secret" not in line and "hush" not in line


def test_a_malformed_sentinel_url_is_a_usage_error(write_config) -> None:
    admin = write_config("[ledger]\nurl = redis+sentinel://:secret@127.0.0.1:1\n")
    line = _one_line_error(admin("agents", code=2))
    assert "must name the master's service" in line and "/service_name/db" in line
    assert "secret" not in line


def test_unreachable_broker_is_one_line(write_config) -> None:
    admin = write_config(
        "[DEFAULT]\ntransport_url = amqp://guest:guest@127.0.0.1:1//\n"
        f"[ledger]\nurl = fakeredis://admin-{uuid.uuid4().hex}\n{DURABILITY_LINE}"
        "[bus]\nconnect_timeout_s = 0.5\n"
    )
    result = admin("queues", code=1)
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: Message bus at amqp://guest:**@127.0.0.1:1// is unavailable")
    assert "Check transport_url" in line and "Traceback" not in result.output


def test_unknown_ids_and_usage_errors(cloud, write_config) -> None:
    _, admin, _ = cloud
    line = _one_line_error(admin("server", "why", "nope", code=1))
    assert "Instance nope could not be found. List a project's servers with" in line
    _one_line_error(admin("allocations", str(uuid.uuid4()), code=1))
    _one_line_error(admin("provider", "show", "nope", code=1))
    admin("queues", "--format", "xml", code=2)
    admin("no-such-command", code=2)
    broken = write_config("[ledger\nurl = \n")
    assert "cannot read the configuration" in broken("queues", code=2).output


def test_an_empty_embedded_ledger_warns(write_config) -> None:
    admin = write_config(f"[ledger]\nurl = fakeredis://alone-{uuid.uuid4().hex}\n{DURABILITY_LINE}")
    result = admin("agents")
    assert "warning: [ledger] url is fakeredis://" in result.stderr
    assert result.stdout.strip() == "no agent has ever heartbeated"
