"""archive-deleted: the ledger's step, the run that drives it and the admin command, on
fakeredis and on a real Redis (see ``stores``)."""

from __future__ import annotations

import io
import json
import time
import uuid
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from qsched import exception
from qsched.admin import schemas
from qsched.admin.archive import archive_deleted, parse_before
from qsched.admin.cli import cli
from qsched.ledger import Stores
from qsched.ledger import instances as instances_module
from qsched.ledger.base import Instance, Inventory, State
from tests.api.test_api import ADMIN, USER, app, at, bus, client, fault, post_server
from tests.conftest import DURABILITY_LINE
from tests.raw import redis_store

__all__ = ["app", "bus", "client"]  # fixtures, see tests.api.test_api

FUTURE = 1e12  # a cut-off after every deletion


def make_deleted(stores: Stores, count: int, project: str = "p1") -> list[str]:
    """``count`` instances created and deleted, one after the other (oldest first)."""
    made = []
    for _ in range(count):
        made.append(make_live(stores, project))
        stores.instances.delete(made[-1])
    return made


def make_live(stores: Stores, project: str = "p1") -> str:
    uuid_ = str(uuid.uuid4())
    flavor = {"name": "f", "vcpus": 1, "ram_mb": 512}
    record = Instance(uuid_, project, "u1", "vm", flavor, State.BUILD)
    stores.instances.create(record, deadline=FUTURE)
    return uuid_


def lines(out: io.StringIO) -> list[dict]:
    found = [json.loads(line) for line in out.getvalue().splitlines()]
    for line in found:
        jsonschema.validate(line, schemas.HISTORY_LINE)
    return found


def test_deleted_instances_leave_oldest_first_with_their_history(stores: Stores) -> None:
    deleted = make_deleted(stores, 5)
    live = make_live(stores)
    out = io.StringIO()
    report = archive_deleted(stores.archive, out, FUTURE, batch=2)
    assert (report.archived, report.held, report.steps, report.complete) == (5, 0, 3, True)
    written = lines(out)
    assert [w["uuid"] for w in written] == deleted  # oldest deletion first
    first = written[0]
    assert first["record"]["state"] == "DELETED" and first["record"]["flavor"]["vcpus"] == 1
    assert [e["event"] for e in first["events"]] == ["accepted", "deleted"]
    assert first["deleted_at"] == pytest.approx(time.time(), abs=60)
    for gone in deleted:
        with pytest.raises(exception.InstanceNotFound):
            stores.instances.get(gone)
        assert stores.instances.events(gone) == []
    assert stores.instances.deleted_since(0) == [] and stores.instances.deleted_since(0, "p1") == []
    assert stores.instances.get(live).state == State.BUILD
    assert stores.archive.staged() == {} and stores.archive.deleted_count() == 0
    # nothing of an archived instance is left in the cell (the live one's keys only)
    client, keys = redis_store(stores).client, redis_store(stores).keys
    assert not [k for k in client.scan_iter(f"{keys.prefix}*") if deleted[0].encode() in k]


def test_only_those_deleted_before_the_cut_off_go(stores: Stores) -> None:
    old = make_deleted(stores, 2)
    time.sleep(0.01)
    cut = time.time()
    time.sleep(0.01)
    young = make_deleted(stores, 2)
    report = archive_deleted(stores.archive, io.StringIO(), cut)
    assert (report.archived, report.left, report.complete) == (2, 0, True)
    assert stores.instances.deleted_since(0) == young[::-1]
    assert all(stores.instances.get(u).state == State.DELETED for u in young)
    assert not stores.instances.get_many(old)


def test_an_instance_still_referred_to_is_held_and_does_not_stop_the_others(
    stores: Stores,
) -> None:
    first, second, third = make_deleted(stores, 3)
    rp = str(uuid.uuid4())
    stores.ledger.create_provider(rp, "host-a")
    stores.ledger.set_inventory(rp, 0, {"VCPU": Inventory(4)})
    stores.ledger.put_allocations(second, {rp: {"VCPU": 1}}, None, "p1", "u1")  # after its end
    out = io.StringIO()
    report = archive_deleted(stores.archive, out, FUTURE, batch=1)
    assert [w["uuid"] for w in lines(out)] == [first, third]
    assert report.held == 1 and report.held_named == {second: "holds allocations"}
    assert report.left == 1 and report.complete
    assert stores.instances.get(second).state == State.DELETED
    assert stores.instances.deleted_since(0) == [second]


