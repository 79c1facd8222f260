#!/usr/bin/env bash
# The main job: build collie, train a small MLP on 2 ranks with the DDP
# reducer (then again with PowerSGD compressing its gradients, picked by an
# environment variable alone), then run the all-reduce bandwidth sweep on 2
# ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# What the demo runs, not the test suites (scripts/test.sh builds those in
# the same directory): about half the first build's time.
BUILD_TARGETS="comm/launch/collie-run examples/train_mlp bench/collie-bench" \
  scripts/build.sh "$BUILD" -Dbuildtype=release
echo "== collie-run -n 2 train_mlp   (our own autograd engine, gradients averaged by collie's reducer)"
"$BUILD/comm/launch/collie-run" -n 2 "$BUILD/examples/train_mlp"
echo
echo "== the same binary with another comm hook: COLLIE_COMM_HOOK=powersgd:rank=2,start_iter=50"
COLLIE_COMM_HOOK=powersgd:rank=2,start_iter=50 OPENBLAS_NUM_THREADS=1 \
  "$BUILD/comm/launch/collie-run" -n 2 "$BUILD/examples/train_mlp" --steps 100
echo
echo "== collie-run -n 2 collie-bench ${BENCH_ARGS:-}"
"$BUILD/comm/launch/collie-run" -n 2 "$BUILD/bench/collie-bench" ${BENCH_ARGS:-}
