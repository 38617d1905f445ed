"""Prometheus metrics: a burst through the API with real agents, scraped from both;
labels bounded; no token needed; gunicorn's multiprocess sums; the housekeeping counts."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.metrics import AgentMetrics
from agents.service import ComputeAgent
from agents.virt.fake import FakeDriver, FakeNodeSpec
from qsched import exception
from qsched.api import app as api_app
from qsched.api import routes
from qsched.api.wsgi import make_server
from qsched.bus.base import BusUnavailable
from qsched.bus.kombu import KombuBus
from qsched.cells import housekeeping
from qsched.compute.api import ComputeAPI
from qsched.compute.boot import FlavorRefNotFound
from qsched.conf import AgentOptions, APIOptions, LedgerOptions, SchedulerOptions
from qsched.context import RequestContext
from qsched.flavors import Flavor
from qsched.ledger import Stores, open_stores
from qsched.ledger.base import State
from qsched.metrics import APIMetrics, NoMetrics, refusal_reason
from qsched.net import free_port
from qsched.scheduling.message import BootRequest
from qsched.scheduling.records import record_for, request_for
from qsched.scheduling.request import RefusalKind
from qsched.stack.processes import http_call
from tests.cloud import Cloud, transport_url
from tests.conftest import TEST_DURABILITY, real_redis
from tests.helpers import RecordingDelivery, wait_until
from tests.raw import redis_store

IMAGE = "6b9f3c1e-58f4-4f0e-9d4b-0c7f3a1d2e55"
FLAVORS = ("small:1:512:0", "huge:64:1024:0")
BURST = 30
UUID_LIKE = 36  # a label value this long with four dashes would be an instance's


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[Samples, list[Any]]:
    """GET ``url`` without a token: every sample by (name, labels), and the families."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        return parse(answer.read())


def parse(text: bytes) -> tuple[Samples, list[Any]]:
    families = list(text_string_to_metric_families(text.decode()))
    found = {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}
    return found, families


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    """A metric summed over its label sets."""
    return sum(v for (n, _labels), v in samples.items() if n == name)


def labels_of(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for (n, labels), _v in samples.items() if n == name}


@dataclasses.dataclass
class Cell:
    stores: Stores
    api_port: int
    agents: list[ComputeAgent]
    metrics: list[int]  # each agent's metrics port
    routes: frozenset[str]  # the API's route templates

    def boot(self, flavor: str = "small", token: str = "u1:p1") -> tuple[int, dict[str, Any]]:
        server = {"name": "vm", "flavorRef": flavor, "imageRef": IMAGE}
        return http_call(self.api_port, "POST", "/v2.1/servers", {"server": server}, token)

    def state(self, uuid_: str) -> State:
        return self.stores.instances.get(uuid_).state


@pytest.fixture
def cell() -> Iterator[Cell]:
    """The API in process (noauth2, metrics on) and three agents, each serving its metrics."""
    stores = open_stores(
        LedgerOptions.defaults().replace(durability=TEST_DURABILITY),
        url=f"fakeredis://m-{uuid.uuid4().hex}",
    )
    bus = KombuBus("memory://", prefix=f"m{uuid.uuid4().hex[:10]}")
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    stores.quota.set_limits("p2", instances=2, cores=-1, ram_mb=-1)
    app = api_app.create_app(stores, bus, APIOptions.defaults().replace(flavor=FLAVORS))
    server = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    agents = []
    for i in range(3):
        options = AgentOptions.defaults().replace(
            host=f"m{i}", metrics_host="127.0.0.1", metrics_port=free_port(), reap_interval_s=0,
            class_poll_interval_s=0.2, heartbeat_interval_s=0.5, spawn_workers=4,
        )  # fmt: skip
        driver = FakeDriver(2, FakeNodeSpec(vcpus=8, ram_mb=16384, disk_gb=0), host=f"m{i}")
        agents.append(ComputeAgent(options, stores, bus, driver))
        agents[-1].start(ready_timeout_s=30)
    templates = frozenset(t for t, _r in routes.table(ComputeAPI(stores, bus), None, 1024))
    ports = [a.opts.metrics_port for a in agents]
    yield Cell(stores, server.server_port, agents, ports, templates | {"/metrics"})
    server.shutdown()
    server.server_close()
    for agent in agents:
        agent.stop(timeout_s=5)
    bus.close()


