"""Finding and talking to a Ray cluster: addresses, auth tokens and errors a person can act on.

Two kinds of address are in play. `orchestrator run` joins the cluster as a driver and needs
the cluster (GCS) address, `host:6379`. The job commands (`submit`, `status`, `list`, `logs`,
`stop`) talk to the Jobs API on the dashboard, `http://host:8265`; like `ray job` they also
accept a cluster address and look the dashboard up from it.

Ray 2.60 heads started with `ray start` use token authentication whenever a token exists.
Clients find the token where Ray's own do: `$RAY_AUTH_TOKEN`, the file at
`$RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

TOKEN_HELP = (
    "get the token on the head node with `ray get-auth-token` and put it in"
    " ~/.ray/auth_token here, or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH to a file"
    " holding it)"
)


class ClusterError(Exception):
    """The cluster cannot be reached or refused us: printed as one line, exit status 1."""


# --- auth tokens ------------------------------------------------------------------------


def use_token_if_available() -> bool:
    """Turn on token auth for this process when a token is at hand and RAY_AUTH_MODE is unset.

    This is what `ray start` and a local `ray.init()` do; Ray's job clients and `ray.init`
    with an explicit address do not, so without it they would reach a token head tokenless.
    Sending a token to a head without auth is harmless. Returns whether token auth is on.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    from ray.exceptions import AuthenticationError

    from orchestrator.ray import internals

    try:
        if not internals.token_at_hand():
            return False
    except AuthenticationError as err:  # e.g. RAY_AUTH_TOKEN_PATH names a missing file
        raise ClusterError(f"{str(err.message).split('. Note:')[0]}; {TOKEN_HELP}") from None
    os.environ["RAY_AUTH_MODE"] = "token"
    internals.reload_config()  # Ray caches its config: so that this process sees token mode
    return True


def is_auth_error(err: BaseException) -> bool:
    """True when `err`, or an error it was raised from, is Ray refusing our token."""
    from ray.exceptions import AuthenticationError

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, AuthenticationError) or "InvalidAuthToken" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _have_token() -> bool:
    from orchestrator.ray import internals

    try:
        return internals.token_at_hand()
    except Exception:  # a token path that cannot be read counts as no token
        return False


