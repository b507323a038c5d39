"""deploy/: every file parses, the launcher config passes Ray's schema, the RayJob runs a valid job."""

import shlex
from pathlib import Path

import yaml

from core.spec import load_spec
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def test_cluster_launcher_config_passes_rays_validation():
    from orchestrator.ray.internals import validate_autoscaler_config

    config = load("ray-cluster.yaml")
    validate_autoscaler_config(config)  # raises on a schema error
    gpu = config["available_node_types"]["gpu_8x"]
    assert gpu["max_workers"] >= 1 and config["head_node_type"] == "head"
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        if "ray start" in command:
            assert "RAY_AUTH_MODE=token" in command and "--disable-usage-stats" in command


def pod_containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def test_kuberay_raycluster_manifest():
    cluster = load("kuberay-raycluster.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    spec = cluster["spec"]
    assert spec["rayVersion"] == "2.60.0" and spec["authOptions"]["mode"] == "token"
    workers = spec["workerGroupSpecs"][0]
    assert pod_containers(workers)[0]["resources"]["limits"]["nvidia.com/gpu"]
    images = {
        c["image"] for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]] for c in pod_containers(g)
    }
    assert len(images) == 1  # head and workers run the same image


def test_the_autoscaler_configs_tell_the_service_what_a_new_node_holds():
    """The service plans autoscaler requests from these (orchestrator/ray/autoscaler.py)."""
    from orchestrator.ray.autoscaler import load_config

    launcher = load_config(str(DEPLOY / "ray-cluster.yaml"))
    assert launcher["types"] == [{"name": "gpu_8x", "resources": {"CPU": 96.0, "GPU": 8.0}, "max_nodes": 4}]
    # KubeRay's autoscaler has no file the service can find: the one shipped must match the groups
    kuberay = load_config(str(DEPLOY / "autoscaler-kuberay.yaml"))
    groups = load("kuberay-raycluster.yaml")["spec"]["workerGroupSpecs"]
    assert load("kuberay-raycluster.yaml")["spec"]["enableInTreeAutoscaling"] is True
    expected = []
    for group in groups:
        limits = pod_containers(group)[0]["resources"]["limits"]
        resources = {"CPU": float(limits["cpu"]), "GPU": float(limits["nvidia.com/gpu"])}
        expected.append(
            {"name": group["groupName"], "resources": resources, "max_nodes": group["maxReplicas"]}
        )
    assert kuberay["types"] == expected


def test_kuberay_rayjob_runs_a_valid_orchestrator_command():
    job = load("kuberay-rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["orchestrator", "run", "jobs/vit.yaml"]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    spec = load_spec(ROOT / argv[2], overrides)  # raises SpecError if any override is invalid
    assert spec.resources.gpus_per_worker == 1 and spec.checkpoint.storage.startswith("s3://")
    assert job["spec"]["rayClusterSpec"]["authOptions"]["mode"] == "token"
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert pod_containers(head)[0]["workingDir"] == "/app"


def test_dockerfile_installs_the_project_on_a_cuda_torch_base():
    text = (DEPLOY / "Dockerfile").read_text()
    base = next(line for line in text.splitlines() if line.startswith("ARG BASE_IMAGE="))
    assert "pytorch/pytorch:" in base and "cuda" in base
    assert "FROM ${BASE_IMAGE}" in text
    assert "pip install --no-deps ." in text and "COPY jobs ./jobs" in text
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_every_deploy_file_is_documented():
    readme = (DEPLOY / "README.md").read_text()
    for name in ["Dockerfile", "ray-cluster.yaml", "kuberay-raycluster.yaml", "kuberay-rayjob.yaml"]:
        assert f"`{name}`" in readme, name
    assert Path(DEPLOY / "Dockerfile").exists()
