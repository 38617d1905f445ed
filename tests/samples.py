"""Where Nova's api_samples are: the templates the nova package ships.

``make install`` installs nova without its dependencies for them; nothing imports it
(``importlib.util.find_spec`` finds a package without running it). Under CI=true a
missing package is an error, elsewhere the tests that read the samples skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest


def _find() -> Path | None:
    spec = importlib.util.find_spec("nova")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations)))
    found = found / "tests" / "functional" / "api_sample_tests" / "api_samples"
    return found if found.is_dir() else None


#: the api_samples directory (``<resource>/[v2.N/]<name>.json.tpl``), or None
SAMPLES = _find()

if SAMPLES is None and os.environ.get("CI") == "true":
    raise RuntimeError("nova's api_samples are missing: run make install")

#: a mark for the tests that read them
needs_samples = pytest.mark.skipif(
    SAMPLES is None, reason="nova's api_samples are not installed: pip install --no-deps nova"
)


def samples_dir() -> Path:
    """:data:`SAMPLES`, for a test that runs only with them (see :data:`needs_samples`)."""
    assert SAMPLES is not None, "nova's api_samples are not installed: run make install"
    return SAMPLES


# -- comparing an answer with a response sample --

PLACEHOLDER = re.compile(r"%\((\w+)\)s")

#: keys whose values are maps of data (their keys are names, not fields)
DATA_MAPS = frozenset({"metadata", "extra_specs", "addresses", "rules", "cpu_info", "hosts"})
#: keys Nova's API reference says may be null, where a sample shows a value
NULLABLE = frozenset(
    {
        "availability_zone",
        "disabled_reason",
        "description",
        "host_ip",
        "OS-EXT-SRV-ATTR:root_device_name",
        "trusted_image_certificates",
        "locked_reason",
    }
)

#: what a placeholder outside quotes stands for, by name (any other: a number)
_BARE = {"strtime_or_none": "null", "strtime": '"text"', "hostname": '"text"',
         "forced_down": "false", "preserve_ephemeral": "false"}  # fmt: skip


def shape(text: str) -> Any:
    """A response template as JSON: a quoted placeholder is a string, a bare one what
    :data:`_BARE` says."""
    numbers = re.sub(r'"%\(int:\w+\)s"', "0", text)  # Nova's mark of an integer
    quoted = re.sub(r'"[^"\n]*%\(\w+\)s[^"\n]*"', '"text"', numbers)
    return json.loads(PLACEHOLDER.sub(lambda m: _BARE.get(m.group(1), "0"), quoted))


def mismatches(ours: Any, sample: Any, where: str = "") -> list[str]:
    """Where ``ours`` lacks a key of ``sample`` or holds another JSON type."""
    if sample is None or (ours is None and where.rsplit(".", 1)[-1] in NULLABLE):
        return []
    if isinstance(sample, dict):
        if not isinstance(ours, dict):
            return [f"{where or '.'}: {type(ours).__name__}, not an object"]
        if where.rsplit(".", 1)[-1] in DATA_MAPS:
            return []
        found = []
        for key, value in sample.items():
            if key not in ours:
                found.append(f"{where}.{key}: missing")
            else:
                found.extend(mismatches(ours[key], value, f"{where}.{key}"))
        return found
    if isinstance(sample, list):
        if not isinstance(ours, list):
            return [f"{where}: {type(ours).__name__}, not a list"]
        if ours and sample:
            return mismatches(ours[0], sample[0], f"{where}[0]")
        return []
    kinds = {bool: (bool,), int: (int, float), float: (int, float), str: (str,)}[type(sample)]
    if isinstance(ours, kinds) and (isinstance(ours, bool) == isinstance(sample, bool)):
        return []
    return [f"{where}: {ours!r} is not like the sample's {sample!r}"]