def test_a_burst_is_counted_by_the_api_and_summed_over_the_agents(cell: Cell) -> None:
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _i: cell.boot(), range(BURST)))
    over_quota = [cell.boot(token="u2:p2") for _ in range(4)]  # quota of 2 instances
    unknown = cell.boot(flavor="nope")
    accepted = [body["server"]["id"] for status, body in answers + over_quota if status == 202]
    assert [status for status, _ in answers] == [202] * BURST
    assert sorted(status for status, _ in over_quota) == [202, 202, 403, 403]
    assert unknown[0] == 400
    assert wait_until(lambda: all(cell.state(u) == State.ACTIVE for u in accepted), 60, 0.05)
    for uuid_ in accepted[:3]:  # a route with an id in it
        assert http_call(cell.api_port, "GET", f"/v2.1/servers/{uuid_}", token="u1:p1")[0] == 200
    http_call(cell.api_port, "GET", f"/nowhere/{uuid.uuid4()}")

    api, families = scrape(f"http://127.0.0.1:{cell.api_port}/metrics")
    placed = len(accepted)
    assert placed == BURST + 2
    assert value(api, "qsched_api_boots_accepted_total") == placed
    assert value(api, "qsched_api_boots_refused_total", reason="quota") == 2
    assert value(api, "qsched_api_boots_refused_total", reason="invalid") == 1
    assert total(api, "qsched_api_boots_refused_total") == 3
    requests = "qsched_api_requests_total"
    post = {"route": "/v2.1/servers", "method": "POST"}
    assert value(api, requests, **post, status="202") == placed
    assert value(api, requests, **post, status="403") == 2
    assert value(api, requests, **post, status="400") == 1
    assert value(api, requests, route="/v2.1/servers/{server_id}", method="GET", status="200") == 3
    assert value(api, requests, route="unmatched", method="GET", status="401") == 1
    assert value(api, "qsched_api_request_duration_seconds_count", **post) == BURST + 4 + 1
    assert_api_labels_bounded(api, families, cell.routes)

    agents = [scrape(f"http://127.0.0.1:{port}/metrics")[0] for port in cell.metrics]
    per_agent = [value(a, "qsched_agent_placements_total") for a in agents]
    assert sum(per_agent) == placed, per_agent
    assert sum(value(a, "qsched_agent_active_total") for a in agents) == placed
    assert sum(value(a, "qsched_agent_claim_duration_seconds_count") for a in agents) == placed
    waited = "qsched_agent_published_to_claimed_seconds_count"
    assert sum(value(a, waited) for a in agents) == placed
    assert sum(total(a, "qsched_agent_refusals_total") for a in agents) == 0
    for agent, samples in zip(cell.agents, agents, strict=True):
        used = agent.index.totals()["VCPU"][0]
        capacity = value(samples, "qsched_agent_resource_capacity", resource_class="VCPU")
        free = value(samples, "qsched_agent_resource_free", resource_class="VCPU")
        assert capacity - free == used
        assert labels_of(samples, "qsched_agent_consuming_class", "scheduling_class") == set(
            agent.consumer.classes if agent.consumer else ()
        )


def assert_api_labels_bounded(
    samples: Samples, families: list[Any], templates: frozenset[str]
) -> None:
    """Route templates, HTTP methods and fixed reasons: never a path, an id or a host."""
    assert labels_of(samples, "qsched_api_requests_total", "route") <= templates | {"unmatched"}
    for family in families:
        for sample in family.samples:
            for name, label in sample.labels.items():
                assert not (len(label) == UUID_LIKE and label.count("-") == 4), (name, label)
                assert "m0" not in label and "p1" not in label, (name, label)


def test_refusals_and_no_valid_host_at_an_agent_are_counted_by_reason(cell: Cell) -> None:
    """A request no node fits, handed to an agent: refused with the fit's reason; the
    same request past its deadline: ended NoValidHost there."""
    status, body = cell.boot(flavor="huge")  # accepted, and no agent consumes its class
    assert status == 202
    msg = request_for(cell.stores.instances.get(body["server"]["id"]))
    agent = cell.agents[0]
    agent.on_message(msg.encode(), RecordingDelivery())
    why = agent.placer.why_not(msg)
    assert why is not None
    past = time.time() - 1  # the record's deadline too: a message alone cannot end it
    store = redis_store(cell.stores)
    store.client.hset(store.keys.instance(msg.instance_uuid), "deadline", repr(past))
    agent.on_message(dataclasses.replace(msg, deadline=past).encode(), RecordingDelivery())
    assert cell.state(msg.instance_uuid) == State.ERROR

    samples, _families = scrape(f"http://127.0.0.1:{cell.metrics[0]}/metrics")
    refusals = "qsched_agent_refusals_total"
    assert value(samples, refusals, reason=why.kind.value) == 1
    assert total(samples, refusals) == 1
    assert value(samples, "qsched_no_valid_host_total", reason="deadline") == 1
    reasons = {k.value for k in RefusalKind} | {"service", "none"}
    assert labels_of(samples, refusals, "reason") <= reasons


