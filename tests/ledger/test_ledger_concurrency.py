"""Race many actors against the ledger and check its invariants from the outside.

Each worker plays one compute agent plus a share of the API and the reaper: it
boots instances through quota, claims them on random providers through
:func:`qsched.ledger.retry.claim`, redelivers, spawns, fails, requeues, errors,
deletes and changes inventories, and tallies what succeeded. After the race the
tallies are checked against the cell, independently of :func:`audit` (which
must agree), then everything is deleted and the cell must be back to empty.

Hypothesis draws the cloud (providers, flavors, quotas) and the mix of
operations; the seed drives each worker's choices.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import random
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from qsched import conf as qconf
from qsched import exception
from qsched.conf import LedgerOptions
from qsched.ledger import Stores, open_stores
from qsched.ledger.audit import audit
from qsched.ledger.base import Instance, Inventory, State, Usage
from qsched.ledger.retry import claim
from tests.conftest import TEST_DURABILITY

VCPU, RAM = "VCPU", "MEMORY_MB"
OPS = ("create", "claim", "redeliver", "spawned", "spawn_failed", "no_room", "error",
       "delete", "inventory")  # fmt: skip
LIVE = (State.BUILD, State.ACTIVE)
THREADS, THREAD_OPS = 8, 60
PROCESSES, PROCESS_OPS = 4, 150


class Barrier(Protocol):
    def wait(self, timeout: float | None = None) -> Any: ...


# The world: what every worker knows before the race. Plain data, so it pickles.


@dataclasses.dataclass(frozen=True)
class ProviderSpec:
    uuid: str
    name: str
    vcpus: int
    cpu_ratio: float
    ram_mb: int

    def inventories(self, vcpus: int | None = None) -> dict[str, Inventory]:
        cpu = Inventory(vcpus or self.vcpus, allocation_ratio=self.cpu_ratio)
        return {VCPU: cpu, RAM: Inventory(self.ram_mb)}


@dataclasses.dataclass(frozen=True)
class World:
    url: str
    cell: str
    providers: tuple[ProviderSpec, ...]
    flavors: tuple[tuple[int, int], ...]  # (vcpus, ram_mb)
    limits: tuple[tuple[str, Usage], ...]  # (project, quota limits)
    weights: tuple[int, ...]  # one per OPS
    ops: int

    def provider_named(self, name: str | None) -> ProviderSpec:
        return next(p for p in self.providers if p.name == name)


@dataclasses.dataclass(frozen=True)
class Scenario:
    providers: tuple[tuple[int, float, int], ...]  # (vcpus, cpu ratio, ram_mb)
    flavors: tuple[tuple[int, int], ...]
    limits: tuple[tuple[int, int, int], ...]  # (instances, cores, ram_mb); -1: no limit
    weights: tuple[int, ...]
    seed: int


scenarios = st.builds(
    Scenario,
    providers=st.lists(
        st.tuples(st.integers(1, 6), st.sampled_from([1.0, 1.5, 2.0]), st.integers(2, 8)),
        min_size=1, max_size=5,
    ).map(lambda ps: tuple((v, r, ram * 512) for v, r, ram in ps)),
    flavors=st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from([256, 512, 1024])), min_size=1, max_size=3
    ).map(tuple),
    limits=st.lists(
        st.tuples(st.integers(1, 10), st.integers(1, 24), st.sampled_from([-1, 2048, 8192])),
        min_size=1, max_size=3,
    ).map(tuple),
    weights=st.tuples(
        st.integers(2, 6), st.integers(3, 8), *[st.integers(0, 3) for _ in OPS[2:]]
    ),
    seed=st.integers(0, 2**32 - 1),
)  # fmt: skip

RACE_SETTINGS = settings(
    max_examples=6,
    deadline=None,
    database=None,
    # a race does not replay the same way twice, so shrinking would only chase ghosts
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def open_world(world: World) -> Stores:
    conf = qconf.load()
    conf.set_override("durability", TEST_DURABILITY, group="ledger")
    conf.set_override("cell", world.cell, "ledger")
    return open_stores(LedgerOptions.from_conf(conf), url=world.url)


def build_world(url: str, scenario: Scenario, ops: int) -> tuple[World, Tally]:
    """Create the providers and quotas of ``scenario`` in a fresh cell."""
    providers = tuple(
        ProviderSpec(str(uuid.uuid4()), f"node-{i}", vcpus, ratio, ram_mb)
        for i, (vcpus, ratio, ram_mb) in enumerate(scenario.providers)
    )
    limits = tuple((f"project-{i}", Usage(*lim)) for i, lim in enumerate(scenario.limits))
    cell = f"race-{uuid.uuid4().hex[:12]}"
    world = World(url, cell, providers, scenario.flavors, limits, scenario.weights, ops)
    stores, tally = open_world(world), Tally()
    for p in providers:
        stores.ledger.create_provider(p.uuid, p.name)
        stores.ledger.set_inventory(p.uuid, 0, p.inventories())
        tally.inventory_sets[p.uuid] += 1
    for project, lim in limits:
        stores.quota.set_limits(project, lim.instances, lim.cores, lim.ram_mb)
    return world, tally


# What the workers saw succeed.


@dataclasses.dataclass
class Tally:
    inventory_sets: Counter[str] = dataclasses.field(default_factory=Counter)  # per provider
    claims: Counter[str] = dataclasses.field(default_factory=Counter)  # fresh, per provider
    claims_of: Counter[str] = dataclasses.field(default_factory=Counter)  # per instance
    releases_of: Counter[str] = dataclasses.field(default_factory=Counter)  # by its claimer
    actives_of: Counter[str] = dataclasses.field(default_factory=Counter)
    created: dict[str, str] = dataclasses.field(default_factory=dict)  # instance -> project
    problems: list[str] = dataclasses.field(default_factory=list)

    def merge(self, other: Tally) -> Tally:
        self.inventory_sets += other.inventory_sets
        self.claims += other.claims
        self.claims_of += other.claims_of
        self.releases_of += other.releases_of
        self.actives_of += other.actives_of
        self.created.update(other.created)
        self.problems.extend(other.problems)
        return self


@dataclasses.dataclass(frozen=True)
class Held:
    """A claim this agent made and has not given up yet."""

    provider: ProviderSpec
    allocations: dict[str, dict[str, int]]
    generation: int


class Agent:
    """One worker: a compute agent named ``name``, plus API and reaper work."""

    def __init__(self, world: World, name: str, seed: int) -> None:
        self.world, self.name = world, name
        self.stores = open_world(world)
        self.rng = random.Random(seed)
        self.owned: dict[str, Held] = {}
        self.tally = Tally()

    def run(self, start: Barrier) -> Tally:
        start.wait(timeout=30)
        for op in self.rng.choices(OPS, self.world.weights, k=self.world.ops):
            getattr(self, f"do_{op}")()
        return self.tally

    def problem(self, what: str) -> None:
        self.tally.problems.append(f"{self.name}: {what}")

    # the API and the reaper

    def do_create(self) -> None:
        project, limits = self.rng.choice(self.world.limits)
        vcpus, ram_mb = self.rng.choice(self.world.flavors)
        flavor = {"name": f"f{vcpus}-{ram_mb}", "vcpus": vcpus, "ram_mb": ram_mb}
        inst = Instance(str(uuid.uuid4()), project, "user", "vm", flavor, State.BUILD)
        try:
            self.stores.instances.create(inst, time.time() + 600)
        except exception.QuotaExceeded:
            return
        self.tally.created[inst.uuid] = project
        used = self.stores.quota.get_usage(project)
        if over_limits(used, limits):
            self.problem(f"quota of {project} exceeded: {used} over {limits}")

    def do_error(self) -> None:
        inst = self.pick_instance()
        if inst is not None:
            self.stores.instances.set_error(inst.uuid, "No valid host was found.", {"by": "race"})

    def do_delete(self) -> None:
        inst = self.pick_instance()
        if inst is not None:
            self.stores.instances.delete(inst.uuid)

    def do_inventory(self) -> None:
        spec = self.rng.choice(self.world.providers)
        vcpus = max(1, spec.vcpus + self.rng.randint(-2, 2))
        generation = self.stores.ledger.get_provider(spec.uuid).generation
        try:
            self.stores.ledger.set_inventory(spec.uuid, generation, spec.inventories(vcpus))
        except (exception.ProviderGenerationConflict, exception.InventoryInUse):
            return
        self.tally.inventory_sets[spec.uuid] += 1

    # the agent

    def do_claim(self) -> None:
        inst = self.pick_instance(waiting=self.rng.random() < 0.75)
        if inst is None or inst.uuid in self.owned:
            return
        # a third of the claims go for the first provider, so that some always collide
        hot = self.rng.random() < 0.3
        spec = self.world.providers[0] if hot else self.rng.choice(self.world.providers)
        allocations = {spec.uuid: {VCPU: inst.flavor["vcpus"], RAM: inst.flavor["ram_mb"]}}
        gens = None
        if self.rng.random() < 0.5:  # an agent's view, possibly stale by the time it claims
            gens = {spec.uuid: self.stores.ledger.get_provider(spec.uuid).generation}
        try:
            result = claim(self.stores.ledger, inst.uuid, allocations, self.name, spec.name, gens)
        except (exception.Conflict, exception.InvalidAmount):
            return  # full, taken, ended, still conflicting, or larger than max_unit
        self.owned[inst.uuid] = Held(spec, allocations, result.generation)
        self.tally.claims[spec.uuid] += 1
        self.tally.claims_of[inst.uuid] += 1
        self.check_capacity(spec)

    def do_redeliver(self) -> None:
        """The same request again: the claim must be idempotent, not a second placement."""
        uuid_, held = self.pick_owned()
        if held is None:
            return
        try:
            result = claim(self.stores.ledger, uuid_, held.allocations, self.name,
                           held.provider.name)  # fmt: skip
        except exception.InstanceNotWaiting as exc:
            self.expect_ended(uuid_, exc, "redelivery")
            return
        if result.generation != held.generation or not result.already:
            self.problem(f"redelivered claim of {uuid_} moved generation {held.generation} "
                         f"-> {result.generation} (already={result.already})")  # fmt: skip

    def do_spawned(self) -> None:
        uuid_, held = self.pick_owned(pop=True)
        if held is None:
            return
        try:
            self.stores.instances.set_active(uuid_, self.name, held.provider.name)
        except exception.InstanceNotWaiting as exc:
            self.expect_ended(uuid_, exc, "set_active")
            return
        self.tally.actives_of[uuid_] += 1

    def do_spawn_failed(self) -> None:
        uuid_, held = self.pick_owned(pop=True)
        if held is None:
            return
        if self.stores.ledger.release(uuid_, self.name):
            self.tally.releases_of[uuid_] += 1
        elif self.stores.instances.get(uuid_).state == State.BUILD:
            self.problem(f"release of {uuid_} by its claimer found nothing, still BUILD")
        try:
            self.stores.instances.requeue(uuid_, self.name, "spawn failed")
        except exception.InstanceNotWaiting as exc:
            if exc.kwargs.get("host") in (None, False, "", self.name):
                self.expect_ended(uuid_, exc, "requeue after release")
            # else another agent claimed it between the release and the requeue: fine

    def do_no_room(self) -> None:
        uuid_, held = self.pick_owned(pop=True)
        if held is None:
            return
        try:
            self.stores.instances.requeue(uuid_, self.name, "no room")
        except exception.InstanceNotWaiting as exc:
            self.expect_ended(uuid_, exc, "requeue")
            return
        self.tally.releases_of[uuid_] += 1

    # helpers

    def pick_instance(self, waiting: bool = False) -> Instance | None:
        project, _ = self.rng.choice(self.world.limits)
        found = self.stores.instances.list_project(project)
        if waiting:
            found = [i for i in found if i.state == State.BUILD and not i.host]
        return self.rng.choice(found) if found else None

    def pick_owned(self, pop: bool = False) -> tuple[str, Held | None]:
        if not self.owned:
            return "", None
        uuid_ = self.rng.choice(sorted(self.owned))
        return uuid_, self.owned.pop(uuid_) if pop else self.owned[uuid_]

    def expect_ended(self, uuid_: str, exc: exception.InstanceNotWaiting, what: str) -> None:
        """Only the API or the reaper may take a claimed instance away from its claimer."""
        self.owned.pop(uuid_, None)
        if exc.kwargs.get("state") not in (State.DELETED, State.ERROR):
            self.problem(f"{what} of {uuid_} refused although nobody ended it: {exc}")

    def check_capacity(self, spec: ProviderSpec) -> None:
        provider = self.stores.ledger.get_provider(spec.uuid)
        for rc, inv in provider.inventories.items():
            if provider.usages.get(rc, 0) > inv.capacity:
                self.problem(f"{spec.name} over capacity: {rc} {provider.usages} of {inv}")


def over_limits(used: Usage, limits: Usage) -> bool:
    pairs = zip(dataclasses.astuple(used), dataclasses.astuple(limits), strict=True)
    return any(limit >= 0 and n > limit for n, limit in pairs)


def run_agent(world: World, name: str, seed: int, start: Barrier) -> Tally:
    """Run one agent; a crash becomes a problem in its tally, never a silent thread death."""
    try:
        return Agent(world, name, seed).run(start)
    except Exception:
        return Tally(problems=[f"{name} crashed:\n{traceback.format_exc()}"])


def agent_process(world: World, name: str, seed: int, start: Barrier, results: Any) -> None:
    """Entry point of one worker process: its tally goes back through ``results``."""
    results.put(run_agent(world, name, seed, start))


def race_threads(world: World, seed: int, count: int) -> Tally:
    start = threading.Barrier(count)
    tallies = [Tally() for _ in range(count)]

    def work(i: int) -> None:
        tallies[i] = run_agent(world, f"agent-{i}", seed + i, start)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return merge(tallies)


def race_processes(world: World, seed: int, count: int) -> Tally:
    # fork where there is one: the workers start in milliseconds instead of re-importing
    # everything; each opens its own connections, none is inherited
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    start, results = ctx.Barrier(count), ctx.Queue()
    procs = [
        ctx.Process(target=agent_process, args=(world, f"agent-{i}", seed + i, start, results))
        for i in range(count)
    ]
    for p in procs:
        p.start()
    tallies = [collect(results, procs) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    return merge(tallies)


def collect(results: Any, procs: list[Any], timeout_s: float = 40.0) -> Tally:
    """The next tally; fail fast when every worker has exited without sending one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tally: Tally = results.get(timeout=0.5)
            return tally
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
    codes = [p.exitcode for p in procs]
    pytest.fail(f"a worker process died without reporting (exit codes {codes})")