def answers(address: str, timeout: float = 2.0) -> bool | None:
    """Whether something accepts connections at the GCS address host:port; None when the
    address is not of that form (a ray:// client address, `auto`)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError:
        return False
    return True


def refuses_our_token(address: str) -> bool:
    """Whether the cluster's GCS at host:port refuses this process' token, or its lack of one:
    one request, answered in milliseconds, where `ray.init` retries for 20 s before it gives up.
    False when the address is not a reachable host:port (then `ray.init` says what is wrong)."""
    if not answers(address):
        return False
    try:
        from orchestrator.ray.internals import ask_gcs

        ask_gcs(address)
    except Exception as err:  # only a refusal is ours to report
        return is_auth_error(err)
    return False


def connected_temp_dir() -> str | None:
    """The temp dir of the cluster this process joined (where its head writes the Prometheus
    service discovery file); None when Ray does not say."""
    try:
        import ray

        return ray.get_runtime_context().get_temp_dir()
    except Exception:  # not connected, or Ray changed: the caller falls back to Ray's default
        return None


def read_token() -> str | None:
    """This machine's Ray auth token, looked up in Ray's order ($RAY_AUTH_TOKEN, the file
    $RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token); None when there is none. Needs no Ray: the
    CLI's HTTP submissions and the service's check of them both use it."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip() or None
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def token_source() -> str | None:
    """Where this machine's Ray clients take the token from, in Ray's order, to tell a person
    (never the token itself); None when there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "$RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return path if os.path.isfile(path) else None


def auth_message(where: str) -> str:
    if _have_token():
        return f"the Ray cluster at {where} rejected this machine's auth token; {TOKEN_HELP}"
    return f"the Ray cluster at {where} requires an auth token and none was found; {TOKEN_HELP}"


# --- the driver's connection ----------------------------------------------------------------


def driver_address(address: str | None) -> str | None:
    """--address, else $RAY_ADDRESS, else None (start a local cluster)."""
    address = address or os.environ.get("RAY_ADDRESS") or (read_state() or {}).get("address") or None
    if address and address.startswith(("http://", "https://")):
        raise ClusterError(
            f"'{address}' is a dashboard (Jobs API) address; `orchestrator run` needs the cluster"
            " address, e.g. head-node:6379 (or `auto` on a cluster node); to send the job to the"
            " cluster from here use `orchestrator submit`"
        )
    return address


def train_env() -> dict[str, str]:
    """Environment of the job's Ray processes. Ray Train V2's controller polls its workers every
    RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default): every wait in it (the worker group
    starting, each `ray.train.report`) is rounded up to that. 0.5 s took 6 s off a job's start on
    a 2-core machine (docs/ray.md); a value in the environment wins."""
    env = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")}
    if os.environ.get("ORCHESTRATOR_METRICS_AB_BLOCK"):  # bench/metrics_overhead.py's same-run A/B
        env["ORCHESTRATOR_METRICS_AB_BLOCK"] = os.environ["ORCHESTRATOR_METRICS_AB_BLOCK"]
    return env


# Ray runs its workers at nice 15 so that its own daemons stay responsive. Training workers
# use every core, so on a small machine each wake-up of a daemon (the dashboard agent, the
# raylet, a driver) stalls one of their threads, and the others wait for it at the next
# barrier. A local Ray started here runs workers at nice 0, level with Ray's own processes.
# (A rank training on the CPU on the head goes further down on its own: workers/cpu_priority.py.)
WORKER_NICENESS = "RAY_worker_niceness"

# What watches a run (its driver and state actor: records, the metrics log, progress) is
# bookkeeping; where GPU ranks' threads keep every core busy, it should take its CPU from
# their gaps rather than from their steps. bench/metrics_overhead.py measures the difference.
# (CPU ranks on the head train in the background, workers/cpu_priority.py: bookkeeping first.)
BOOKKEEPING_NICENESS = 10


# Ray declares a node dead after `threshold` health checks in a row fail, `period` apart, each
# waiting up to `timeout` (Ray's defaults: 5, 3 s, 10 s). A head busy starting many jobs on
# few cores can leave its own raylet's checks unanswered for tens of seconds, and a raylet
# declared dead exits, taking the service and every job with it. The heads `orchestrator up`
# starts are therefore more patient than Ray's defaults, never quicker: the service does not
# wait for Ray's verdict to move jobs off a lost node (it probes the nodes itself:
# node_health.py), so patience costs the jobs nothing. Set on the head (the GCS reads them);
# a value in the environment wins. docs/cluster.md has the figures.
NODE_HEALTH_CHECK = {
    "RAY_health_check_period_ms": "3000",
    "RAY_health_check_timeout_ms": "20000",
    "RAY_health_check_failure_threshold": "10",
}


def yield_to_training() -> None:
    """Lower the calling thread, and the threads it starts from now on, to nice
    BOOKKEEPING_NICENESS (on Linux a thread's nice value is its own; never raises)."""
    with contextlib.suppress(AttributeError, OSError):  # no setpriority (Windows), not allowed
        current = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, max(current, BOOKKEEPING_NICENESS))


