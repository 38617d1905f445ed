"""Policy in code: Nova's rule names and defaults for everything qsched serves.

:func:`list_rules` is the ``oslo.policy.policies`` entry point (``qsched``), so
``oslopolicy-sample-generator --namespace qsched`` writes every rule with its
default, and a ``policy.yaml`` overrides any of them by name.
"""

from __future__ import annotations

from oslo_policy import policy

from qsched.policies import (
    aggregates,
    availability_zone,
    base,
    flavors,
    hypervisors,
    instance_actions,
    keypairs,
    migrations,
    moves,
    quotas,
    server_actions,
    server_groups,
    server_metadata,
    servers,
    services,
    shelve,
)


def list_rules() -> list[policy.RuleDefault]:
    """Every rule qsched enforces, with its default."""
    return [
        *base.list_rules(), *servers.list_rules(), *flavors.list_rules(),
        *aggregates.list_rules(), *services.list_rules(), *server_groups.list_rules(),
        *quotas.list_rules(),
        *availability_zone.list_rules(), *hypervisors.list_rules(),
        *keypairs.list_rules(),
        *server_metadata.list_rules(),
        *server_actions.list_rules(), *instance_actions.list_rules(),
        *moves.list_rules(), *migrations.list_rules(), *shelve.list_rules(),
    ]  # fmt: skip
