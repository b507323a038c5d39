"""Tenants on the live service (tests/conftest.py's 3-node cluster, one `slot` per node; a test
job of 2 workers fills it): two teams, each with a queue of its own. A member of team A
cannot submit to B's queue, stop or preempt B's job, or apply queues: each is refused in one
line (exit status 2), nothing changes, and the audit log has the refusal; an admin can. A
revoked token is refused at once. LAS counts service per authenticated user: two jobs sent
from the same machine by two users' tokens are two users' jobs.

The CLI runs as a user with $ORCHESTRATOR_TOKEN (it then submits, reads, stops and preempts
over the page with that token); without it, as the fixture's, it is the Ray token's holder. A
member with only its own token, no Ray token anywhere in its environment, submits, reads and
stops its own job over the page, and is refused another team's. Users get a suffix of their
own: the session's service is shared.
"""

import json
import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SERVICE_SPEC, run_cli
from tests.test_service import when

SUFFIX = secrets.token_hex(2)
TEAM_A, TEAM_B = f"team-a{SUFFIX}", f"team-b{SUFFIX}"
QUEUES = f"""queues:
  qa: {{teams: [{TEAM_A}]}}
  qb: {{teams: [{TEAM_B}]}}
  fair: {{order: las}}
las: {{thresholds_gpu_s: [1000000], min_run_s: 3}}
"""


def as_user(service, token: str, *args: str):
    return run_cli(*args, env={**service.env, "ORCHESTRATOR_TOKEN": token}, timeout=240)


