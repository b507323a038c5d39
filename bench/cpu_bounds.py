"""CPU time of what a user waits for on their own machine, before any cluster: a hostile job
spec refused, the largest spec read, the model catalog, Fashion-MNIST from the system install.

    python bench/cpu_bounds.py

Each figure is this process' CPU time (`time.process_time`: what the work costs, whatever else
runs beside it), printed against its goal. The tests check the answers (tests/test_spec_input.py:
one line naming the limit hit; tests/test_models.py, tests/test_data.py: the exact counts); how
long they take is this script's, since a loaded machine misses a goal that a correct program
meets. Exits 1 when a goal is missed.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.spec import MAX_SPEC_BYTES, SpecError, load_spec  # noqa: E402

HEAD = "name: t\nmodel: {family: vit, preset: vit_micro}\ndata: {source: digits}\ntrain: {steps: 10}\n"


def laughs(levels: int, width: int) -> bytes:
    """The "billion laughs": each level is `width` aliases of the one before."""
    text = HEAD + 'notes: &l0 ["lol"]\n'
    for i in range(1, levels + 1):
        text += f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]\n"
    return text.encode()


# the inputs the parser works hardest on before it refuses them -> (bytes, goal in CPU seconds)
SPECS = {
    "billion laughs (9 x 9 aliases)": (laughs(9, 9), 2.0),
    "wide laughs (40 million values once expanded)": (laughs(9, 7), 0.1),
    "deep nesting (5,000 brackets)": (b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n", 2.0),
    "many values (20,000)": (b"v: [" + b"1, " * 20000 + b"1]\n", 2.0),
    "endless integer (5,000 digits)": (HEAD.replace("10", "9" * 5000).encode(), 2.0),
    "the largest file read (plain text)": (b"name: " + b"a " * (MAX_SPEC_BYTES // 2 - 8) + b"\n", 2.0),
}


def cpu_s(work: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """The CPU seconds `work(*args)` took, and what it returned."""
    start = time.process_time()
    result = work(*args)
    return time.process_time() - start, result


def refused(path: Path) -> str:
    """The one line a user gets for the file ("" if it was accepted)."""
    try:
        load_spec(path)
    except SpecError as err:
        return err.problems[0]
    return ""


def spec_figures(folder: Path) -> dict[str, tuple[float, float, str]]:
    """Each hostile spec -> (CPU seconds, goal, the line it was refused with)."""
    figures = {}
    for i, (name, (data, goal)) in enumerate(SPECS.items()):
        path = folder / f"spec{i}.yaml"
        path.write_bytes(data)
        seconds, line = cpu_s(refused, path)
        figures[name] = (seconds, goal, line)
    return figures


def load_figures() -> dict[str, tuple[float, float, str]]:
    """The model catalog, and Fashion-MNIST where the system has it (the tests' goals)."""
    from core.spec import DataSpec
    from workers import data, models
    from workers.data import fashion_mnist

    seconds, rows = cpu_s(models.catalog)
    figures = {"model catalog": (seconds, 20.0, f"{len(rows)} presets")}
    if fashion_mnist.SYSTEM_DIR.is_dir():
        seconds, loaded = cpu_s(data.load, DataSpec(source="fashion-mnist"))
        figures["Fashion-MNIST, system install"] = (seconds, 2.0, f"{len(loaded.train):,} train images")
    return figures


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        figures = {**spec_figures(Path(folder)), **load_figures()}
    print(f"{'CPU s':>7}  {'goal':>6}  met  what (answer)")
    for name, (seconds, goal, answer) in figures.items():
        met = "yes" if seconds < goal else "NO"
        print(f"{seconds:7.3f}  {f'< {goal:g}':>6}  {met:<3}  {name} ({answer[:70]})")
    return 0 if all(seconds < goal for seconds, goal, _ in figures.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