def merge(tallies: Iterable[Tally]) -> Tally:
    total = Tally()
    for t in tallies:
        total.merge(t)
    return total


# Checks after the race, from the cell's own records and the workers' tallies.


def placed_on(world: World, inst: Instance) -> ProviderSpec | None:
    """Where an instance must hold its allocations, from its record alone."""
    if inst.state == State.ACTIVE or (inst.state == State.BUILD and inst.host):
        return world.provider_named(inst.node)
    return None


def expected_allocations(world: World, inst: Instance) -> dict[str, dict[str, int]]:
    spec = placed_on(world, inst)
    if spec is None:
        return {}
    return {spec.uuid: {VCPU: inst.flavor["vcpus"], RAM: inst.flavor["ram_mb"]}}


def check_instances(stores: Stores, world: World, records: dict[str, Instance]) -> list[str]:
    problems = []
    for uuid_, inst in records.items():
        held = stores.ledger.get_allocations(uuid_).allocations
        if held != expected_allocations(world, inst):
            problems.append(f"{uuid_} {inst.state} host={inst.host} node={inst.node} "
                            f"holds {held}")  # fmt: skip
        if (inst.quota is not None) != (inst.state in LIVE):
            problems.append(f"{uuid_} {inst.state} holds quota {inst.quota}")
    return problems


