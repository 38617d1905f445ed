"""URLs fit for logs, errors and reports: their passwords masked.

The one helper every layer uses (the options, the ledger, the admin CLI, the
benchmarks), so that a URL reads the same everywhere and no copy forgets a case.
"""

from __future__ import annotations

import re

#: the userinfo of a URL: what lies between ``://`` and the last ``@`` of its authority
_USERINFO = re.compile(r"://([^/?#\s]*)@")
#: a query's ``password=`` value, and any ``*password=`` (``sentinel_password=``)
_PASSWORD_PARAM = re.compile(r"(password=)[^&\s]*")


def masked(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``: after the
    user name in ``user:password@`` (``redis://u:***@h``, ``redis://:***@h``), the
    whole of a userinfo without ``:`` (``redis+sentinel://***@h``, which the Sentinel
    URL reads as a password), and the value of every ``*password=`` parameter. The
    rest is kept as written; ``text`` may be one URL or a line that holds some (a
    ``[cells] cell`` line).

    A user name and password in each host of a multi-host URL
    (``amqp://u:p@h1,u:p@h2/``) are masked from the first password to the last
    ``@``: the hosts between are hidden too, never a password shown.
    """
    return _PASSWORD_PARAM.sub(r"\1***", _USERINFO.sub(_mask_userinfo, text))


def _mask_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match.group(1).partition(":")
    return f"://{user}:***@" if colon else "://***@"
