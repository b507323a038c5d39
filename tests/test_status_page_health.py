"""A job's health on the status page, in headless Chromium: ranks that straggle, a hang, the
nodes it avoids, in its view and as marks on its queue row; node ids and addresses as text."""

from __future__ import annotations

from orchestrator.monitoring.web import make_app, serve
from tests.status_page_browser import clean_console, load, page_errors, wait_for
from tests.status_page_fake import FakeService

pytest_plugins = ["tests.status_page_fixtures"]  # the fixtures `registry`, `served`, `browser`


# --- a job's health: ranks that straggle, a hang, the nodes it avoids -----------------------------

NODE_A = "5f0c61e1" + "9d3a" * 11 + "e1"  # Ray node ids: 56 hex digits
NODE_B = "9b27c4d0" + "7e11" * 11 + "0a"
NODE_C = "c3d1e2f4" + "00ab" * 11 + "77"
VIT = "vit-b16-imagenet-1123-1040-07be"
DISTILL = "vit-small-distill-1123-0820-5b11"
HOSTILE_NODE = "<i>n</i><img src=x onerror=alert(7)>"  # its first 8 characters are markup too
HOSTILE_IP = "<b>10.0.0.7</b><script>window.__pwned = true</script>"
PER_STEP = "the median rank's compute per step"

READ_HEALTH = """
return [...document.querySelectorAll('#job-health li')].map(li => ({
  kind: li.dataset.kind, text: li.textContent,
  nodes: [...li.querySelectorAll('.node')].map(n => [n.textContent, n.title]),
}));
"""

# each row's warning marker while it is shown (null while hidden)
READ_FLAGS = """
return Object.fromEntries([...document.querySelectorAll('#queue-body tr')].map(tr => {
  const flag = tr.querySelector('.flag');
  const shown = flag.offsetParent !== null;
  return [tr.dataset.jobId,
          shown ? {text: flag.textContent, title: flag.title, hung: flag.classList.contains('hung')} : null];
}));
"""


def troubled_service() -> FakeService:
    """The fake with a hung job that has two straggling ranks, a running job with one (its node's
    address unknown), and a preempted job kept off two stragglers' nodes."""
    source = FakeService()
    source.set_health(
        source.running_id,
        stragglers=[
            {"rank": 1, "node": NODE_A, "ip": "10.0.0.7", "ratio": 1.912},
            {"rank": 6, "node": NODE_B, "ip": "10.0.0.9", "ratio": 1.254},
        ],
        hung=True,
    )
    source.set_health(VIT, stragglers=[{"rank": 2, "node": NODE_C, "ip": None, "ratio": 1.3051}])
    source.set_health(DISTILL, avoid_nodes=[NODE_A, NODE_B])
    return source


def open_job_warnings(browser, url: str, job_id: str, name: str) -> list[dict]:
    """Open the job's view; its warning lines once the page shows that job."""
    browser.get(url + "#/jobs/" + job_id)
    wait_for(lambda: browser.find_element("id", "job-name").text == name, what=f"{name}'s view")
    wait_for(lambda: browser.execute_script(READ_HEALTH), what=f"{name}'s warnings")
    return browser.execute_script(READ_HEALTH)