def check_providers(
    stores: Stores, world: World, records: dict[str, Instance], tally: Tally
) -> list[str]:
    problems = []
    for spec in world.providers:
        provider = stores.ledger.get_provider(spec.uuid)
        consumers = stores.ledger.provider_consumers(spec.uuid)
        expected = {u for u, inst in records.items() if placed_on(world, inst) == spec}
        if consumers != expected:
            problems.append(f"{spec.name} consumers {sorted(consumers)} != {sorted(expected)}")
        summed: Counter[str] = Counter()
        for consumer in consumers:
            summed.update(stores.ledger.get_allocations(consumer).allocations.get(spec.uuid, {}))
        for rc, inv in provider.inventories.items():
            used = provider.usages.get(rc, 0)
            if used != summed[rc] or used > inv.capacity:
                problems.append(f"{spec.name} {rc}: usage {used}, allocated {summed[rc]}, "
                                f"capacity {inv.capacity}")  # fmt: skip
        # every claim bumps once, every release of it bumps once more: the ones still
        # held have not been released yet
        changes = tally.inventory_sets[spec.uuid] + 2 * tally.claims[spec.uuid] - len(consumers)
        if provider.generation != changes:
            problems.append(f"{spec.name} generation {provider.generation}, {changes} changes")
    return problems


