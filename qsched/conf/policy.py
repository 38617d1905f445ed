"""The ``[oslo_policy]`` section: oslo.policy registers it on the ConfigOpts it is given.

:func:`policy_enforcer` is for entry points: it hands oslo.policy the parsed
configuration (``policy_file`` and the rest), or an empty one for the shipped
defaults, and returns the enforcer that :class:`qsched.policy.Policy` wraps.
"""

from __future__ import annotations

import os

from oslo_config import cfg
from oslo_policy import policy


def policy_enforcer(conf: cfg.ConfigOpts | None = None) -> policy.Enforcer:
    """oslo.policy's enforcer reading ``conf``'s ``[oslo_policy]``; None: the defaults only
    (its policy file is the empty ``os.devnull``, so no ``policy.yaml`` is looked for)."""
    if conf is None:
        conf = cfg.ConfigOpts()
        conf([], project="qsched", default_config_files=[])
        return policy.Enforcer(conf, policy_file=os.devnull)
    return policy.Enforcer(conf)
