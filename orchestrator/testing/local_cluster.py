"""Real Ray clusters on this machine for the tests and the benchmarks, started as a user would
with `ray start`.

`start_ray_head` starts a head node; `RayHead.add_node` joins more nodes to it, each a raylet
of its own on this machine with its own logical CPUs, custom resources and node id, and
`kill_node` SIGKILLs one node's raylet as a hardware fault would. Every port gets a free one
so that a test cluster never meets another on the machine, and everything is stopped by its
own process group (not `ray stop`, which stops every Ray on the machine).

The clusters run as operators run theirs: Ray's own health checks (nothing tuned), and each
worker node as a machine of its own: its raylet and every process it starts live in a mount
namespace of their own (`unshare --mount`) where Ray's temp dir has the head's path but is the
node's own directory, as `/tmp/ray` is on every machine of a real cluster (Ray finds a
driver's log by that path on the driver's node). Where a head names `private_disks`, each
worker node also has a fresh tmpfs over each of those directories, so what a worker writes
there only that node sees. The head sees the machine's real directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).parent / "ray")


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@dataclass
class RayNode:
    """A node of a test cluster: `ray start --block` and the processes it started."""

    name: str
    process: subprocess.Popen
    log: Path
    id: str | None = None  # Ray's node id, once known

    def node_id(self, dashboard: str, env: dict, timeout: float = 60) -> str:
        """This node's id, once Ray's node table lists it alive (the raylet names it)."""
        if self.id:
            return self.id
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                args = self.raylet().cmdline()
            except (RuntimeError, psutil.NoSuchProcess):
                args = []
            ids = [a.split("=", 1)[1] for a in args if a.startswith("--node_id=")]
            if ids and any(
                n["node_id"] == ids[0] and n["state"] == "ALIVE" for n in list_nodes(dashboard, env)
            ):
                return ids[0]
            time.sleep(0.5)
        raise RuntimeError(f"node {self.name} never joined: {self.log.read_text()[-2000:]}")

    def raylet(self) -> psutil.Process:
        for child in psutil.Process(self.process.pid).children(recursive=True):
            if child.name() == "raylet":
                return child
        raise RuntimeError(f"node {self.name} has no raylet")

    def stop(self) -> None:
        stop_group(self.process)


@dataclass
class RayHead:
    address: str  # the cluster (GCS) address, for `orchestrator run --address`
    dashboard: str  # the Jobs API, for `orchestrator submit` and `ray job submit`
    env: dict  # what a client needs: token auth on, the token file, the venv on PATH
    temp_dir: str
    process: subprocess.Popen
    autoscaling_config: str | None = None  # the autoscaler's cluster config, when it has one
    nodes: list[RayNode] = field(default_factory=list)  # worker nodes, in the order they joined
    restarted: list[subprocess.Popen] = field(default_factory=list)  # head processes started again
    private_disks: list[str] = field(default_factory=list)  # a tmpfs of its own there on each worker node

    def add_node(self, name: str, num_cpus: int, resources: dict | None = None) -> RayNode:
        """Join one more node (a raylet of its own) and wait until Ray lists it."""
        node_manager, object_manager, agent, agent_grpc, runtime_env, metrics = free_ports(6)
        log = Path(self.temp_dir, f"{name}.log")
        command = [
            RAY,
            "start",
            "--block",
            f"--address={self.address}",
            f"--node-manager-port={node_manager}",
            f"--object-manager-port={object_manager}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}",
            f"--temp-dir={self.temp_dir}/ray",  # the head's path, the node's own directory
            f"--num-cpus={num_cpus}",
            *([f"--resources={json.dumps(resources)}"] if resources else []),
            "--include-log-monitor=false",  # the head's monitor reads this machine's logs
            "--disable-usage-stats",
        ]
        own = Path(self.temp_dir, name)  # the node's temp dir, as the machine sees it
        own.mkdir(exist_ok=True)
        process = subprocess.Popen(
            as_own_machine(command, own, f"{self.temp_dir}/ray", self.private_disks),
            env={**os.environ, **self.env},
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        node = RayNode(name, process, log)
        self.nodes.append(node)
        node.node_id(self.dashboard, self.env)
        return node

    def node_id_of(self, node: RayNode) -> str:
        return node.node_id(self.dashboard, self.env)

    def kill_node(self, node: RayNode) -> float:
        """SIGKILL the node's raylet, as a machine that dies; returns when. Its other
        processes are stopped too, as they would be with the machine."""
        raylet = node.raylet()
        killed_at = time.time()
        raylet.send_signal(signal.SIGKILL)
        node.stop()
        return killed_at


# binds $1 over $2, mounts a tmpfs over each directory before `--`, then runs what follows
# it, in the mount namespace `unshare` made (private propagation: the mounts never reach the
# machine's)
_MOUNT_THEN_RUN = (
    'set -e; mount --bind "$1" "$2"; shift 2; '
    'while [ "$1" != -- ]; do mount -t tmpfs -o size=4g node-disk "$1"; shift; done; shift; exec "$@"'
)


def as_own_machine(command: list[str], own_temp: Path, temp_path: str, disks: list[str]) -> list[str]:
    """`command` run in a mount namespace of its own where `temp_path` is `own_temp`, with a
    fresh tmpfs over each of `disks` (which must exist): a node's own disk. As root (CI);
    elsewhere in a user namespace of one's own."""
    as_root = [] if os.geteuid() == 0 else ["--map-root-user"]
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        *as_root,
        "sh",
        "-c",
        _MOUNT_THEN_RUN,
        "sh",
        str(own_temp),
        temp_path,
        *disks,
        "--",
        *command,
    ]