def check_projects(stores: Stores, world: World, records: dict[str, Instance]) -> list[str]:
    problems = []
    for project, limits in world.limits:
        mine = [i for i in records.values() if i.project_id == project]
        live = [i for i in mine if i.state in LIVE]
        expected = Usage(len(live), sum(i.flavor["vcpus"] for i in live),
                         sum(i.flavor["ram_mb"] for i in live))  # fmt: skip
        used = stores.quota.get_usage(project)
        if used != expected or over_limits(used, limits):
            problems.append(f"{project} quota used {used}, live {expected}, limits {limits}")
        allocated: Counter[str] = Counter()
        for inst in mine:
            for amounts in expected_allocations(world, inst).values():
                allocated.update(amounts)
        if stores.ledger.project_usages(project) != +allocated:
            problems.append(f"{project} usages {stores.ledger.project_usages(project)} "
                            f"!= allocated {dict(allocated)}")  # fmt: skip
    return problems


def check_tally(tally: Tally) -> list[str]:
    """No instance claimed again unless its claimer let it go first; ACTIVE once."""
    problems = list(tally.problems)
    for uuid_, n in tally.claims_of.items():
        if n > 1 + tally.releases_of[uuid_]:
            problems.append(f"{uuid_} claimed {n} times, released {tally.releases_of[uuid_]}")
    problems += [f"{u} went ACTIVE {n} times" for u, n in tally.actives_of.items() if n > 1]
    return problems


