"""What a kombu message holds, read without trusting it: its body, kombu's own errors.

A message on a boot queue can come from anyone who can publish there, so nothing
here assumes its shape. kombu does not hand over bytes in every case:

* py-amqp gives ``""`` (a str) for an empty body, and a ``str`` for any body whose
  ``content_encoding`` is a text codec: it decodes the bytes itself;
* kombu decompresses a body whose ``compression`` header it knows, and records the
  failure in ``message.errors`` when it cannot (a consumer's ``on_decode_error``
  gets it).

Every function here is pure and returns a value for any input: it raises nothing.
"""

from __future__ import annotations

from typing import Any

from qsched.bus import base


def body_bytes(message: Any) -> bytes:
    """The body as bytes, whatever type the transport handed over.

    A ``str`` is encoded back with the message's own ``content_encoding`` (py-amqp
    decoded it with that codec, so this gives the bytes that were sent), else UTF-8.
    ``None`` is empty; any other object (only ``memory://`` can carry one) is its repr.
    """
    body = getattr(message, "body", None)
    if isinstance(body, bytes):
        return body
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    if body is None:
        return b""
    if isinstance(body, str):
        return _encode(body, getattr(message, "content_encoding", None))
    return _encode(_repr(body), None)


def _encode(text: str, encoding: Any) -> bytes:
    try:
        encoded = text.encode(encoding if isinstance(encoding, str) else "utf-8")
    except (LookupError, UnicodeError, TypeError, ValueError):
        return text.encode("utf-8", "surrogatepass")
    return encoded if isinstance(encoded, bytes) else text.encode("utf-8", "surrogatepass")


def problem(message: Any) -> str | None:
    """Why kombu could not build the message (its recorded errors), or None."""
    errors = getattr(message, "errors", None)
    if not errors or not isinstance(errors, list | tuple):
        return None
    first = errors[0]
    exc = first[1] if isinstance(first, tuple) and len(first) > 1 else first
    if isinstance(exc, BaseException):
        return f"kombu could not decode it: {base.describe(exc)}"
    return f"kombu could not decode it: {text(exc)}"


def text(value: Any) -> str:
    """Any header value as printable text: bytes decoded, control characters escaped."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        found = bytes(value).decode("utf-8", "replace")
    elif isinstance(value, str):
        found = value
    else:
        found = _repr(value)
    return found if found.isprintable() else found.encode("unicode_escape").decode("ascii")


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a value's own __repr__ may fail; its type still says something
        return f"<{type(value).__name__}>"