def test_the_index_keeps_every_deletion_while_lists_read_the_newest(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(instances_module, "DELETED_LISTED", 2)
    deleted = make_deleted(stores, 3)
    assert stores.instances.deleted_since(0) == deleted[:0:-1]  # the newest two
    assert stores.archive.deleted_count() == 3
    out = io.StringIO()
    assert archive_deleted(stores.archive, out, FUTURE).archived == 3
    assert [w["uuid"] for w in lines(out)] == deleted


def test_a_dry_run_counts_and_changes_nothing(stores: Stores) -> None:
    deleted = make_deleted(stores, 3)
    report = archive_deleted(stores.archive, None, FUTURE, batch=2, dry_run=True)
    assert (report.archived, report.steps, report.left, report.complete) == (3, 2, 3, True)
    assert set(stores.instances.get_many(deleted)) == set(deleted)
    assert stores.archive.staged() == {}


def test_max_rows_bounds_a_run_and_the_next_run_goes_on(stores: Stores) -> None:
    deleted = make_deleted(stores, 5)
    out = io.StringIO()
    report = archive_deleted(stores.archive, out, FUTURE, batch=2, max_rows=3)
    assert (report.archived, report.left, report.complete) == (3, 2, False)
    report = archive_deleted(stores.archive, out, FUTURE, batch=2)
    assert (report.archived, report.left, report.complete) == (2, 0, True)
    assert [w["uuid"] for w in lines(out)] == deleted


def test_what_a_stopped_run_staged_is_written_by_the_next(stores: Stores) -> None:
    deleted = make_deleted(stores, 3)
    step = stores.archive.step(FUTURE, 2)  # a run that died before writing its batch
    assert list(step.archived) == deleted[:2] and set(stores.archive.staged()) == set(step.archived)
    with pytest.raises(exception.InstanceNotFound):  # out of the cell already: a 404
        stores.instances.get(deleted[0])
    out = io.StringIO()
    report = archive_deleted(stores.archive, out, FUTURE)
    assert (report.archived, report.recovered) == (3, 2)
    assert sorted(w["uuid"] for w in lines(out)) == sorted(deleted)
    assert stores.archive.staged() == {}


def test_an_index_entry_without_a_record_is_dropped(stores: Stores) -> None:
    (gone,) = make_deleted(stores, 1)
    store = redis_store(stores)
    store.client.delete(store.keys.instance(gone))
    report = archive_deleted(stores.archive, io.StringIO(), FUTURE)
    assert (report.archived, report.stale, report.left) == (0, 1, 0)


def test_a_late_event_of_an_archived_instance_leaves_no_history(stores: Stores) -> None:
    (gone,) = make_deleted(stores, 1)
    archive_deleted(stores.archive, io.StringIO(), FUTURE)
    stores.instances.add_event(gone, "refused", host="h1", reason="a stale request")
    store = redis_store(stores)
    assert not store.client.exists(store.keys.instance_events(gone))


def test_a_step_of_no_instance_is_refused(stores: Stores) -> None:
    with pytest.raises(exception.Invalid, match="use 1 or more"):
        stores.archive.step(FUTURE, 0)


def test_a_run_needs_somewhere_to_write_the_history(stores: Stores) -> None:
    with pytest.raises(ValueError, match="give it a stream"):
        archive_deleted(stores.archive, None, FUTURE)


# -- the API: an archived server is a purged one ----------------------------------------


def test_the_api_answers_404_for_an_archived_server(client, stores: Stores) -> None:
    made = post_server(client, USER, name="gone")
    assert made.status_code == 202, made.text
    server = made.json["server"]["id"]
    assert client.simulate_delete(f"/v2.1/servers/{server}", headers=USER).status_code == 204
    since = "/v2.1/servers/detail?changes-since=2000-01-01T00:00:00Z"
    listed = client.simulate_get(since, headers=USER)
    assert [(s["id"], s["status"]) for s in listed.json["servers"]] == [(server, "DELETED")]
    actions = f"/v2.1/servers/{server}/os-instance-actions"
    assert client.simulate_get(actions, headers=at("2.21", USER)).status_code == 200
    archive_deleted(stores.archive, io.StringIO(), FUTURE)
    fault(client.simulate_get(f"/v2.1/servers/{server}", headers=ADMIN), 404, "itemNotFound")
    fault(client.simulate_get(actions, headers=at("2.21", USER)), 404, "itemNotFound")
    assert client.simulate_get(since, headers=USER).json["servers"] == []


# -- the cut-off ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90d", 1_000_000.0 - 90 * 86400),
        ("12h", 1_000_000.0 - 12 * 3600),
        ("30m", 1_000_000.0 - 1800),
        ("45s", 1_000_000.0 - 45),
        ("2w", 1_000_000.0 - 14 * 86400),
        ("1.5h", 1_000_000.0 - 5400),
        ("2024-05-01", 1714521600.0),
        ("2024-05-01T12:00:00Z", 1714564800.0),
        ("2024-05-01T14:00:00+02:00", 1714564800.0),
    ],
)
def test_before_is_an_age_or_an_iso_time(text: str, expected: float) -> None:
    assert parse_before(text, now=1_000_000.0) == expected


