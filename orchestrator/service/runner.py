"""Starting, watching and stopping the attempt controllers that run the queue's jobs.

Each attempt of a job runs in one process, its attempt controller
(`orchestrator/attempt/controller.py`): a detached actor named `<id>-a<attempt>` in the service's
namespace, on the job's own node (the one with most of its workers), so the head pays for none
of a job's control and a job's control shares its nodes' fate; a job of replica groups has it on
the head, since it outlives the loss of any one group's node. Ray refuses a second live actor
of one name, so an attempt cannot start twice, whichever service tries.

Its working_dir is the job's package in the store (the project directory the job was submitted
from, zipped, with its spec), uploaded to the cluster once by its hash, the way Ray Jobs uploads
a working_dir (a package in a store elsewhere, s3:// or gs://, is copied to a local file on the
head first; a job queued before packages were zips has a directory, which Ray zips). Ray's
dashboard lists each controller among its actors, by name, with its log; `orchestrator logs ID`
reads them.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import shutil
import tempfile
from collections.abc import Iterator

from core import storage
from orchestrator.client import NAMESPACE, attempt_name
from orchestrator.ray.launcher import driver_node, head_node_id
from orchestrator.service.store import SPEC_IN_PACKAGE

log = logging.getLogger("orchestrator.service")

RUNNING = "RUNNING"  # an attempt controller the cluster has, starting or running


@contextlib.contextmanager
def local_copy(package_uri: str) -> Iterator[str]:
    """The package as a local zip file (or directory) for as long as Ray takes to upload it:
    itself in a local store, else a temporary copy."""
    if storage.is_local(package_uri):
        yield storage.resolve(package_uri)[1]
        return
    with tempfile.TemporaryDirectory(prefix="orchestrator-package-") as local:
        if package_uri.partition("?")[0].endswith(".zip"):
            target = posixpath.join(local, "package.zip")
            fs, path = storage.resolve(package_uri)
            with fs.open_input_stream(path) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            yield target
        else:
            storage.download(package_uri, local)
            yield local


class AttemptRunner:
    """The attempt controllers of the cluster the service runs on."""

    def __init__(self, dashboard: str):
        self.dashboard = dashboard
        self._client = None

    @property
    def client(self):
        """Ray Jobs' client of the dashboard: what uploads a working_dir to the cluster."""
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.dashboard)
        return self._client

    def upload(self, package_uri: str) -> str:
        """The package's URI in the cluster (gcs://...), uploaded unless Ray has it already.
        Ray uploads a local working_dir for a driver or a Ray Job only; this is Ray Jobs'
        client's own upload, through the dashboard with the cluster's token."""
        from orchestrator.ray.internals import upload_working_dir

        with local_copy(package_uri) as working_dir:
            return upload_working_dir(self.client, working_dir)

    def launch(
        self, job_id: str, attempt: int, package_uri: str, placement: dict[str, int], groups: int = 1
    ) -> tuple[str, str | None]:
        """Start the controller of `job_id`'s attempt on its `placement`; returns its name and
        node. A job of replica groups has its controller on the head: it outlives any one group's
        node, as the job does."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from orchestrator.attempt.controller import AttemptControllerActor

        name = attempt_name(job_id, attempt)
        options = dict(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",  # it outlives a restart of the service, as a Ray Job did
            runtime_env={"working_dir": self.upload(package_uri)},
        )
        node = driver_node(placement) if groups == 1 else head_node_id()
        if node:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        try:
            controller = AttemptControllerActor.options(**options).remote()
        except ValueError as err:  # the name is taken: an earlier service started it
            if "already taken" not in str(err) and "already exists" not in str(err):
                raise
            log.warning("%s was already started (by an earlier service)", name)
            return name, node
        controller.run.remote(SPEC_IN_PACKAGE, job_id)
        return name, node

    def stop(self, name: str) -> None:
        """End the attempt's controller now, and its run with it."""
        import ray

        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        except ValueError:  # no such controller: gone already
            pass

    def statuses(self) -> dict[str, str]:
        """Every attempt controller the cluster has (starting or running), by name, in one call."""
        import ray

        return {
            a["name"]: RUNNING
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and "-a" in a["name"]
        }
