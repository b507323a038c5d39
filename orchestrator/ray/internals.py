"""Every use of Ray's private surface, in one place, each with why no public API serves.

The rest of the project uses Ray's public APIs only (tests/test_ray_internals.py checks the
source for private imports anywhere else). Each private symbol used here is listed in `USES`
with its kind (class, method, coroutine, ...) and the parameters relied on; the contract test
checks every entry against the installed Ray and fails with one line naming the symbol and
Ray's version. pyproject.toml pins Ray to the range that test ran on (`RAY_RANGE`); moving to
the next Ray is: change the pin, run tests/test_ray_internals.py, fix this module
(docs/ray.md, Upgrading Ray).

Nothing here imports a private module at import time: the CLI and the service load this
module without loading Ray Train.
"""

from __future__ import annotations

import functools
import os

from core import private_api
from core.private_api import Private

RAY_RANGE = ">=2.60,<2.61"  # as in pyproject.toml; the range the contract test ran on

# Ray's logger of token authentication: a new local cluster uses token auth (Ray's default),
# and says so at every start; the CLI silences it there. Ray's loggers have no public names.
AUTH_LOGGER = "ray._private.authentication"

# The autoscaler's monitor process runs this script with `--autoscaling-config=PATH`: the
# service reads the node types from that file (Ray keeps no copy a process can read).
AUTOSCALER_MONITOR_SCRIPT = "autoscaler/_private/monitor.py"


TRAIN = "ray.train.v2._internal"
USES: tuple[Private, ...] = (
    # -- the cluster ----------------------------------------------------------------------------
    Private(
        "ray._private.state:GlobalState.get_draining_nodes",
        "method",
        ("self",),
        "the nodes being drained (ray drain-node, the autoscaler); Ray Train reads the same table",
    ),
    Private("ray._private.state:state", "attribute", None, "the GlobalState of this process"),
    Private(
        "ray._raylet:AuthenticationTokenLoader.instance",
        "attribute",
        None,
        "whether a token is at hand where Ray's clients look; no public call says",
    ),
    Private("ray._raylet:Config.initialize", "attribute", None, "re-read RAY_AUTH_MODE after setting it"),
    Private("ray._raylet:Config.health_check_period_ms", "attribute", None, "the head's health checks"),
    Private("ray._raylet:Config.health_check_timeout_ms", "attribute", None, "the head's health checks"),
    Private("ray._raylet:Config.health_check_failure_threshold", "attribute", None, "(as above)"),
    Private("ray._raylet:Config.health_check_initial_delay_ms", "attribute", None, "(as above)"),
    Private(
        "ray._raylet:GcsClient",
        "class",
        None,
        "one request that tells a refused token in milliseconds (ray.init retries for 20 s)",
    ),
    Private("ray._raylet:InnerGcsClient.internal_kv_get", "attribute", None, "(GcsClient's, as above)"),
    Private(
        "ray._raylet:PlacementGroupID.from_hex",
        "attribute",
        None,
        "a placement group from the id the public table gives; the public handle needs a name",
    ),
    Private(AUTH_LOGGER, "module", None, "its logger, silenced for a local cluster"),
    Private(AUTOSCALER_MONITOR_SCRIPT, "file", None, "found in the monitor's command line"),
    # -- packages ------------------------------------------------------------------------------
    Private(
        "ray.job_submission:JobSubmissionClient._upload_working_dir_if_needed",
        "method",
        ("self", "runtime_env"),
        "uploads a working_dir for an actor the service starts (Ray uploads one for a driver only)",
    ),
    Private(
        "ray._private.runtime_env.working_dir:upload_working_dir_if_needed",
        "function",
        ("runtime_env", "include_gitignore", "scratch_dir", "logger", "upload_fn"),
        "the package URI Ray gives a directory, computed without uploading (where a Ray Job came from)",
    ),
    Private(
        "ray.autoscaler._private.util:validate_config",
        "function",
        ("config",),
        "an autoscaler config checked as `ray up` checks it (deploy/'s files, in tests)",
    ),
    Private("ray.autoscaler._private.util:prepare_config", "function", ("config",), "(as above)"),
    # -- Ray Train: a run without the parts the product does without (`lean_trainer`) ---------------
    Private(
        "ray.train.v2.api.data_parallel_trainer:DataParallelTrainer._create_default_callbacks",
        "method",
        ("self",),
        "no switch turns off the PlacementGroupCleaner or the DatasetsCallback",
    ),
    Private(
        "ray.train.v2.api.data_parallel_trainer:DataParallelTrainer._initialize_and_run_controller",
        "method",
        ("self", "controller_init_kwargs"),
        "no switch runs the controller loop in the calling process instead of an actor of its own",
    ),
    Private(f"{TRAIN}.callbacks.datasets:DatasetsCallback", "class", None, "filtered out (above)"),
    Private(
        f"{TRAIN}.callbacks.placement_group_callback:PlacementGroupCleanerCallback",
        "class",
        None,
        "filtered out (above)",
    ),
    Private(
        f"{TRAIN}.execution.scaling_policy:FixedScalingPolicy",
        "class",
        None,
        "its requests to the autoscaler replace the service's standing request: overridden",
    ),
    Private(
        f"{TRAIN}.execution.scaling_policy:FixedScalingPolicy.after_controller_start",
        "method",
        ("self", "train_run_context"),
        "(as above)",
    ),
    Private(
        f"{TRAIN}.execution.scaling_policy:FixedScalingPolicy._maybe_send_resource_request",
        "method",
        ("self",),
        "(as above)",
    ),
    Private(
        f"{TRAIN}.execution.scaling_policy:FixedScalingPolicy._cancel_resource_request",
        "method",
        ("self",),
        "(as above)",
    ),
    Private(
        f"{TRAIN}.execution.controller:TrainController",
        "class",
        (
            "self",
            "train_fn_ref",
            "train_run_context",
            "scaling_policy",
            "failure_policy",
            "callbacks",
            "validation_config",
        ),
        "run in this process (`run_controller_here`)",
    ),
    Private(f"{TRAIN}.execution.controller:TrainController.run", "coroutine", ("self",), "(as above)"),
    Private(
        f"{TRAIN}.execution.worker_group.worker_group:SynchronizationActor",
        "attribute",  # an actor class: `.options(...).remote(...)` is what the module calls
        None,
        "no switch starts a worker group without it (`without_synchronization_actor`)",
    ),
    Private(
        f"{TRAIN}.execution.worker_group.state:_shutdown_sync_actor",
        "function",
        ("sync_actor",),
        "(as above): the stand-in outlives the worker group",
    ),
    Private(f"{TRAIN}.execution.controller:TrainController.get_result", "method", ("self",), "(as above)"),
    Private(
        f"{TRAIN}.util:TrainingFramework.TORCH",
        "attribute",
        None,
        "Ray Train's run table labels a run's framework by this enum alone",
    ),
)


