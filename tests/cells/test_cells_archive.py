"""archive-deleted with several cells behind one API: the archived instances' mappings
(``inst-map:<uuid>`` in the API keyspace) leave with them, a batch a round trip, once
their history is written. On fakeredis, a real Redis and a real Redis Cluster, as
``tests/cells/test_cells_api.py``; the API keyspace and two cells share the test's ledger.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner, Result

from qsched import exception
from qsched.admin import schemas
from qsched.admin.archive import archive_deleted
from qsched.admin.cli import cli
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.cellmap import RedisCellMap, cell_map
from qsched.net import free_port
from tests.admin.test_archive import FUTURE, lines, make_deleted, make_live
from tests.conftest import DURABILITY_LINE, WITH_CLUSTER, backend_url
from tests.raw import DeadClient, redis_store


@pytest.fixture(params=WITH_CLUSTER)
def ledger_url(request: pytest.FixtureRequest) -> str:
    return backend_url(request)


@pytest.fixture
def keyspaces(conf, ledger_url: str) -> dict[str, Stores]:
    """The API keyspace (``api``) and cells ``cell1`` and ``cell2``, on the test's ledger."""
    ledger = LedgerOptions.from_conf(conf)
    return {name: open_stores(ledger.replace(cell=name), url=ledger_url)
            for name in ("api", "cell1", "cell2")}  # fmt: skip


def booted(keyspaces: dict[str, Stores], cell: str, uuids: Sequence[str]) -> list[str]:
    """Map ``uuids`` to ``cell`` in the API keyspace, as the front door's boot does."""
    mappings = cell_map(keyspaces["api"])
    mappings.map(uuids, cell, "p1")
    mappings.confirm(uuids)
    return list(uuids)


def mapped(keyspaces: dict[str, Stores], uuids: Sequence[str]) -> list[str]:
    api = cell_map(keyspaces["api"])
    return [u for u in uuids if api.mapping(u) is not None]


class Unmaps:
    """``unmap`` for a run, counting its calls: one a batch, never one an instance."""

    def __init__(self, mappings: RedisCellMap) -> None:
        self.mappings = mappings
        self.calls: list[int] = []

    def __call__(self, uuids: Sequence[str]) -> int:
        self.calls.append(len(uuids))
        return self.mappings.unmap(uuids)


def test_archiving_a_cell_drops_the_mappings_of_what_it_archived(
    keyspaces: dict[str, Stores],
) -> None:
    cell1 = keyspaces["cell1"]
    gone = booted(keyspaces, "cell1", make_deleted(cell1, 5))
    live = booted(keyspaces, "cell1", [make_live(cell1)])
    other = booted(keyspaces, "cell2", make_deleted(keyspaces["cell2"], 1))
    unmap = Unmaps(cell_map(keyspaces["api"]))
    out = io.StringIO()
    report = archive_deleted(cell1.archive, out, FUTURE, batch=2, unmap=unmap)
    assert (report.archived, report.unmapped) == (5, 5)
    assert unmap.calls == [2, 2, 1]  # a batch a call, one round trip each
    assert [w["uuid"] for w in lines(out)] == gone
    assert mapped(keyspaces, gone + live + other) == live + other
    again = archive_deleted(cell1.archive, io.StringIO(), FUTURE, unmap=unmap)
    assert (again.archived, again.unmapped) == (0, 0)


def test_a_dry_run_or_a_run_without_unmap_drops_no_mapping(keyspaces: dict[str, Stores]) -> None:
    cell1 = keyspaces["cell1"]
    gone = booted(keyspaces, "cell1", make_deleted(cell1, 2))
    unmap = Unmaps(cell_map(keyspaces["api"]))
    dry = archive_deleted(cell1.archive, None, FUTURE, dry_run=True, unmap=unmap)
    assert (dry.archived, dry.unmapped, unmap.calls) == (2, None, [])
    assert archive_deleted(cell1.archive, io.StringIO(), FUTURE).unmapped is None
    assert mapped(keyspaces, gone) == gone  # one cell: nothing to drop


