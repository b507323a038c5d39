"""A dependency's private symbols, as the project relies on them, and the check that they still
are what it relies on.

Where no public API serves, the project uses a dependency's private symbol through one module
per dependency (`orchestrator/ray/internals.py` for Ray, `workers/torch_internals.py` for
torch), which lists each use as a `Private` with why no public API serves; the contract tests
run `problem` on every entry against the installed version. Imports neither Ray nor torch
itself: `problem` imports what an entry names, when it is checked.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Private:
    """One private symbol used: `module:Qual.name` (a file: a path inside the package), what it
    is, the parameters relied on (in order, `self` first for methods; None: not checked, e.g.
    compiled code without a signature) and why no public API serves."""

    symbol: str
    kind: str  # "module", "class", "function", "method", "coroutine", "attribute", "file"
    params: tuple[str, ...] | None = None
    why: str = ""


def resolve(symbol: str):
    """The object `module:Qual.name` names (a module for a bare module name)."""
    module_name, _, qualname = symbol.partition(":")
    found = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        found = getattr(found, part)
    return found


KIND_CHECKS = {
    "module": inspect.ismodule,
    "class": inspect.isclass,
    "function": lambda f: inspect.isfunction(f) and not inspect.iscoroutinefunction(f),
    "method": lambda f: callable(f) and not inspect.iscoroutinefunction(f),
    "coroutine": inspect.iscoroutinefunction,
    "attribute": lambda f: True,
}


def problem(use: Private, package: str) -> str | None:
    """None when `use` holds on the installed `package` (ray, torch), else one line naming the
    symbol and the package's version."""
    installed = importlib.import_module(package)
    where = f"{package} {installed.__version__}"
    if use.kind == "file":
        path = os.path.join(os.path.dirname(installed.__file__), use.symbol)
        return None if os.path.isfile(path) else f"{use.symbol}: no such file in {where}"
    try:
        found = resolve(use.symbol)
    except (ImportError, AttributeError) as err:
        return f"{use.symbol}: not in {where} ({err})"
    if not KIND_CHECKS[use.kind](found):
        return f"{use.symbol}: is no longer a {use.kind} in {where}"
    if use.params is None:
        return None
    target = found.__init__ if inspect.isclass(found) else found
    params = tuple(inspect.signature(target).parameters)
    if params[: len(use.params)] != use.params:
        return f"{use.symbol}: parameters {params} in {where}, expected {use.params}"
    return None
