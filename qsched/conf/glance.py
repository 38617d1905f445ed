"""The [glance] section: how the API reaches Glance, in keystoneauth's own options.

The section holds keystoneauth's session options (TLS, ``timeout``) and its
adapter options (``service_type``, ``valid_interfaces``, ``region_name``,
``endpoint_override``, the retries), as every OpenStack service's client
sections do; keystoneauth reads them, so the section has no frozen value:
:func:`image_adapter` turns them into the adapter an entry point hands to
:class:`qsched.images.glance.GlanceImages`. There are no credentials here: every image
lookup carries the token of the caller whose boot it is, so Glance itself
decides what the caller may see.

Glance's v2 API is the only one qsched speaks, so keystoneauth's version
options are not offered.

Configuring the section is what turns image lookups on when ``[api]
image_service`` is left unset (:func:`set_options` names what the operator set).
"""

from __future__ import annotations

from typing import Any

from keystoneauth1 import adapter
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

GROUP = "glance"
_VERSION_OPTS = ("version", "min_version", "max_version")
_DEFAULTS: dict[str, Any] = {
    "service_type": "image",
    "valid_interfaces": ["internal", "public"],
    # keystoneauth waits for ever by default; a boot must not.
    "timeout": 10,
    "connect_retries": 1,
    "status_code_retries": 1,
}


def glance_opts() -> list[cfg.Opt]:
    """keystoneauth's session and adapter options, with qsched's defaults."""
    opts = ks_loading.get_session_conf_options() + [
        opt
        for opt in ks_loading.get_adapter_conf_options(include_deprecated=False)
        if opt.dest not in _VERSION_OPTS
    ]
    cfg.set_defaults(opts, **_DEFAULTS)
    for opt in opts:
        if opt.dest == "endpoint_override":
            opt.help = (
                "Glance's root URL (e.g. https://image.example.com:9292), used instead of the "
                "image endpoint of the service catalog that comes with each caller's token."
            )
    return opts


def set_options(conf: cfg.ConfigOpts) -> tuple[str, ...]:
    """The ``[glance]`` options the operator set (in a config file, on the command line
    or in the environment), by name; () when ``conf`` has no such section."""
    if GROUP not in conf:
        return ()
    found = []
    for opt in glance_opts():
        where = conf.get_location(opt.dest, GROUP)
        if where is not None and where.location.is_user_controlled:
            found.append(opt.dest)
    return tuple(sorted(found))


def image_adapter(conf: cfg.ConfigOpts) -> adapter.Adapter:
    """A keystoneauth adapter to Glance from ``conf``'s ``[glance]``, with no auth of
    its own: each request passes the caller's (:mod:`qsched.images.glance`)."""
    section = conf[GROUP]
    return adapter.Adapter(
        ks_loading.load_session_from_conf_options(conf, GROUP),
        service_type=section.service_type,
        service_name=section.service_name,
        interface=section.valid_interfaces,
        region_name=section.region_name,
        endpoint_override=section.endpoint_override,
        connect_retries=section.connect_retries,
        connect_retry_delay=section.connect_retry_delay,
        status_code_retries=section.status_code_retries,
        status_code_retry_delay=section.status_code_retry_delay,
        retriable_status_codes=section.retriable_status_codes,
    )
