#!/usr/bin/env bash
# The main job: a ViT on Fashion-MNIST through the orchestrator service, on this machine (no
# GPU needed). `orchestrator up` starts a local Ray head (dashboard on) and the service unless
# they are already up, and prints where to watch: Ray's dashboard and the status page. The job
# is queued there and followed to its end. Extra arguments go to `orchestrator submit`, e.g.
# --set train.epochs=1. `orchestrator down` stops the service and the local Ray head.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
orchestrator up
exec orchestrator submit jobs/vit.yaml --wait --summary runs/vit-summary.json "$@"
