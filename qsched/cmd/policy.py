"""The ``oslo.policy.enforcer`` entry point: qsched's enforcer for oslo.policy's tools.

``oslopolicy-policy-generator --namespace qsched --config-file
/etc/qsched/qsched.conf`` and ``oslopolicy-list-redundant`` call
:func:`get_enforcer` with their own command line in ``sys.argv``, as Nova's
tools do: the rules in code, overridden by the ``policy.yaml`` that the
configuration names (``[oslo_policy] policy_file``, found beside the
configuration files or in ``/etc/qsched`` as for the services). The tool's
``--config-file`` and ``--config-dir`` arguments are read here; its other
arguments are its own. Without any, the configuration is looked for where
oslo.config looks for ``qsched.conf`` (``/etc/qsched/qsched.conf``, ...).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from oslo_config import cfg
from oslo_policy import policy

from qsched import conf as qconf
from qsched.conf.policy import policy_enforcer
from qsched.policy import Policy


def config_args(argv: Sequence[str]) -> list[str]:
    """The ``--config-file`` and ``--config-dir`` arguments of a command line, in order."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--config-file", action="append", dest="config", default=[],
                        type=lambda v: ("--config-file", v))  # fmt: skip
    parser.add_argument("--config-dir", action="append", dest="config",
                        type=lambda v: ("--config-dir", v))  # fmt: skip
    known, _theirs = parser.parse_known_args(list(argv))
    return [arg for pair in known.config for arg in pair]


def get_enforcer(argv: Sequence[str] | None = None) -> policy.Enforcer:
    """The enforcer the API would use, with every rule registered, configured by the
    configuration files that ``argv`` (default: the tool's ``sys.argv``) names."""
    args = config_args(sys.argv[1:] if argv is None else argv)
    conf = qconf.load(args, config_files=cfg.find_config_files(project="qsched"))
    return Policy(policy_enforcer(conf)).enforcer
