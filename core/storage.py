"""Checkpoint storage on any pyarrow filesystem: a local or NFS path, s3://, gs://, hdfs://.

pyarrow is imported at the first call that touches storage, not at import: the CLI's commands
that only talk to the service (`queue`, `status`) never need it (0.15 s of each one's CPU)."""

from __future__ import annotations

import os
import posixpath
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow.fs


def _pafs():
    import pyarrow.fs

    return pyarrow.fs


def resolve(uri: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """A storage URI or local path -> (filesystem, path inside it)."""
    pafs = _pafs()
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
    return pafs.FileSystem.from_uri(uri)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def is_absolute(uri: str) -> bool:
    """A URI or an absolute local path: one that means the same wherever it is read."""
    return "://" in uri or os.path.isabs(uri)


def as_the_user_meant(uri: str, cwd: str | None, home: str) -> str:
    """`uri` as the user meant it: a relative local path made absolute from the directory they
    stood in (`cwd`), one under ~ from their home; URIs and absolute paths unchanged. The one
    place a relative checkpoint path is resolved (the service, for every submission; `orchestrator
    run` without a service). `cwd` None: where they stood is not known (the driver of a `ray job
    submit` from a directory this machine did not record): ValueError, since Ray runs the job in
    a temporary copy of its working directory."""
    if is_absolute(uri):
        return uri
    if uri == "~" or uri.startswith("~/"):
        return posixpath.normpath(home + uri[1:])
    if cwd is None:
        raise ValueError(
            f"checkpoint.storage '{uri}' is relative, and `ray job submit` runs the job in a temporary "
            "copy of its working directory, deleted with the cluster, without saying where it came "
            "from: give an absolute path or a URI (--set checkpoint.storage=$PWD/"
            f"{uri.removeprefix('./')}), or submit with `orchestrator submit`"
        )
    return posixpath.normpath(posixpath.join(cwd, uri))


def join(uri: str, *parts: str) -> str:
    if "://" in uri:
        # keep a query string (s3://b/p?endpoint_override=host:9000) at the end
        base, sep, query = uri.partition("?")
        return posixpath.join(base.rstrip("/"), *parts) + sep + query
    return os.path.join(uri, *parts)


def list_dirs(uri: str) -> list[str]:
    """Names of the directories directly under `uri` (empty if it does not exist)."""
    pafs = _pafs()
    fs, path = resolve(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.Directory)


def exists(uri: str) -> bool:
    pafs = _pafs()
    fs, path = resolve(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def upload(local_dir: str | Path, uri: str) -> None:
    pafs = _pafs()
    fs, path = resolve(uri)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(local_dir), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def download(uri: str, local_dir: str | Path) -> None:
    pafs = _pafs()
    fs, path = resolve(uri)
    Path(local_dir).mkdir(parents=True, exist_ok=True)
    pafs.copy_files(path, str(local_dir), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())


def delete_dir(uri: str) -> None:
    fs, path = resolve(uri)
    fs.delete_dir(path)


def check_writable(uri: str) -> None:
    """Raise OSError naming the URI when a checkpoint could not be written there."""
    try:
        fs, path = resolve(uri)
        fs.create_dir(path, recursive=True)
        # a name of its own per call: two checks of one place at once must not meet
        probe = posixpath.join(path, f".write-probe-{os.getpid()}-{secrets.token_hex(6)}")
        with fs.open_output_stream(probe) as out:
            out.write(b"ok")
        fs.delete_file(probe)
    except Exception as err:  # pyarrow raises several unrelated types for the same failure
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise OSError(f"checkpoint storage '{uri}' is not writable: {reason}") from err