def test_metrics_need_no_token_and_can_be_turned_off() -> None:
    stores = open_stores(
        LedgerOptions.defaults().replace(durability=TEST_DURABILITY),
        url=f"fakeredis://m-{uuid.uuid4().hex}",
    )
    bus = KombuBus("memory://", prefix=f"m{uuid.uuid4().hex[:10]}")
    for strategy in ("noauth2", "keystone"):
        api = APIOptions.defaults().replace(auth_strategy=strategy)
        client = falcon.testing.TestClient(api_app.create_app(stores, bus, api))
        assert client.simulate_get("/v2.1/servers").status_code == 401
        answer = client.simulate_get("/metrics")
        assert answer.status_code == 200, strategy
        assert answer.headers["content-type"].startswith("text/plain")
        assert "qsched_api_requests_total" in answer.text
    off = APIOptions.defaults().replace(metrics=False)
    client = falcon.testing.TestClient(api_app.create_app(stores, bus, off))
    assert client.simulate_get("/metrics").status_code == 404
    assert client.simulate_get("/v2.1/servers", headers={"X-Auth-Token": "admin"}).status == (
        falcon.HTTP_200
    )


def test_a_refused_create_is_counted_under_a_word_of_a_fixed_set() -> None:
    assert refusal_reason(exception.QuotaExceeded(resource="instances", requested=1, used=1,
                                                  limit=1)) == "quota"  # fmt: skip
    assert refusal_reason(exception.Forbidden(action="create")) == "policy"
    assert refusal_reason(FlavorRefNotFound(flavor="x")) == "invalid"
    assert refusal_reason(exception.GroupNotFound(group="g")) == "not_found"
    assert refusal_reason(BusUnavailable("amqp://h", "down")) == "bus_unavailable"
    down = exception.BackendUnavailable(backend="Redis", url="redis://h", reason="down")
    assert refusal_reason(down) == "ledger_unavailable"
    assert refusal_reason(ValueError("bug")) == "error"
    assert NoMetrics().exposition() == b""


def test_the_reaper_and_the_janitor_count_what_they_did() -> None:
    stores = open_stores(
        LedgerOptions.defaults().replace(durability=TEST_DURABILITY),
        url=f"fakeredis://m-{uuid.uuid4().hex}",
    )
    bus = KombuBus("memory://", prefix=f"m{uuid.uuid4().hex[:10]}")
    late = BootRequest.create(
        str(uuid.uuid4()), "p1", "u1", Flavor("small", 1, 512, 0), timeout_s=-1
    )
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    stores.instances.create(record_for(late, "vm"), late.deadline)
    options = SchedulerOptions.defaults().replace(
        reap_interval_s=0.05, janitor_interval_s=0.05, outbox_interval_s=0
    )
    metrics = APIMetrics()
    tasks = housekeeping.start_periodic_tasks(options, stores, bus, metrics)
    try:
        assert wait_until(lambda: stores.instances.get(late.instance_uuid).state == State.ERROR,
                          10)  # fmt: skip
        time.sleep(0.2)  # the janitor ran too, with nothing to do
    finally:
        for task in tasks:
            task.stop()
        bus.close()
    samples, _families = parse(metrics.exposition())
    assert value(samples, "qsched_no_valid_host_total", reason="deadline") == 1
    assert value(samples, "qsched_janitor_requeued_total") == 0


COUNTING = """
import sys
from qsched.metrics import APIMetrics
metrics = APIMetrics()
for _ in range(int(sys.argv[1])):
    metrics.boots_accepted(1)
    metrics.request("/v2.1/servers", "POST", 202, 0.01)
"""


