#!/usr/bin/env bash
# Create (or reuse) .venv and install the project into it. Safe to run again.
# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.13.0
TRITON_VERSION=3.7.1   # the Triton release torch 2.13 is built against

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Ray's own clients (`ray job submit`, `ray status`) send the cluster's auth token only when
# RAY_AUTH_MODE=token; the heads `orchestrator up` starts require one (docs/ray.md, Token authentication).
if ! grep -q "orchestrator: RAY_AUTH_MODE" .venv/bin/activate; then
  cat >> .venv/bin/activate <<'HOOK'
# orchestrator: RAY_AUTH_MODE=token, so that Ray's own clients send the token in ~/.ray/auth_token
if [ -z "${RAY_AUTH_MODE:-}" ]; then export RAY_AUTH_MODE=token; fi
HOOK
fi
. .venv/bin/activate
# skip the installs when nothing they depend on changed since the last successful one
stamp=".venv/.installed-$(cat pyproject.toml "$0" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q "torch==${TORCH_VERSION}"
  if [ "$(uname -s)" = Linux ]; then
    python -m pip install -q "triton==${TRITON_VERSION}"
  fi
  python -m pip install -q -e ".[dev]"
  rm -f .venv/.installed-* && touch "$stamp"
fi

# Fashion-MNIST (the main job's data) ships as Debian's package dataset-fashion-mnist.
if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  if $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 \
     || { $SUDO apt-get update -qq >/dev/null 2>&1 && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; }; then
    echo "installed Fashion-MNIST (Debian package dataset-fashion-mnist)"
  else
    echo "note: could not install Debian's dataset-fashion-mnist; see README (Data) for other ways" >&2
  fi
fi