@contextlib.contextmanager
def connect(address: str | None, num_cpus: int = 1) -> Iterator[str]:
    """Join the cluster at `address`, or start a private local one; yields a description.

    A local cluster gets a short temp dir of its own (Unix socket paths are limited to 107
    bytes), no dashboard and at least `num_cpus` CPUs, so an N-worker job fits on a laptop
    with fewer cores. It is shut down and removed on exit.
    """
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault(WORKER_NICENESS, "0")  # for the local Ray this may start, see below
    temp_dir = None
    try:
        if address:
            if use_token_if_available() and not _have_token():  # Ray's own client would abort
                raise ClusterError(auth_message(address))
            if answers(address) is False:  # `ray.init` would retry for minutes
                raise ClusterError(f"cannot connect to the Ray cluster at '{address}': nothing answers there")
            if refuses_our_token(address):
                raise ClusterError(auth_message(address))
            try:
                context = ray.init(
                    address=address,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    runtime_env={"env_vars": train_env()},
                )
                connected["dashboard"] = context.dashboard_url and f"http://{context.dashboard_url}"
            except Exception as err:  # Ray raises ConnectionError, RuntimeError, ValueError
                if is_auth_error(err):
                    raise ClusterError(auth_message(address)) from None
                raise ClusterError(
                    f"cannot connect to the Ray cluster at '{address}': {_first_line(err)}"
                ) from None
            where = f"Ray cluster at {address}"
        else:
            temp_dir = tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp")
            # a new local cluster uses token auth (Ray's default); no need to warn about it
            from orchestrator.ray.internals import AUTH_LOGGER

            logging.getLogger(AUTH_LOGGER).setLevel(logging.ERROR)
            ray.init(
                num_cpus=max(os.cpu_count() or 1, num_cpus),
                include_dashboard=False,
                _temp_dir=temp_dir,
                log_to_driver=False,
                logging_level=logging.WARNING,
                runtime_env={"env_vars": train_env()},
            )
            where = f"local Ray ({int(ray.cluster_resources().get('CPU', 0))} CPUs)"
        yield where
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


connected: dict[str, str | None] = {}  # what the last `connect` learned (the dashboard URL)


# --- what `orchestrator up` started -----------------------------------------------------------


def home() -> Path:
    """Where the CLI keeps its state: $ORCHESTRATOR_HOME, else ~/.orchestrator."""
    return Path(os.environ.get("ORCHESTRATOR_HOME") or Path.home() / ".orchestrator")


def state_file() -> Path:
    return home() / "cluster.json"


def read_state() -> dict | None:
    """What `orchestrator up` recorded: the cluster and dashboard addresses, the job store, and
    whether it started the Ray head itself (then `down` stops it)."""
    try:
        return json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None


def write_state(state: dict) -> None:
    home().mkdir(parents=True, exist_ok=True)
    tmp = state_file().with_suffix(f".{secrets.token_hex(4)}.tmp")  # whole or absent, per call
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(state_file())


def clear_state() -> None:
    state_file().unlink(missing_ok=True)


# --- the Jobs API ----------------------------------------------------------------------------


def jobs_client(address: str | None):
    """A `JobSubmissionClient` for --address, else $RAY_API_SERVER_ADDRESS / $RAY_ADDRESS, else
    the dashboard of the cluster `orchestrator up` started or joined."""
    if not (address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")):
        address = (read_state() or {}).get("dashboard")
    if address:
        # Ray lets the environment override an explicit address; here the option wins
        os.environ.pop("RAY_API_SERVER_ADDRESS", None)
        os.environ["RAY_ADDRESS"] = address
    where = (
        address
        or os.environ.get("RAY_API_SERVER_ADDRESS")
        or os.environ.get("RAY_ADDRESS")
        or "the local Ray cluster"
    )
    use_token_if_available()
    from ray.job_submission import JobSubmissionClient

    logging.getLogger("ray").setLevel(logging.ERROR)  # packaging and websocket chatter
    try:
        return JobSubmissionClient(address)
    except Exception as err:
        raise translate(err, where) from None


def translate(err: BaseException, where: str) -> ClusterError:
    """Any Jobs API failure -> one line that says what to do."""
    if is_auth_error(err):
        return ClusterError(auth_message(where))
    text = _first_line(err)
    if "Failed to connect" in text or "Connection refused" in text or "ConnectionError" in type(err).__name__:
        return ClusterError(
            f"cannot reach the Ray Jobs API at {where}: is the cluster up, and is"
            f" the address its dashboard (http://HEAD:8265)? ({text})"
        )
    return ClusterError(f"{where}: {text}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
