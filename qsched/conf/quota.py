"""The [quota] section: default limits per project (Nova's option names and defaults).

A project's own limits, set through ``os-quota-sets``, override these
(:class:`qsched.compute.quotas.QuotaAPI`).
"""

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
    cfg.IntOpt("key_pairs", default=100, min=-1,
               help="Keypairs per user (Nova's default); -1: no limit."),
    cfg.IntOpt("metadata_items", default=128, min=-1,
               help="Metadata items per server (Nova's default); -1: no limit."),
    cfg.IntOpt("injected_files", default=5, min=-1,
               help="Injected files (personality) per server, until microversion 2.57 "
                    "(Nova's default); -1: no limit."),
    cfg.IntOpt("injected_file_content_bytes", default=10240, min=-1,
               help="Bytes in one injected file (Nova's default); -1: no limit."),
    cfg.IntOpt("injected_file_path_bytes", default=255, min=-1,
               help="Bytes in an injected file's path (Nova's default); -1: no limit."),
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
    key_pairs: int
    metadata_items: int
    injected_files: int
    injected_file_content_bytes: int
    injected_file_path_bytes: int
