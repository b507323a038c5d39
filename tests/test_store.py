"""The service's durable job table and lease, on a real local pyarrow filesystem."""

import json

import pytest

from core.spec import validate
from orchestrator.project_package import project_files
from orchestrator.service.store import LEASE_TTL_S, JobRecord, JobState, LeaseHeld, Store, find
from tests.conftest import ROOT

SPEC = validate(
    {
        "name": "job",
        "model": {"family": "convnet", "preset": "tiny"},
        "data": {"source": "synthetic"},
        "train": {"steps": 1},
    }
)


def record(job_id="job-1", **changes) -> JobRecord:
    values = dict(
        id=job_id,
        name="job",
        spec=SPEC,
        priority=0,
        queue="default",
        preemptible=False,
        workers=2,
        per_worker={"CPU": 1.0},
        submitted_at=100.0,
    )
    return JobRecord(**{**values, **changes})


def test_records_round_trip_and_half_written_files_are_ignored(tmp_path):
    store = Store(str(tmp_path))
    job = record(state=JobState.RUNNING, placement={"node-a": 2})
    job.log("admitted", 101.0, attempt=1)
    store.save(job)
    (tmp_path / "jobs" / "job-2.json.tmp-abcd").write_text('{"half": ')  # an interrupted write
    loaded = Store(str(tmp_path)).load_all()
    assert list(loaded) == ["job-1"]
    again = loaded["job-1"]
    assert again == job and again.state is JobState.RUNNING and again.history[0]["attempt"] == 1
    assert not list((tmp_path / "jobs").glob("job-1.json.tmp-*"))  # moved into place


def test_a_record_of_a_newer_version_still_loads(tmp_path):
    data = {**record().to_json(), "field_of_a_later_version": 1}
    assert JobRecord.from_json(data) == record()


def test_the_nodes_a_job_avoids_survive_a_restart_and_reach_the_policy(tmp_path):
    from orchestrator.service.cycle import request

    Store(str(tmp_path)).save(record(avoid_nodes=["node-b"]))
    again = Store(str(tmp_path)).load_all()["job-1"]  # as a restarted service loads it
    assert again.avoid_nodes == ["node-b"]
    assert request(again).avoid_nodes == frozenset({"node-b"})
    older = {k: v for k, v in record().to_json().items() if k != "avoid_nodes"}  # before the field
    assert JobRecord.from_json(older).avoid_nodes == []
    assert request(JobRecord.from_json(older)).avoid_nodes == frozenset()


def test_states(tmp_path):
    assert JobState.PREEMPTED.is_pending and JobState.QUEUED.is_pending
    assert JobState.STOPPING.holds_resources and not JobState.STOPPING.is_terminal
    assert {s for s in JobState if s.is_terminal} == {JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}


def test_remaining_time_comes_from_measured_step_times_while_it_runs():
    running = JobState.RUNNING
    assert record(total_steps=100, step=40, state=running).remaining_s is None
    assert record(total_steps=100, step=40, step_time_s=0.5, state=running).remaining_s == 30.0
    for state in (JobState.QUEUED, JobState.PREEMPTED, JobState.ADMITTED, JobState.SUCCEEDED):
        assert record(total_steps=100, step=40, step_time_s=0.5, state=state).remaining_s is None


def test_the_lease_keeps_a_second_service_out_until_it_expires(tmp_path):
    store = Store(str(tmp_path))
    assert store.acquire_lease("service-a", now=1000.0) == 1
    store.renew_lease("service-a", 1, now=1005.0)
    with pytest.raises(LeaseHeld, match="in use by another orchestrator service"):
        Store(str(tmp_path)).acquire_lease("service-b", now=1005.0 + LEASE_TTL_S - 1)
    assert store.acquire_lease("service-a", now=1010.0) == 2  # the same service, restarted
    taken = Store(str(tmp_path)).acquire_lease("service-b", now=1010.0 + LEASE_TTL_S + 1)
    assert taken == 3
    with pytest.raises(LeaseHeld, match="taken over"):
        store.renew_lease("service-a", 2)
    assert json.loads((tmp_path / "service.json").read_text())["owner"] == "service-b"


def test_a_package_holds_what_git_would_ship(tmp_path):
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "code.py").write_text("x = 1\n")
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "code.pyc").write_bytes(b"\0")
    (project / ".venv").mkdir()
    (project / ".venv" / "big").write_bytes(b"\0" * 10)
    assert [p.as_posix() for p in project_files(project)] == ["pkg/code.py"]


