"""The field types several bodies share (Nova's parameter_types, reduced to what qsched
reads): plain schema dicts, never compiled here."""

from __future__ import annotations

MAX_INT = 2**31 - 1  # Nova's db_const.MAX_INT: the largest size or count it stores
MAX_TEXT = 255

#: one printable character; ``EDGE``: one that is neither a control nor a space
PRINTABLE = r"[^\x00-\x1f\x7f]"
EDGE = r"[^\s\x00-\x1f\x7f]"

name = {
    "type": "string",
    "minLength": 1,
    "maxLength": 255,
    "pattern": f"^{EDGE}(?:{PRINTABLE}*{EDGE})?$",
    "x-message": "must be 1 to 255 printable characters without leading or trailing spaces",
}

uuid_like = {
    "type": "string",
    "pattern": "^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$",
    "x-message": "must be a UUID",
}

#: Nova's multiple create: how many servers (an integer, or its digits as a string)
server_count = {
    "type": ["integer", "string"],
    "pattern": "^[0-9]{1,10}$",
    "format": "int32",
    "minimum": 1,
    "minLength": 1,
    "x-message": "must be a whole number of servers, at least 1",
}
#: Nova's parameter_types.boolean
TRUE = (True, "True", "TRUE", "true", "1", "ON", "On", "on", "YES", "Yes", "yes")
FALSE = (False, "False", "FALSE", "false", "0", "OFF", "Off", "off", "NO", "No", "no")
boolean = {"enum": [*TRUE, *FALSE], "x-message": "must be a boolean (true or false)"}

fqdn = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[a-zA-Z0-9-._]*$"}


def to_bool(value: bool | str) -> bool:
    """A value :data:`boolean` accepted, as a bool."""
    return value in TRUE
