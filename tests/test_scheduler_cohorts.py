"""Fair share between queues (orchestrator/policy/cohorts.py) and the queue config file
(core/queues.py): borrowing up to the limit, reclaim, and one-line validation errors."""

from __future__ import annotations

import pytest

from core.queues import DEFAULT_QUEUES, QueueConfig, load_queue_config, validate_queue_config
from core.spec.errors import SpecError
from orchestrator.policy import Allocation, JobRequest, Node, Policy
from orchestrator.policy.cohorts import CohortBook


def config(limit=None, order="fifo") -> QueueConfig:
    a = {"cohort": "research", "nominal": {"GPU": 4}, "order": order}
    if limit is not None:
        a["borrowing_limit"] = {"GPU": limit}
    b = {"cohort": "research", "nominal": {"GPU": 4}, "order": order}
    return validate_queue_config({"cohorts": ["research"], "queues": {"team-a": a, "team-b": b}})


CLUSTER = [Node("n0", {"GPU": 8.0})]


def job(name, queue, gpus=1, submitted=0.0, preemptible=True):
    return JobRequest(name, 0, 1, {"GPU": float(gpus)}, submitted, preemptible, queue)


def running(name, queue, gpus=1, started=0.0):
    return Allocation(name, 0, {"n0": 1}, {"GPU": float(gpus)}, started, True, queue)


def admitted(decision) -> list[str]:
    return [job_id for job_id, _ in decision.admit]


def test_idle_quota_is_borrowed_in_full_without_a_limit():
    pending = [job(f"a{i}", "team-a", submitted=i) for i in range(10)]
    decision = Policy(CLUSTER, queues=config()).schedule(10.0, pending, [])
    assert admitted(decision) == [f"a{i}" for i in range(8)]


def test_borrowing_stops_at_the_limit():
    pending = [job(f"a{i}", "team-a", submitted=i) for i in range(10)]
    decision = Policy(CLUSTER, queues=config(limit=2)).schedule(10.0, pending, [])
    assert admitted(decision) == [f"a{i}" for i in range(6)]
    assert "borrowing limit" in decision.notes["a6"]


def test_two_queues_whose_jobs_both_must_borrow_do_not_wait_for_each_other():
    """Each job needs 6 GPUs on a nominal 4: neither is guaranteed, so neither pauses the
    other's borrowing; the first in order runs, the other follows when it ends."""
    pending = [job("a", "team-a", gpus=6), job("b", "team-b", gpus=6, submitted=1.0)]
    policy = Policy(CLUSTER, queues=config())
    assert admitted(policy.schedule(10.0, pending, [])) == ["a"]
    assert admitted(policy.schedule(20.0, pending[1:], [])) == ["b"]
    # a waiting job within its nominal quota still goes before anyone borrows
    pending = [job("a6", "team-a", gpus=6), job("b4", "team-b", gpus=4, submitted=1.0)]
    within = policy.schedule(30.0, pending, [])
    assert admitted(within) == ["b4"] and "borrowing paused" in within.notes["a6"]


def test_a_job_that_cannot_be_preempted_does_not_borrow():
    pending = [job(f"a{i}", "team-a", submitted=i, preemptible=i < 4) for i in range(6)]
    decision = Policy(CLUSTER, queues=config()).schedule(10.0, pending, [])
    assert admitted(decision) == ["a0", "a1", "a2", "a3"]
    assert "not preemptible" in decision.notes["a4"]


def test_reclaim_preempts_borrowers_most_recent_first_down_to_their_nominal_quota():
    held = [running(f"a{i}", "team-a", started=float(i)) for i in range(8)]  # team-a borrows 4
    decision = Policy(CLUSTER, queues=config()).schedule(100.0, [job("b0", "team-b", gpus=3)], held)
    assert decision.preempt == ["a7", "a6", "a5"] and decision.reserved_for == "b0"
    assert "borrowing" in decision.notes["b0"]
    # never below the borrower's own nominal quota: team-b cannot take 5 of team-a's 8
    held_b = [running("b-run", "team-b")] + held[:7]
    big = Policy(CLUSTER, queues=config()).schedule(100.0, [job("b1", "team-b", gpus=4)], held_b)
    assert big.preempt == []


def test_borrowing_pauses_while_a_lender_waits():
    held = [running(f"a{i}", "team-a", started=float(i)) for i in range(6)] + [running("b0", "team-b")]
    pending = [job("a-next", "team-a", submitted=1.0), job("b-big", "team-b", gpus=2, submitted=2.0)]
    decision = Policy(CLUSTER, queues=config()).schedule(100.0, pending, held)
    # one GPU is free, but it is kept for team-b (below its nominal quota), which reclaims one more
    assert "a-next" not in admitted(decision)
    assert decision.preempt == ["a5"] and decision.reserved_for == "b-big"


