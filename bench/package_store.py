"""What a submission costs the service in its job store, on a real S3 API server (moto):
the job's package kept as one zip (`Store.put_package`, since 2026-11-27) against the way
before, one object per file of the project (this repository: its files as git ships them).
Both are done under the service's lock, so every other call waits for them.

    PYTHONPATH=$PWD python bench/package_store.py [--repeats 3]

Prints the median wall and CPU time of each and their ratio; writes
bench/results/package_store.json.
"""

from __future__ import annotations

import argparse
import io
import json
import posixpath
import statistics
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def file_by_file(store, job_id: str, package: bytes) -> None:
    """The way before: each file of the zip its own object under packages/<job id>/."""
    from core import storage

    fs, root = storage.resolve(storage.join(store.uri, "packages", job_id))
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        for item in archive.infolist():
            target = posixpath.join(root, item.filename)
            fs.create_dir(posixpath.dirname(target), recursive=True)
            with fs.open_output_stream(target) as out:
                out.write(archive.read(item))


def timed(fn, *args) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    from provenance import provenance  # bench/provenance.py

    from core.spec import load_spec
    from orchestrator.project_package import zip_project
    from orchestrator.service.store import Store
    from orchestrator.service.submission import store_package
    from orchestrator.testing.s3_server import restore, start_s3_server

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec = load_spec(ROOT / "jobs/convnet.yaml", [])
    package = zip_project(ROOT)
    with zipfile.ZipFile(io.BytesIO(package)) as archive:
        files = len(archive.infolist())
    s3 = start_s3_server()
    previous = s3.use()
    try:
        store = Store(s3.uri("bench", "store"))
        before, after = [], []
        for i in range(args.repeats):  # alternating, so that load on the machine hits both
            before.append(timed(file_by_file, store, f"before-{i}", package))
            after.append(timed(store_package, store, f"after-{i}", package, spec))
    finally:
        s3.stop()
        restore(previous)
    median = lambda runs, k: statistics.median(run[k] for run in runs)  # noqa: E731
    result = {
        **provenance(),
        "project_files": files,
        "package_bytes": len(package),
        "repeats": args.repeats,
        "one_object_per_file_wall_s": median(before, 0),
        "one_object_per_file_cpu_s": median(before, 1),
        "one_zip_wall_s": median(after, 0),
        "one_zip_cpu_s": median(after, 1),
    }
    result["wall_ratio"] = result["one_object_per_file_wall_s"] / result["one_zip_wall_s"]
    print(
        f"a submission's package ({files} files, {len(package) / 2**20:.1f} MiB) into an S3 job store: "
        f"one object per file {result['one_object_per_file_wall_s']:.2f} s "
        f"(CPU {result['one_object_per_file_cpu_s']:.2f} s), one zip {result['one_zip_wall_s']:.3f} s "
        f"(CPU {result['one_zip_cpu_s']:.3f} s): x{result['wall_ratio']:.0f}"
    )
    (ROOT / "bench/results/package_store.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
