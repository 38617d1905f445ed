"""The [cells] options (:mod:`qsched.conf.cells`): good lines parsed, bad lines refused
with the line (its password masked) and the fix, no [cells] line the single cell; each
entry point (qsched-api, qsched-agent, qsched-admin) says a refused option in one line
and exits as it does for its other refused options."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from agents import main as agent_main
from qsched import conf as qconf
from qsched import exception
from qsched.admin.cli import cli as admin_cli
from qsched.api import app as api_app
from qsched.api import auth
from qsched.cmd import api as api_cmd
from qsched.conf import CellsOptions
from qsched.conf.cells import CellSpec
from tests.conftest import DURABILITY_LINE

SHIPPED = CellsOptions.defaults()
TWO = ("cell1 redis://:s3cret@10.0.0.11:6379/0 cell1",
       "cell2 redis+cluster://10.0.0.21:7000,10.0.0.22:7000 qsched-cell2")  # fmt: skip
API_URL = "redis://10.0.0.10:6379/0"


def cells(lines: tuple[str, ...] = TWO, **others) -> CellsOptions:
    return SHIPPED.replace(cell=lines, **{"api_url": API_URL, **others})


def test_no_cell_line_is_the_single_cell() -> None:
    assert not SHIPPED.enabled
    assert SHIPPED.specs() == () and SHIPPED.zones() == {}
    assert SHIPPED.api_url is None and SHIPPED.mover_interval_s > 0
    assert qconf.Options.defaults().cells == SHIPPED


def test_cells_and_zones_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "qsched.conf"
    path.write_text(
        "[cells]\n"
        f"cell = {TWO[0]}\ncell = {TWO[1]}\n"
        f"api_url = {API_URL}\n"
        "zone = az1 cell1\nzone = rack 7 east cell2\n"
        "pending_grace_s = 90\nmover_interval_s = 2.5\n"
    )
    options = qconf.load_options(config_files=[str(path)]).cells
    assert options.enabled
    assert options.specs() == (
        CellSpec("cell1", "redis://:s3cret@10.0.0.11:6379/0", "cell1"),
        CellSpec("cell2", "redis+cluster://10.0.0.21:7000,10.0.0.22:7000", "qsched-cell2"),
    )
    assert options.zones() == {"az1": "cell1", "rack 7 east": "cell2"}  # the cell: last word
    assert (options.api_url, options.pending_grace_s, options.mover_interval_s) == (
        API_URL, 90.0, 2.5)  # fmt: skip


def test_the_cell_lines_are_secret_in_the_logged_options() -> None:
    opts = {opt.dest: opt for group, found in qconf.list_opts() if group == "cells"
            for opt in found}  # fmt: skip
    assert opts["cell"].secret and opts["api_url"].secret and not opts["zone"].secret


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (("cell1 redis://:s3cret@h:6379/0",),
         r"\[cells\] cell 'cell1 redis://:\*\*\*@h:6379/0': 2 fields, not 3; write it as "
         r"<name> <ledger url> <bus prefix>, e.g. 'cell = cell1 redis://10\.0\.0\.11:6379/0 "
         r"cell1'"),
        (("cell1 redis://h/0 cell1 extra",), "4 fields, not 3; write it as <name>"),
        (("cell1 cell1 redis://user:pw@h/0",),
         r"cell 'cell1 cell1 redis://user:\*\*\*@h/0': the second field, 'cell1', is not a "
         "ledger URL; write it as"),
        (("api redis://h/0 api",), "'api' is the API keyspace's name; give the cell another"),
        (("cell{1} redis://h/0 c1",), r"the name 'cell\{1\}' holds a brace or ':'"),
        (("c1 redis://h/0 p1", "c1 redis://h2/0 p2"),
         r"cell 'c1 redis://h2/0 p2': the name 'c1' is another line's too; give every "
         "cell one line and its own name"),
        (("c1 redis://h/0 same", "c2 redis://h2/0 same"),
         r"cell 'c2 redis://h2/0 same': the bus prefix 'same' is cell 'c1''s too, whose "
         "agents would take this cell's boots; give every cell its own bus prefix"),
    ],
)  # fmt: skip
def test_a_bad_cell_line_is_named_with_the_fix(lines: tuple[str, ...], expected: str) -> None:
    with pytest.raises(exception.Invalid, match=expected) as caught:
        cells(lines)
    assert "s3cret" not in str(caught.value) and ":pw@" not in str(caught.value)


def test_cells_without_an_api_url_are_refused_with_the_fix() -> None:
    with pytest.raises(exception.Invalid, match=r"set \[cells\] api_url to the ledger URL of "
                       "the API keyspace"):  # fmt: skip
        cells(api_url=None)
    assert SHIPPED.replace(api_url=API_URL).specs() == ()  # unused without cells


@pytest.mark.parametrize(
    ("lines", "zones", "expected"),
    [
        (TWO, ("az1 cell3",),
         r"\[cells\] zone 'az1 cell3': no \[cells\] cell line names 'cell3' \(the cells: "
         r"cell1, cell2\); write it as <availability zone> <cell name>"),
        ((), ("az1 cell1",), r"no \[cells\] cell line names 'cell1' \(the cells: none\)"),
        (TWO, ("az1",), r"zone 'az1': write it as <availability zone> <cell name>, e\.g\."),
        (TWO, ("az1 cell1", "az1 cell2"),
         "zone 'az1 cell2': zone 'az1' is served by 'cell1' already; give each zone one line"),
    ],
)  # fmt: skip
def test_a_bad_zone_line_is_named_with_the_fix(
    lines: tuple[str, ...], zones: tuple[str, ...], expected: str
) -> None:
    with pytest.raises(exception.Invalid, match=expected):
        cells(lines, zone=zones)


def test_a_bad_line_in_a_file_fails_the_read(tmp_path: Path) -> None:
    path = tmp_path / "qsched.conf"
    path.write_text("[cells]\ncell = cell1 redis://h:6379/0\n")
    with pytest.raises(exception.Invalid, match=r"\[cells\] cell 'cell1 redis://h:6379/0'"):
        qconf.load_options(config_files=[str(path)])


# -- each entry point says a refused [cells] option in one line, no traceback ------------

REFUSED = [
    ("cell = cell1 redis://:s3cret@h:6379/0\n",
     r"Invalid input: \[cells\] cell 'cell1 redis://:\*\*\*@h:6379/0': 2 fields, not 3; "
     "write it as <name> <ledger url> <bus prefix>"),
    ("pending_grace_s = 0.5\n",
     "Value for option pending_grace_s .* is not valid: Should be greater than or equal to 1"),
]  # fmt: skip


def refused_config(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "qsched.conf"
    path.write_text(f"[DEFAULT]\ntransport_url = memory://\n"
                    f"[ledger]\nurl = fakeredis://opts-{uuid.uuid4().hex}\n{DURABILITY_LINE}"
                    f"[cells]\napi_url = {API_URL}\n{line}")  # fmt: skip
    return path


def one_line(text: str, pattern: str, prefix: str) -> None:
    (line,) = text.strip().splitlines()
    assert line.startswith(prefix) and re.search(pattern, line), line
    assert "s3cret" not in text and "Traceback" not in text


@pytest.mark.parametrize(("line", "expected"), REFUSED)
def test_qsched_api_says_it_and_exits_2(tmp_path: Path, capsys, line: str, expected: str) -> None:
    config = refused_config(tmp_path, line)
    assert api_cmd.main(["--config-file", str(config)]) == 2
    one_line(capsys.readouterr().err, expected, "qsched-api: ")
    with pytest.raises(auth.UnreadableOptions, match=expected):  # gunicorn's master
        api_app.check_bind(["127.0.0.1:8774"], [str(config)])
    with pytest.raises(auth.UnreadableOptions, match=expected):  # and its workers
        api_app.load_app([str(config)], bind=["127.0.0.1:8774"])


@pytest.mark.parametrize(("line", "expected"), REFUSED)
def test_qsched_agent_says_it_and_exits_1(tmp_path: Path, line: str, expected: str) -> None:
    config = refused_config(tmp_path, line)
    result = CliRunner().invoke(agent_main.main, ["--config-file", str(config)])
    assert result.exit_code == 1, (result.output, result.exception)
    one_line(result.output, expected, "Error: ")


@pytest.mark.parametrize(("line", "expected"), REFUSED)
def test_qsched_admin_says_it_and_exits_2(tmp_path: Path, line: str, expected: str) -> None:
    config = refused_config(tmp_path, line)
    result = CliRunner().invoke(admin_cli, ["--config-file", str(config), "agents"])
    assert result.exit_code == 2, (result.output, result.exception)
    one_line(result.output, expected, "Error: ")
