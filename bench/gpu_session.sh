#!/usr/bin/env bash
# One GPU session in one command: the CUDA tests and the benchmarks, stage by stage, each
# with its own time limit, all logs and results gathered into one archive.
#
#   bench/gpu_session.sh STAGE[:SECONDS] ...      e.g. env tests:150 train:380
#
# Stages: env (versions, GPU), tests (tests/gpu kernel tests, default configs), parity
# (tests/gpu training parity, autotuned), profile (bench/gpu_train.py compile mode with
# kernel profiles, and GPT-2 at batch 32), variants (compile mode
# at larger batches), train (bench/gpu_train.py, all modes), legacy
# (bench/gpu_train.py eager and compile, before and after the loop changes), kernels
# (bench/kernels.py). Extra arguments for a bench stage go in TRAIN_ARGS / KERNELS_ARGS.
#
# The machine needs torch and triton (the repository's pins need not match; the versions
# are recorded); Python packages it lacks can be carried as wheels in .whl/. Results land in
# bench/results/ and, with the logs, in $OUT/session.tgz (OUT defaults to /tmp/gpu-session).
# Compile caches (inductor, Triton, autotune choices) are kept in .gpucache/ and archived to
# $OUT/gpucache.tgz, so that a later session on a fresh machine can carry them back.
#
# Pass the commit you are measuring: BENCH_COMMIT=$(git rev-parse HEAD) bench/gpu_session.sh ...
# (the copy of the tree on the GPU machine may carry stale git metadata); commit first, so
# that the commit is the code that runs.
set -u
cd "$(dirname "$0")/.."
export BENCH_COMMIT=${BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
OUT=${OUT:-/tmp/gpu-session}
LOGS=$(mktemp -d)
mkdir -p "$OUT" bench/results
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -f .gpucache.tgz ]; then tar xzf .gpucache.tgz; fi
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpucache/inductor TRITON_CACHE_DIR=$PWD/.gpucache/triton
export TRITON_CACHE_AUTOTUNING=1 TRITON_PRINT_AUTOTUNING=1

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  grep -E "passed|failed|error|Error|^\| |wrote" "$LOGS/$name.log" | tail -n 40
}

for item in "$@"; do
  name=${item%%:*}
  limit=${item#*:}
  [ "$limit" = "$item" ] && limit=300
  case $name in
    env) stage env "$limit" bash -c 'nvidia-smi; python3 -c "
import torch, triton, sys
print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"triton\", triton.__version__)
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
import kernels, workers.trainer, core.spec, torchao, pydantic
print(\"torchao\", torchao.__version__, \"pydantic\", pydantic.__version__)"; git log -1 --format="%H %cd" 2>/dev/null || true' ;;
    tests) stage tests "$limit" env KERNELS_AUTOTUNE=0 python3 -m pytest -m gpu -q -p no:cacheprovider \
             -n 6 tests/gpu/test_kernels_cuda.py ${TESTS_ARGS:-} ;;
    parity) stage parity "$limit" python3 -m pytest -m gpu -q -s -p no:cacheprovider \
              tests/gpu/test_training_parity_cuda.py ;;
    train) stage train "$limit" python3 bench/gpu_train.py --loader 8 ${TRAIN_ARGS:-} ;;
    profile) stage profile "$limit" bash -c 'set -e; a="--modes compile --profile 5 --steps 15 --warmup 3"
              python3 bench/gpu_train.py $a --out bench/results/profile
              python3 bench/gpu_train.py $a --models gpt2_small --batch gpt2_small=32 --out bench/results/profile/b32' ;;
    variants) stage variants "$limit" python3 bench/gpu_train.py --modes compile --steps 15 --warmup 3 \
                --batch gpt2_small=32 vit_b16=512 --out bench/results/variants ;;
    legacy) stage legacy "$limit" python3 bench/gpu_train.py --modes eager compile --legacy-loop \
              --out bench/results/legacy ${TRAIN_ARGS:-} ;;
    kernels) stage kernels "$limit" python3 bench/kernels.py ${KERNELS_ARGS:-} ;;
    *) echo "unknown stage $name" ;;
  esac
done

cp -r bench/results "$LOGS/results"
tar czf "$OUT/session.tgz" -C "$LOGS" .
if [ -d .gpucache ]; then
  tar czf "$OUT/gpucache.tgz" .gpucache
  [ "$(stat -c %s "$OUT/gpucache.tgz")" -gt 15000000 ] && rm "$OUT/gpucache.tgz" && echo "cache too large to bring back"
fi
ls -la "$OUT"
