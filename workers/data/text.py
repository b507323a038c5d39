"""Byte-level language modelling over text on disk (vocab 256: no tokenizer file needed).

`path` is a file or a directory (its *.txt, *.py and *.md files, recursively,
in sorted order); without a path the corpus is the Python standard library's
own source. The corpus is capped (MAX_BYTES) so loading stays fast. Items are
non-overlapping windows of seq_len + 1 bytes; the eval split is the last
`eval_split` fraction of the corpus, contiguous, so it shares no text with train.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path
from typing import Any

from . import DataInfo, Datasets

SUFFIXES = (".txt", ".py", ".md")
MAX_BYTES = 5_000_000
STDLIB_BYTES = 3_000_000
VOCAB_SIZE = 256
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def _walk(root: Path, suffixes: tuple[str, ...]):
    """Files under root in a deterministic (sorted, depth-first) order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(suffixes):
                yield Path(dirpath) / name


def corpus_files(spec: Any) -> tuple[list[Path], int]:
    """The files that make up the corpus and its size in bytes (stat only, nothing is read)."""
    if spec.path is None:
        files, cap = _walk(Path(sysconfig.get_paths()["stdlib"]), (".py",)), STDLIB_BYTES
    elif Path(spec.path).is_file():
        files, cap = iter([Path(spec.path)]), MAX_BYTES
    else:
        files, cap = _walk(Path(spec.path), SUFFIXES), MAX_BYTES
    chosen, total = [], 0
    for f in files:  # a generator: stop walking as soon as the cap is reached
        if total >= cap:
            break
        chosen.append(f)
        total += f.stat().st_size
    return chosen, min(total, cap)


def _split_sizes(n_bytes: int, spec: Any) -> tuple[int, int, int]:
    """(train bytes, train windows, eval windows)."""
    cut = n_bytes - int(n_bytes * spec.eval_split)
    window = spec.seq_len + 1
    return cut, cut // window, (n_bytes - cut) // window


def describe(spec: Any) -> DataInfo:
    _, n_bytes = corpus_files(spec)
    _, n_train, n_eval = _split_sizes(n_bytes, spec)
    return DataInfo.tokens(VOCAB_SIZE, spec.seq_len, n_train, n_eval)


def load(spec: Any, seed: int = 0, rank: int = 0, world_size: int = 1) -> Datasets:
    import torch

    from .datasets import TokenWindows

    files, n_bytes = corpus_files(spec)
    data = bytearray()
    for f in files:
        data += f.read_bytes()[: n_bytes - len(data)]
    if len(data) != n_bytes:
        raise RuntimeError(f"text: corpus changed while reading ({len(data)} != {n_bytes} bytes)")
    tokens = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    cut, n_train, n_eval = _split_sizes(n_bytes, spec)
    if n_train == 0:
        raise ValueError(
            f"text: corpus of {n_bytes} bytes is too small for one training window "
            f"of seq_len + 1 = {spec.seq_len + 1} bytes"
        )
    eval_ = TokenWindows(tokens[cut:], spec.seq_len) if n_eval else None
    return Datasets(TokenWindows(tokens[:cut], spec.seq_len), eval_, describe(spec))


def check(spec: Any) -> list[tuple[str, str]]:
    if spec.path is None:
        return []
    path = Path(spec.path)
    if not path.exists():
        return [("path", f"no such file or directory {spec.path!r}")]
    files, n_bytes = corpus_files(spec)
    if not files:
        return [("path", f"no {', '.join('*' + s for s in SUFFIXES)} files under {spec.path!r}")]
    if _split_sizes(n_bytes, spec)[1] == 0:
        return [
            (
                "seq_len",
                f"{spec.path!r} holds {n_bytes} bytes, too few for one training "
                f"window of seq_len + 1 = {spec.seq_len + 1}",
            )
        ]
    return []
