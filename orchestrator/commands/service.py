"""`orchestrator up` / `orchestrator down`: the orchestrator service of a cluster.

`up` joins the cluster at --address (or $RAY_ADDRESS); on a machine with no cluster it starts
a local Ray head with its dashboard first. It then starts the service actor (or finds the one
already running) and records what it did in ~/.orchestrator/cluster.json, which the other
commands read for their default addresses. `down` stops the service, and the Ray head if `up`
started it.
"""

from __future__ import annotations

import os
import time

from orchestrator.commands import local_head
from orchestrator.commands.options import add_address, with_cluster_errors
from orchestrator.errors import UsageError


def register(sub) -> None:
    up = sub.add_parser(
        "up", help="start the orchestrator service (and a local Ray head if there is no cluster)"
    )
    _add_cluster_options(up)
    _add_scheduling_options(up)
    _add_resilience_options(up)
    up.set_defaults(handler=with_cluster_errors(handle_up))

    down = sub.add_parser("down", help="stop the orchestrator service (and the Ray head `up` started)")
    add_address(down, "Ray cluster (default: the one `orchestrator up` recorded)")
    down.set_defaults(handler=with_cluster_errors(handle_down))


def _add_cluster_options(up) -> None:
    """`up`'s cluster and job store, and the local head it may start."""
    add_address(up, "Ray cluster to serve (default: $RAY_ADDRESS, else start a local one)")
    up.add_argument(
        "--store", help="job store URI: a path, NFS, s3://, gs://, hdfs:// (default: ~/.orchestrator/store)"
    )
    up.add_argument("--port", type=int, default=6379, help="a new local head's cluster port (default 6379)")
    up.add_argument(
        "--dashboard-port", type=int, default=8265, help="a new local head's dashboard port (default 8265)"
    )
    up.add_argument("--num-cpus", type=int, help="CPUs a new local head offers (default: all)")
    up.add_argument(
        "--resources", metavar="JSON", help="custom resources of a new local head, e.g. '{\"fake_gpu\": 4}'"
    )


def _add_scheduling_options(up) -> None:
    """`up`'s queues and scheduling policy, and where its status page listens."""
    up.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="QUEUE=RES:N[,RES:N]",
        help="a queue's quota, e.g. research=GPU:8 (repeatable)",
    )
    up.add_argument(
        "--queues",
        metavar="FILE",
        help="the queue configuration (cohorts, nominal quotas, LAS; docs/scheduler.md), validated "
        "before anything starts; later: `orchestrator queues apply FILE`",
    )
    up.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="where the status page and /metrics listen (default 127.0.0.1; 0.0.0.0 for every address:"
        " then every request needs a token)",
    )
    up.add_argument(
        "--require-login",
        action="store_true",
        help="every request needs a token, on 127.0.0.1 too (a head node that several people log in to)",
    )
    up.add_argument(
        "--metrics-port",
        type=int,
        default=8266,
        help="their port (default 8266; 0 picks a free one, which the service keeps when it restarts)",
    )
    up.add_argument("--no-preemption", action="store_true", help="never preempt running jobs")
    up.add_argument("--no-backfill", action="store_true", help="start jobs strictly in queue order")
    up.add_argument(
        "--start-deadline",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds an admitted job's workers have to start, while no other job's start completes, "
        "before it is requeued (default 300)",
    )


