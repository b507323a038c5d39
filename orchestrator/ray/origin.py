"""Where a `ray job submit` was run from, for a spec whose `checkpoint.storage` is relative.

Ray ships a job's working directory as a content-addressed package (`gcs://_ray_pkg_<hash>.zip`)
and runs the job in a temporary copy of it, which goes with the cluster: checkpoints written
there are lost. Ray keeps no record of the directory the package was made from. So the
directories this machine's `orchestrator up` and `orchestrator submit` ran in are recorded
(`cluster.json`), and one of them is taken as the origin only when its contents hash to the
very package the job runs from (Ray's own computation, with Ray's own excludes). Anything else,
a cluster on another machine, a directory changed since, has no known origin: the driver then
refuses the relative path instead of guessing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

KEEP = 8  # the newest project directories remembered


def remember(directory: str | Path) -> None:
    """Note a project directory a job may be submitted from (`up` and `submit` call this)."""
    from orchestrator.ray import cluster

    state = cluster.read_state()
    if state is None:
        return
    path = str(Path(directory).resolve())
    dirs = [path, *(d for d in state.get("project_dirs", []) if d != path)][:KEEP]
    if dirs != state.get("project_dirs"):
        cluster.write_state({**state, "project_dirs": dirs})


def own_package() -> str | None:
    """The package URI of this Ray Job's working_dir; None outside a Ray Job."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        working_dir = json.loads(raw).get("runtime_env", {}).get("working_dir")
    except (ValueError, AttributeError):
        return None
    return working_dir if isinstance(working_dir, str) else None


def package_of(directory: str) -> str:
    """The URI Ray gives the package of `directory`, computed as `ray job submit` does; nothing
    is uploaded."""
    from orchestrator.ray.internals import package_uri

    return package_uri(directory)


def submitted_from() -> str | None:
    """The recorded project directory this Ray Job's package was made from, or None."""
    from orchestrator.ray import cluster

    package = own_package()
    if package is None:
        return None
    for directory in (cluster.read_state() or {}).get("project_dirs", []):
        if os.path.isdir(directory) and package_of(directory) == package:
            return directory
    return None
