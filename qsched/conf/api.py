"""The [api] section: how the front door serves."""

from __future__ import annotations

import dataclasses
from typing import Self

from oslo_config import cfg

from qsched.conf import glance
from qsched.conf.base import Section

_KEYSTONE = (
    "Keystone tokens, validated by keystonemiddleware's auth_token as the "
    "[keystone_authtoken] section configures it"
)
_NOAUTH2 = (
    "X-Auth-Token: 'admin' or '<user>:<project>', no Keystone: for the embedded demo "
    "and tests, refused on a non-loopback address"
)

api_opts = [
    cfg.HostAddressOpt(
        "host",
        default="127.0.0.1",
        help="Address qsched-api listens on when it serves in process. Behind gunicorn "
        "the WSGI server's own bind setting applies instead.",
    ),
    cfg.PortOpt("port", default=8774, help="Port qsched-api listens on (Nova's 8774)."),
    cfg.StrOpt(
        "public_endpoint",
        help="Base URL put in links and Location headers, e.g. https://compute.example.com "
        "(Nova's osapi_compute_link_prefix). Unset: taken from each request's Host.",
    ),
    cfg.StrOpt(
        "auth_strategy",
        default="noauth2",
        choices=[
            ("keystone", _KEYSTONE),
            ("noauth2", _NOAUTH2),
        ],
        help="How requests are authenticated. Production uses keystone.",
    ),
    cfg.StrOpt(
        "image_service",
        choices=[
            (
                "opaque",
                "no image service: imageRef is an opaque image id, checked for its "
                "form only (the embedded default); refused with any [glance] option set",
            ),
            (
                "glance",
                "each boot looks its image up in Glance, as the [glance] section "
                "says, with the caller's token; needs auth_strategy = keystone",
            ),
        ],
        help="Where a boot's imageRef is looked up. Unset: glance when the [glance] "
        "section sets any option, else opaque. With glance, the image must exist, be "
        "visible to the caller's project and active; its min_ram and min_disk must fit the "
        "flavor; and each trait:<NAME>=required property becomes a required trait of the "
        "request, so only hosts with the trait see it.",
    ),
    cfg.BoolOpt(
        "allow_noauth2_on_public_address",
        default=False,
        help="DANGEROUS. Let an API configured with auth_strategy = noauth2 listen on an "
        "address that is not loopback ([api] host, or the WSGI server's bind) and serve "
        "peers that are not loopback. noauth2 believes whatever a caller writes in "
        "X-Auth-Token: with this set, ANYONE WHO CAN REACH THE PORT IS ADMIN OF THE CLOUD. "
        "Without it such an API refuses to start on such an address, and answers 403 to "
        "every request whose peer (the WSGI server's REMOTE_ADDR) is neither loopback nor "
        "a unix socket's, whatever server runs it. A proxy or load balancer on the same "
        "machine is such a peer for every request it forwards, from wherever: never "
        "publish a noauth2 API through one.",
    ),
    cfg.BoolOpt(
        "metrics",
        default=True,
        help="Count requests, boots and the housekeeping tasks in Prometheus metrics and "
        "serve them on /metrics, like /healthcheck without a token (docs/metrics.rst). "
        "Under gunicorn set PROMETHEUS_MULTIPROC_DIR (deploy/gunicorn.conf.py does) so "
        "that a scrape sums every worker. Off: no /metrics and nothing counted.",
    ),
    cfg.IntOpt(
        "max_request_body_bytes",
        default=64 * 1024,
        min=1024,
        help="Largest request body accepted; a larger one gets 413 before it is parsed.",
    ),
    cfg.IntOpt(
        "max_limit",
        default=1000,
        min=1,
        help="Most items one list call returns, whatever ?limit= asks (Nova's max_limit).",
    ),
    cfg.BoolOpt(
        "enable_instance_password",
        default=True,
        help="Return the admin password of a new server in the create response (Nova's "
        "option): the one the request gave, or one generated. It is never stored; "
        "qsched's fake driver sets no password in a guest.",
    ),
    cfg.MultiStrOpt(
        "flavor",
        default=[],
        help="A flavor to create at startup, one per line: "
        "name:vcpus:ram_mb[:disk_gb[:id]], e.g. 'flavor = m1.small:1:2048:20'. The id "
        "defaults to the name. Startup creates a missing one and rewrites a changed one; "
        "flavors created through the API are left alone.",
    ),
    cfg.MultiStrOpt(
        "flavor_extra_spec",
        default=[],
        help="An extra spec of a configured flavor, one per line: <flavor name>:<key>=<value> "
        "with the key in Nova syntax, e.g. 'flavor_extra_spec = "
        "m1.small:trait:CUSTOM_X=required' or 'flavor_extra_spec = g1.large:resources:VGPU=1'. "
        "Everything before the first ':' is the flavor name, everything after the first '=' "
        "the value.",
    ),
]


@dataclasses.dataclass(frozen=True)
class APIOptions(Section):
    """The ``[api]`` options."""

    GROUPS = (("api", api_opts),)

    host: str
    port: int
    public_endpoint: str | None
    auth_strategy: str
    image_service: str
    allow_noauth2_on_public_address: bool
    metrics: bool
    max_request_body_bytes: int
    max_limit: int
    enable_instance_password: bool
    flavor: tuple[str, ...]
    flavor_extra_spec: tuple[str, ...]

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> Self:
        """The ``[api]`` options, ``image_service`` decided when unset (see its help)."""
        options = super().from_conf(conf)
        if options.image_service is not None:
            return options
        chosen = "glance" if glance.set_options(conf) else "opaque"
        return options.replace(image_service=chosen)