def test_the_api_keyspace_down_stops_the_run_and_the_next_drops_what_it_left(
    keyspaces: dict[str, Stores],
) -> None:
    """The history of the first batch is written, its mappings could not be dropped:
    it stays staged, and the next run writes it again (the same lines) and drops them."""
    cell1 = keyspaces["cell1"]
    gone = booted(keyspaces, "cell1", make_deleted(cell1, 3))
    store = redis_store(keyspaces["api"])
    live, store.client = store.client, DeadClient()  # type: ignore[assignment]
    out = io.StringIO()
    try:
        with pytest.raises(exception.BackendUnavailable):
            archive_deleted(cell1.archive, out, FUTURE, batch=2,
                            unmap=cell_map(keyspaces["api"]).unmap)  # fmt: skip
    finally:
        store.client = live
    assert [w["uuid"] for w in lines(out)] == gone[:2]
    assert set(cell1.archive.staged()) == set(gone[:2]) and mapped(keyspaces, gone) == gone
    report = archive_deleted(cell1.archive, out, FUTURE, unmap=cell_map(keyspaces["api"]).unmap)
    assert (report.archived, report.recovered, report.unmapped) == (3, 2, 3)
    assert sorted(w["uuid"] for w in lines(out)) == sorted(gone[:2] * 2 + gone[2:])
    assert mapped(keyspaces, gone) == [] and cell1.archive.staged() == {}


# -- qsched-admin archive-deleted with [cells] --------------------------------------------


