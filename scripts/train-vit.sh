#!/usr/bin/env bash
# The main job: a ViT on Fashion-MNIST, on this machine (no GPU needed). Extra arguments
# go to `orchestrator run`, e.g. --set train.epochs=1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
exec orchestrator run --local jobs/vit.yaml --summary runs/vit-summary.json "$@"