def test_job_view_warns_of_stragglers_a_hang_and_avoided_nodes(browser):
    source = troubled_service()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        hung, first, second = open_job_warnings(browser, url, source.running_id, "gpt2-small-owt")
        assert browser.find_element("id", "job-health").is_displayed()
        assert hung["kind"] == "hung" and hung["nodes"] == []
        assert hung["text"].startswith("Hung: no step progress past the hang timeout.")
        assert "stacks are saved" in hung["text"] and "restarts from its newest checkpoint" in hung["text"]
        assert first == {
            "kind": "straggler",
            "text": f"Rank 1 on node 5f0c61e1 (10.0.0.7) is a straggler: 1.91x {PER_STEP}",
            "nodes": [["5f0c61e1", NODE_A]],  # shortened, the whole id on hover
        }
        assert second["text"] == f"Rank 6 on node 9b27c4d0 (10.0.0.9) is a straggler: 1.25x {PER_STEP}"
        assert second["nodes"] == [["9b27c4d0", NODE_B]]

        # it steps again and its ranks even out: the warnings go, without a reload
        source.set_health(source.running_id)
        health = browser.find_element("id", "job-health")
        wait_for(lambda: not health.is_displayed(), what="the warnings to go")
        assert browser.execute_script(READ_HEALTH) == []

        # a straggler whose node's address is unknown
        [line] = open_job_warnings(browser, url, VIT, "vit-b16-imagenet")
        assert line["text"] == f"Rank 2 on node c3d1e2f4 is a straggler: 1.31x {PER_STEP}"

        # a job kept off the nodes stragglers ran on
        [line] = open_job_warnings(browser, url, DISTILL, "vit-small-distill")
        assert line["kind"] == "avoiding" and line["nodes"] == [["5f0c61e1", NODE_A], ["9b27c4d0", NODE_B]]
        assert line["text"] == (
            "Avoiding node(s) 5f0c61e1, 9b27c4d0 (stragglers ran there): the job is not placed on them again."
        )
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_queue_marks_the_rows_of_jobs_with_stragglers_or_a_hang(browser):
    source = troubled_service()
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        load(browser, url, "#queue-body tr", len(source.jobs), "a row per job")
        flags = browser.execute_script(READ_FLAGS)
        assert flags[source.running_id] == {
            "text": "⚠",
            "hung": True,
            "title": "Hung: no step progress past the hang timeout; stacks saved, restarting\n"
            f"Straggler: rank 1 at 1.91x {PER_STEP} (node 5f0c61e1, 10.0.0.7)\n"
            f"Straggler: rank 6 at 1.25x {PER_STEP} (node 9b27c4d0, 10.0.0.9)",
        }
        assert flags[VIT] == {
            "text": "⚠",
            "hung": False,
            "title": f"Straggler: rank 2 at 1.31x {PER_STEP} (node c3d1e2f4)",
        }
        # healthy jobs, and one that only avoids nodes, carry no marker
        assert {job_id for job_id, flag in flags.items() if flag} == {source.running_id, VIT}

        source.set_health(source.running_id, avoid_nodes=[NODE_A])  # it stepped again
        wait_for(
            lambda: browser.execute_script(READ_FLAGS)[source.running_id] is None, what="the marker to go"
        )
        assert browser.execute_script(READ_FLAGS)[VIT] == flags[VIT]
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_node_ids_and_addresses_are_shown_as_text_never_as_markup(browser):
    source = FakeService()
    straggler = {"rank": 3, "node": HOSTILE_NODE, "ip": HOSTILE_IP, "ratio": 2.5}
    source.set_health(source.running_id, stragglers=[straggler], hung=True, avoid_nodes=[HOSTILE_NODE])
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        _, shown, avoiding = open_job_warnings(browser, url, source.running_id, "gpt2-small-owt")
        assert shown["text"] == f"Rank 3 on node <i>n</i> ({HOSTILE_IP}) is a straggler: 2.50x {PER_STEP}"
        assert shown["nodes"] == avoiding["nodes"] == [["<i>n</i>", HOSTILE_NODE]]
        flag = browser.execute_script(READ_FLAGS)[source.running_id]
        assert flag["title"].endswith(f"(node <i>n</i>, {HOSTILE_IP})")
        assert browser.execute_script("return document.querySelectorAll('img, b, i').length") == 0
        assert browser.execute_script("return window.__pwned === undefined") is True
        assert page_errors(browser) == []
    finally:
        server.stop()


def test_job_view_shows_its_replica_groups_a_lost_one_and_its_replacement_healed(browser):
    """A job of two replica groups: one lost (its node died), the other training; then a new
    group placed on another node, healed from the live one. The service's placement decides
    that a group is lost, whatever the attempt last said of it."""
    source = FakeService()
    trains = {"state": "training", "started_at": 100.0, "joined_at": 104.0, "nodes": [NODE_A]}
    stale = {"state": "training", "started_at": 100.0, "joined_at": 103.5, "nodes": [NODE_B]}
    with source.lock:
        source.jobs[VIT].update(group_placements=[{NODE_A: 1}, {}], replica_groups={"0": trains, "1": stale})
    server, url = serve(make_app(source), "127.0.0.1", 0)
    try:
        clean_console(browser)
        [line] = open_job_warnings(browser, url, VIT, "vit-b16-imagenet")
        assert line["kind"] == "replica-groups"
        assert line["text"] == (
            "Replica groups: 1 of 2 training · group 0 training, started in 4.0 s · "
            "group 1 lost, waiting for nodes"
        )
        healed = {"state": "training", "started_at": 300.0, "joined_at": 303.0, "nodes": [NODE_C]}
        healed.update(healed_at=305.5, healed_step=350)
        with source.lock:
            source.jobs[VIT].update(
                group_placements=[{NODE_A: 1}, {NODE_C: 1}], replica_groups={"0": trains, "1": healed}
            )
        wait_for(lambda: "2 of 2" in browser.execute_script(READ_HEALTH)[0]["text"], what="the heal")
        [line] = browser.execute_script(READ_HEALTH)
        assert line["text"] == (
            "Replica groups: 2 of 2 training · group 0 training, started in 4.0 s · group 1 training, "
            "started in 3.0 s, healed from a peer at step 350 (5.5 s after its start)"
        )
        assert page_errors(browser) == []
    finally:
        server.stop()