@pytest.mark.parametrize("text", ["", "90", "3y", "yesterday", "2024-13-01"])
def test_a_cut_off_that_is_neither_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"neither an age \(90d"):
        parse_before(text, now=1_000_000.0)


# -- qsched-admin archive-deleted -------------------------------------------------------


def admin(ledger_url: str, tmp_path: Path, *args: str, code: int = 0):
    config = tmp_path / "qsched.conf"
    config.write_text(f"[ledger]\nurl = {ledger_url}\n{DURABILITY_LINE}")
    result = CliRunner().invoke(cli, ["--config-file", str(config), "archive-deleted", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


def test_the_command_appends_the_history_to_a_file(
    stores: Stores, ledger_url: str, tmp_path: Path
) -> None:
    deleted = make_deleted(stores, 3)
    history = tmp_path / "archive.jsonl"
    history.write_text('{"kept": "an earlier run\'s line"}\n')
    dry = admin(ledger_url, tmp_path, "--before", "0s", "--dry-run", "--format", "json")
    document = json.loads(dry.stdout)
    jsonschema.validate(document, schemas.ARCHIVE)
    assert (document["archived"], document["dry_run"], document["left"]) == (3, True, 3)
    done = admin(ledger_url, tmp_path, "--before", "0s", "--batch", "2", "-o", str(history))
    assert "archived" in done.stdout and "step 2: archived 3 so far" in done.stderr
    kept, *written = history.read_text().splitlines()
    assert json.loads(kept) == {"kept": "an earlier run's line"}
    assert [json.loads(w)["uuid"] for w in written] == deleted
    assert not stores.instances.get_many(deleted)


def test_the_command_writes_the_history_to_stdout_and_the_summary_to_stderr(
    stores: Stores, ledger_url: str, tmp_path: Path
) -> None:
    (deleted,) = make_deleted(stores, 1)
    result = admin(ledger_url, tmp_path, "--before", "0s", "-o", "-", "--format", "json")
    (line,) = result.stdout.splitlines()
    assert json.loads(line)["uuid"] == deleted
    summary = json.loads(result.stderr[result.stderr.index("{") :])
    assert summary["archived"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--before", "90d"], "needs --output FILE (or - for stdout)"),
        (["--before", "soon", "--dry-run"], "--before 'soon' is neither an age"),
        (["--before", "1d", "-o", "/nonexistent/dir/a.jsonl"], "give a writable file"),
    ],
)
def test_the_command_refuses_what_it_cannot_do_and_says_how(
    ledger_url: str, tmp_path: Path, args: list[str], message: str
) -> None:
    result = admin(ledger_url, tmp_path, *args, code=2)
    assert message in result.stderr
