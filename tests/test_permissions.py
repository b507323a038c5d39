"""Who may do what (orchestrator/policy/permissions.py): every role x action x ownership case
against a table written out here by hand, the lines a refusal says, and properties over any
identity and target. Pure: no service, no Ray."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.policy.permissions import (
    DOING,
    GRANTS,
    TARGET_KIND,
    Action,
    Allowed,
    Identity,
    JobTarget,
    QueueTarget,
    Refused,
    Role,
    decide,
)

ME = {role: Identity(f"ann-{role}", "vision", role) for role in Role}

# the targets a call may meet, by how they relate to the caller (the team 'vision')
JOB_CASES = {
    "own job": lambda me: JobTarget("j-1", me.user, me.team),
    "team mate's job": lambda me: JobTarget("j-2", "bob", me.team),
    "other team's job": lambda me: JobTarget("j-3", "carl", "nlp"),
    "job from before tenants": lambda me: JobTarget("j-4", "unknown", "unknown"),
}
QUEUE_CASES = {
    "open queue": lambda me: QueueTarget("default", None),
    "queue of its team": lambda me: QueueTarget("gpu", frozenset({me.team, "nlp"})),
    "queue of other teams": lambda me: QueueTarget("nlp-gpu", frozenset({"nlp", "speech"})),
}
NO_TARGET = {"the service": lambda me: None}


def cases(action: Action) -> dict:
    kind = TARGET_KIND[action]
    return JOB_CASES if kind is JobTarget else QUEUE_CASES if kind is QueueTarget else NO_TARGET


# The whole answer, written out: (role, action) -> the cases it is allowed in.
EVERY = object()
EXPECTED = {
    **{(Role.ADMIN, action): EVERY for action in Action},
    (Role.MEMBER, Action.SUBMIT): {"open queue", "queue of its team"},
    (Role.MEMBER, Action.STOP): {"own job"},
    (Role.MEMBER, Action.PREEMPT): {"own job"},
    (Role.MEMBER, Action.RESIZE): {"own job"},
    (Role.MEMBER, Action.READ): EVERY,
    (Role.VIEWER, Action.READ): EVERY,
}

ALL_CASES = [
    (role, action, case) for role, action in itertools.product(Role, Action) for case in cases(action)
]


@pytest.mark.parametrize(("role", "action", "case"), ALL_CASES, ids=lambda v: str(v).replace(" ", "-"))
def test_every_role_action_and_ownership(role, action, case):
    me = ME[role]
    target = cases(action)[case](me)
    expected = EXPECTED.get((role, action), set())
    verdict = decide(me, action, target)
    if expected is EVERY or case in expected:
        assert verdict == Allowed() and verdict.allowed
        return
    assert isinstance(verdict, Refused) and not verdict.allowed
    assert verdict.status == 403
    line = verdict.reason
    assert "\n" not in line and me.user in line and role in line
    if (role, action) not in EXPECTED:  # the role may not do it at all: say which roles may
        assert DOING[action] in line and "needs role admin" in line
    elif TARGET_KIND[action] is JobTarget:  # a job of someone else: whose, and who may
        assert f"job {target.job_id!r} of user {target.user!r}" in line
        assert "only its own jobs" in line and "an admin may" in line
    else:  # a queue of other teams: which teams it takes
        assert f"queue {target.name!r}" in line and "nlp, speech" in line and "'vision'" in line


def test_the_table_is_total():
    """Each action says what it is done to; each role has its grants; the admin's are all."""
    assert set(TARGET_KIND) == set(Action) == set(DOING)
    assert set(GRANTS) == set(Role)
    assert set(GRANTS[Role.ADMIN]) == set(Action)
    assert len(ALL_CASES) == 3 * (4 * 3 + 3 + 4)  # 3 roles; 4 job actions x 4, submit x 3, 4 others


@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("sent", [False, True])
def test_no_identity_is_401_saying_what_is_missing(action, sent):
    target = next(iter(cases(action).values()))(ME[Role.ADMIN])
    verdict = decide(None, action, target, token_sent=sent)
    assert verdict.status == 401 and "\n" not in verdict.reason
    assert "a valid token is needed" in verdict.reason and "orchestrator login" in verdict.reason
    assert ("unknown or revoked" in verdict.reason) == sent
    assert ("no token was sent" in verdict.reason) == (not sent)


@pytest.mark.parametrize(
    ("action", "target"),
    [
        (Action.SUBMIT, None),
        (Action.SUBMIT, JobTarget("j", "ann", "vision")),
        (Action.STOP, QueueTarget("q")),
        (Action.RESIZE, None),
        (Action.QUEUES_APPLY, QueueTarget("q")),
        (Action.READ, JobTarget("j", "ann", "vision")),
    ],
)
def test_a_target_of_the_wrong_kind_is_a_bug_not_a_refusal(action, target):
    """Even for an admin (who would be allowed anything): the wiring is wrong, say so loudly."""
    with pytest.raises(ValueError, match=f"{action} is decided on"):
        decide(ME[Role.ADMIN], action, target)


names = st.sampled_from(["ann", "bob", "carl", "unknown"])
teams = st.sampled_from(["vision", "nlp", "speech", "unknown"])
identities = st.builds(Identity, names, teams, st.sampled_from(list(Role)))
queue_targets = st.builds(QueueTarget, st.just("q"), st.none() | st.frozensets(teams, min_size=1))
job_targets = st.builds(JobTarget, st.just("j"), names, teams)


def target_for(action: Action):
    kind = TARGET_KIND[action]
    return job_targets if kind is JobTarget else queue_targets if kind is QueueTarget else st.none()


@given(st.data())
def test_properties_over_any_identity_and_target(data):
    me = data.draw(identities)
    action = data.draw(st.sampled_from(list(Action)))
    target = data.draw(target_for(action))
    verdict = decide(me, action, target)
    if me.role is Role.ADMIN:
        assert verdict.allowed
    if me.role is Role.VIEWER:
        assert verdict.allowed == (action is Action.READ)
    if me.role is Role.MEMBER and isinstance(target, JobTarget):  # owned by user, not team
        assert verdict.allowed == (target.user == me.user)
    if me.role is Role.MEMBER and isinstance(target, QueueTarget):
        assert verdict.allowed == (target.teams is None or me.team in target.teams)
    if not verdict.allowed:
        assert verdict.status == 403 and "\n" not in verdict.reason and me.user in verdict.reason