def test_gunicorn_workers_are_summed_in_one_scrape(tmp_path: Path) -> None:
    """prometheus_client's multiprocess mode, as deploy/gunicorn.conf.py sets it up: two
    processes count, a third (any worker answering /metrics) sums their files."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for count in (3, 4):
        subprocess.run([sys.executable, "-c", COUNTING, str(count)], env=env, check=True,
                       timeout=60)  # fmt: skip
    scrape_code = "from qsched.metrics import APIMetrics; import sys\n" \
        f"sys.stdout.write(APIMetrics({str(tmp_path)!r}).exposition().decode())"  # fmt: skip
    done = subprocess.run([sys.executable, "-c", scrape_code], env=env, check=True,
                          timeout=60, capture_output=True, text=True)  # fmt: skip
    samples, _families = parse(done.stdout.encode())
    assert value(samples, "qsched_api_boots_accepted_total") == 7
    post = {"route": "/v2.1/servers", "method": "POST"}
    assert value(samples, "qsched_api_requests_total", **post, status="202") == 7
    assert value(samples, "qsched_api_request_duration_seconds_count", **post) == 7


@pytest.mark.real
@pytest.mark.slow
def test_gunicorn_and_agent_processes_scraped_after_a_burst(tmp_path: Path) -> None:
    """The shipped gunicorn settings (two workers, multiprocess mode) and qsched-agent
    processes on real servers: every scrape of the API says the whole burst, whichever
    worker answers, and the agents' placements add up to it."""
    ledger = real_redis()
    ledger.flushdb()
    cloud = Cloud(tmp_path, transport_url("redis"))
    ports = [free_port() for _ in range(cloud.agent_count)]
    try:
        cloud.start(
            {i: {"metrics_host": "127.0.0.1", "metrics_port": p} for i, p in enumerate(ports)}
        )
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _i: cloud.boot(), range(8)))  # the cloud's room
        assert [status for status, _ in answers] == [202] * 8
        cloud.settle([body["server"]["id"] for _, body in answers])
        for _ in range(4):  # each scrape may reach another worker: each sums them all
            api, _families = scrape(f"http://127.0.0.1:{cloud.port}/metrics")
            assert value(api, "qsched_api_boots_accepted_total") == 8
            post = {"route": "/v2.1/servers", "method": "POST", "status": "202"}
            assert value(api, "qsched_api_requests_total", **post) == 8
        placed = [value(scrape(f"http://127.0.0.1:{p}/metrics")[0], PLACEMENTS) for p in ports]
        assert sum(placed) == 8, placed
    finally:
        cloud.shutdown()
        ledger.flushdb()


PLACEMENTS = "qsched_agent_placements_total"


class RefusingBus(KombuBus):
    """A broker that confirms nothing."""

    def publish_boot(self, message: BootRequest) -> None:
        raise BusUnavailable("memory://", "no confirm", "publishes failing")


def test_a_publish_the_broker_did_not_confirm_is_counted_with_the_refusal() -> None:
    stores = open_stores(
        LedgerOptions.defaults().replace(durability=TEST_DURABILITY),
        url=f"fakeredis://m-{uuid.uuid4().hex}",
    )
    bus = RefusingBus("memory://", prefix=f"m{uuid.uuid4().hex[:10]}")
    stores.quota.set_limits("p1", instances=-1, cores=-1, ram_mb=-1)
    metrics = APIMetrics()
    compute = ComputeAPI(stores, bus, metrics=metrics)
    compute.cell.flavors.create(Flavor("small", 1, 512, 0))
    context = RequestContext(user_id="u1", project_id="p1", roles=["member", "reader"])
    with pytest.raises(BusUnavailable):
        compute.boot(context, "vm", "small")
    bus.close()
    samples, _families = parse(metrics.exposition())
    assert value(samples, "qsched_api_publish_failures_total", kind="boot") == 1
    assert value(samples, "qsched_api_boots_refused_total", reason="bus_unavailable") == 1
    assert value(samples, "qsched_api_boots_accepted_total") == 0


def test_the_metrics_work_of_one_placement_costs_microseconds() -> None:
    """What metrics add to one placement: the API's counts of the request and the boot,
    the agent's two observations. A placement costs milliseconds of CPU (the bench's
    figures); this must stay a small fraction of it."""
    api = APIMetrics()
    agent = AgentMetrics(Counter(claimed=1), lambda: {"VCPU": (1, 8)}, lambda: {"small"}, int)
    msg = BootRequest.create(str(uuid.uuid4()), "p1", "u1", Flavor("small", 1, 512, 0))
    count = 20_000
    began = time.process_time()
    for _ in range(count):
        api.request("/v2.1/servers", "POST", 202, 0.01)
        api.boots_accepted(1)
        agent.claimed(msg, 0.002)
    per_placement_us = (time.process_time() - began) / count * 1e6
    print(f"metrics work per placement: {per_placement_us:.1f} µs of CPU")
    assert per_placement_us < 100
