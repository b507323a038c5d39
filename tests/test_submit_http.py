"""`orchestrator submit` over the service's HTTP API, the quick path: the CLI sends the spec
file's text, the overrides and its directories; the service (the real class, without Ray:
tests/tenant_harness.py, on its own page) reads and checks it as `validate` does. The CLI
loads no schema for it, a bad spec is still its lines and exit 2 with nothing queued, and the
project's zip is made again only when a file changed."""

import json
import os
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from orchestrator.monitoring.page_view import data_plane_modules
from orchestrator.project_package import cached_project_zip, zip_project
from tests.tenant_harness import RAY_TOKEN, start_service

ROOT = Path(__file__).resolve().parents[1]
SPEC = str(ROOT / "jobs" / "convnet.yaml")

# the CLI as a user runs it, reporting afterwards which heavy modules it loaded
PROBE = """
import json, sys
from orchestrator.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as done:
    code = done.code
heavy = ("pydantic", "core.spec", "yaml", "pyarrow", "numpy", "ray", "torch", "asyncio")
with open(sys.argv[1], "w") as out:
    json.dump(sorted(m for m in heavy if m in sys.modules), out)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def rayless_service(tmp_path_factory):
    svc = start_service(str(tmp_path_factory.mktemp("store")))
    try:
        yield svc
    finally:
        svc.shutdown()


def submit(
    service, tmp_path: Path, *args: str, token: str | None = None
) -> tuple[subprocess.CompletedProcess, list]:
    """`orchestrator submit ARGS` from `tmp_path`, with a user's `token`, else this machine's
    Ray token (the cluster's admin)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ORCHESTRATOR_HOME": str(tmp_path / "home"),
        "ORCHESTRATOR_URL": service.page_url,
        "RAY_AUTH_TOKEN": RAY_TOKEN,
    }
    env.pop("ORCHESTRATOR_TOKEN", None)
    if token:
        env["ORCHESTRATOR_TOKEN"] = token
    loaded = tmp_path / "loaded.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(loaded), "submit", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, json.loads(loaded.read_text())


def test_the_service_reads_the_spec_from_where_the_user_stood_and_the_cli_loads_no_schema(
    rayless_service, tmp_path
):
    overrides = ("--set", "checkpoint.storage=rel-runs", "--set", "name=quick", "--set", "train.steps=17")
    done, loaded = submit(rayless_service, tmp_path, SPEC, *overrides)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[0]
    assert loaded == []  # neither pydantic, the schema, yaml, pyarrow, Ray nor torch
    job = rayless_service.jobs[job_id]
    # relative storage is where the user's shell was, not where the service runs
    assert job.spec.checkpoint.storage == str(tmp_path / "rel-runs")
    assert (tmp_path / "rel-runs").is_dir()  # the service checked it is writable
    assert (job.spec.name, job.spec.train.steps, job.spec.model.preset) == ("quick", 17, "convnet_small")
    with zipfile.ZipFile(BytesIO(Path(job.package).read_bytes())) as package:
        assert "jobs/convnet.yaml" in package.namelist() and ".orchestrator/job.json" in package.namelist()
    # a second submission of a run with a checkpoint says it resumes it
    (tmp_path / "rel-runs" / "quick" / "checkpoint_00000040").mkdir(parents=True)
    again, _ = submit(rayless_service, tmp_path, SPEC, *overrides)
    assert again.returncode == 0, again.stderr
    assert "resuming run quick: its newest checkpoint is at step 40" in again.stderr
    assert len(list((tmp_path / "home" / "packages").glob("*.zip"))) == 1  # zipped once


