"""The project directory a job runs in, as the zip that travels with its submission.

Zipping this repository costs ~0.17 s of CPU, which a loaded head turns into seconds of a
`submit` (docs/scaling.md). The zip is kept beside the CLI's state, keyed by the files' names,
sizes and modification times (as git's index tells a changed file), and made again only when
one of those changes. Imports neither pydantic nor pyarrow: the CLI's quick path.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import subprocess
import zipfile
from pathlib import Path

SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", "runs", "data", ".whl", ".gpucache"}
MAX_PACKAGE_BYTES = 100 * 2**20  # Ray's own limit for a working_dir is of this order
KEPT = 4  # packages kept in the cache: a few projects (or versions of one) submitted in turn
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def default_working_dir() -> Path:
    """The directory a job ships when none is named: this checkout (an editable or source one
    ships itself), else the current directory (an installed package)."""
    return PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").exists() else Path.cwd()


def project_files(root: Path) -> list[Path]:
    """The files a job's working_dir carries, relative to `root`: what git would ship (tracked
    and untracked, not ignored), else every file outside SKIP_DIRS."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            timeout=30,
            check=True,
        )
        files = [Path(p) for p in out.stdout.decode().split("\0") if p]
        files = [p for p in files if (root / p).is_file()]
    except (OSError, subprocess.SubprocessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            files += [Path(dirpath, f).relative_to(root) for f in filenames if not f.endswith(".pyc")]
    total = sum((root / p).stat().st_size for p in files)
    if total > MAX_PACKAGE_BYTES:
        raise OSError(
            f"the project directory {root} holds {total / 2**20:.0f} MiB to ship with the job"
            f" (limit {MAX_PACKAGE_BYTES / 2**20:.0f} MiB); add the large files to .gitignore"
        )
    return sorted(files)


def zip_project(root: str | Path) -> bytes:
    """The project directory as a zip (the files git would ship), for the job's package."""
    root = Path(root).resolve()
    return _zip(root, project_files(root))


def _zip(root: Path, files: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative in files:
            archive.write(root / relative, relative.as_posix())
    return buffer.getvalue()


def fingerprint(root: Path, files: list[Path]) -> str:
    """Changes when a file is added, removed, renamed, resized or written to."""
    digest = hashlib.sha256(str(root).encode())
    for relative in files:
        stat = (root / relative).stat()
        digest.update(f"\0{relative.as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def cached_project_zip(root: str | Path, cache: Path) -> bytes:
    """`zip_project(root)`, from `cache` while no file of the project changed since it was made."""
    root = Path(root).resolve()
    files = project_files(root)
    kept = cache / f"{fingerprint(root, files)}.zip"
    try:
        return kept.read_bytes()
    except OSError:
        pass
    zipped = _zip(root, files)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}-{secrets.token_hex(4)}.partial")
        partial.write_bytes(zipped)
        partial.replace(kept)  # whole or absent, for a submission running beside this one
        _prune(cache)
    except OSError:  # a cache that cannot be written costs the next submission the zipping only
        pass
    return zipped


def _prune(cache: Path) -> None:
    packages = sorted(cache.glob("*.zip"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in packages[KEPT:]:
        old.unlink(missing_ok=True)
