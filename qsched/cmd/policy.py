"""The ``oslo.policy.enforcer`` entry point: qsched's enforcer for oslo.policy's tools.

``oslopolicy-checker --namespace qsched`` and ``oslopolicy-policy-generator
--namespace qsched`` call :func:`get_enforcer`: the rules in code, overridden by
the ``policy.yaml`` the configuration names (``[oslo_policy] policy_file``,
looked for in ``/etc/qsched`` as for the services).
"""

from __future__ import annotations

from oslo_policy import policy

from qsched import conf as qconf
from qsched.conf.policy import policy_enforcer
from qsched.policy import Policy


def get_enforcer() -> policy.Enforcer:
    """The enforcer the API would use, with every rule registered."""
    return Policy(policy_enforcer(qconf.load())).enforcer
