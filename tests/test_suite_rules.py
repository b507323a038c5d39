"""Rules for the suite itself, read from the tests' source with `ast` (nothing is imported).

No timed assertions: a test that bounds a measured duration from above, or a measured rate from
below, fails on a correct program when the machine is slow or loaded. Such thresholds live in
`bench/`, which prints each figure against its goal; a test keeps what fails on any machine (the
invariants, the counts, the provenance, that a figure was measured). Waiting for something with
a deadline is not a bound on its speed: `time.time() < deadline` compares with no constant.

`python tests/test_suite_rules.py` prints what the rule finds.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a measured duration: its name says so (a key, an attribute, a variable, a function)
DURATION = re.compile(r"elapsed|duration|took|latency|seconds|_s$|_ms$|^p50$|^p9\d$|wall")
RATE = re.compile(r"per_s$|samples_per|tokens_per|throughput|speed")
CLOCKS = {"time", "perf_counter", "process_time", "monotonic", "perf_counter_ns", "monotonic_ns"}
UPPER, LOWER = (ast.Lt, ast.LtE), (ast.Gt, ast.GtE)
FLIPPED = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
# (file, test): why its bounds are not a machine's speed
ALLOWED = {
    # committed bench results, as the docs quote them: a figure recorded once, not measured here
    ("test_scheduler_sim.py", "test_committed_full_size_results"),
    ("test_scheduler_traces.py", "test_committed_trace_results_meet_the_targets_they_claim"),
}


def _label(node: ast.expr) -> str | None:
    """The name a figure goes by: a variable, an attribute, a dict key, a function called."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call):
        return _label(node.func)
    return None


def _is_clock(node: ast.expr) -> bool:
    """`time.perf_counter()` and its kin: a reading of the clock."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCKS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def measured(node: ast.expr) -> str | None:
    """Whether the expression reads like a measured "duration" or "rate" (None: neither)."""
    label = _label(node) or ""
    if RATE.search(label):  # before DURATION: samples_per_s is a rate
        return "rate"
    if _is_clock(node) or DURATION.search(label):
        return "duration"
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Sub) and (_label(node.left) or "").endswith("_at"):
            return "duration"  # one timestamp minus another
        return measured(node.left) or measured(node.right)
    # (not `abs`: `abs(a - b) < eps` says two figures agree, it bounds neither)
    if isinstance(node, ast.Call) and _label(node) in ("min", "max", "sum"):
        return next((kind for arg in node.args if (kind := measured(arg))), None)
    if isinstance(node, ast.GeneratorExp):
        return measured(node.elt)
    return None


def fixed(node: ast.expr) -> bool:
    """A number written in the test: a literal, a module constant, arithmetic of those."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id.isupper()
    if isinstance(node, ast.UnaryOp):
        return fixed(node.operand)
    if isinstance(node, ast.BinOp):
        return fixed(node.left) and fixed(node.right)
    return False


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def timed(left: ast.expr, op: ast.cmpop, right: ast.expr) -> bool:
    """Whether `left op right` bounds a measured duration from above or a rate from below."""
    if fixed(left) and not fixed(right):  # `10 > x` reads as `x < 10`
        left, op, right = right, FLIPPED.get(type(op), type(op))(), left
    if not fixed(right):
        return False
    kind = measured(left)
    if kind == "duration":
        return isinstance(op, UPPER)
    return kind == "rate" and isinstance(op, LOWER) and not _is_zero(right)


def _tests(tree: ast.Module):
    """(function name, assert) for each assert, by the top-level function it is in."""
    for top in tree.body:
        name = top.name if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else ""
        for node in ast.walk(top):
            if isinstance(node, ast.Assert):
                yield name, node


def timed_asserts(path: Path, source: str | None = None) -> list[str]:
    """`file:line: the assert` for each timed assertion in a test file."""
    source = path.read_text() if source is None else source
    found = []
    for function, node in _tests(ast.parse(source, str(path))):
        if (path.name, function) in ALLOWED:
            continue
        for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            operands = [compare.left, *compare.comparators]
            if any(timed(a, op, b) for a, op, b in zip(operands, compare.ops, operands[1:])):
                found.append(f"{_shown(path)}:{node.lineno}: {ast.unparse(node.test)[:100]}")
                break
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def suite_files() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("*.py") if "_artifacts" not in p.parts)


def test_no_test_bounds_a_measured_time_or_speed():
    found = [line for path in suite_files() for line in timed_asserts(path)]
    assert not found, "time thresholds belong in bench/, not in tests:\n" + "\n".join(found)


# what the rule was written against: asserts the suite had, each to be found
OFFENDERS = """
def test_offenders():  # parsed, never run
    assert decision["p99"] < 10, "a scheduling decision must take well under 10 ms"
    assert record["wall_s"] < 60
    assert elapsed < 2.0, f"took {elapsed:.2f} s of CPU"
    assert time.process_time() - start < 0.1
    assert time.perf_counter() - started < 5, "handing records over waited for the server"
    assert noticed_s < 10
    assert stop_s < START_UP_STOP_S
    assert HANG_TIMEOUT_S <= hung["stalled_s"] < HANG_TIMEOUT_S + 10
    assert resumed_at - stalled_from <= HANG_TIMEOUT_S + 30
    assert max(step_s() for _ in range(3)) < 0.05
    assert fast["compute_s"] < 0.5 * SLOW_S
    assert result["samples_per_s"] > 100
"""
# what it must let through: deadlines, lower bounds on what a sleep guarantees, same-run
# comparisons, figures that are merely there, exact sums
INNOCENT = """
def test_innocent():
    assert time.time() < deadline, "no step 500 in the metrics log"
    assert min(step_s() for _ in range(3)) >= 0.05
    assert HANG_TIMEOUT_S <= hung["stalled_s"]
    assert fast["compute_s"] < slow["compute_s"]
    assert 0 <= resumed["check_s"] < time.time() - started
    assert summary["checkpoint_blocked_s"] > 0 and data["samples_per_s"] > 0
    assert 0 < decision["p50"] <= decision["p99"] <= decision["max"]
    assert sum(ledger.seconds.values()) == pytest.approx(31.0)
    assert hangs.timeout_s(None, 30.0) == 300.0
    assert abs(summary["on_step_s"] - summary["off_step_s"]) < 1e-9
"""


def test_the_rule_finds_the_timed_asserts_the_suite_had_and_only_those():
    offenders = timed_asserts(ROOT / "tests" / "offenders.py", OFFENDERS)
    assert len(offenders) == OFFENDERS.count("assert "), offenders
    assert timed_asserts(ROOT / "tests" / "innocent.py", INNOCENT) == []


if __name__ == "__main__":
    paths = [Path(arg).resolve() for arg in sys.argv[1:]] or suite_files()
    print("\n".join(line for path in paths for line in timed_asserts(path)) or "no timed assertions")