def check_reclaims(stores: Stores, world: World, records: dict[str, Instance]) -> list[str]:
    """A placed instance refuses every other host, and its own host's claim is a no-op."""
    problems = []
    for uuid_, inst in records.items():
        spec = placed_on(world, inst)
        if spec is None:
            continue
        allocations = expected_allocations(world, inst)
        try:
            claim(stores.ledger, uuid_, allocations, "intruder", spec.name)
            problems.append(f"{uuid_} claimed again by another host")
        except exception.InstanceNotWaiting:
            pass
        if inst.state == State.BUILD:
            generation = stores.ledger.get_allocations(uuid_).generation
            again = claim(stores.ledger, uuid_, allocations, inst.host or "", spec.name)
            if again.generation != generation:
                problems.append(f"{uuid_} redelivery moved generation to {again.generation}")
    return problems


def check_cell(stores: Stores, world: World, tally: Tally) -> list[str]:
    records = {u: stores.instances.get(u) for u in tally.created}
    report = audit(stores)
    problems = [] if report.ok else [f"audit: {report.to_dict()}"]
    problems += check_tally(tally)
    problems += check_instances(stores, world, records)
    problems += check_providers(stores, world, records, tally)
    problems += check_projects(stores, world, records)
    problems += check_reclaims(stores, world, records)
    return problems


