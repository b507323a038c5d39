#!/usr/bin/env bash
# The test suite, on a real local Ray cluster and real filesystems; no GPU needed.
# Extra arguments go to pytest, e.g. -k spec.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
exec python -m pytest -q "$@"
