"""How a body is checked against a schema: compiling it once, and Nova's 400s.

:func:`compiled` is the one way a schema becomes a validator (with the formats
below); :func:`validate` gives Nova's message ("Invalid input for field/attribute
...") for the most relevant error, with a subschema's ``x-message`` if it carries
one. :func:`field_error` and :func:`query_int` give the same wording for what a
handler checks itself.

Formats: ``int32`` bounds a number written as a string of digits, ``text255``
bounds a number by the length of its text (Nova checks both in code after its
schema); ``ipv4``, ``ipv6`` and ``base64`` are Nova's formats of the same names.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Sequence
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator

from qsched import exception
from qsched.api.schemas.parameter_types import MAX_INT, MAX_TEXT

_DIGITS = re.compile(r"[0-9]{1,10}")

_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("int32")
def _int32(value: object) -> bool:
    """A string of digits (the pattern checks that) stands for a number <= MAX_INT."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value) <= MAX_INT
    return True


@_FORMATS.checks("ipv4")
def _ipv4(value: object) -> bool:
    return not isinstance(value, str) or _is_address(value, ipaddress.IPv4Address)


@_FORMATS.checks("ipv6")
def _ipv6(value: object) -> bool:
    return not isinstance(value, str) or _is_address(value, ipaddress.IPv6Address)


def _is_address(value: str, kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


@_FORMATS.checks("base64")
def _base64(value: object) -> bool:
    """Base64 as Nova reads it (``base64.decodebytes``: characters outside the alphabet,
    such as spaces and line breaks, are skipped; the padding must be right)."""
    if not isinstance(value, str):
        return True
    try:
        base64.decodebytes(value.encode("utf-8"))
    except (binascii.Error, UnicodeError):
        return False
    return True


@_FORMATS.checks("text255")
def _text255(value: object) -> bool:
    """A number is kept as its text (Nova stores extra specs so): at most MAX_TEXT of it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return len(str(value)) <= MAX_TEXT
    return True


def compiled(schema: dict[str, Any]) -> Validator:
    """``schema``, checked and compiled with the formats above (once, at import)."""
    cls = validators.validator_for(schema, default=Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, format_checker=_FORMATS)


def for_version(choices: Sequence[tuple[tuple[int, int], Validator]], version: Any) -> Validator:
    """The validator of the newest first microversion at or below ``version``."""
    return next(v for since, v in choices if version >= since)


def validate(validator: Validator, body: Any) -> Any:
    """Return ``body`` if it matches, else raise Invalid with Nova's wording."""
    error = best_match(validator.iter_errors(body))
    if error is None:
        return body
    raise field_error(error.absolute_path, error.instance, _explanation(error))


def field_error(path: Sequence[Any], value: Any, explanation: str) -> exception.Invalid:
    """Nova's 400 for one field: "Invalid input for field/attribute <path>. Value: <value>.
    <explanation>" (``body`` for the whole body; a surrogate in a key shown escaped)."""
    where = "/".join(str(p) for p in path) or "body"
    where = where.encode("utf-8", "backslashreplace").decode("utf-8")
    return exception.Invalid(
        message=f"Invalid input for field/attribute {where}. Value: {_short(value)}. {explanation}"
    )


def query_int(name: str, value: str, maximum: int = MAX_INT) -> int:
    """A query parameter that must be a whole number from 0 to ``maximum`` (Nova's
    non_negative_integer, bounded): ASCII digits only, so neither '-1' nor '²' passes.

    :raises Invalid: anything else, in Nova's words for query parameters.
    """
    if _DIGITS.fullmatch(value) and int(value) <= maximum:
        return int(value)
    raise exception.Invalid(
        message=f"Invalid input for query parameters {name}. Value: {_short(value)}. "
        f"It must be a whole number (at most {maximum})."
    )


def _explanation(error: ValidationError) -> str:
    if error.validator in ("required", "additionalProperties", "maxProperties"):
        return str(error.message)
    # A missing or wrongly shaped field explains itself better in plain words.
    for schema in (error.schema, *_parents(error)):
        if isinstance(schema, dict) and "x-message" in schema:
            return f"It {schema['x-message']}."
    return str(error.message)


def _parents(error: ValidationError) -> list[Any]:
    parents = []
    while error.parent is not None:
        error = error.parent
        parents.append(error.schema)
    return parents


def _short(value: Any, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