def test_rejection_names_what_a_queue_may_ever_use():
    policy = Policy([Node("n0", {"GPU": 8.0}), Node("n1", {"GPU": 8.0})], queues=config(limit=2))
    reason = policy.rejection_reason(JobRequest("x", 0, 1, {"GPU": 7.0}, 0.0, True, "team-a"))
    assert reason == "job x needs 7 GPU but queue 'team-a' may use at most 6"
    not_preemptible = JobRequest("y", 0, 1, {"GPU": 5.0}, 0.0, False, "team-b")
    assert "not preemptible" in policy.rejection_reason(not_preemptible)


def test_report_shows_use_nominal_borrowed_and_lent():
    held = [running(f"a{i}", "team-a") for i in range(6)] + [running("b0", "team-b")]
    report = CohortBook(config(), held).report()
    assert report["team-a"] == {
        "cohort": "research",
        "used": {"GPU": 6.0},
        "nominal": {"GPU": 4.0},
        "borrowed": {"GPU": 2.0},
        "lent": {"GPU": 0.0},
    }
    assert report["team-b"]["lent"] == {"GPU": 2.0} and report["team-b"]["borrowed"] == {"GPU": 0.0}


def test_a_queue_without_cohort_is_a_hard_cap_like_quotas():
    capped = validate_queue_config({"queues": {"batch": {"nominal": {"GPU": 2}}}})
    pending = [job(f"j{i}", "batch", submitted=i) for i in range(4)]
    by_config = Policy(CLUSTER, queues=capped).schedule(5.0, pending, [])
    by_flag = Policy(CLUSTER, quotas={"batch": {"GPU": 2}}).schedule(5.0, pending, [])
    assert admitted(by_config) == admitted(by_flag) == ["j0", "j1"]
    assert QueueConfig.from_quotas({"batch": {"GPU": 2}}).hard_caps() == {"batch": {"GPU": 2.0}}
    with pytest.raises(ValueError, match="both a quota and a queue config"):
        Policy(CLUSTER, quotas={"batch": {"GPU": 1}}, queues=capped)


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        (
            {"queues": {"team-a": {"nominal": {"GPU": -1}}}},
            "queues.team-a.nominal.GPU: -1 is out of range; allowed: >= 0",
        ),
        (
            {"queues": {"team-a": {"nominal": {"GPU": "lots"}}}},
            "queues.team-a.nominal.GPU: Input should be a valid number",
        ),
        (
            {"queues": {"team-a": {"nomnal": {}}}},
            "queues.team-a.nomnal: unknown field; did you mean 'nominal'?",
        ),
        ({"queus": {}}, "queus: unknown field; did you mean 'queues'?"),
        (
            {"queues": {"q": {"order": "lifo"}}},
            "queues.q.order: 'lifo' is not allowed; expected 'fifo', 'las' or 'las-share'",
        ),
        (
            {"cohorts": ["research"], "queues": {"q": {"cohort": "reserch", "nominal": {"GPU": 1}}}},
            "queues.q.cohort: unknown cohort 'reserch' (cohorts: research)",
        ),
        (
            {"queues": {"q": {"nominal": {"GPU": 1}, "borrowing_limit": {"GPU": 1}}}},
            "queues.q.borrowing_limit: only",
        ),
        ({"queues": {"Team A": {}}}, "queues: 'Team A' is not a valid queue name"),
        (
            {"queues": {"a": {"order": "las-share"}, "b": {"order": "las"}}},
            "queues.a.order: las-share cannot be mixed with las in one file (queue 'b' is las)",
        ),
        (
            {"order": "las-share", "queues": {"b": {"order": "las"}}},
            "order: las-share cannot be mixed with las in one file (queue 'b' is las)",
        ),
        (
            {"order": "las", "queues": {"a": {"order": "las-share"}}},
            "queues.a.order: las-share cannot be mixed with las in one file (the file's order is las)",
        ),
        ({"order": "lifo"}, "order: 'lifo' is not allowed; expected 'fifo', 'las' or 'las-share'"),
        ({"las": {"thresholds_gpu_s": [10, 5]}}, "las.thresholds_gpu_s: must be ascending"),
        ({"las": {"min_run_s": -1}}, "las.min_run_s: -1 is out of range; allowed: >= 0"),
        (
            {"queues": {"q": {"nominal": {"GPU": float("nan")}}}},
            "queues.q.nominal.GPU: must be a finite number",
        ),
        ([1, 2], "expected a mapping with 'queues', got a list"),
        ({"queues": {"gpu": {"teams": "nlp"}}}, "queues.gpu.teams: expected a list"),
        ({"queues": {"gpu": {"teams": [7]}}}, "queues.gpu.teams.0: Input should be a valid string"),
        ({"queues": {"gpu": {"teams": []}}}, "queues.gpu.teams: an empty list admits no team; leave"),
        ({"queues": {"gpu": {"teams": ["Vision"]}}}, "queues.gpu.teams: 'Vision' is not a valid team name"),
        ({"queues": {"gpu": {"teams": ["nlp", "cv", "nlp"]}}}, "queues.gpu.teams: 'nlp' listed more than"),
        ({"queues": {"gpu": {"team": ["nlp"]}}}, "queues.gpu.team: unknown field; did you mean 'teams'?"),
    ],
)
def test_config_errors_are_one_line_naming_the_field(raw, line):
    with pytest.raises(SpecError) as err:
        validate_queue_config(raw)
    assert any(problem.startswith(line) for problem in err.value.problems), err.value.problems
    assert all("\n" not in problem for problem in err.value.problems)


