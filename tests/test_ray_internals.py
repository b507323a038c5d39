"""Ray's private surface, held at one door: `orchestrator/ray/internals.py` (torch's:
`workers/torch_internals.py`, tests/test_torch_internals.py).

Every private symbol the product uses is listed there (`USES`) with its kind and the parameters
relied on; each is checked here against the installed Ray, so that a renamed method fails this
test with one line naming it (an override of a renamed method would otherwise be dead code,
silently). The rest of the source may not reach Ray's (or torch's) private modules at all.
"""

import ast
import re
from pathlib import Path

import pytest
import ray

from orchestrator.ray import internals
from tests.conftest import ROOT
from workers import torch_internals

PRIVATE_MODULE = re.compile(r"^(ray|torch)(\.[A-Za-z0-9_]+)*\._[a-z]")  # ray._private, ray.train._internal
SOURCES = ("core", "kernels", "workers", "orchestrator", "bench", "tests")


@pytest.mark.parametrize("use", internals.USES, ids=lambda use: use.symbol)
def test_each_private_symbol_is_what_the_product_relies_on(use):
    assert internals.problem(use) is None, internals.problem(use)
    assert use.why, f"{use.symbol}: say why no public API serves"


def test_ray_is_in_the_range_pyproject_pins():
    from packaging.specifiers import SpecifierSet

    pyproject = (ROOT / "pyproject.toml").read_text()
    pinned = re.search(r'"ray\[[a-z,]+\]([^"]+)"', pyproject).group(1)
    assert pinned == internals.RAY_RANGE, "pyproject.toml and internals.RAY_RANGE disagree"
    assert ray.__version__ in SpecifierSet(pinned), f"Ray {ray.__version__} is outside {pinned}"


def test_a_renamed_symbol_fails_with_one_line_naming_it_and_the_version(monkeypatch):
    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy

    use = next(u for u in internals.USES if u.symbol.endswith("._maybe_send_resource_request"))
    owner = next(c for c in FixedScalingPolicy.__mro__ if "_maybe_send_resource_request" in vars(c))
    monkeypatch.delattr(owner, "_maybe_send_resource_request")
    line = internals.problem(use)
    assert line.startswith(use.symbol) and f"ray {ray.__version__}" in line and "\n" not in line


def test_a_coroutine_that_became_a_plain_method_is_caught(monkeypatch):
    from ray.train.v2._internal.execution.controller import TrainController

    use = next(u for u in internals.USES if u.symbol.endswith("TrainController.run"))
    monkeypatch.setattr(TrainController, "run", lambda self: None)
    assert "no longer a coroutine" in internals.problem(use)


def test_changed_parameters_are_caught(monkeypatch):
    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy

    use = next(u for u in internals.USES if u.symbol.endswith(".after_controller_start"))
    monkeypatch.setattr(FixedScalingPolicy, "after_controller_start", lambda self, context, extra: None)
    assert "parameters" in internals.problem(use)


def private_uses(path: Path, root: Path = ROOT) -> list[str]:
    """'path:line what' for each import of a private Ray or torch module, and each attribute
    chain `ray._x` / `torch._x`, in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in ("ray", "torch") and node.attr.startswith("_"):
                names = [f"{node.value.id}.{node.attr}"]
        found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if PRIVATE_MODULE.match(n)]
    return found


def test_no_private_ray_or_torch_outside_the_internals_module():
    # the two doors, and their contract tests
    doors = ("orchestrator/ray/internals.py", "workers/torch_internals.py", "tests/test_torch_internals.py")
    allowed = {ROOT / path for path in doors} | {Path(__file__).resolve()}
    found = []
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.resolve() not in allowed:
                found += private_uses(path)
    private_methods = {u.symbol.rsplit(".", 1)[-1] for u in internals.USES + torch_internals.USES}
    private_methods = {m for m in private_methods if m.startswith("_")}
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.resolve() in allowed:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                found += [f"{path.relative_to(ROOT)}:{n} {m}" for m in private_methods if m in line]
    assert found == [], "private Ray or torch outside orchestrator/ray/internals.py:\n" + "\n".join(found)


def test_the_walk_sees_private_imports_and_attributes(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import ray\nfrom ray._private import state\nimport ray.train._internal.utils\n"
        "from ray.train import report\nray._private.worker\ntorch._dynamo.reset()\n"
    )
    uses = sorted(line.split(" ", 1)[1] for line in private_uses(sample, tmp_path))
    assert uses == ["ray._private", "ray._private", "ray.train._internal.utils", "torch._dynamo"]


def ray_train_barriers(path: Path, root: Path = ROOT) -> list[str]:
    """Where the source reaches `ray.train.report` or Ray Train's collectives (code, not text)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("report", "collective"):
            if ast.unparse(node.value) in ("ray.train", "train"):
                found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ray.train"):
            names = {alias.name for alias in node.names}
            if names & {"report", "collective"} or node.module.startswith("ray.train.collective"):
                found.append(f"{path.relative_to(root)}:{node.lineno} from {node.module} import ...")
    return found


def test_no_worker_calls_a_ray_train_barrier_so_a_run_needs_no_synchronization_actor(tmp_path):
    """`internals.without_synchronization_actor` stands the attempt's controller in for Ray
    Train's SynchronizationActor: it holds only while nothing calls the barriers it serves."""
    sample = tmp_path / "sample.py"
    sample.write_text("import ray\nfrom ray.train import report\nray.train.report({})\n")
    assert [use.split(" ")[0] for use in ray_train_barriers(sample, tmp_path)] == [
        "sample.py:2",
        "sample.py:3",
    ]
    found = [
        use
        for package in ("workers", "orchestrator", "kernels", "core")
        for path in sorted((ROOT / package).rglob("*.py"))
        for use in ray_train_barriers(path)
    ]
    assert found == [], "a Ray Train barrier is called: restore its SynchronizationActor\n" + "\n".join(found)
