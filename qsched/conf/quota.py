"""The [quota] section: default limits per project."""

from __future__ import annotations

import dataclasses

from oslo_config import cfg

from qsched.conf.base import Section

quota_opts = [
    cfg.IntOpt("instances", default=10, min=-1, help="Instances per project; -1: no limit."),
    cfg.IntOpt("cores", default=20, min=-1, help="VCPUs per project; -1: no limit."),
    cfg.IntOpt("ram", default=51200, min=-1, help="MiB of RAM per project; -1: no limit."),
    cfg.IntOpt("server_groups", default=10, min=-1,
               help="Server groups per project (Nova's default); -1: no limit."),
    cfg.IntOpt("server_group_members", default=10, min=-1,
               help="Servers per server group (Nova's default); -1: no limit."),
    cfg.IntOpt("metadata_items", default=128, min=-1,
               help="Metadata items per server (Nova's default); -1: no limit."),
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class QuotaOptions(Section):
    """The ``[quota]`` options: default limits per project (-1: no limit)."""

    GROUPS = (("quota", quota_opts),)

    instances: int
    cores: int
    ram: int
    server_groups: int
    server_group_members: int
    metadata_items: int
