"""The order the suite's tests run in, and when the session's clusters stop (a pytest plugin of
tests/conftest.py).

With `-n` (scripts/test.sh runs `-n auto`), the files whose tests start Ray clusters run in
two lanes, each on one pytest-xdist worker, one test after the other. The lane of the
session's shared clusters starts first; the other tests run on the other worker meanwhile, and
when they are done that worker takes the late lane (LATE_LANE_FILES): the tests that start a
cluster of their own. Alone, the first lane used ~1.4 of the 2 cores in its last ~16 minutes.
(test_ray_run.py moved to the late lane, on a `ray_head` of that worker's, tried on
2026-11-29: 25 min 54 s against 25 min 40 s; the lanes slowed each other on 2 cores.)
tests/test_up.py ran last in the first lane, alone at the end, since on 2026-11-28, in the
second lane beside the first, Ray's Jobs API refused its `ray job submit` under the load ("No
available agent to submit job, please try again later"); it tries again while Ray says so, as
Ray advises, and runs in the late lane (2026-11-29: 27 min 40 s against 29 min 10 s, with the
early stops below and tests/test_autoscaler.py in the first lane, which then ended ~140 s after
the other; with it back in the late lane the lanes ended within 50 s of each other, 28 min 26-37
s on a slower hour of the VM: docs/benchmarks.md). (Two lanes from the start, tried on 2026-11-27:
three tests failed their time bounds on the 2 cores.) A test that starts a cluster in a file
not listed here is a collection error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CLUSTER_FILES = {
    "test_autoscaler.py",
    "test_checkpoint_faults_ray.py",
    "test_cluster.py",
    "test_faults.py",
    "test_head_restart.py",
    "test_mlflow_live.py",
    "test_monitoring.py",
    "test_queues_live.py",
    "test_ray_jobs.py",
    "test_ray_run.py",
    "test_replica_cluster.py",
    "test_replica_run.py",
    "test_service.py",
    "test_service_recovery.py",
    "test_tenants_live.py",
    "test_up.py",
}
# clusters of their own
LATE_LANE_FILES = {
    "test_autoscaler.py",
    "test_head_restart.py",
    "test_replica_cluster.py",
    "test_replica_run.py",
    "test_up.py",
}
# session or module scope
CLUSTER_FIXTURES = {"ray_head", "service", "ft_service", "scaling", "cluster", "frozen"}


def _lane(path: str) -> int:
    """0: the shared clusters' lane, 1: the other tests, 2: the late lane (last)."""
    name = Path(path).name
    return 2 if name in LATE_LANE_FILES else 0 if name in CLUSTER_FILES else 1


def _uses_session(item, name: str) -> bool:
    """Whether the test uses the session's fixture `name` (a module's own fixture of that name,
    as the tenants' unit tests have for `service`, is another)."""
    defs = item._fixtureinfo.name2fixturedefs.get(name)
    return bool(defs) and defs[-1].scope == "session"


def pytest_collection_modifyitems(items):
    for item in items:
        defs = item._fixtureinfo.name2fixturedefs
        # a module's own function-scoped fixture named `service` (the tenants' unit tests) starts none
        shared = [defs[name][-1].scope for name in CLUSTER_FIXTURES & defs.keys()]
        starts_one = item.get_closest_marker("cluster") or any(s in ("session", "module") for s in shared)
        if starts_one and item.path.name not in CLUSTER_FILES:
            raise pytest.UsageError(f"{item.nodeid} starts a Ray cluster: add its file to CLUSTER_FILES")
    # xdist hands out scopes in this order: the shared clusters' lane first, the late lane last;
    # in the first lane, the files of `ray_head` first (it stops after them, `released_early`)
    on_ray_head = {item.path for item in items if _uses_session(item, "ray_head")}
    items.sort(key=lambda item: (_lane(str(item.path)), item.path not in on_ray_head))


def pytest_collection_finish(session):
    """The last user of each early-released cluster, among the tests this run keeps (-k and
    the like deselect after the hook above)."""
    _last_user.clear()
    for item in session.items:
        for name in RELEASED_EARLY:
            if _uses_session(item, name):
                _last_user[name] = item.nodeid


# The session's clusters of the first lane stop after the last test of the run that uses them,
# not at the end of the session: an idle cluster costs 0.07-0.10 of a core (measured
# 2026-11-29), and the lane's other tests run for minutes after.
RELEASED_EARLY = ("ray_head", "service")
_last_user: dict[str, str] = {}  # fixture -> the node id of the last test of this run using it
_release: dict[str, Callable[[], None]] = {}  # fixture -> what stops what it started, once


@contextlib.contextmanager
def released_early(name: str, stop: Callable[[], None]) -> Iterator[None]:
    """Run `stop` once: after the teardown of the last test of this run that uses the session
    fixture `name` (pytest_runtest_teardown below), else when the fixture ends."""
    stopped = []

    def once() -> None:
        if not stopped:
            stopped.append(True)
            stop()

    _release[name] = once
    try:
        yield
    finally:
        _release.pop(name, None)
        once()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the test's own fixtures end first: they may still use the cluster
    for name, last in _last_user.items():
        if item.nodeid == last and name in _release:
            _release.pop(name)()


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ClusterLanes(LoadScopeScheduling):
        """xdist's scope scheduling with one scope per lane of cluster tests, one per other test."""

        def _split_scope(self, nodeid: str) -> str:
            lane = _lane(nodeid.split("::")[0])
            return ("ray-clusters", nodeid, "ray-clusters-late")[lane]

    config.option.loadscopereorder = False  # xdist puts the largest scopes first: keep the lanes' order
    return ClusterLanes(config, log)
