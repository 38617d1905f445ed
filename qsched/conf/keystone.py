"""The [keystone_authtoken] section: keystonemiddleware's own options, read where they live.

keystonemiddleware's ``auth_token`` registers its options (and its auth
plugin's) on the ``ConfigOpts`` it is handed and reads them there, so this
section has no frozen value: an entry point hands its parsed ``ConfigOpts`` to
the middleware through :func:`auth_token_conf`, once, and nothing else reads it.
``oslo-config-generator --namespace keystonemiddleware.auth_token`` lists them.
"""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

GROUP = "keystone_authtoken"


def auth_token_conf(conf: cfg.ConfigOpts, **overrides: Any) -> dict[str, Any]:
    """The ``conf`` argument of ``AuthProtocol``: the entry point's ``ConfigOpts`` and
    ``overrides`` of ``[keystone_authtoken]`` options that qsched fixes itself."""
    return {"oslo_config_config": conf, **overrides}