def test_a_bad_spec_is_each_of_its_lines_and_exit_2_and_queues_nothing(rayless_service, tmp_path):
    before = set(rayless_service.jobs)
    done, _ = submit(rayless_service, tmp_path, SPEC, "--set", "train.steps=-1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: {SPEC}: train.steps: -1 is out of range; allowed: 1 to 1000000000"
    two, _ = submit(rayless_service, tmp_path, SPEC, "--set", "train.steps=-1", "--set", "optimizer.lr=fast")
    lines = two.stderr.strip().splitlines()
    assert two.returncode == 2 and len(lines) == 2 and all(line.startswith("error: ") for line in lines)
    assert any("train.steps" in line for line in lines) and any("optimizer.lr" in line for line in lines)
    nowhere, _ = submit(rayless_service, tmp_path, SPEC, "--working-dir", str(tmp_path / "no-such-dir"))
    assert nowhere.returncode == 2 and nowhere.stderr.strip().endswith("no-such-dir: not a directory")
    unwritable = tmp_path / "read-only"
    unwritable.write_text("a file, not a folder")
    storage, _ = submit(rayless_service, tmp_path, SPEC, "--set", f"checkpoint.storage={unwritable}")
    assert storage.returncode == 2 and "is not writable" in storage.stderr, storage.stderr
    assert set(rayless_service.jobs) == before


def test_a_caller_refused_the_queue_changes_nothing_not_even_the_storage_it_names(rayless_service, tmp_path):
    from tests.tenant_harness import add_team_users

    ann = add_team_users(rayless_service)["ann"]  # of team vision: nlp-gpu is not hers
    before = set(rayless_service.jobs)
    storage = tmp_path / "never-made"
    theirs, _ = submit(
        rayless_service,
        tmp_path,
        SPEC,
        "--set",
        "scheduling.queue=nlp-gpu",
        "--set",
        f"checkpoint.storage={storage}",
        token=ann,
    )
    assert theirs.returncode == 2 and "nlp-gpu" in theirs.stderr and "Traceback" not in theirs.stderr
    assert not storage.exists() and set(rayless_service.jobs) == before
    ours, _ = submit(
        rayless_service,
        tmp_path,
        SPEC,
        "--set",
        "scheduling.queue=vision-gpu",
        "--set",
        f"checkpoint.storage={storage}",
        token=ann,
    )
    assert ours.returncode == 0, ours.stderr
    job = rayless_service.jobs[ours.stdout.split()[0]]
    assert (job.user, job.team, job.queue) == ("ann", "vision", "vision-gpu") and storage.is_dir()


def test_the_project_is_zipped_again_only_when_one_of_its_files_changes(tmp_path):
    project, cache = tmp_path / "project", tmp_path / "cache"
    (project / "pkg").mkdir(parents=True)
    code = project / "pkg" / "code.py"
    code.write_text("x = 1\n")
    first = cached_project_zip(project, cache)
    assert first == zip_project(project) and len(list(cache.glob("*.zip"))) == 1
    assert cached_project_zip(project, cache) == first  # from the cache
    code.write_text("x = 22\n")  # another size: a new package
    changed = cached_project_zip(project, cache)
    with zipfile.ZipFile(BytesIO(changed)) as package:
        assert package.read("pkg/code.py") == b"x = 22\n"
    (project / "pkg" / "more.py").write_text("y = 2\n")  # a new file: a new package
    with zipfile.ZipFile(BytesIO(cached_project_zip(project, cache))) as package:
        assert sorted(package.namelist()) == ["pkg/code.py", "pkg/more.py"]
    assert len(list(cache.glob("*.zip"))) == 3


def test_reading_a_sent_spec_loads_no_training_code_into_the_service():
    """The service reads specs sent over HTTP with the data plane's catalogue only: no torch,
    no kernels, no training code (what `/api/info` reports as `data_plane_modules`)."""
    probe = (
        "import sys\n"
        "from orchestrator.service.sent_spec import SentSpec, read_sent\n"
        "from orchestrator.monitoring.page_view import data_plane_modules\n"
        "for name in ('convnet', 'vit', 'gpt', 'resnet', 'sweep'):\n"
        f"    path = '{ROOT}/jobs/' + name + '.yaml'\n"
        "    read_sent(SentSpec(path, open(path).read(), (), '/', '/'))\n"
        "print(data_plane_modules(sys.modules), 'workers.checks' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] True"
    assert data_plane_modules(["workers.trainer", "torch.nn", "workers.data.digits"]) == [
        "torch",
        "workers.trainer",
    ]
