"""Reading a spec file: YAML bounded in size, time and memory, every failure one line.

Whatever the file holds (bytes that are not text, YAML bombs, duplicate keys, recursive
aliases, a 5,000-digit integer), `read_yaml` returns the top-level mapping or raises
`SpecError` with a line that names the place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from core.spec.errors import SpecError, short, value_kind

MAX_SPEC_BYTES = 256 * 1024  # a job spec is a few KiB; parsing 256 KiB takes at most ~0.3 s
MAX_DEPTH = 32  # nesting levels (a spec needs about 6)
MAX_ALIASES = 64  # *alias references in one document
MAX_VALUES = 10_000  # values in the document, once every alias is expanded


class YAMLRefused(Exception):
    """YAML that parses but is refused (duplicate keys, limits); `line` is 1-based."""

    def __init__(self, message: str, line: int | None = None):
        self.line = line
        super().__init__(f"line {line}: {message}" if line else message)


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting and alias bombs while composing and names bad values'
    lines while constructing."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                line = self.peek_event().start_mark.line + 1
                raise YAMLRefused(f"more than {MAX_ALIASES} aliases (*name); a job spec needs a few", line)
            return super().compose_node(parent, index)
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            line = self.peek_event().start_mark.line + 1
            raise YAMLRefused(f"nested more than {MAX_DEPTH} levels deep", line)
        if self._nodes > MAX_VALUES:  # stop early: pure-Python parsing costs ~20 us a value
            line = self.peek_event().start_mark.line + 1
            raise YAMLRefused(f"more than {MAX_VALUES} values; a job spec has a few hundred", line)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # e.g. a date 2026-02-30, a 5,000-digit integer
            reason = "too many digits" if "integer string conversion" in str(err) else str(err)
            raise YAMLRefused(
                f"cannot read the value {short(node.value)}: {reason}", node.start_mark.line + 1
            ) from None


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_graph(root, loader: _Loader) -> None:
    """Refuse recursive aliases, alias chains nested too deep, documents that expand to too
    many values, and duplicate keys; visits each node once (iteratively: no recursion limit)."""
    size: dict[int, int] = {}  # id(node) -> values once expanded
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()  # the path from the root to the node being visited
    stack = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            open_nodes.discard(key)
            line = node.start_mark.line + 1
            if size[key] > MAX_VALUES:
                raise YAMLRefused(
                    f"the document expands to more than {MAX_VALUES} values through anchors and"
                    " aliases; a job spec has a few hundred",
                    line,
                )
            if depth[key] > MAX_DEPTH:
                raise YAMLRefused(f"nested more than {MAX_DEPTH} levels deep (through aliases)", line)
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise YAMLRefused(
                "an alias refers to a node that contains it (a recursive structure)", node.start_mark.line + 1
            )
        open_nodes.add(key)
        if isinstance(node, yaml.MappingNode):
            _check_duplicate_keys(node, loader)
        stack.append((node, True))
        stack += [(child, False) for child in _children(node)]


def _check_duplicate_keys(node, loader: _Loader) -> None:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue  # merged keys may be overridden; complex keys are refused by the constructor
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            earlier = first_line.get(key)
        except TypeError:  # unhashable: the constructor says so
            continue
        if earlier is not None:
            raise YAMLRefused(
                f"duplicate key '{short(key, 60, quote=False)}' (first at line {earlier}, again at line"
                f" {line}); each key may appear once per mapping",
                line,
            )
        first_line[key] = line


def parse_yaml(text: str) -> Any:
    """One YAML document, or None if there is none; raises yaml.YAMLError or YAMLRefused."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, loader)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_problem(err: yaml.YAMLError, text: str) -> str:
    """One line for a YAML error, with its line (and column)."""
    if isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
        code = ord(err.character) if isinstance(err.character, str) else err.character
        return f"line {line}: unacceptable character #x{code:04x}; YAML allows no control characters"
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is None:
        return f"YAML syntax error: {problem}"
    lines = text.splitlines()
    source_line = lines[mark.line] if mark.line < len(lines) else ""
    indent = source_line[: len(source_line) - len(source_line.lstrip(" \t"))]
    if "\t" in indent:
        return f"line {mark.line + 1}: a tab character indents this line; YAML indents with spaces only"
    if "'\\t'" in problem:
        return (
            f"line {mark.line + 1}, column {mark.column + 1}: a tab character; YAML separates values"
            " with spaces (tabs may appear only inside quoted strings and comments)"
        )
    context = getattr(err, "context", None)
    context_mark = getattr(err, "context_mark", None)
    if context and context_mark is not None and context_mark.line != mark.line:
        problem += f" ({context} at line {context_mark.line + 1})"
    return f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _read_bytes(path: Path) -> bytes:
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(["no such file"], source) from None
    except IsADirectoryError:
        raise SpecError(["is a directory, not a job spec file"], source) from None
    except OSError as err:
        raise SpecError([f"cannot read: {err.strerror or err}"], source) from None
    except ValueError as err:  # e.g. a NUL byte in the path
        raise SpecError([f"not a usable file path: {err}"], source) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([f"larger than {MAX_SPEC_BYTES // 1024} KiB; a job spec is a few KiB"], source)
    return data


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise SpecError(
            [f"not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start} (line {line})"], source
        ) from None


def read_yaml(path: str | Path) -> dict:
    """The top-level mapping of a spec file; SpecError with one line for anything else."""
    path = Path(path)
    source = str(path)
    return mapping_of_text(_decode(_read_bytes(path), source), source)


def mapping_of_text(text: str, source: str) -> dict:
    """`read_yaml` of a spec file's text (as `orchestrator submit` sends it to the service)."""
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise SpecError([f"larger than {MAX_SPEC_BYTES // 1024} KiB; a job spec is a few KiB"], source)
    text = text.removeprefix("\ufeff")
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as err:
        raise SpecError([_yaml_problem(err, text)], source) from None
    except YAMLRefused as err:
        raise SpecError([str(err)], source) from None
    if raw is None:
        detail = "" if not text.strip() else " (nothing but comments and blank lines)"
        raise SpecError([f"the file is empty{detail}"], source)
    if not isinstance(raw, dict):
        raise SpecError([f"expected a mapping of sections at the top level, got {value_kind(raw)}"], source)
    return raw
