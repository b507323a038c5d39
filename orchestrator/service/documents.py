"""Small JSON documents in the store, written whole: the user registry and the audit entries.

The same two rules as the job records (`store.py`): a document is written to a temporary name
and moved into place, so a reader sees the old one or the new one, never half of one; and it
is never appended to, since object storage (S3, GCS) cannot append. Readers skip the
temporary names (`is_temporary`) of a write that was interrupted.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pyarrow.fs as pafs

from orchestrator.service.store import read_json

__all__ = ["is_temporary", "read_json", "write_json"]

TEMP_MARK = ".tmp-"


def write_json(fs: pafs.FileSystem, path: str, data: Any) -> None:
    tmp = f"{path}{TEMP_MARK}{secrets.token_hex(4)}"
    with fs.open_output_stream(tmp) as out:
        out.write(json.dumps(data, indent=1, sort_keys=True).encode())
    fs.move(tmp, path)


def is_temporary(path: str) -> bool:
    return TEMP_MARK in path.rsplit("/", 1)[-1]
