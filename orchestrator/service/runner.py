"""Starting, watching and stopping the Ray Jobs that run the queue's jobs.

Each attempt of a job runs as one Ray Job (so Ray's dashboard shows it, with its logs) whose
entrypoint is the ordinary driver, `orchestrator run`, attached to the queue's record:

    orchestrator run .orchestrator/job.json --job-id <id>

Its working_dir is the job's package in the store (the project directory the job was
submitted from, zipped, with its spec), and its submission id is `<id>-a<attempt>`: Ray
refuses a second Ray Job with the same id, so an attempt can never start twice, whichever
service tries. Ray takes a working_dir as a local zip file (which it uploads to the cluster
once, by its hash); a package in a store elsewhere (s3://, gs://) is copied to a local file
on the head first. (A job queued before packages were zips has a directory: Ray zips that.)

The driver runs on the job's own node (the one with most of its workers), not on the head: Ray
Train's controller and its actors follow their driver, so the head pays for none of a job's
control processes, and a job's control shares its nodes' fate. A driver started here runs
one attempt: the next admission starts a new one, on the nodes of that admission.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import shlex
import shutil
import tempfile
from collections.abc import Iterator

from core import storage
from orchestrator.ray.launcher import NODE_ID_LABEL, driver_node
from orchestrator.service.store import SPEC_IN_PACKAGE

log = logging.getLogger("orchestrator.service")


def submission_id(job_id: str, attempt: int) -> str:
    return f"{job_id}-a{attempt}"


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


def driver_node_selector(placement: dict[str, int]) -> dict[str, str] | None:
    node = driver_node(placement)
    return {NODE_ID_LABEL: node} if node else None


class JobRunner:
    """The Ray Jobs API of the cluster the service runs on."""

    def __init__(self, dashboard: str):
        self.dashboard = dashboard
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = JobSubmissionClient(self.dashboard)
        return self._client

    def launch(
        self, job_id: str, attempt: int, package_uri: str, metadata: dict, placement: dict[str, int]
    ) -> str:
        """Start the driver of `job_id`'s attempt on its `placement`; returns its submission id."""
        sid = submission_id(job_id, attempt)
        entrypoint = shlex.join(["orchestrator", "run", SPEC_IN_PACKAGE, "--job-id", job_id])
        with local_copy(package_uri) as working_dir:
            try:
                self.client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=sid,
                    runtime_env={"working_dir": working_dir},
                    entrypoint_label_selector=driver_node_selector(placement),
                    metadata={"orchestrator_job": job_id, **{k: str(v) for k, v in metadata.items()}},
                )
            except Exception as err:
                if "already exists" not in str(err):
                    raise
                log.warning("%s was already started (by an earlier service)", sid)
        return sid

    def status(self, sid: str) -> str | None:
        """RUNNING, PENDING, SUCCEEDED, ...; None when Ray does not know the submission."""
        try:
            return str(getattr(self.client.get_job_status(sid), "value", ""))
        except Exception as err:
            if "does not exist" in str(err) or "not found" in str(err).lower():
                return None
            raise

    def stop(self, sid: str) -> None:
        """SIGTERM to the driver, SIGKILL a few seconds later (Ray's own stop)."""
        try:
            self.client.stop_job(sid)
        except Exception as err:
            if "does not exist" not in str(err):
                raise

    def statuses(self) -> dict[str, str]:
        """Every submission Ray knows, with its status (one call)."""
        return {
            j.submission_id: str(getattr(j.status, "value", j.status))
            for j in self.client.list_jobs()
            if j.submission_id
        }
