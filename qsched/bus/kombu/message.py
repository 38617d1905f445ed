"""What a kombu message holds, read without trusting it: body, kombu's own errors, dead letters.

A message on a boot queue can come from anyone who can publish there, so nothing
here assumes its shape. kombu does not hand over bytes in every case:

* py-amqp gives ``""`` (a str) for an empty body, and a ``str`` for any body whose
  ``content_encoding`` is a text codec: it decodes the bytes itself;
* kombu decompresses a body whose ``compression`` header it knows, and records the
  failure in ``message.errors`` when it cannot (a consumer's ``on_decode_error``
  gets it; ``Queue.get`` raises it);
* headers may be missing, and on ``memory://`` hold any Python object.

Every function here is pure (``get_message`` aside) and returns a value for any
input: it raises nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from qsched.bus import base

#: Headers kombu acts on when it builds a message; a copy written back drops them.
KOMBU_HEADERS = frozenset({"compression"})
MAX_NAME_CHARS = 255
#: Later than this (year 2286) a time of death is noise, and too late for strftime.
MAX_EPOCH_S = 1e10


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


def get_message(channel: Any, queue: str) -> Any | None:
    """Take one message unacked from ``queue`` (None when empty) as a kombu message.

    Unlike ``kombu.Queue.get`` it never raises what kombu could not decode (a
    ``compression`` header that does not match the body): such a message would
    otherwise be unreadable for good. Its errors stay in ``message.errors``.

    :raises: the transport's connection and channel errors.
    """
    raw = channel.basic_get(queue=queue, no_ack=False)
    if raw is None:
        return None
    to_python = getattr(channel, "message_to_python", None)
    return to_python(raw) if to_python is not None else raw


def dead_letter(message: Any) -> base.DeadLetter:
    """A dead letter from a message of the dead-letter queue, whatever it holds."""
    headers = message_headers(message)
    queue = name(headers.get(base.ORIGIN_QUEUE_HEADER)) or name(headers.get("x-first-death-queue"))
    return base.DeadLetter(
        body=body_bytes(message),
        reason=letter_reason(headers),
        queue=queue,
        routing_key=name(headers.get(base.ORIGIN_KEY_HEADER)),
        dead_at=epoch_s(headers.get(base.DEAD_AT_HEADER)),
        headers=headers,
    )


def message_headers(message: Any) -> dict[Any, Any]:
    """The headers as a new dict; empty when there are none or they are not a mapping."""
    headers = getattr(message, "headers", None)
    return dict(headers) if isinstance(headers, Mapping) else {}


def kept_headers(headers: Mapping[Any, Any]) -> dict[Any, Any]:
    """Headers for a copy written back as it was read: without those kombu acts on.

    The body of the copy is what kombu handed over (already decompressed, or left
    as it was when that failed), so a ``compression`` header would only fail again.
    """
    return {key: value for key, value in headers.items() if key not in KOMBU_HEADERS}


def letter_reason(headers: Mapping[Any, Any]) -> str:
    """Why a letter died: qsched's reason header, RabbitMQ's, or a note that none says."""
    reason = text(headers.get(base.REASON_HEADER)).strip()
    if reason:
        return reason[: base.MAX_REASON_CHARS]
    cause = text(headers.get("x-first-death-reason")).strip()
    if cause:
        return f"the broker dead-lettered it: {cause[:MAX_NAME_CHARS]}"
    return "no reason given: qsched did not dead-letter it"


def name(value: Any) -> str | None:
    """A header naming a queue or key as printable text (cut), None when missing or empty."""
    found = text(value)
    return found[:MAX_NAME_CHARS] if found else None


def epoch_s(value: Any) -> float | None:
    """A header holding seconds since the epoch, None unless a plausible finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except (OverflowError, ValueError):  # an int too big for a float
        return None
    return seconds if math.isfinite(seconds) and 0 <= seconds <= MAX_EPOCH_S else None


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