def admin(config: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, ["--config-file", str(config), "archive-deleted", *args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


@pytest.fixture
def cells_config(ledger_url: str, tmp_path: Path) -> Path:
    """qsched-api's configuration of the two cells, its [ledger] the first."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    path = tmp_path / "qsched.conf"
    path.write_text(f"[ledger]\nurl = {ledger_url}\ncell = cell1\n{DURABILITY_LINE}"
                    f"[cells]\napi_url = {ledger_url}\n"
                    f"cell = cell1 {ledger_url} {prefix}-cell1\n"
                    f"cell = cell2 {ledger_url} {prefix}-cell2\n")  # fmt: skip
    return path


def test_the_command_archives_the_ledger_cell_or_the_one_named_and_drops_their_mappings(
    keyspaces: dict[str, Stores], cells_config: Path, tmp_path: Path
) -> None:
    first = booted(keyspaces, "cell1", make_deleted(keyspaces["cell1"], 2))
    second = booted(keyspaces, "cell2", make_deleted(keyspaces["cell2"], 3))
    history = tmp_path / "archive.jsonl"
    done = admin(cells_config, "--before", "0s", "-o", str(history))
    assert re.search(r"^their instance mappings dropped +2$", done.stdout, re.MULTILINE)
    assert mapped(keyspaces, first + second) == second
    dry = admin(cells_config, "--before", "0s", "--cell", "cell2", "--dry-run", "-f", "json")
    document = json.loads(dry.stdout)
    jsonschema.validate(document, schemas.ARCHIVE)
    assert (document["archived"], document["unmapped"]) == (3, None)
    named = admin(cells_config, "--before", "0s", "--cell", "cell2", "-o", str(history),
                  "-f", "json")  # fmt: skip
    document = json.loads(named.stdout)
    assert (document["archived"], document["unmapped"]) == (3, 3)
    assert [json.loads(line)["uuid"] for line in history.read_text().splitlines()] == (
        first + second)  # fmt: skip
    assert mapped(keyspaces, second) == [] and not keyspaces["cell2"].instances.get_many(second)


def test_the_command_refuses_a_cell_no_line_names_and_a_cell_without_cells(
    cells_config: Path, ledger_url: str, tmp_path: Path
) -> None:
    refused = admin(cells_config, "--before", "0s", "--dry-run", "--cell", "cell9", code=2)
    assert "--cell cell9: no [cells] cell line names it" in refused.stderr
    assert "give --cell one of cell1, cell2" in refused.stderr
    other = tmp_path / "other.conf"
    other.write_text(cells_config.read_text().replace("cell = cell1\n", "cell = cell7\n", 1))
    refused = admin(other, "--before", "0s", "--dry-run", code=2)
    assert "[ledger] cell cell7: no [cells] cell line names it" in refused.stderr
    single = tmp_path / "single.conf"
    single.write_text(f"[ledger]\nurl = {ledger_url}\n{DURABILITY_LINE}")
    refused = admin(single, "--before", "0s", "--dry-run", "--cell", "cell1", code=2)
    assert "--cell cell1: the configuration" in refused.stderr
    assert "has no [cells] cell line" in refused.stderr


def test_the_command_names_the_keyspace_that_does_not_answer(
    keyspaces: dict[str, Stores], ledger_url: str, tmp_path: Path
) -> None:
    """A cell's ledger, by its [cells] line; the API keyspace, by [cells] api_url (the
    history written stays written, the next run drops the mappings)."""
    booted(keyspaces, "cell1", make_deleted(keyspaces["cell1"], 1))
    down = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    config = tmp_path / "qsched.conf"
    config.write_text(f"[ledger]\nconnect_timeout_s = 0.2\n{DURABILITY_LINE}"
                      f"[cells]\napi_url = {down}\n"
                      f"cell = cell1 {ledger_url} t1\ncell = cell2 {down} t2\n")  # fmt: skip
    shown = down.replace("s3cret", "***")
    dead = admin(config, "--before", "0s", "-o", str(tmp_path / "a.jsonl"), "--cell", "cell2",
                 code=1)  # fmt: skip
    assert f"the ledger (Redis at {shown}) is unreachable" in dead.stderr
    assert "Check [cells] cell cell2" in dead.stderr and "s3cret" not in dead.output
    api_down = admin(config, "--before", "0s", "-o", str(tmp_path / "a.jsonl"), code=1)
    assert f"the API keyspace (Redis at {shown}) is unreachable" in api_down.stderr
    assert "Check [cells] api_url" in api_down.stderr and "s3cret" not in api_down.output
    assert len(keyspaces["cell1"].archive.staged()) == 1  # written, waiting for its unmap


def test_all_cells_archives_every_cell_in_turn_within_one_max_rows(
    keyspaces: dict[str, Stores], cells_config: Path, tmp_path: Path
) -> None:
    first = booted(keyspaces, "cell1", make_deleted(keyspaces["cell1"], 2))
    second = booted(keyspaces, "cell2", make_deleted(keyspaces["cell2"], 3))
    history = tmp_path / "archive.jsonl"
    capped = admin(cells_config, "--before", "0s", "--all-cells", "--max-rows", "3", "-o",
                   str(history), "-f", "json")  # fmt: skip
    document = json.loads(capped.stdout)
    jsonschema.validate(document, schemas.ARCHIVE_CELLS)
    runs = {run["cell"]: run for run in document["cells"]}
    assert list(runs) == ["cell1", "cell2"]
    assert (runs["cell1"]["report"]["archived"], runs["cell2"]["report"]["archived"]) == (2, 1)
    assert mapped(keyspaces, first) == [] and len(mapped(keyspaces, second)) == 2
    rest = admin(cells_config, "--before", "0s", "--all-cells", "-o", str(history))
    assert re.search(r"^cell cell1:\n  before ", rest.stdout, re.MULTILINE)
    assert re.search(r"^cell cell2:\n(  .*\n)*  archived +2$", rest.stdout, re.MULTILINE)
    assert mapped(keyspaces, first + second) == []
    archived = [json.loads(line)["uuid"] for line in history.read_text().splitlines()]
    assert sorted(archived) == sorted(first + second)
    done = admin(cells_config, "--before", "0s", "--all-cells", "--max-rows", "1", "--dry-run",
                 "-f", "json")  # fmt: skip
    assert [r["report"]["archived"] for r in json.loads(done.stdout)["cells"]] == [0, 0]


def test_all_cells_reports_a_cell_that_does_not_answer_archives_the_others_and_fails(
    keyspaces: dict[str, Stores], ledger_url: str, tmp_path: Path
) -> None:
    gone = booted(keyspaces, "cell2", make_deleted(keyspaces["cell2"], 2))
    down = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    config = tmp_path / "qsched.conf"
    config.write_text(f"[ledger]\nconnect_timeout_s = 0.2\n{DURABILITY_LINE}"
                      f"[cells]\napi_url = {ledger_url}\n"
                      f"cell = cell1 {down} t1\ncell = cell2 {ledger_url} t2\n")  # fmt: skip
    failed = admin(config, "--before", "0s", "--all-cells", "-o", str(tmp_path / "a.jsonl"),
                   "-f", "json", code=1)  # fmt: skip
    document = json.loads(failed.stdout)
    jsonschema.validate(document, schemas.ARCHIVE_CELLS)
    dead, alive = document["cells"]
    assert dead["report"] is None and "Check [cells] cell cell1" in dead["error"]
    assert "s3cret" not in failed.output
    assert alive["report"]["archived"] == 2 and mapped(keyspaces, gone) == []
    assert "1 of 2 cells not archived: cell1" in failed.stderr


def test_all_cells_is_refused_with_cell_and_without_cells(
    cells_config: Path, ledger_url: str, tmp_path: Path
) -> None:
    both = admin(cells_config, "--before", "0s", "--dry-run", "--all-cells", "--cell", "cell1",
                 code=2)  # fmt: skip
    assert "--cell cell1 and --all-cells: give one of them" in both.stderr
    single = tmp_path / "single.conf"
    single.write_text(f"[ledger]\nurl = {ledger_url}\n{DURABILITY_LINE}")
    alone = admin(single, "--before", "0s", "--dry-run", "--all-cells", code=2)
    assert "--all-cells: the configuration" in alone.stderr
    assert "has no [cells] cell line" in alone.stderr
