"""A job as `orchestrator submit` sends it over HTTP: the spec file's text, the `--set`
overrides and where the user stood. The service reads it as the CLI reads a spec (the schema,
the data plane's registries, the storage check), so the CLI's quick path loads neither
pydantic nor the schema: on a head whose cores training fills, every import the CLI makes
costs it seconds (docs/scaling.md). Kubernetes' API server and SkyPilot's do the same.

The other ways in (the actor, a driver) validate where they run and share `queue_items`,
`storage_problem` and `resume_note` with this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from core import storage
from core.run_folder import checkpoint_step, checkpoints, run_name, run_uri
from core.spec import JobSpec, SpecError, load_spec_text
from core.spec import sweep as sweeps


@dataclass(frozen=True)
class SentSpec:
    path: str  # as the user named the file: errors name it so
    text: str
    overrides: tuple[str, ...]
    cwd: str  # where a relative checkpoint.storage is meant ("": not known)
    home: str  # what ~ means to the user
    check_storage: bool = True  # False: storage only the job's nodes reach; the attempt checks it

    @classmethod
    def from_body(cls, body: object) -> SentSpec:
        """From the request's JSON, or ValueError with one line."""
        fields = ("path", "text", "cwd", "home")
        if not isinstance(body, dict) or not all(isinstance(body.get(k), str) for k in fields):
            raise ValueError("spec_file must be {path, text, overrides, cwd, home}, each a string")
        overrides = body.get("overrides") or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ValueError("spec_file.overrides must be a list of KEY=VALUE strings")
        check_storage = body.get("check_storage", True)
        if not isinstance(check_storage, bool):
            raise ValueError("spec_file.check_storage must be true or false")
        return cls(body["path"], body["text"], tuple(overrides), body["cwd"], body["home"], check_storage)

    def to_body(self) -> dict:
        fields = {"path": self.path, "text": self.text, "cwd": self.cwd, "home": self.home}
        return {**fields, "overrides": list(self.overrides), "check_storage": self.check_storage}


def read_sent(sent: SentSpec) -> JobSpec:
    """The spec, checked as `orchestrator validate` checks it, or SpecError."""
    return checked(load_spec_text(sent.text, sent.path, list(sent.overrides)), sent.path)


def checked(spec: JobSpec, source: str = "submitted spec") -> JobSpec:
    """`spec`, when its model and data are ones the data plane has; else SpecError."""
    from workers.checks import job_problems  # the data plane's model and data registries (no torch)

    problems = job_problems(spec)
    if problems:
        raise SpecError(problems, source)
    return spec


def queue_items(spec: JobSpec, cwd: str | None, home: str) -> tuple[list[JobSpec], list[dict]]:
    """The specs to queue (a sweep's trials, or the spec) with their options; relative storage
    made absolute as seen from `cwd`, where the user stood (None: not known, for the driver of
    a `ray job submit` from a directory this machine did not record: refused)."""
    if spec.sweep is not None:
        trials = sweeps.trials(spec)
        specs = [trial.spec for trial in trials]
        options = [
            {
                "job_id": trial.name,
                "sweep": spec.name,
                "sweep_params": trial.params,
                "sweep_metric": spec.sweep.metric,
                "sweep_mode": spec.sweep.mode,
                "sweep_max_concurrent": spec.sweep.max_concurrent,
            }
            for trial in trials
        ]
    else:
        specs, options = [spec], [{}]
    for job_spec in specs:
        job_spec.checkpoint.storage = storage.as_the_user_meant(job_spec.checkpoint.storage, cwd, home)
    return specs, options


def storage_problem(name: str, uri: str) -> str | None:
    """Why job `name` could not write its checkpoints to `uri`, in one line; None if it can."""
    try:
        storage.check_writable(uri)
    except OSError as err:
        return f"{name}: {str(err).splitlines()[0]}"
    return None


def resume_note(spec: JobSpec) -> str | None:
    """A run of this name has checkpoints: the job continues it (checkpoint.resume: auto)."""
    if spec.checkpoint.resume != "auto":
        return None
    run = run_name(spec)
    try:
        saved = checkpoints(run_uri(spec, run))
    except OSError:  # storage only the cluster reaches: the driver says it when it starts
        return None
    if not saved:
        return None
    return (
        f"resuming run {run}: its newest checkpoint is at step {checkpoint_step(saved[-1])} (the newest "
        "complete one is used); --set checkpoint.resume=never starts a new run"
    )