def list_nodes(dashboard: str, env: dict, detail: bool = False) -> list[dict]:
    """Ray's node table through the dashboard's state API (what `ray list nodes` reads); with
    `detail`, each node's start and end times too."""
    return state_api(dashboard, env, "nodes", limit=1000, **({"detail": "true"} if detail else {}))


def list_actors(dashboard: str, env: dict, class_name: str) -> list[dict]:
    return [a for a in state_api(dashboard, env, "actors") if a.get("class_name") == class_name]


def state_api(dashboard: str, env: dict, what: str, **params) -> list[dict]:
    """Ray's state API on the dashboard (`/api/v0/<what>`: "nodes", "actors", ...), with the
    cluster's token from `env`; `params` as its query (`detail="true"`, filters)."""
    query = "&".join(f"{k}={v}" for k, v in {"limit": 1000, **params}.items())
    request = urllib.request.Request(f"{dashboard}/api/v0/{what}?{query}")
    token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text().strip() if env.get("RAY_AUTH_TOKEN_PATH") else None
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)["data"]["result"]["result"]


def start_ray_head(
    num_cpus: int = 4,
    resources: dict | None = None,
    redis: str | None = None,
    autoscaling: dict | None = None,
) -> RayHead:
    """`ray start --head --block` with token auth, its own ports and a short temp dir.

    With `autoscaling` (node type name -> {"resources", "max_workers"}): Ray's autoscaler on
    the head, with Ray's fake multi-node provider (each node it adds is a raylet on this
    machine, a child of the autoscaler's monitor, in the head's process group).

    With `redis` (host:port): GCS fault tolerance backed by that Redis, and without --block
    (which ends the whole head when one of its processes dies), as `orchestrator up` starts
    a head: a GCS that dies is then started again by whoever supervises the head."""
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Unix socket paths: 107 bytes at most
    token = os.path.join(temp_dir, "auth_token")
    with open(token, "w") as out:
        out.write(secrets.token_hex(32))
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": token,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_worker_niceness": "0",  # as the clusters the product starts (orchestrator/ray/cluster.py)
    }
    gcs, dash, client, agent, agent_grpc, runtime_env, metrics = free_ports(7)
    scaling_args, scaling_env, config = [], {}, None
    if autoscaling:
        config = _autoscaling_config(temp_dir, f"127.0.0.1:{gcs}", num_cpus, autoscaling)
        scaling_args = [f"--autoscaling-config={config}"]
        scaling_env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}  # the default: 5 s
    log = open(os.path.join(temp_dir, "head.log"), "w")
    process = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            *([] if redis else ["--block"]),
            f"--port={gcs}",
            f"--dashboard-port={dash}",
            "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={client}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}",
            f"--temp-dir={temp_dir}/ray",
            f"--num-cpus={num_cpus}",
            *([f"--resources={json.dumps(resources)}"] if resources else []),
            "--include-dashboard=true",
            "--disable-usage-stats",
            *scaling_args,
        ],
        env={**os.environ, **env, **_redis_env(redis), **scaling_env},  # Ray's own health checks
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    head = RayHead(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", env, temp_dir, process, config)
    deadline = time.time() + 120
    while time.time() < deadline:
        if process.poll() not in (None, *([0] if redis else [])):
            raise RuntimeError(f"ray start --head exited: {Path(temp_dir, 'head.log').read_text()}")
        try:  # 401 means the dashboard is up and wants the token
            urllib.request.urlopen(f"{head.dashboard}/api/version", timeout=2)
            return head
        except urllib.error.HTTPError:
            return head
        except OSError:
            time.sleep(1)
    stop_ray_head(head)
    raise RuntimeError("the Ray head did not come up in 120 s")


def _autoscaling_config(temp_dir: str, gcs: str, head_cpus: int, types: dict) -> str:
    """The cluster config of Ray's fake multi-node provider (what Ray's own autoscaler tests
    use; ray.cluster_utils.AutoscalingCluster's example config is not in the wheel)."""
    config = {
        "cluster_name": "fake-multinode",
        "max_workers": sum(t["max_workers"] for t in types.values()),
        # gcs_address: else the fake nodes join <this machine's ip>:6379, whatever runs there
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs,
        },
        "head_node_type": "ray.head.default",
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
            **{name: {"node_config": {}, "min_workers": 0, **t} for name, t in types.items()},
        },
        "idle_timeout_minutes": 0.1,  # an idle node goes after 6 s
        "upscaling_speed": 1.0,
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        **{key: [] for key in ("initialization_commands", "setup_commands", "head_setup_commands")},
        **{
            key: []
            for key in ("worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")
        },
    }
    path = os.path.join(temp_dir, "autoscaling.json")
    with open(path, "w") as out:
        json.dump(config, out)
    return path


