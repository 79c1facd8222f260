#!/usr/bin/env bash
# Makes .gpu/bundle.tar.xz for bench/gpu_run.sh: a build of collie for the
# GPU machine (sm_90, CUDA and NCCL, no MPI or hwloc, which that machine
# lacks) with the programs the GPU checks run, and the OpenBLAS and
# gfortran libraries of this machine that PowerSGD's CPU reference needs.
#   bench/gpu_bundle.sh          (from the repository root, on a CPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_TARGETS="comm/launch/collie-run tests/test_gpu bench/collie-bench" \
  scripts/build.sh build-gpu -Dbuildtype=release -Dcuda=enabled -Dnccl=enabled -Dgpu_arch=90 \
  -Dmpi=disabled -Dhwloc=disabled
rm -rf .gpu/stage && mkdir -p .gpu/stage/build/comm/launch .gpu/stage/build/tests \
  .gpu/stage/build/bench .gpu/stage/lib .gpu/stage/fallback
cp -a build-gpu/libcollie.so build-gpu/libcollie.so.0 build-gpu/libcollie.so.0.2.0 .gpu/stage/build/
cp build-gpu/comm/launch/collie-run .gpu/stage/build/comm/launch/
cp build-gpu/tests/test_gpu .gpu/stage/build/tests/
cp build-gpu/bench/collie-bench .gpu/stage/build/bench/
for l in $(ldd build-gpu/libcollie.so.0 | awk '/blas|gfortran|quadmath/ {print $3}'); do
  cp -L "$l" .gpu/stage/lib/
done
cp -L "$(ldd build-gpu/libcollie.so.0 | awk '/libcrypto/ {print $3}')" .gpu/stage/fallback/
tar -C .gpu/stage -cJf .gpu/bundle.tar.xz .
ls -la .gpu/bundle.tar.xz