def _add_resilience_options(up) -> None:
    """`up`'s answers to a failing head or node, shared storage, and a cluster that changes size."""
    up.add_argument(
        "--redis",
        metavar="HOST:PORT",
        help="a new local head keeps the cluster's state (GCS) in this Redis, so that the head can "
        "restart without losing its actors and jobs (Ray's GCS fault tolerance)",
    )
    up.add_argument(
        "--node-loss-wait",
        type=float,
        metavar="S",
        help="the longest a failed job is held while the service finds out whether one of its nodes "
        "died (it probes them; then it is requeued instead of failed). Default: as long as the "
        "cluster's own health checks may take to declare a node dead",
    )
    up.add_argument(
        "--shared-storage",
        action="append",
        default=[],
        metavar="PATH",
        help="a local path every node of the cluster mounts (NFS, a parallel file system): jobs may "
        "keep checkpoints under it; any other local path is one disk per node (repeatable)",
    )
    up.add_argument(
        "--autoscaler-config",
        metavar="FILE",
        help="the autoscaler's cluster config (Ray's cluster YAML: available_node_types with resources "
        "and max_workers): a job that fits once nodes are added waits for them, and the service asks "
        "the autoscaler for them. Default: the config of the autoscaler running on this machine, if any",
    )
    up.add_argument(
        "--grow-after",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds an elastic job runs at one size before it may grow into free room, so that a "
        "restart is paid back (default 120)",
    )
    up.add_argument(
        "--move-after",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a preemptible job runs before it may be moved (checkpointed and started again "
        "on another node) to make room for a job that free resources spread over nodes keep waiting; "
        "'inf' never moves jobs (default 600)",
    )


def parse_quotas(items: list[str]) -> dict[str, dict[str, float]]:
    quotas = {}
    for item in items:
        queue, _, spec = item.partition("=")
        try:
            quotas[queue.strip()] = {k.strip(): float(v) for k, v in (p.split(":") for p in spec.split(","))}
        except ValueError:
            raise UsageError(
                f"--quota {item}: expected QUEUE=RESOURCE:N[,RESOURCE:N], e.g. research=GPU:8"
            ) from None
        if not queue.strip() or not quotas[queue.strip()]:
            raise UsageError(f"--quota {item}: expected QUEUE=RESOURCE:N[,RESOURCE:N], e.g. research=GPU:8")
    return quotas


def handle_up(args) -> int:
    from orchestrator import client
    from orchestrator.ray import cluster
    from orchestrator.service.actor import ServiceActor, service_options

    started = time.perf_counter()
    recorded = cluster.read_state() or {}
    address = args.address or os.environ.get("RAY_ADDRESS") or recorded.get("address")
    state = {"address": address, "started_head": False}
    if address and address == recorded.get("address"):
        state = dict(recorded)  # a head an earlier `up` started stays ours to stop on `down`
    quotas, queues, autoscaler = _up_settings(args)
    if address and args.redis:
        raise UsageError(
            f"--redis: the cluster at {address} is already running; GCS fault tolerance is set "
            "when its head starts (RAY_REDIS_ADDRESS on the head, see docs/cluster.md)"
        )
    if address:
        address = cluster.driver_address(address)
    else:
        state = local_head.start(args)
        address = state["address"]
        print(f"started a local Ray head: {address}", flush=True)
    store = args.store or recorded.get("store") or str(cluster.home() / "store")
    if "://" not in store:
        store = os.path.abspath(os.path.expanduser(store))
    with cluster.connect(address):
        dashboard = state.get("dashboard") or cluster.connected.get("dashboard")
        if not dashboard:
            raise cluster.ClusterError(
                f"the Ray cluster at {address} has no dashboard: the service starts jobs "
                "through its Jobs API; start the head with --include-dashboard=true"
            )
        existing = client.find()
        config = _service_config(args, store, dashboard, quotas, autoscaler)
        if existing is None:
            wait_for_free_store(store)
            if queues is not None:  # the new service applies what its store holds
                from orchestrator.service.store import Store

                Store(store).save_queues(queues.model_dump(mode="json"))
        service = existing or ServiceActor.options(**service_options()).remote(config)
        if existing is not None and queues is not None:  # a running service takes the file too
            try:
                client.call(service.set_queues, queues)
            except client.ServiceError as err:
                raise UsageError(f"--queues {args.queues}: {err}") from None
        info = client.call(service.info, retries=30)
        scrape_token = client.call(service.scrape_token)  # a viewer's, for Prometheus
        ray_temp_dir = state.get("temp_dir") or cluster.connected_temp_dir()
    cluster.write_state(
        {
            **recorded,
            **state,
            "address": address,
            "dashboard": dashboard,
            "store": info["store"],
            "status_page": info.get("status_page"),
        }
    )
    from orchestrator.ray.origin import remember

    remember(os.getcwd())  # where jobs are likely submitted from (for `ray job submit`)
    verb = "already running" if existing else "up"
    print(
        f"orchestrator service {verb} (generation {info['generation']}, {info['nodes']} node(s)) "
        f"in {time.perf_counter() - started:.1f} s"
    )
    _print_service(info, address, dashboard, ray_temp_dir, scrape_token)
    return 0


def _up_settings(args) -> tuple:
    """`up`'s options checked before anything starts: (quotas, the queue configuration or None,
    the autoscaler's config or None). Bad ones raise UsageError (or SpecError for --queues)."""
    for flag, value in (
        ("--node-loss-wait", args.node_loss_wait),
        ("--grow-after", args.grow_after),
        ("--move-after", args.move_after),
    ):
        if value is not None and not value >= 0:  # NaN too
            raise UsageError(f"{flag} {value:g}: must be 0 or more seconds")
    quotas, queues = parse_quotas(args.quota), None
    if args.queues:  # SpecError: one line per problem, exit 2, before anything starts
        from core.queues import load_queue_config

        queues = load_queue_config(args.queues)
        both = sorted(quotas.keys() & queues.queues.keys())
        if both:
            raise UsageError(f"--queues {args.queues}: queue(s) {', '.join(both)} also have a --quota")
    autoscaler = None
    if args.autoscaler_config:
        from orchestrator.ray.autoscaler import ConfigError, load_config

        try:
            autoscaler = load_config(args.autoscaler_config)
        except ConfigError as err:
            raise UsageError(f"--autoscaler-config {err}") from None
    return quotas, queues, autoscaler


def _service_config(args, store: str, dashboard: str, quotas: dict, autoscaler) -> dict:
    """The configuration a new service actor starts with."""
    return {
        "store": store,
        "dashboard": dashboard,
        "quotas": quotas,
        "backfill": not args.no_backfill,
        "preemption": not args.no_preemption,
        "start_deadline_s": args.start_deadline,
        "node_loss_wait_s": args.node_loss_wait,
        "shared_storage": [os.path.abspath(os.path.expanduser(p)) for p in args.shared_storage],
        "grow_after_s": args.grow_after,
        "move_after_s": args.move_after,
        "autoscaler": autoscaler,
        "web_host": args.metrics_host,
        "web_port": args.metrics_port,
        "single_user": not args.require_login,
    }


def _print_service(
    info: dict, address: str, dashboard: str, ray_temp_dir: str | None, scrape_token: str
) -> None:
    """`up`'s lines after the first: where the cluster, its pages and the job store are."""
    from orchestrator.ray import cluster

    print(f"  cluster:   {address}")
    print(f"  dashboard: {dashboard}")
    token = cluster.token_source() if cluster.use_token_if_available() else None
    if token:  # Ray's dashboard asks for it once, then keeps it in a cookie
        print(f"             it asks for the cluster's token once: paste the one in {token}")
    print(f"  job store: {info['store']}")
    if info.get("shared_storage"):
        print(f"  shared:    {', '.join(info['shared_storage'])}   (checkpoints may go there)")
    if info.get("health_checks"):  # node loss does not wait on them: the service probes the nodes
        print(f"  health:    {info['health_checks']}")
    if info.get("status_page"):
        print(f"  status:    {info['status_page']}   (Prometheus: {info['status_page'].rstrip('/')}/metrics)")
        config = write_prometheus_config(info["status_page"], ray_temp_dir, scrape_token)
        print(f"  prometheus --config.file={config}   (scrapes the service and Ray's own metrics)")
    print("  submit a job with: orchestrator submit jobs/vit.yaml")


def write_prometheus_config(status_page: str, ray_temp_dir: str | None, scrape_token: str) -> str:
    """A Prometheus config for this cluster, beside the CLI's state: the service's endpoint
    with the read-only token it is scraped with (in a file of its own, mode 0600, which
    Prometheus reads at each scrape: the next `up` rotates it in place), and the service
    discovery file of Ray's head (under the temp dir it was started with)."""
    from urllib.parse import urlparse

    from orchestrator.monitoring.prometheus_config import (
        DEFAULT_DISCOVERY,
        DISCOVERY_FILE,
        prometheus_config,
    )
    from orchestrator.ray import cluster

    page = urlparse(status_page)
    discovery = os.path.join(ray_temp_dir, DISCOVERY_FILE) if ray_temp_dir else DEFAULT_DISCOVERY
    path = cluster.home() / "prometheus.yml"
    credentials = cluster.home() / "prometheus.token"
    credentials.unlink(missing_ok=True)
    fd = os.open(credentials, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    with os.fdopen(fd, "w") as out:
        out.write(scrape_token + "\n")
    note = f"this cluster's: {ray_temp_dir or '/tmp/ray'}"
    target = f"{page.hostname}:{page.port}"
    path.write_text(prometheus_config(target, discovery, str(path), note, credentials_file=str(credentials)))
    return str(path)


def wait_for_free_store(uri: str) -> None:
    """A service that died with its head holds the job store's lease until it lapses (15 s):
    wait that out instead of failing. One that keeps renewing it runs elsewhere: refuse."""
    from orchestrator.service.store import LEASE_TTL_S, Store

    store, told = Store(uri), False
    deadline = time.time() + LEASE_TTL_S + 5  # a live service renews it every pass
    while (lease := store.read_lease()) and (age := time.time() - lease["renewed_at"]) < LEASE_TTL_S:
        if time.time() > deadline:
            raise UsageError(
                f"the job store {uri} is in use by another orchestrator service (generation "
                f"{lease['generation']}, on another cluster): run `orchestrator down` there first"
            )
        if not told:
            print(
                f"the job store's last service renewed it {age:.0f} s ago (its cluster may have died); "
                f"waiting up to {LEASE_TTL_S - age:.0f} s for its lease to lapse",
                flush=True,
            )
            told = True
        time.sleep(1.0)


def handle_down(args) -> int:
    import ray

    from orchestrator import client
    from orchestrator.ray import cluster

    state = cluster.read_state() or {}
    address = args.address or state.get("address")
    if not address:
        print("no orchestrator service recorded on this machine (nothing to stop)")
        return 0
    stopped_service = False
    try:
        with cluster.connect(address):
            service = client.find()
            if service is not None:
                client.call(service.shutdown, retries=3)
                ray.kill(service, no_restart=True)
                stopped_service = True
    except cluster.ClusterError as err:
        if not state.get("started_head"):
            raise
        print(f"note: {err}")
    print("orchestrator service stopped" if stopped_service else "no orchestrator service was running")
    if state.get("started_head") and not args.address:
        count = local_head.stop(state["temp_dir"], gcs_port=int(state["address"].rsplit(":", 1)[1]))
        print(f"stopped the local Ray head ({count} processes)")
    if not args.address or args.address == state.get("address"):
        cluster.clear_state()
    return 0