def test_teams_say_who_may_submit_and_a_file_without_them_admits_every_team(tmp_path):
    config = validate_queue_config(
        {"queues": {"gpu": {"nominal": {"GPU": 8}, "teams": ["vision", "nlp"]}, "cpu": {}}}
    )
    assert config.teams_of("gpu") == frozenset({"vision", "nlp"})
    assert config.teams_of("cpu") is None  # no teams: every team
    assert config.teams_of("not-listed") is None  # a queue the file does not name: every team
    stored = config.model_dump(mode="json")  # what the service keeps in the store, and reloads
    assert validate_queue_config(stored).teams_of("gpu") == config.teams_of("gpu")
    before = tmp_path / "before.yaml"  # a file from before teams
    before.write_text("queues:\n  batch: {nominal: {GPU: 4}}\n")
    assert load_queue_config(before).teams_of("batch") is None


def test_order_las_share_validates_with_its_own_las_defaults_where_the_file_sets_none():
    share = validate_queue_config(
        {"queues": {"a": {"order": "las-share"}, "b": {"order": "fifo"}}, "las": {"min_run_s": 60}}
    )
    assert "a" in share.las_queues() and "b" not in share.las_queues() and share.las_share()
    las = share.las  # las-share's thresholds and starve factor, the file's minimum run
    assert (las.thresholds_gpu_s, las.starve_factor, las.min_run_s) == ([3600, 36000, 360000], 16, 60)
    assert validate_queue_config(share.model_dump(mode="json")) == share  # as the service stores it
    chosen = validate_queue_config({"queues": {"a": {"order": "las-share"}}, "las": {"starve_factor": 2}})
    assert chosen.las.starve_factor == 2  # what the file sets stays
    plain = validate_queue_config({"queues": {"a": {"order": "las"}}})
    assert not plain.las_share() and (plain.las.thresholds_gpu_s, plain.las.starve_factor) == (
        [3600, 36000],
        4,
    )


def test_a_queue_that_names_no_order_has_the_file_s_order_and_that_is_las_share_by_default():
    """The default order is `las-share`: for queues a file does not list, those that name no
    order, and with no file at all; `order: fifo` chooses FIFO. The implied orders are written
    into the config, so the stored copy (and `queues show`) says what runs."""
    given = validate_queue_config({"queues": {"a": {}, "f": {"order": "fifo"}}})
    assert [given.order_of(q) for q in ("a", "f", "unlisted")] == ["las-share", "fifo", "las-share"]
    names = given.las_queues()
    assert "a" in names and "unlisted" in names and "f" not in names
    assert given.las.thresholds_gpu_s == [3600, 36000, 360000]  # las-share's own `las:` defaults
    stored = given.model_dump(mode="json")
    assert stored["order"] == "las-share" and stored["queues"]["a"]["order"] == "las-share"
    assert validate_queue_config(stored) == given
    assert DEFAULT_QUEUES.order_of("anything") == "las-share" and DEFAULT_QUEUES.las_share()
    fifo = validate_queue_config({"order": "fifo", "queues": {"a": {}, "l": {"order": "las-share"}}})
    assert [fifo.order_of(q) for q in ("a", "l", "unlisted")] == ["fifo", "las-share", "fifo"]
    assert "unlisted" not in fifo.las_queues() and "l" in fifo.las_queues()
    assert not validate_queue_config({"order": "fifo"}).las_queues()  # FIFO everywhere: no LAS
    # a file that names `las` keeps it for the rest: one `las:` block, one LAS order per file
    las = validate_queue_config({"queues": {"a": {"order": "las"}, "b": {}}})
    assert [las.order_of(q) for q in ("a", "b", "unlisted")] == ["las", "las", "las"]
    assert las.las.thresholds_gpu_s == [3600, 36000] and not las.las_share()
    # --quota caps: hard caps, in the default order
    assert QueueConfig.from_quotas({"batch": {"GPU": 2}}).order_of("batch") == "las-share"


def test_load_queue_config_reads_a_file(tmp_path):
    good = tmp_path / "queues.yaml"
    good.write_text(
        "cohorts: [research]\nqueues:\n"
        "  team-a: {cohort: research, nominal: {GPU: 8}, borrowing_limit: {GPU: 8}, order: las}\n"
        "  team-b: {cohort: research, nominal: {GPU: 8}, order: las}\n"
    )
    loaded = load_queue_config(good)
    assert loaded.order_of("team-a") == loaded.order_of("team-b") == "las"
    assert loaded.queues["team-a"].borrowing_limit == {"GPU": 8}
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues:\n  team-a: {nominal: {GPU: 8}, cohort: nowhere}\n")
    with pytest.raises(SpecError, match=r"bad.yaml: queues.team-a.cohort: unknown cohort 'nowhere'"):
        load_queue_config(bad)
    with pytest.raises(SpecError, match="no such file"):
        load_queue_config(tmp_path / "missing.yaml")