def problem(use: Private) -> str | None:
    """None when `use` holds on the installed Ray, else one line naming it and Ray's version."""
    return private_api.problem(use, "ray")


# -- the cluster -------------------------------------------------------------------------------


def draining_nodes() -> set[str]:
    """Ids of the nodes Ray is draining."""
    import ray._private.state

    return set(ray._private.state.state.get_draining_nodes())


def token_at_hand() -> bool:
    """Whether a Ray auth token is where Ray's clients look, whatever RAY_AUTH_MODE says;
    raises Ray's AuthenticationError when a configured token path cannot be read."""
    from ray._raylet import AuthenticationTokenLoader

    return AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)


def reload_config() -> None:
    """Ray caches its config: re-read it after the environment changed (RAY_AUTH_MODE)."""
    from ray._raylet import Config

    Config.initialize("")


def ask_gcs(address: str, timeout: float = 5.0) -> None:
    """One request to the GCS at host:port with this process's token; raises what Ray raises
    (an AuthenticationError for a refused token)."""
    from ray._raylet import GcsClient

    GcsClient(address=address).internal_kv_get(b"orchestrator-token-check", None, timeout=timeout)


def health_check_settings(names: tuple[str, ...]) -> dict[str, float]:
    """RAY_health_check_<name> as this process's Ray config has them."""
    from ray._raylet import Config

    return {name: float(getattr(Config, f"health_check_{name}")()) for name in names}


def remove_placement_group(pg_id: str) -> None:
    """Remove the placement group of id `pg_id` (hex, as `placement_group_table` lists it)."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(pg_id)))


def validate_autoscaler_config(config: dict) -> dict:
    """An autoscaler (cluster launcher) config, checked and filled in as `ray up` does."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(config)
    validate_config(prepared)
    return prepared


