"""The suite's own order (tests/lanes.py): the session's clusters of the first lane each stop
after the last test of the run that uses them, and the tests of `ray_head` come first in that
lane, so that its cluster is gone before the service's long run of tests begins."""

from tests import lanes


def _lane_zero_files(items) -> list[str]:
    files = [item.path.name for item in items if lanes._lane(str(item.path)) == 0]
    return list(dict.fromkeys(files))


def test_ray_heads_tests_come_first_in_the_first_lane_and_each_cluster_has_its_last_user(request):
    items = request.session.items
    users = {
        name: [item for item in items if lanes._uses_session(item, name)] for name in lanes.RELEASED_EARLY
    }
    for name, found in users.items():
        if found:  # this run uses it: it stops after the last of them
            assert lanes._last_user[name] == found[-1].nodeid
    files = _lane_zero_files(items)
    on_ray_head = {item.path.name for item in users["ray_head"]}
    if on_ray_head and len(files) > len(on_ray_head):
        assert set(files[: len(on_ray_head)]) == on_ray_head, files  # before every other file


def test_a_released_cluster_is_stopped_once_whoever_releases_it_first():
    stopped = []
    with lanes.released_early("probe", lambda: stopped.append("stopped")):
        lanes._release["probe"]()  # after its last user's teardown
        assert stopped == ["stopped"]
    assert stopped == ["stopped"] and "probe" not in lanes._release  # not again at the end
    with lanes.released_early("probe", lambda: stopped.append("at the end")):
        pass  # no test released it: it stops when the fixture ends
    assert stopped == ["stopped", "at the end"]