def test_a_package_is_one_zip_in_the_store_with_the_spec_in_it_and_nothing_outside_its_folder(tmp_path):
    """One object per submission, whatever the project's size (on object storage each file was
    a request: 343 of them took 25 s under load), the spec beside the files, as the driver
    loads it; names that would land outside the folder it is unpacked into are dropped."""
    import io
    import zipfile

    from core.spec import load_spec, load_stored
    from orchestrator.project_package import zip_project
    from orchestrator.service.store import SPEC_IN_PACKAGE
    from orchestrator.service.submission import store_package

    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "code.py").write_text("x = 1\n")
    spec = load_spec(ROOT / "jobs/convnet.yaml", ["train.steps=7"])
    store = Store(str(tmp_path / "store"))
    uri = store_package(store, "job-1", zip_project(project), spec)
    assert uri.endswith("packages/job-1.zip")
    assert [p.name for p in (tmp_path / "store" / "packages").iterdir()] == ["job-1.zip"]
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(tmp_path / "store" / "packages" / "job-1.zip") as archive:
        assert sorted(archive.namelist()) == [SPEC_IN_PACKAGE, "pkg/code.py"]
        archive.extractall(unpacked)
    assert (unpacked / "pkg" / "code.py").read_text() == "x = 1\n"
    assert load_stored(unpacked / SPEC_IN_PACKAGE) == spec

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in ("ok.py", "../escape.py", "/etc/passwd", "a/../../b.py", SPEC_IN_PACKAGE):
            archive.writestr(name, "y = 2\n")
    store_package(store, "job-2", buffer.getvalue(), spec)
    with zipfile.ZipFile(tmp_path / "store" / "packages" / "job-2.zip") as archive:
        assert sorted(archive.namelist()) == [SPEC_IN_PACKAGE, "ok.py"]
        assert load_stored_bytes(archive.read(SPEC_IN_PACKAGE)) == spec  # the service's, not the sender's


def load_stored_bytes(data: bytes):
    from core.spec import JobSpec

    return JobSpec.model_validate_json(data)


def test_a_record_read_while_it_is_rewritten_is_read_again(tmp_path):
    """On object storage a read that straddles a rewrite sees part of each version (a size,
    then ranged GETs): the store reads a document that does not parse again."""
    import threading

    import pyarrow.fs as pafs

    from orchestrator.service.store import read_json

    path = tmp_path / "job.json"
    path.write_text('{"id": "job-1", "history": [{"event": "que')  # the first part of a longer version
    threading.Timer(0.15, lambda: path.write_text('{"id": "job-1", "history": []}')).start()
    assert read_json(pafs.LocalFileSystem(), str(path)) == {"id": "job-1", "history": []}
    path.write_text("{not json")
    with pytest.raises(ValueError):  # one that never parses is an error, not a hang
        read_json(pafs.LocalFileSystem(), str(path), tries=2)


def test_a_job_is_found_by_its_id_or_by_the_ray_job_id_of_any_of_its_drivers(tmp_path):
    came = record("via-ray-3", came_in_by="raysubmit_abc", submission_id="via-ray-3-a2", attempt=2)
    other = record("other-1")
    jobs = {job.id: job for job in (came, other)}
    assert find(jobs, "via-ray-3") is came
    assert find(jobs, "raysubmit_abc") is came  # the id `ray job submit` printed
    assert find(jobs, "via-ray-3-a2") is came  # the driver running now, as Ray's dashboard names it
    assert find(jobs, "other-1-a1") is other  # an earlier attempt's driver
    assert find(jobs, "other-1-ax") is None and find(jobs, "raysubmit_zzz") is None
    # the id the job came in by survives a restart of the service
    Store(str(tmp_path)).save(came)
    assert Store(str(tmp_path)).load("via-ray-3").came_in_by == "raysubmit_abc"


def test_what_the_cli_packs_with_loads_neither_ray_nor_torch():
    """`submit` zips the project with orchestrator/service/submission.py: importing Ray there
    (through the runner, for the spec's name in the package) cost every submission 0.4 s of CPU."""
    import subprocess
    import sys

    code = "import sys, orchestrator.service.submission; print(sorted({'ray', 'torch'} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr


def test_a_service_asked_for_any_free_port_keeps_the_one_it_took_when_it_starts_again(tmp_path):
    """Ray restarts a service that dies, with the same configuration (port 0: any free one):
    it comes back on the port `orchestrator up` recorded for the CLI; a port taken meanwhile
    gives way to another, which is then the one kept."""
    import socket

    from tests.tenant_harness import start_service

    store = str(tmp_path / "store")
    first = start_service(store)
    port = int(first.page_url.rstrip("/").rsplit(":", 1)[1])
    first.shutdown()
    again = start_service(store)
    assert again.page_url == first.page_url
    again.shutdown()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        moved = start_service(store)
        assert moved.page_url != first.page_url and moved.page is not None
        moved.shutdown()
    assert Store(store).page_port() == int(moved.page_url.rstrip("/").rsplit(":", 1)[1])
