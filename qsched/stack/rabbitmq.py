"""RabbitMQ nodes of a harness's own: one node, or a cluster of several on this machine.

Nothing of the machine's own node (``rabbit@<hostname>``, port 5672) is touched.
Every node started here has its own node name (``qs<8 hex>-<i>@localhost``), AMQP
port, distribution port, data and logs under the harness's directory, and no
plugins (``RABBITMQ_ENABLED_PLUGINS_FILE`` names an empty list). Its Erlang cookie
is in ``HOME``, which is the harness's directory too: the nodes of one cluster share
one ``HOME``, hence one cookie, which is generated once and never the user's.

:class:`RabbitNode` is one node: start, stop (``rabbitmqctl stop``, or SIGKILL of
the Erlang VM as a crash), ``stop_app``/``start_app`` restarts, and
``deploy/rabbitmq-policies.sh`` applied to it. :class:`RabbitCluster` starts
``size`` such nodes, the others joining the first (classic peer discovery),
stops one node and starts it again, and waits until every node runs again. Quorum
queues declared while every node runs have a replica on each node (RabbitMQ's
default initial group size, 3, covers a three-node cluster); :meth:`RabbitCluster.members`
reads where a queue's replicas are.

Figures (docs/reliability.rst, "RabbitMQ cluster"; two cores): three nodes form a
cluster in 18-20 s on a quiet machine, 25-40 s on a busy one; a node started again
takes 6-12 s; each node's Erlang VM holds about 135 MB resident.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from qsched.ledger.server import wait_for
from qsched.net import LOOPBACK, free_port, port_open

#: The broker policies a deployment applies (deploy/ of the source tree).
POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "rabbitmq-policies.sh"
#: The server's own scripts: the packaged wrappers run them as the rabbitmq user and
#: write the shared node's startup log.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
#: How a node is stopped: ``rabbitmqctl stop`` (a clean shutdown) or SIGKILL (a crash).
STOP, KILL = "stop", "kill"
#: Erlang VM flags of every node: no busy waiting of idle schedulers (RabbitMQ's advice
#: for hosts that run other work), which several nodes on two cores need.
ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"
#: How long a node joining a cluster on its first start keeps looking for its peers
#: (a loaded machine slows every start).
DISCOVERY_RETRIES, DISCOVERY_INTERVAL_MS = 120, 500


class RabbitFailed(Exception):
    """A RabbitMQ node is not installed, did not start or stop, or a command failed."""


def config_text(address: str, peers: Sequence[str]) -> str:
    """``rabbitmq.conf`` of a node listening on ``address``: with ``peers``, classic
    peer discovery, so that the node's first start joins the cluster of those nodes
    (RabbitMQ uses it only while the node's database is empty, never after)."""
    lines = [f"listeners.tcp.1 = {address}"]
    if peers:
        lines += ["cluster_formation.peer_discovery_backend = classic_config",
                  f"cluster_formation.discovery_retry_limit = {DISCOVERY_RETRIES}",
                  f"cluster_formation.discovery_retry_interval = {DISCOVERY_INTERVAL_MS}",
                  *(f"cluster_formation.classic_config.nodes.{i} = {peer}"
                    for i, peer in enumerate(peers, 1))]  # fmt: skip
    return "\n".join(lines) + "\n"


class RabbitNode:
    """A RabbitMQ node of a harness's own: its node name, AMQP and distribution ports, data
    and logs under ``directory / name``; the Erlang cookie under ``home`` (by default that
    same directory); no plugins.

    Its ports are free ephemeral ones (:func:`~qsched.net.free_port`), never the shared
    node's 5672, 25672, or 35672-35682 that its CLI tools take. ``started_s``: how long
    the last start took. ``pid``: the Erlang VM's process, while it runs.
    """

    def __init__(
        self,
        directory: Path,
        name: str = "bus-rabbit",
        node: str = "",
        home: Path | None = None,
        peers: Sequence[str] = (),
    ) -> None:
        self.dir = directory / name
        self.home = home or self.dir
        self.peers = list(peers)  # nodes to join on the first start (peer discovery)
        self.node = node or f"qsched{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.dist_port = _dist_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.started_s: float | None = None
        self.bin = RABBITMQ_BIN if (RABBITMQ_BIN / "rabbitmq-server").exists() else None

    @property
    def url(self) -> str:
        """oslo.messaging's ``rabbit://`` URL of this node (kombu takes it too)."""
        return f"rabbit://guest:guest@{LOOPBACK}:{self.port}/"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def env(self) -> dict[str, str]:
        d = self.dir
        return {
            **os.environ,
            "HOME": str(self.home),  # the Erlang cookie of this node and of its CLI calls
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),  # not /etc's
            # Idle schedulers sleep instead of spinning: several nodes share few cores.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ERL_ARGS,
        }

    def command(self, name: str) -> str:
        """The path of one of RabbitMQ's commands. :raises RabbitFailed: not installed."""
        found = str(self.bin / name) if self.bin is not None else shutil.which(name)
        if found is None:
            raise RabbitFailed(f"{name} is not installed (apt-get install rabbitmq-server)")
        return found

    def start(self, timeout_s: float = 90.0) -> float:
        """Start the node and wait until it takes AMQP connections; the seconds it took.

        A node started before (its data kept) comes back with its queues and, in a
        cluster, rejoins it.

        :raises RabbitFailed: it did not come up (it is stopped again).
        """
        self._write_files()
        began = time.monotonic()
        with (self.dir / "server.log").open("ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen([self.command("rabbitmq-server")], env=self.env(),
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        try:
            self.ctl("wait", "--timeout", str(int(timeout_s)), str(self.dir / "rabbit.pid"),
                     timeout_s=timeout_s + 10)  # fmt: skip
            if not wait_for(lambda: port_open(LOOPBACK, self.port), 30, 0.1):
                raise RabbitFailed(f"RabbitMQ node {self.node} did not open port {self.port}")
        except BaseException:
            self.stop(KILL)
            raise
        self.started_s = round(time.monotonic() - began, 2)
        return self.started_s

    def _write_files(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(config_text(self.address, self.peers))
        (self.dir / "rabbitmq-env.conf").write_text("")

    def ctl(self, *args: str, timeout_s: float = 120.0) -> str:
        """``rabbitmqctl -n NODE ARGS``; its output. :raises RabbitFailed: it failed."""
        cmd = [self.command("rabbitmqctl"), "-q", "-n", self.node, *args]
        try:
            done = subprocess.run(cmd, env=self.env(), capture_output=True, timeout=timeout_s,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise RabbitFailed(f"{' '.join(cmd)} did not finish in {timeout_s:.0f}s") from exc
        if done.returncode != 0:
            output = (done.stderr or done.stdout).decode(errors="replace").strip()
            raise RabbitFailed(f"{' '.join(cmd)} failed ({done.returncode}): {output[-500:]}")
        return done.stdout.decode(errors="replace")

    def apply_policies(self, prefix: str, delivery_limit: int) -> None:
        """Run the deployment's ``deploy/rabbitmq-policies.sh`` on this node (in a
        cluster, on every node: policies are the cluster's).

        :raises RabbitFailed: the script is missing (not a source tree) or failed.
        """
        if not POLICIES.exists():
            raise RabbitFailed(f"{POLICIES} is missing: run from a source tree")
        env = {**self.env(), "PREFIX": prefix, "DELIVERY_LIMIT": str(delivery_limit),
               "RABBITMQCTL": f"{self.command('rabbitmqctl')} -n {self.node}"}  # fmt: skip
        done = subprocess.run(["sh", str(POLICIES)], env=env, capture_output=True, timeout=120,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            output = (done.stderr or done.stdout).decode(errors="replace").strip()
            raise RabbitFailed(f"{POLICIES.name} failed ({done.returncode}): {output[-500:]}")

    def restart(self, outage_s: float, abort: threading.Event) -> float:
        """``stop_app``, wait ``outage_s``, ``start_app`` (always); when it is up again."""
        with self.lock:
            try:
                self.ctl("stop_app")
                abort.wait(outage_s)
            finally:
                self.ctl("start_app")
                self.ctl("await_startup", "--timeout", "120", timeout_s=150)
        if not wait_for(lambda: port_open(LOOPBACK, self.port), 60, 0.25):
            raise RabbitFailed(f"RabbitMQ node {self.node} did not open {self.port} again")
        return time.time()

    def stop(self, how: str = STOP) -> None:
        """Stop the node: ``rabbitmqctl stop`` (``how`` :data:`STOP`; SIGKILL of its
        process group if that fails) or SIGKILL at once (:data:`KILL`, a crash).
        Idempotent; its data stay for :meth:`start`."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if how == STOP:
            with contextlib.suppress(RabbitFailed):  # the kill below ends it anyway
                self.ctl("stop", timeout_s=60)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # epmd forgets a node whose VM died with its connection; nothing else is left.


class RabbitCluster:
    """``size`` :class:`RabbitNode` s under ``directory``, clustered, sharing one cookie.

    :meth:`start` starts the first node, then every other at once, each joining the
    first on its first start (RabbitMQ's classic peer discovery, :func:`config_text`:
    no ``stop_app``, ``join_cluster``, ``start_app`` round on each); :meth:`stop_node` and
    :meth:`start_node` take one node away and bring it back (its data kept: it
    rejoins); :meth:`wait_whole` waits until every node runs in the cluster again.
    ``started_s``: how long :meth:`start` took.
    """

    def __init__(self, directory: Path, size: int = 3) -> None:
        if size < 1:
            raise ValueError(f"a cluster has at least one node, not {size}")
        self.dir = directory / "rabbit-cluster"
        stem = f"qs{uuid.uuid4().hex[:8]}"
        names = [f"{stem}-{i}@localhost" for i in range(size)]
        self.nodes = [RabbitNode(self.dir, f"node{i}", name, home=self.dir,
                                 peers=names[:1] if i else ())
                      for i, name in enumerate(names)]  # fmt: skip
        self.started_s: float | None = None

    @property
    def url(self) -> str:
        """oslo.messaging's multi-host ``rabbit://`` URL naming every node."""
        hosts = ",".join(f"guest:guest@{node.address}" for node in self.nodes)
        return f"rabbit://{hosts}/"

    @property
    def kombu_url(self) -> str:
        """kombu's failover list (``;``) naming every node."""
        return ";".join(f"amqp://guest:guest@{node.address}//" for node in self.nodes)

    def start(self, timeout_s: float = 120.0) -> float:
        """Start every node and form the cluster; the seconds it took.

        :raises RabbitFailed: a node did not start or join (every node is stopped).
        """
        began = time.monotonic()
        self._write_cookie()
        try:
            # The first node boots alone: a node joining one still booting can break its
            # boot (seen: "incompatible_feature_flags ... replicas ... not active yet").
            self.nodes[0].start(timeout_s)
            with ThreadPoolExecutor(max(1, len(self.nodes) - 1)) as pool:
                list(pool.map(lambda n: n.start(timeout_s), self.nodes[1:]))
            self.wait_whole(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.started_s = round(time.monotonic() - began, 2)
        return self.started_s

    def _write_cookie(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        cookie = self.dir / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(secrets.token_hex(16).upper())
            cookie.chmod(0o400)

    def running_nodes(self, via: RabbitNode | None = None) -> list[str]:
        """The nodes running in the cluster, as ``via`` (a running node) sees them.

        :raises RabbitFailed: no node runs, or ``rabbitmqctl cluster_status`` failed.
        """
        asked = via or self._a_running_node()
        status = json.loads(asked.ctl("cluster_status", "--formatter", "json", timeout_s=30))
        return sorted(status.get("running_nodes", []))

    def whole(self) -> bool:
        """Every node runs and takes AMQP connections, and the cluster counts them all
        running (one ``cluster_status``: each CLI call costs about two seconds here)."""
        if not all(n.running and port_open(LOOPBACK, n.port) for n in self.nodes):
            return False
        return self.running_nodes() == sorted(node.node for node in self.nodes)

    def wait_whole(self, timeout_s: float = 120.0) -> float:
        """Wait until :meth:`whole`; the seconds it took.

        :raises RabbitFailed: it was not whole after ``timeout_s``.
        """
        began = time.monotonic()
        if not wait_for(self.whole, timeout_s, 0.25):
            raise RabbitFailed(f"the RabbitMQ cluster in {self.dir} was not whole after "
                               f"{timeout_s:.0f}s: logs in each node's log/ directory")  # fmt: skip
        return round(time.monotonic() - began, 2)

    def stop_node(self, index: int, how: str = KILL) -> None:
        """Take node ``index`` away (:data:`KILL`: SIGKILL, a crash; :data:`STOP`: a clean
        shutdown). Its data stay for :meth:`start_node`."""
        self.nodes[index].stop(how)

    def start_node(self, index: int, timeout_s: float = 90.0) -> float:
        """Start node ``index`` again (it rejoins the cluster); the seconds it took.

        :raises RabbitFailed: as :meth:`RabbitNode.start`.
        """
        node = self.nodes[index]
        started = node.start(timeout_s)
        node.ctl("await_startup", "--timeout", str(int(timeout_s)), timeout_s=timeout_s + 10)
        return started

    def members(self, queue: str, vhost: str = "/") -> list[str]:
        """The nodes holding a replica of quorum queue ``queue`` (``[]``: no such queue,
        or a classic queue).

        :raises RabbitFailed: as :meth:`running_nodes`.
        """
        out = self._a_running_node().ctl("list_queues", "-p", vhost, "name", "type", "members",
                                         "--formatter", "json", timeout_s=60)  # fmt: skip
        for row in json.loads(out or "[]"):
            if row.get("name") == queue:
                return sorted(row.get("members") or [])
        return []

    def queues(self, vhost: str = "/") -> dict[str, str]:
        """Every queue of ``vhost`` and its type (``quorum``, ``classic``)."""
        out = self._a_running_node().ctl("list_queues", "-p", vhost, "name", "type",
                                         "--formatter", "json", timeout_s=60)  # fmt: skip
        return {row["name"]: row["type"] for row in json.loads(out or "[]")}

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of each running node's Erlang VM (from /proc), in MB."""
        found = {}
        for node in self.nodes:
            pid = _beam_pid(node)
            if pid is not None:
                found[node.node] = _rss_mb(pid)
        return found

    def apply_policies(self, prefix: str, delivery_limit: int) -> None:
        """``deploy/rabbitmq-policies.sh`` on the cluster. :raises RabbitFailed:"""
        self._a_running_node().apply_policies(prefix, delivery_limit)

    def stop(self) -> None:
        """Stop every node, all at once."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(STOP), self.nodes))

    def _a_running_node(self) -> RabbitNode:
        for node in self.nodes:
            if node.running:
                return node
        raise RabbitFailed(f"no node of the RabbitMQ cluster in {self.dir} runs")

    def hosts(self) -> Sequence[str]:
        """``host:port`` of every node, in order."""
        return [node.address for node in self.nodes]


def _beam_pid(node: RabbitNode) -> int | None:
    pid_file = node.dir / "rabbit.pid"
    if not node.running or not pid_file.exists():
        return None
    text = pid_file.read_text().strip()
    return int(text) if text.isdigit() else None


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _dist_port() -> int:
    """A free port for Erlang distribution whose CLI range (+10000..+10010) exists."""
    for _ in range(50):
        port = free_port()
        if port + 10010 < 65536:
            return port
    raise RabbitFailed("no free port below 55526 for RabbitMQ's distribution")
