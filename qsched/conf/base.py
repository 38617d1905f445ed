"""What every options section shares: a frozen value read once at an entry point.

A service's entry point parses one ``cfg.ConfigOpts`` (:func:`qsched.conf.load`),
turns each section it needs into a :class:`Section` value and hands those down;
nothing below an entry point holds or reads the ``ConfigOpts``. A section's
fields are named as its options, so ``[agent] spawn_workers`` is
``AgentOptions.spawn_workers``; ``tests/test_conf.py`` keeps both lists equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Self

from oslo_config import cfg


@dataclasses.dataclass(frozen=True)
class Section:
    """The options of one section as a frozen value.

    Subclasses are frozen dataclasses that set ``GROUPS``: the groups they read,
    each with its options (group None is ``[DEFAULT]``). List options become tuples.
    """

    GROUPS: ClassVar[Sequence[tuple[str | None, Sequence[cfg.Opt]]]] = ()

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> Self:
        """Read the section from a parsed ``conf`` on which its options are registered."""
        values = {}
        for group, opts in cls.GROUPS:
            found = conf if group is None else conf[group]
            values.update({opt.dest: _frozen(found[opt.dest]) for opt in opts})
        return cls(**values)

    @classmethod
    def defaults(cls) -> Self:
        """The section as shipped: every option at its default."""
        conf = cfg.ConfigOpts()
        for group, opts in cls.GROUPS:
            conf.register_opts(list(opts), group=group)
        conf([], project="qsched", default_config_files=[])
        return cls.from_conf(conf)

    def replace(self, **changes: Any) -> Self:
        """A copy with some options changed (tests, the embedded stack)."""
        return dataclasses.replace(self, **changes)


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
