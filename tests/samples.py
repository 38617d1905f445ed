"""Where Nova's api_samples are: the templates the nova package ships.

``make install`` installs nova without its dependencies for them; nothing imports it
(``importlib.util.find_spec`` finds a package without running it). Under CI=true a
missing package is an error, elsewhere the tests that read the samples skip.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from collections.abc import Collection
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


def mismatches(
    ours: Any,
    sample: Any,
    where: str = "",
    *,
    exact: bool = False,
    optional: Collection[str] = (),
    nullable: Collection[str] = NULLABLE,
) -> list[str]:
    """Where ``ours`` lacks a key of ``sample`` or holds another JSON type.

    ``exact``: also where it holds a key the sample lacks, a value of another type than
    the sample's (an int where the sample has a float), any item of a list (not only
    the first) unlike the sample's first, or no item where the sample shows some.
    ``optional``: keys it may leave out; ``nullable``: keys it may leave null. The
    values of :data:`DATA_MAPS` are never compared.
    """
    return _Comparison(exact, frozenset(optional), frozenset(nullable)).of(ours, sample, where)


@dataclasses.dataclass(frozen=True)
class _Comparison:
    """How :func:`mismatches` compares; ``of`` walks the sample."""

    exact: bool
    optional: frozenset[str]
    nullable: frozenset[str]

    def of(self, ours: Any, sample: Any, where: str) -> list[str]:
        if sample is None or (ours is None and where.rsplit(".", 1)[-1] in self.nullable):
            return []
        if isinstance(sample, dict):
            return self.of_object(ours, sample, where)
        if isinstance(sample, list):
            return self.of_list(ours, sample, where)
        return self.of_value(ours, sample, where)

    def of_object(self, ours: Any, sample: dict[str, Any], where: str) -> list[str]:
        if not isinstance(ours, dict):
            return [f"{where or '.'}: {type(ours).__name__}, not an object"]
        if where.rsplit(".", 1)[-1] in DATA_MAPS:
            return []
        found = []
        for key, value in sample.items():
            if key in ours:
                found.extend(self.of(ours[key], value, f"{where}.{key}"))
            elif key not in self.optional:
                found.append(f"{where}.{key}: missing")
        if self.exact:
            found.extend(f"{where}.{key}: not in the sample" for key in ours if key not in sample)
        return found

    def of_list(self, ours: Any, sample: list[Any], where: str) -> list[str]:
        if not isinstance(ours, list):
            return [f"{where}: {type(ours).__name__}, not a list"]
        if not sample:
            return []
        if not self.exact:
            return self.of(ours[0], sample[0], f"{where}[0]") if ours else []
        if not ours:
            return [f"{where}: empty, the sample's is not"]
        return [m for n, item in enumerate(ours) for m in self.of(item, sample[0], f"{where}[{n}]")]

    def of_value(self, ours: Any, sample: Any, where: str) -> list[str]:
        if self.exact:
            alike = type(ours) is type(sample)
        else:
            kinds = {bool: (bool,), int: (int, float), float: (int, float), str: (str,)}
            alike = isinstance(ours, kinds[type(sample)])
            alike = alike and isinstance(ours, bool) == isinstance(sample, bool)
        return [] if alike else [f"{where}: {ours!r} is not like the sample's {sample!r}"]
