"""The packages depend one way: core <- kernels <- workers <- orchestrator <- bench.

- `core` imports nothing of the project but itself, and neither torch, triton nor Ray.
- `kernels` imports only `core` of the project; `workers` only `core`, `kernels` and itself.
- `orchestrator` imports `core` and itself, and `workers` only inside functions of its entry
  points into the data plane (below); never `kernels`.
- `bench` imports nothing of `tests`: the clusters and S3 servers both start come from
  `orchestrator/testing`, which nothing of the product imports.

Within `orchestrator`, three rooms: `orchestrator/policy` (the scheduling policy: pure, it
imports no Ray and nothing of `orchestrator` outside itself), `orchestrator/service` (the
service actor and its I/O), and `orchestrator/client.py` (how the CLI and the drivers reach the
service; they import the service's modules only where listed below).

Read from the source (every import at any depth), so an import inside a function counts.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROJECT = ("core", "kernels", "workers", "orchestrator", "bench")
ALLOWED = {
    "core": {"core"},
    "kernels": {"core", "kernels"},
    "workers": {"core", "kernels", "workers"},
    "orchestrator": {"core", "orchestrator"},
}
FORBIDDEN_IN_CORE = {"torch", "triton", "ray", "torchao"}
# where the control plane hands over to the data plane, each import inside a function
ENTRY_POINTS = {
    "orchestrator/commands/run.py": {"workers.run", "workers.checks"},  # the local run; spec checks
    "orchestrator/commands/validate.py": {"workers.checks"},  # model and data registries
    "orchestrator/commands/models.py": {"workers"},  # the model registry it lists
    # a checkpoint's model state; the model rebuilt for ONNX
    "orchestrator/commands/export.py": {"workers.checkpoint", "workers.onnx_export"},
    # the Ray Train function and set-up
    "orchestrator/ray/train_run.py": {"workers.ray_backend"},
    "orchestrator/ray/launcher.py": {"workers.checks"},  # preflight: the data is there
    "orchestrator/attempt/listeners.py": {"workers.run_log"},  # the run's metrics log in storage
    "orchestrator/service/sent_spec.py": {"workers.checks"},  # a spec sent over HTTP: its model and data
}
# where the CLI and the drivers import the service's own modules (else they use orchestrator.client)
SERVICE_MODULES_OUTSIDE = {
    "orchestrator/commands/service.py": {  # `orchestrator up` starts the actor; `down` frees the store
        "orchestrator.service.actor",
        "orchestrator.service.store",
    },
    # reads a spec as the service reads one sent over HTTP (relative storage, the resume note)
    "orchestrator/commands/submit.py": {"orchestrator.service.sent_spec"},
}


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) of every import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, id(node) in top))
    return found


def package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", ALLOWED)
def test_imports_point_one_way(package):
    files = package_files(package)
    assert files
    wrong = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        for module, at_top in imports(path):
            root = module.split(".")[0]
            if package == "core" and root in FORBIDDEN_IN_CORE:
                wrong.append(f"{relative}: {module}")
            if root not in PROJECT or root in ALLOWED[package]:
                continue
            entry = ENTRY_POINTS.get(relative, set())
            if root == "workers" and not at_top and module in entry:
                continue
            wrong.append(f"{relative}: {module}" + (" (at module level)" if at_top else ""))
    assert wrong == [], "imports against the layering:\n" + "\n".join(wrong)


def test_the_testing_helpers_are_shared_one_way():
    """The benchmarks start their clusters and S3 servers with `orchestrator.testing`, never
    with the tests' modules; the product itself imports none of `orchestrator.testing`."""
    wrong = [
        f"{path.relative_to(ROOT).as_posix()}: {module}"
        for path in package_files("bench")
        for module, _ in imports(path)
        if in_package(module, "tests")
    ]
    for package in ("core", "kernels", "workers", "orchestrator"):
        for path in package_files(package):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith("orchestrator/testing/"):
                continue
            wrong += [
                f"{relative}: {module}"
                for module, _ in imports(path)
                if in_package(module, "orchestrator.testing")
            ]
    assert wrong == [], "imports of the tests or of the testing helpers:\n" + "\n".join(wrong)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f():\n    from workers.run import run_local\n")
    assert imports(sample) == [("os", True), ("workers.run", False)]


def test_the_control_plane_loads_without_torch():
    """The CLI, the service and the driver import neither torch nor the data plane."""
    code = (
        "import sys\n"
        "import orchestrator.cli, orchestrator.driver, orchestrator.service.actor\n"
        "import orchestrator.commands.submit, orchestrator.monitoring.exporter\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'workers', 'kernels', 'triton'}))"
    )
    assert printed_by(code) == "[]"


def printed_by(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (so only what it imports is loaded)."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_policy_imports_no_ray_and_nothing_outside_itself():
    """orchestrator/policy: no Ray, and of the project only `core` and itself (so neither Ray
    nor the service comes in indirectly, through orchestrator.ray or orchestrator.service)."""
    files = package_files("orchestrator/policy")
    assert len(files) > 10
    wrong = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        wrong += [f"{relative}: relative import" for n in ast.walk(tree) if getattr(n, "level", 0)]
        for module, _ in imports(path):
            root = module.split(".")[0]
            if root == "ray" or (
                root in PROJECT and root != "core" and not in_package(module, "orchestrator.policy")
            ):
                wrong.append(f"{relative}: {module}")
    assert wrong == [], "the policy imports against its room:\n" + "\n".join(wrong)


def test_the_cli_and_the_drivers_reach_the_service_through_the_client():
    """Only orchestrator.client, except where listed (SERVICE_MODULES_OUTSIDE); the client itself
    does not import the service actor's module (which loads the whole service)."""
    files = [
        *package_files("orchestrator/commands"),
        ROOT / "orchestrator/driver.py",
        *package_files("orchestrator/attempt"),
    ]
    wrong = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        allowed = SERVICE_MODULES_OUTSIDE.get(relative, set())
        for module, _ in imports(path):
            if in_package(module, "orchestrator.service") and module not in allowed:
                wrong.append(f"{relative}: {module}")
    wrong += [
        f"orchestrator/client.py: {module}"
        for module, _ in imports(ROOT / "orchestrator/client.py")
        if in_package(module, "orchestrator.service.actor")
    ]
    assert wrong == [], "the service reached around its client:\n" + "\n".join(wrong)


def test_the_policy_and_the_client_load_without_ray():
    """Every module of the policy, and the client (whose HTTP way in needs no Ray), once loaded."""
    modules = sorted(
        p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        for p in package_files("orchestrator/policy")
    )
    code = (
        "import importlib, sys\n"
        f"for name in {modules + ['orchestrator.client']!r}:\n"
        "    importlib.import_module(name)\n"
        "outside = {m for m in sys.modules if m.startswith('orchestrator.')}\n"
        "outside -= {m for m in outside if m.startswith('orchestrator.policy')}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'torch'}), sorted(outside))"
    )
    assert printed_by(code) == "[] ['orchestrator.client', 'orchestrator.errors']"
