#!/usr/bin/env bash
# Configures (once) and builds collie in BUILD, saying how far it has got:
# a line every tenth of the way, and the compiler's errors in full if it
# fails. Used by demo.sh and test.sh.
#   scripts/build.sh BUILD [meson setup options...]
#   BUILD_TARGETS="comm/launch/collie-run ..." scripts/build.sh BUILD
#                                     (only those targets and what they need)
set -uo pipefail
cd "$(dirname "$0")/.."
build=$1; shift
# Meson finds nvcc on PATH or in NVCC; the toolkit's own is under CUDA_HOME
# (the nvcc on some PATHs is a wrapper elsewhere).
cuda_root=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
if [ -z "${NVCC:-}" ] && [ -x "$cuda_root/bin/nvcc" ]; then
  export NVCC="$cuda_root/bin/nvcc"
fi
if [ ! -f "$build/build.ninja" ]; then
  echo "building collie in $build/ (the first build takes 1 to 3 minutes on 2 cores)"
  log=$(meson setup "$build" "$@" 2>&1) || { echo "$log" | tail -30; echo "meson setup failed"; exit 1; }
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# ninja prints "[done/total] ..." per step when not on a terminal.
# shellcheck disable=SC2086 # BUILD_TARGETS is a list of targets, split on spaces
ninja -C "$build" ${BUILD_TARGETS:-} 2>&1 | tee "$log" | awk '
  match($0, /^\[([0-9]+)\/([0-9]+)\]/) {
    split(substr($0, RSTART + 1, RLENGTH - 2), p, "/")
    pct = int(100 * p[1] / p[2])
    if (pct >= next_pct) { printf "  build: %3d%% (%d of %d steps)\n", pct, p[1], p[2]; fflush(); next_pct = pct - pct % 10 + 10 }
  }'
status=${PIPESTATUS[0]}
if [ "$status" != 0 ]; then
  grep -v '^\[' "$log" | tail -60
  echo "the build failed (ninja exited $status)"
  exit 1
fi
