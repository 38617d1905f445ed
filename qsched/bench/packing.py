"""Flavors, flavor streams and the offline best-fit packing the fill scenario compares with.

Pure functions: no I/O. The reference packer is O(hosts) per request on purpose;
it is a yardstick for packing quality, not a scheduler.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence

from qsched.resources import DISK_GB, MEMORY_MB, VCPU

RESOURCE_CLASSES = (VCPU, MEMORY_MB, DISK_GB)


@dataclasses.dataclass(frozen=True)
class BenchFlavor:
    """A flavor of the benchmark and its weight in a mixed stream."""

    name: str
    vcpus: int
    ram_mb: int
    disk_gb: int
    weight: int = 1
    extra_specs: tuple[tuple[str, str], ...] = ()

    @property
    def demand(self) -> dict[str, int]:
        """What one instance allocates, by resource class."""
        amounts = {VCPU: self.vcpus, MEMORY_MB: self.ram_mb, DISK_GB: self.disk_gb}
        return {rc: n for rc, n in amounts.items() if n}

    @property
    def config_line(self) -> str:
        """The ``[api] flavor`` line that creates it."""
        return f"{self.name}:{self.vcpus}:{self.ram_mb}:{self.disk_gb}"

    @property
    def spec_lines(self) -> list[str]:
        """Its ``[api] flavor_extra_spec`` lines."""
        return [f"{self.name}:{key}={value}" for key, value in self.extra_specs]


def flavor_stream(flavors: Sequence[BenchFlavor], count: int, seed: int) -> list[BenchFlavor]:
    """``count`` flavors drawn by weight, the same for the same seed."""
    rng = random.Random(seed)
    return rng.choices(list(flavors), [f.weight for f in flavors], k=count)


@dataclasses.dataclass
class Packing:
    """Where an offline packing ended: what was placed and what it uses."""

    rule: str
    requests: int
    placed: int
    first_failure: int | None  # stream index of the first request nothing fitted
    used: dict[str, int]
    capacity: dict[str, int]

    def fractions(self) -> dict[str, float]:
        return fractions(self.used, self.capacity)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"fractions": self.fractions()}


def fractions(used: Mapping[str, int], capacity: Mapping[str, int]) -> dict[str, float]:
    """Used share of capacity by resource class, plus ``bottleneck``: the largest share."""
    shares = {rc: round(used.get(rc, 0) / cap, 4) for rc, cap in sorted(capacity.items()) if cap}
    if shares:
        shares["bottleneck"] = max(shares.values())
    return shares


def best_fit(
    hosts: Sequence[Mapping[str, int]],
    stream: Sequence[Mapping[str, int]],
    stop_at_first_failure: bool,
) -> Packing:
    """Best fit in arrival order: each request goes to the host it fits most tightly.

    Tightness is the host's normalized free capacity left after the request (summed
    over resource classes): the fullest host that still fits wins, ties to the
    lowest index. ``hosts`` are capacities by resource class. A request that fits
    nowhere is skipped, or ends the packing with ``stop_at_first_failure``.
    """
    capacity = [dict(h) for h in hosts]
    free = [dict(h) for h in hosts]
    used: dict[str, int] = dict.fromkeys(_classes(hosts), 0)
    placed, first_failure = 0, None
    for index, demand in enumerate(stream):
        host = _tightest(free, capacity, demand)
        if host is None:
            first_failure = index if first_failure is None else first_failure
            if stop_at_first_failure:
                break
            continue
        for rc, n in demand.items():
            free[host][rc] -= n
            used[rc] += n
        placed += 1
    rule = "best fit, arrival order" + (", until the first failure" * stop_at_first_failure)
    total = {rc: sum(h.get(rc, 0) for h in hosts) for rc in used}
    return Packing(rule, len(stream), placed, first_failure, used, total)


def _classes(hosts: Sequence[Mapping[str, int]]) -> list[str]:
    return sorted({rc for h in hosts for rc in h})


def _tightest(
    free: list[dict[str, int]], capacity: list[dict[str, int]], demand: Mapping[str, int]
) -> int | None:
    best, best_slack = None, 0.0
    for host, room in enumerate(free):
        if any(room.get(rc, 0) < n for rc, n in demand.items()):
            continue
        cap = capacity[host]
        slack = sum((room[rc] - demand.get(rc, 0)) / cap[rc] for rc in room if cap[rc])
        if best is None or slack < best_slack:
            best, best_slack = host, slack
    return best