# -- packages ------------------------------------------------------------------------------------


def upload_working_dir(client, path: str) -> str:
    """The URI (gcs://_ray_pkg_<hash>.zip) of `path` (a zip file or a directory) in the
    cluster of the Jobs API `client`, uploaded unless the cluster has it already."""
    runtime_env = {"working_dir": path}
    client._upload_working_dir_if_needed(runtime_env)
    return runtime_env["working_dir"]


def package_uri(directory: str) -> str:
    """The URI Ray gives the package of `directory`, computed as `ray job submit` does (with
    Ray's own excludes and its gitignore setting); nothing is uploaded."""
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    include_gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    runtime_env = upload_working_dir_if_needed(
        {"working_dir": directory}, include_gitignore=include_gitignore, upload_fn=lambda *a, **k: None
    )
    return runtime_env["working_dir"]


# -- Ray Train -----------------------------------------------------------------------------------


def torch_framework():
    """Ray Train's label of a torch run (its run table and dashboard show it)."""
    from ray.train.v2._internal.util import TrainingFramework

    return TrainingFramework.TORCH


@functools.cache
def lean_trainer() -> type:
    """Ray Train's `DataParallelTrainer` less five things it starts for every run that the
    product does without (docs/ray.md, Start-up; tests/test_service.py checks none runs):

    - the PlacementGroupCleaner, a detached actor pinned to the head (100-300 MiB there per
      running job) that removes a run's placement groups if its controller dies: here the
      attempt controller runs Ray Train's controller, and Ray removes the groups with it;
    - the requests of its scaling policy to the autoscaler, through a detached coordinator
      actor that replaces the one standing request the service keeps for its queue;
    - the DatasetManager, an actor per run (~200 MiB) for Ray Data datasets, which no run
      passes: the workers read their data themselves;
    - the TrainController actor (~250 MiB, ~1 s of the start): its loop runs in the process
      that calls `fit()` instead (`run_controller_here`);
    - the SynchronizationActor of each worker group (~110 MiB): the workers call none of the
      barriers it serves (`without_synchronization_actor`).
    """
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    class FixedSizeWithoutAutoscalerRequests(FixedScalingPolicy):
        def after_controller_start(self, train_run_context) -> None:
            pass

        def _maybe_send_resource_request(self) -> None:
            pass

        def _cancel_resource_request(self) -> None:
            pass

    class LeanTrainer(DataParallelTrainer):
        def _create_default_callbacks(self):
            defaults = super()._create_default_callbacks()
            unused = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
            return [c for c in defaults if not isinstance(c, unused)]

        def _initialize_and_run_controller(self, **controller_init_kwargs):
            controller_init_kwargs["scaling_policy"] = FixedSizeWithoutAutoscalerRequests(self.scaling_config)
            return run_controller_here(controller_init_kwargs)

    return LeanTrainer


def run_controller_here(controller_init_kwargs: dict):
    """Ray Train's controller loop in this process, where `fit()` would start it as an actor
    of its own and block on it: the same loop, states and result, one process less."""
    import asyncio

    from ray.train.v2._internal.execution.controller import TrainController

    without_synchronization_actor()
    controller = TrainController(**controller_init_kwargs)
    asyncio.run(controller.run())
    return controller.get_result()


def without_synchronization_actor() -> None:
    """Ray Train starts a SynchronizationActor with each worker group (a process, ~110 MiB on
    the job's node) for the barriers of `ray.train.report` and its collectives, which the
    product's workers never call (they upload their checkpoints themselves and talk to the
    attempt's controller: `workers/ray_context.py`). In this process, which runs one run, the
    worker groups get the calling actor's handle in its place (a stray barrier call fails
    loudly there: it has no such method), and a worker group's end leaves that actor be."""
    import ray
    from ray.train.v2._internal.execution.worker_group import state, worker_group

    me = ray.get_runtime_context().current_actor

    class StandIn:
        @staticmethod
        def options(**_options):
            return StandIn

        @staticmethod
        def remote(**_arguments):
            return me

    worker_group.SynchronizationActor = StandIn
    state._shutdown_sync_actor = lambda sync_actor: None