def check_drained(stores: Stores, world: World, tally: Tally) -> list[str]:
    """Delete everything: all quota, usage and allocations must come back."""
    for uuid_ in tally.created:
        stores.instances.delete(uuid_)
    records = {u: stores.instances.get(u) for u in tally.created}
    problems = [f"{u} is {i.state} after delete" for u, i in records.items()
                if i.state != State.DELETED]  # fmt: skip
    problems += check_providers(stores, world, records, tally)
    problems += check_projects(stores, world, records)
    for project, _ in world.limits:
        if stores.quota.get_usage(project) != Usage(0, 0, 0):
            problems.append(f"{project} still uses {stores.quota.get_usage(project)}")
    if not audit(stores).ok:
        problems.append(f"audit after delete: {audit(stores).to_dict()}")
    return problems


def assert_race_kept_invariants(
    url: str, scenario: Scenario, race: Callable[[World, int], Tally], ops: int
) -> None:
    world, tally = build_world(url, scenario, ops)
    tally.merge(race(world, scenario.seed))
    stores = open_world(world)
    problems = check_cell(stores, world, tally)
    assert not problems, "after the race:\n" + "\n".join(problems[:30])
    problems = check_drained(stores, world, tally)
    assert not problems, "after deleting everything:\n" + "\n".join(problems[:30])


@pytest.mark.slow
@pytest.mark.timeout(60)
@RACE_SETTINGS
@given(scenario=scenarios)
def test_threads_keep_the_invariants(ledger_url: str, scenario: Scenario) -> None:
    def race(world: World, seed: int) -> Tally:
        return race_threads(world, seed, THREADS)

    assert_race_kept_invariants(ledger_url, scenario, race, THREAD_OPS)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.timeout(60)
@settings(RACE_SETTINGS, max_examples=6)
@given(scenario=scenarios)
def test_processes_keep_the_invariants(real_redis_url: str, scenario: Scenario) -> None:
    def race(world: World, seed: int) -> Tally:
        return race_processes(world, seed, PROCESSES)

    assert_race_kept_invariants(real_redis_url, scenario, race, PROCESS_OPS)


# The last free slots of one provider, claimed by many at once.

CONTENDERS, SLOTS = 16, 8


def fill_all_but(stores: Stores, rp: str, free: int) -> None:
    for _ in range(SLOTS - free):
        uuid_ = boot(stores)
        claim(stores.ledger, uuid_, {rp: {VCPU: 1, RAM: 64}}, "filler", "node-0")


def boot(stores: Stores) -> str:
    inst = Instance(str(uuid.uuid4()), "crowd", "user", "vm",
                    {"name": "tiny", "vcpus": 1, "ram_mb": 64}, State.BUILD)  # fmt: skip
    return stores.instances.create(inst, time.time() + 600).uuid


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("free", [1, 3])
@pytest.mark.parametrize("with_generations", [False, True], ids=["plain", "generations"])
def test_crowd_claims_the_last_free_slots(
    stores: Stores, free: int, with_generations: bool
) -> None:
    stores.quota.set_limits("crowd", -1, -1, -1)
    rp = str(uuid.uuid4())
    stores.ledger.create_provider(rp, "node-0")
    stores.ledger.set_inventory(rp, 0, {VCPU: Inventory(SLOTS), RAM: Inventory(1 << 20)})
    fill_all_but(stores, rp, free)
    before = stores.ledger.get_provider(rp).generation
    gens = {rp: before} if with_generations else None
    contenders = [boot(stores) for _ in range(CONTENDERS)]
    start, outcomes = threading.Barrier(CONTENDERS), Counter[str]()
    lock = threading.Lock()

    def contend(i: int) -> None:
        start.wait(timeout=30)
        try:
            claim(stores.ledger, contenders[i], {rp: {VCPU: 1, RAM: 64}}, f"h{i}", "node-0",
                  gens)  # fmt: skip
            outcome = "claimed"
        except exception.QschedError as exc:
            outcome = type(exc).__name__
        with lock:
            outcomes[outcome] += 1

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(CONTENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes == {"claimed": free, "CapacityExceeded": CONTENDERS - free}
    provider = stores.ledger.get_provider(rp)
    assert (provider.usages[VCPU], provider.generation) == (SLOTS, before + free)
    assert audit(stores).ok
