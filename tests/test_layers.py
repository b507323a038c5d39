"""The packages depend one way: core <- kernels <- workers <- orchestrator <- bench.

- `core` imports nothing of the project but itself, and neither torch, triton nor Ray.
- `kernels` imports only `core` of the project; `workers` only `core`, `kernels` and itself.
- `orchestrator` imports `core` and itself, and `workers` only inside functions of its entry
  points into the data plane (below); never `kernels`.

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
    "orchestrator/commands/export.py": {"workers.checkpoint"},  # a checkpoint's model state
    "orchestrator/ray/launcher.py": {"workers.ray_context"},  # the Ray Train function
    "orchestrator/driver.py": {"workers.checks"},  # preflight: the data is there
    "orchestrator/attempt.py": {"workers.run_log"},  # the run's metrics log in storage
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


def test_the_walk_sees_imports_inside_functions(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\ndef f():\n    from workers.run import run_local\n")
    assert imports(sample) == [("os", True), ("workers.run", False)]


def test_the_control_plane_loads_without_torch():
    """The CLI, the service and the driver import neither torch nor the data plane."""
    code = (
        "import sys\n"
        "import orchestrator.cli, orchestrator.driver, orchestrator.scheduler.actor\n"
        "import orchestrator.commands.submit, orchestrator.monitoring.exporter\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'workers', 'kernels', 'triton'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
