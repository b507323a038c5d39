"""The local Ray head `orchestrator up` starts when given no address, and `down` stops: its
processes, found by the temp dir they name, never another cluster's on the machine."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile

from orchestrator.errors import UsageError


def start(args) -> dict:
    """`ray start --head` with its dashboard, a temp dir of its own and usage stats off."""
    from orchestrator.ray import cluster

    temp_dir = tempfile.mkdtemp(prefix=f"orch-{secrets.token_hex(2)}-", dir="/tmp")  # short: socket paths
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        f"--port={args.port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={args.dashboard_port}",
        "--include-dashboard=true",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    if args.num_cpus:
        command.append(f"--num-cpus={args.num_cpus}")
    if args.resources:
        command.append(f"--resources={args.resources}")
    # Ray's GCS fault tolerance: the GCS keeps its tables in Redis and a restarted GCS (same
    # Redis, same namespace) carries on with the cluster's nodes, actors and jobs
    redis = (
        {"RAY_REDIS_ADDRESS": args.redis, "RAY_external_storage_namespace": "orchestrator"}
        if args.redis
        else {}
    )
    auth = _ensure_token()
    # see cluster.py for the niceness and for health checks patient enough for a busy head
    env = {
        cluster.WORKER_NICENESS: "0",
        **cluster.NODE_HEALTH_CHECK,
        **os.environ,
        **auth,
        **redis,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    if result.returncode != 0:
        lines = [ln for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        raise UsageError(f"could not start a local Ray head: {lines[-1] if lines else 'ray start failed'}")
    return {
        "address": f"127.0.0.1:{args.port}",
        "dashboard": f"http://127.0.0.1:{args.dashboard_port}",
        "started_head": True,
        "temp_dir": temp_dir,
    }


def _ensure_token() -> dict:
    """The local head always uses token auth (it cannot be kept on loopback: docs/ray.md):
    `ray start` turns it on only when a token exists, so make one first where Ray's clients
    look for it (`ray get-auth-token --generate`: ~/.ray/auth_token). RAY_AUTH_MODE=disabled,
    set by the user, is respected."""
    from orchestrator.ray import cluster

    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return {}
    if cluster.token_source() is None:
        command = [sys.executable, "-m", "ray.scripts.scripts", "get-auth-token", "--generate"]
        made = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if made.returncode != 0 or cluster.token_source() is None:
            raise UsageError(f"could not make an auth token for the local Ray head: {made.stderr.strip()}")
    return {"RAY_AUTH_MODE": "token"}


def stop(temp_dir: str, gcs_port: int | None = None, timeout: float = 20.0) -> int:
    """Stop the processes of the Ray head that uses `temp_dir` (and only those: `ray stop`
    would stop every Ray cluster on the machine), in `ray stop`'s order: the raylet, then the
    rest, then the GCS. Sent SIGTERM all at once, the GCS and the autoscaler's monitor wait for
    peers already gone and outlive any grace period (20 s, then SIGKILL); in order, 2-6 s."""
    import psutil

    mine = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.pid != os.getpid() and _of_this_head(cmdline, temp_dir, gcs_port):
                mine.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    # agents rename themselves (ray::DashboardAgent): find them as children of what matched
    for proc in list(mine):
        try:
            mine += [child for child in proc.children(recursive=True) if child not in mine]
        except psutil.NoSuchProcess:
            continue
    named = {proc: _name(proc) for proc in mine}
    raylets = [proc for proc in mine if named[proc] == "raylet"]
    gcs = [proc for proc in mine if named[proc] == "gcs_server"]
    rest = [proc for proc in mine if proc not in raylets and proc not in gcs]
    for bucket in (raylets, rest, gcs):
        _terminate(bucket, timeout / 3)
    shutil.rmtree(temp_dir, ignore_errors=True)
    return len(mine)


def _name(proc) -> str:
    import psutil

    try:
        return proc.name()
    except psutil.NoSuchProcess:
        return ""


def _terminate(processes: list, grace_s: float) -> None:
    """SIGTERM, then SIGKILL to what is left after `grace_s`."""
    import psutil

    for proc in processes:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _of_this_head(cmdline: list[str], temp_dir: str, gcs_port: int | None) -> bool:
    """A process of the head: its command line names the head's temp dir, or it is Ray's client
    server for the head's GCS port (it names neither the temp dir nor a parent: `ray start`
    leaves it to init)."""
    if any(temp_dir in part for part in cmdline):
        return True
    if gcs_port is None or "ray.util.client.server" not in cmdline:
        return False
    return any(part.startswith("--address=") and part.endswith(f":{gcs_port}") for part in cmdline)