def as_member_only(service, token: str, home, *args: str) -> subprocess.CompletedProcess:
    """The CLI as a user holding its own token and nothing of the Ray cluster's: the fixture's
    environment carries the Ray token (`RAY_AUTH_TOKEN_PATH`), which is left out, and HOME is
    a folder of its own (no ~/.ray/auth_token); with RAY_AUTH_MODE=token still set, joining
    the cluster would fail. `up`'s record (ORCHESTRATOR_HOME) names the service's page."""
    keep = {**os.environ, **service.env}
    env = {k: v for k, v in keep.items() if not k.startswith("RAY_AUTH_TOKEN") and k != "RAY_ADDRESS"}
    env.update(HOME=str(home), ORCHESTRATOR_TOKEN=token, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def add_user(service, name: str, team: str, role: str = "member") -> str:
    result = service.cli("users", "add", f"{name}-{SUFFIX}", "--team", team, "--role", role)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def submit_args(queue: str, name: str, steps: int, runs, workers: int = 2) -> list[str]:
    sets = [
        "resources.custom_per_worker.slot=1",
        f"resources.num_workers={workers}",
        f"train.steps={steps}",
        f"checkpoint.storage={runs}",
        "metrics.log_every=5",
        f"scheduling.queue={queue}",
        f"name={name}",
    ]
    return ["submit", SERVICE_SPEC, *[arg for s in sets for arg in ("--set", s)]]


def submit_as(service, token: str, queue: str, name: str, steps: int = 30, workers: int = 2) -> str:
    result = as_user(service, token, *submit_args(queue, name, steps, service.runs, workers))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout.split()[0]


def refused_in_one_line(result, *words: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def audit(service) -> list[dict]:
    result = service.cli("audit", "--since", "30m", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def teams(service, tmp_path_factory):
    """Tokens of ann (team A), bert (team B), ada (admin) and the two teams' queues; the
    queue configuration is cleared afterwards."""
    path = tmp_path_factory.mktemp("tenants") / "queues.yaml"
    path.write_text(QUEUES)
    applied = service.cli("queues", "apply", str(path))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    tokens = {
        "ann": add_user(service, "ann", TEAM_A),
        "bert": add_user(service, "bert", TEAM_B),
        "ada": add_user(service, "ada", "ops", "admin"),
    }
    yield tokens
    cleared = service.cli("queues", "apply", "--clear")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr


@pytest.mark.timeout(600)
def test_a_member_is_refused_the_other_teams_queue_and_jobs_and_the_queues_and_an_admin_is_not(
    service, teams
):
    ann, bert, ada = teams["ann"], teams["bert"], teams["ada"]
    jobs_before = {p.name for p in (service.store / "jobs").iterdir()}
    refused_in_one_line(as_user(service, ann, *submit_args("qb", "ann-in-b", 10, service.runs)), "qb", TEAM_A)
    assert {p.name for p in (service.store / "jobs").iterdir()} == jobs_before  # nothing queued

    job_id = submit_as(service, bert, "qb", "berts", steps=100_000, workers=1)  # stopped by the test
    job = service.wait(job_id, lambda j: j["state"] == "running", what="running")
    assert (job["user"], job["team"]) == (f"bert-{SUFFIX}", TEAM_B)
    refused_in_one_line(as_user(service, ann, "stop", job_id), job_id, "its own jobs")
    refused_in_one_line(as_user(service, ann, "preempt", job_id), job_id, "its own jobs")
    clear = service.store.parent / f"clear-{SUFFIX}.yaml"
    clear.write_text("queues:\n  anything: {}\n")
    refused_in_one_line(as_user(service, ann, "queues", "apply", str(clear)), "queue configuration", "admin")
    job = service.job(job_id)
    assert job["state"] == "running" and not job["stop_requested"] and job["preemptions"] == 0
    assert "qa" in service.cli("queues", "show").stdout  # the configuration is as it was

    refusals = [e for e in audit(service) if e["user"] == f"ann-{SUFFIX}" and e["outcome"] == "refused"]
    assert sorted(e["action"] for e in refusals) == ["preempt", "queues-apply", "stop", "submit"]
    assert all(e["status"] == 403 and e["reason"] for e in refusals)

    preempted = as_user(service, ada, "preempt", job_id)  # an admin acts on any job
    assert preempted.returncode == 0, preempted.stdout + preempted.stderr
    service.wait(job_id, lambda j: j["preemptions"] == 1, what="the preemption")
    stopped = as_user(service, ada, "stop", job_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    service.wait(job_id, lambda j: j["state"] == "stopped", what="stopped")
    allowed = {(e["action"], e["target"]) for e in audit(service) if e["user"] == f"ada-{SUFFIX}"}
    assert {
        ("preempt", f"job {job_id} of bert-{SUFFIX}"),
        ("stop", f"job {job_id} of bert-{SUFFIX}"),
    } <= allowed


@pytest.mark.timeout(300)
def test_a_revoked_token_is_refused_at_once(service, teams):
    token = add_user(service, "rev", TEAM_A)
    read = as_user(service, token, "queue")
    assert read.returncode == 0, read.stdout + read.stderr
    revoked = service.cli("users", "revoke", f"rev-{SUFFIX}")
    assert revoked.returncode == 0, revoked.stdout + revoked.stderr
    refused_in_one_line(as_user(service, token, "queue"), "unknown or revoked")
    refused_in_one_line(as_user(service, token, *submit_args("qa", "revoked", 10, service.runs)), "revoked")
    entry = [e for e in audit(service) if e["action"] == "submit" and e["outcome"] == "refused"][-1]
    assert (entry["user"], entry["status"]) == (None, 401)


@pytest.mark.timeout(600)
def test_las_counts_service_per_authenticated_user(service, teams):
    """ann's running job (one slot) is service ann attained while the two others wait behind
    an admin's blocker (two slots). Of those two, sent from this one machine, bert's goes first
    when the blocker stops, although ann's was sent first: the queue tells the users apart by
    their tokens (a client-sent name would have made them one user, and FIFO ann's first)."""
    ann, bert = teams["ann"], teams["bert"]
    name = service.paced(f"fair-running-{SUFFIX}")  # still running when bert's job is chosen
    running = submit_as(service, ann, "fair", name, steps=400, workers=1)
    blocker = service.submit(name=f"fair-blocker-{SUFFIX}", steps=100_000)  # stopped below
    service.wait(running, lambda j: j["state"] == "running" and j["step"] >= 20, what="progress")
    service.wait(blocker, lambda j: j["state"] == "running", what="the blocker running")
    anns = submit_as(service, ann, "fair", "fair-ann")
    berts = submit_as(service, bert, "fair", "fair-bert")
    assert service.cli("stop", blocker).returncode == 0
    first = service.wait(berts, lambda j: j["state"] in ("running", "succeeded"), what="admitted")
    # ann's job waits while bert's runs (once bert's 30 steps are done, it may start: read after)
    anns_state = service.job(anns)["state"]
    assert anns_state == "queued" or service.job(berts)["state"] == "succeeded", "ann holds service"
    service.release(name)
    first, second, done = service.done(berts), service.done(anns), service.done(running)
    assert (first["user"], second["user"]) == (f"bert-{SUFFIX}", f"ann-{SUFFIX}")
    assert first["team"] == TEAM_B and second["team"] == TEAM_A
    assert when(first, "admitted") < when(second, "admitted"), "bert (no service yet) goes first"
    assert when(first, "admitted") < when(done, "succeeded")  # while ann's job still ran
    assert done["preemptions"] == 0  # one LAS level: nobody preempts


@pytest.mark.timeout(600)
def test_a_member_without_the_ray_token_stops_its_own_job_over_http_and_not_another_teams(
    service, teams, tmp_path
):
    ann, bert = teams["ann"], teams["bert"]
    home = tmp_path / "ann-home"
    home.mkdir()
    submitted = as_member_only(service, ann, home, *submit_args("qa", "anns-own", 100_000, service.runs))
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
    anns = submitted.stdout.split()[0]
    service.wait(anns, lambda j: j["state"] == "running", what="running")
    berts = submit_as(service, bert, "qb", "berts-waiting", steps=30)  # waits: ann's job fills the cluster
    listed = as_member_only(service, ann, home, "queue")
    assert listed.returncode == 0 and anns in listed.stdout and berts in listed.stdout, listed.stderr

    refused_in_one_line(as_member_only(service, ann, home, "stop", berts), berts, "its own jobs")
    refused_in_one_line(as_member_only(service, ann, home, "preempt", berts), berts, "its own jobs")
    assert service.job(berts)["state"] == "queued"
    stopped = as_member_only(service, ann, home, "stop", anns)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    service.wait(anns, lambda j: j["state"] == "stopped", what="stopped")
    service.done(berts)  # the room ann's job held

    mine = [e for e in audit(service) if e["user"] == f"ann-{SUFFIX}" and e["action"] in ("stop", "preempt")]
    assert {(e["action"], e["target"], e["outcome"], e["route"]) for e in mine} >= {
        ("stop", f"job {berts} of bert-{SUFFIX}", "refused", "http"),
        ("preempt", f"job {berts} of bert-{SUFFIX}", "refused", "http"),
        ("stop", f"job {anns} of ann-{SUFFIX}", "allowed", "http"),
    }
