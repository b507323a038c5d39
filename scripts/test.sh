#!/usr/bin/env bash
# Lint, format check and the test suite, on a real local Ray cluster and real filesystems;
# no GPU needed. Extra arguments go to pytest, e.g. -k spec.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
ruff check .
ruff format --check .
exec python -m pytest -q --durations=15 "$@"
