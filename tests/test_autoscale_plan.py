"""What the service asks an autoscaler for (orchestrator/policy/autoscale.py, pure) and how
the policy treats a job that fits only once nodes are added; the live path is
tests/test_autoscaler.py."""

import pytest

from orchestrator.policy import Policy
from orchestrator.policy.autoscale import NodeType, describe, headroom, nodes_to_add, possible_nodes
from orchestrator.policy.types import JobRequest, Node
from orchestrator.ray.autoscaler import ConfigError, load_config

GPU8 = NodeType("gpu-8x", {"CPU": 96.0, "GPU": 8.0}, max_nodes=4)
CPU16 = NodeType("cpu-16", {"CPU": 16.0}, max_nodes=10)


def job(workers: int, gpu: float = 1.0, cpu: float = 8.0) -> JobRequest:
    return JobRequest("j", 0, workers, {"CPU": cpu, "GPU": gpu}, 0.0)


def test_headroom_counts_only_the_autoscalers_own_nodes_and_the_global_cap():
    workers = [Node("a", {"CPU": 96.0, "GPU": 8.0}), Node("hand-made", {"CPU": 96.0, "GPU": 4.0})]
    assert headroom([GPU8, CPU16], workers) == {"gpu-8x": 3, "cpu-16": 10}
    assert headroom([GPU8, CPU16], workers, total_cap=3) == {"gpu-8x": 2, "cpu-16": 2}
    assert headroom([GPU8], [Node(str(i), dict(GPU8.resources)) for i in range(5)]) == {"gpu-8x": 0}


def test_the_fewest_nodes_of_the_type_that_holds_most_workers():
    free = {"head": {"CPU": 8.0}}
    assert nodes_to_add(job(12), free, [CPU16, GPU8], {"cpu-16": 10, "gpu-8x": 4}) == {"gpu-8x": 2}
    # free room on a live node counts: 4 GPUs free there, so 12 workers need one more node only
    free["n1"] = {"CPU": 48.0, "GPU": 4.0}
    assert nodes_to_add(job(12), free, [GPU8], {"gpu-8x": 4}) == {"gpu-8x": 1}
    assert nodes_to_add(job(12), free, [GPU8], {"gpu-8x": 0}) is None  # none left to add
    # a CPU job: CPU nodes while there are any (a GPU node would hold 6 of its workers, idle GPUs)
    cpu_job = job(2, gpu=0, cpu=16)
    assert nodes_to_add(cpu_job, {}, [GPU8, CPU16], {"gpu-8x": 4, "cpu-16": 2}) == {"cpu-16": 2}
    assert nodes_to_add(cpu_job, {}, [GPU8, CPU16], {"gpu-8x": 4, "cpu-16": 1}) == {"cpu-16": 1, "gpu-8x": 1}
    assert describe({"gpu-8x": 2}, [GPU8]) == "2 more node(s) of gpu-8x (96 CPU, 8 GPU)"


def test_a_job_that_fits_only_with_added_nodes_waits_instead_of_being_refused():
    live = [Node("head", {"CPU": 8.0})]
    policy = Policy(live)
    assert "no node has any GPU" in policy.rejection_reason(job(8))
    policy.set_nodes(live, possible=possible_nodes(live, [GPU8], {"gpu-8x": 1}))
    assert policy.rejection_reason(job(8)) is None
    too_big = policy.rejection_reason(job(9))
    assert "room for only 8 such worker(s) (2 node(s))" in too_big
    assert too_big.endswith("counting the 1 the autoscaler may still add")
    decision = policy.schedule(0.0, [job(8)], [])
    assert decision.admit == [] and decision.head == "j"  # it waits at the head for the nodes


def test_an_autoscaler_config_that_cannot_be_used_names_the_field(tmp_path):
    path = tmp_path / "cluster.yaml"
    cases = {
        "available_node_types: {}\n": "available_node_types: required",
        "available_node_types: {w: {resources: {GPU: many}, max_workers: 1}}\n": "w.resources: a mapping",
        "available_node_types: {w: {resources: {GPU: 1}, max_workers: -1}}\n": "w.max_workers: a whole",
    }
    for text, words in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError, match=words):
            load_config(str(path))
    path.write_text(
        "head_node_type: head\nmax_workers: 3\navailable_node_types:\n"
        "  head: {resources: {CPU: 0}, max_workers: 0}\n  w: {resources: {GPU: 8}, max_workers: 2}\n"
    )
    assert load_config(str(path)) == {
        "types": [{"name": "w", "resources": {"GPU": 8.0}, "max_nodes": 2}],  # the head is never added
        "max_workers": 3,
    }
