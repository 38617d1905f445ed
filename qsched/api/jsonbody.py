"""Request bodies parsed as strict JSON (RFC 8259), so what passes can be stored and shown.

Python's :func:`json.loads` is laxer than JSON and than what qsched can keep:

- it recurses once per level of nesting, so a body nested thousands of levels deep
  raises ``RecursionError``;
- it accepts ``NaN``, ``Infinity`` and ``-Infinity``, and reads ``1e400`` as infinity;
- it reads a lone UTF-16 surrogate escape (``"\\ud800"``) into a ``str`` that no
  UTF-8 encoder takes, so it fails later: in Redis, on the bus, or when a listing
  that shows it is rendered, long after the request that brought it was accepted.
- it reads bytes with ``surrogatepass``, so a surrogate encoded as UTF-8 (CESU-8,
  ``ED A0 80``) gets in the same way; and it guesses UTF-16 or UTF-32 from the first
  bytes, where Nova reads UTF-8 only.

:func:`parse` refuses all of these with :class:`~qsched.exception.Invalid` (400),
before any handler sees the body. Its cost is linear in the size of the body, which
the caller has already capped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from qsched import exception
from qsched.api.schemas.validation import field_error

MAX_DEPTH = 32  # levels of arrays and objects; no request needs more than 4
MAX_DIGITS = 1000  # digits of one number; no field takes a number of more than 255

# A JSON string (escapes included) or one bracket: strings are skipped when counting depth.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
# Only an escape can put a surrogate in a parsed string: strict UTF-8 decoding refuses
# encoded ones. Bodies without such an escape skip the walk over every string.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse(raw: bytes) -> Any:
    """The JSON document in ``raw``, or Invalid saying what is wrong with it and where.

    :raises Invalid: not UTF-8, nested deeper than :data:`MAX_DEPTH`, malformed, a
        ``NaN`` or ``Infinity``, a number out of range, or a lone surrogate in a string.
    """
    text = _utf8(raw)
    _check_depth(text)
    try:
        document = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except ValueError as exc:  # json.JSONDecodeError
        raise exception.Invalid(message=f"Malformed request body: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):
        _check_text(document)
    return document


def _utf8(raw: bytes) -> str:
    """The body as text: UTF-8 as RFC 8259 requires (and Nova reads), a leading BOM ignored."""
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise exception.Invalid(
            message=f"Malformed request body: it is not UTF-8 (byte 0x{raw[exc.start]:02x} "
            f"at offset {exc.start}); send JSON encoded in UTF-8."
        ) from None


def _check_depth(text: str) -> None:
    """Refuse arrays and objects nested deeper than MAX_DEPTH, before the decoder recurses."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return  # too few brackets to nest that deep: most bodies
    depth = 0
    for token in _TOKEN.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise exception.Invalid(
                    message=f"Malformed request body: arrays and objects nest more than "
                    f"{MAX_DEPTH} levels deep; qsched reads at most {MAX_DEPTH} levels."
                )
        elif bracket in "]}":
            depth -= 1


def _constant(name: str) -> Any:
    raise exception.Invalid(
        message=f"Malformed request body: {name} is not a JSON value; send a number or a string."
    )


def _float(numeral: str) -> float:
    value = float(numeral)
    if not math.isfinite(value):
        raise exception.Invalid(
            message=f"Malformed request body: the number {_numeral(numeral)} is out of range; "
            "send a smaller one."
        )
    return value


def _int(numeral: str) -> int:
    digits = len(numeral.lstrip("-"))
    if digits > MAX_DIGITS:
        raise exception.Invalid(
            message=f"Malformed request body: a number of {digits} digits "
            f"({_numeral(numeral)}); qsched reads numbers of at most {MAX_DIGITS} digits."
        )
    return int(numeral)


def _numeral(numeral: str, limit: int = 40) -> str:
    return numeral if len(numeral) <= limit else numeral[: limit - 3] + "..."


def _check_text(document: Any) -> None:
    """Refuse a lone surrogate in any string of the document, key or value, naming where."""
    for path, text, is_key in _strings(document):
        if _SURROGATE.search(text):
            what = "The key" if is_key else "It"
            raise field_error(
                path, text, f"{what} contains a lone UTF-16 surrogate, which is not a "
                "character; send valid Unicode text (a surrogate escape such as \\ud83d "
                "only in a pair, as in \\ud83d\\ude00)."
            )  # fmt: skip


def _strings(document: Any) -> Iterator[tuple[tuple[Any, ...], str, bool]]:
    """Every string of the document with its path and whether it is a key (iterative)."""
    todo: list[tuple[tuple[Any, ...], Any]] = [((), document)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, str):
            yield path, value, False
        elif isinstance(value, dict):
            for key, item in value.items():
                yield path, key, True
                todo.append(((*path, key), item))
        elif isinstance(value, list):
            todo.extend(((*path, index), item) for index, item in enumerate(value))
