#!/usr/bin/env bash
# Lint, format check and the test suite, on a real local Ray cluster and real filesystems;
# no GPU needed. Extra arguments go to pytest, e.g. -k spec.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Debian packages some tests use: headless Chromium for the status page, Prometheus, Redis for
# the head restart. Without them those tests fail, so install them where apt can.
TEST_PACKAGES="chromium chromium-driver prometheus redis-server"
if command -v apt-get >/dev/null 2>&1 && ! dpkg -s $TEST_PACKAGES >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $TEST_PACKAGES; } >/dev/null 2>&1 \
    || echo "note: apt-get could not install $TEST_PACKAGES; the tests that need them fail" >&2
fi
# MLflow's tracking server, for the tests of `tracking.mlflow`: a service of its own in a
# virtualenv of its own (the server pins a pyarrow older than the project's)
MLFLOW_VERSION=3.17.2
if ! .venv/mlflow-server/bin/python -m mlflow --version 2>/dev/null | grep -q "$MLFLOW_VERSION"; then
  python3 -m venv .venv/mlflow-server
  .venv/mlflow-server/bin/python -m pip install -q "mlflow==${MLFLOW_VERSION}"
fi
. .venv/bin/activate
ruff check .
ruff format --check .
# the tests that start Ray clusters run one after the other on one worker; the rest beside them
exec python -m pytest -q -n auto --durations=15 "$@"
