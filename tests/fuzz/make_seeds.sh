#!/usr/bin/env bash
# Rewrites the fuzz targets' seeds in tests/fuzz/corpus/ from collie's own
# writers: fuzz_make_seeds (frame headers, checkpoints, hook specs, edge
# cases), the environments the launchers give a rank (collie-run, mpirun,
# torchrun, each where installed) and a tuning profile that
# `collie-bench --tune` measures. Run from a release build with tests:
#   tests/fuzz/make_seeds.sh build
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=tests/fuzz/corpus
"$build/tests/fuzz/fuzz_make_seeds" "$out"

# What a launcher sets for collie to read (nothing else of the machine's
# environment goes into the seeds).
vars='^(COLLIE_[A-Z_]*|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|'
vars+='TORCHELASTIC_[A-Z_]*|OMPI_COMM_WORLD_[A-Z_]*|OMPI_MCA_ess_base_jobid|'
vars+='OMPI_MCA_mpi_oversubscribe|OMPI_MCA_btl|SLURM_[A-Z_]*|OMP_NUM_THREADS)='
capture() {  # NAME LAUNCHER...: every rank's environment, one seed each
  local name=$1 tmp
  shift
  tmp=$(mktemp -d)
  if "$@" sh -c "env | grep -E '$vars' | sort > $tmp/\$\$" >/dev/null 2>&1; then
    local i=0
    for f in "$tmp"/*; do
      cp "$f" "$out/launch_env/$name-$i"
      i=$((i + 1))
    done
    echo "make_seeds: $i environments from $name"
  else
    echo "make_seeds: $name did not run: no seeds from it"
  fi
  rm -rf "$tmp"
}
capture collie-run "$build/comm/launch/collie-run" -n 2
if command -v mpirun >/dev/null; then
  capture mpirun mpirun --allow-run-as-root --oversubscribe -n 2
fi
if command -v torchrun >/dev/null; then
  capture torchrun torchrun --nproc_per_node 2 --redirects 1 --tee 1 --no_python
fi
if [ -x "$build/bench/collie-bench" ]; then
  "$build/comm/launch/collie-run" -n 2 "$build/bench/collie-bench" --tune \
    "$out/tuning_file/collie-bench-tune" >/dev/null && echo "make_seeds: a profile from collie-bench --tune"
fi
