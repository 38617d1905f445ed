"""deploy/qsched.conf.sample and policy.yaml.sample list every option and rule as the code
defines them; deploy/qsched.conf sets only options that exist."""

from __future__ import annotations

import configparser
from pathlib import Path

from keystoneauth1 import loading as ks_loading
from keystonemiddleware.auth_token import _opts as auth_token_opts
from oslo_config import generator
from oslo_middleware import opts as middleware_opts
from oslo_policy import generator as policy_generator

from qsched import conf as qconf
from qsched.api import app as api_app
from qsched.api import auth
from qsched.bus import kombu
from qsched.images.glance import GlanceImages
from tests.helpers import ROOT


def test_sample_config_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "qsched.conf.sample"
    generator.main(
        ["--config-file", str(ROOT / "deploy/qsched-config-generator.conf"),
         "--output-file", str(fresh)]
    )  # fmt: skip
    committed = (ROOT / "deploy/qsched.conf.sample").read_text()
    assert fresh.read_text() == committed, "run `make sample-config` and commit the result"


def test_sample_policy_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "policy.yaml.sample"
    policy_generator.generate_sample(
        args=["--config-file", str(ROOT / "deploy/qsched-policy-generator.conf"),
              "--output-file", str(fresh)]
    )  # fmt: skip
    committed = (ROOT / "deploy/policy.yaml.sample").read_text()
    assert fresh.read_text() == committed, "run `make sample-config` and commit the result"


def test_the_shipped_deployment_config_sets_only_options_that_exist() -> None:
    """deploy/qsched.conf: every option it sets is known (oslo.config would ignore a
    misspelt one), and the API would serve it: keystone, Glance, a bus it speaks."""
    path = ROOT / "deploy/qsched.conf"
    conf = qconf.load(config_files=[str(path)], service=True)
    for group, opts in middleware_opts.list_opts_healthcheck():
        conf.register_opts(opts, group=group)
    conf.register_opts(auth_token_opts.list_opts()[0][1], group="keystone_authtoken")
    conf.register_opts(ks_loading.get_auth_common_conf_options(), group="keystone_authtoken")
    conf.register_opts(
        ks_loading.get_auth_plugin_conf_options("password"), group="keystone_authtoken"
    )
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(path)
    unknown = [
        f"[{section}] {name}"
        for section in ["DEFAULT", *parser.sections()]
        for name in (
            parser.defaults()
            if section == "DEFAULT"
            else set(parser[section]) - set(parser.defaults())
        )
        if name not in (conf if section == "DEFAULT" else conf[section])
    ]
    assert not unknown, unknown
    options = qconf.Options.from_conf(conf)
    auth.refuse_bad_options(options.api, ["0.0.0.0:8774"])  # deploy/gunicorn.conf.py's bind
    assert isinstance(api_app.image_service(options.api, conf), GlanceImages)
    assert options.bus.transport_url.partition("://")[0] in kombu.SCHEMES