def _redis_env(redis: str | None) -> dict:
    return {"RAY_REDIS_ADDRESS": redis, "RAY_external_storage_namespace": "orchestrator"} if redis else {}


def restart_gcs(head: RayHead, down_s: float = 3.0) -> tuple[float, float]:
    """SIGKILL the head's GCS server and, `down_s` later, start it again as it was (its command
    line and environment: same port, same Redis), as a supervisor would. Returns (killed at,
    restarted at)."""
    gcs = next(
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "gcs_server" and head.temp_dir in " ".join(p.info["cmdline"] or [])
    )
    command, environ, cwd = gcs.cmdline(), gcs.environ(), gcs.cwd()
    killed_at = time.time()
    gcs.send_signal(signal.SIGKILL)
    gcs.wait(10)
    time.sleep(down_s)
    log = open(Path(head.temp_dir, "gcs-restarted.log"), "w")
    head.restarted.append(
        subprocess.Popen(
            command, env=environ, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    )
    return killed_at, time.time()


@dataclass
class Redis:
    """A real `redis-server` (Debian's package) on a free port, its files in a temp dir."""

    address: str
    process: subprocess.Popen
    directory: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_redis() -> Redis:
    (port,) = free_ports(1)
    directory = tempfile.mkdtemp(prefix="redis-", dir="/tmp")
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", ""],
        stdout=open(Path(directory, "redis.log"), "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return Redis(f"127.0.0.1:{port}", process, directory)
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("redis-server did not start in 30 s")


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to `ray start` (with --block it stops what it started); then SIGKILL to what is
    left of the process group we started it in, by its id (a head without --block has no
    leader left, but its processes keep the group)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def stop_ray_head(head: RayHead) -> None:
    """Stop the worker nodes, then the head: SIGTERM to `ray start --block` stops the processes
    it started; then the group, by id."""
    for node in head.nodes:
        node.stop()
    for process in head.restarted:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    stop_group(head.process)
    # anything of this cluster that left its group (seen: a Redis-backed GCS outliving the head)
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if head.temp_dir in " ".join(process.info["cmdline"] or []):
                process.kill()
    if not os.environ.get("KEEP_RAY_TMP"):  # set it to read a failed test's driver logs afterwards
        shutil.rmtree(head.temp_dir, ignore_errors=True)
