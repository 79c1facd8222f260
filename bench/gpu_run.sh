#!/usr/bin/env bash
# The GPU checks and figures, in one call on the lent GPU machine (which has
# no Meson build of collie, no GoogleTest and no OpenBLAS): a build made on a
# CPU machine is carried there as .gpu/bundle.tar.xz (bench/gpu_bundle.sh
# makes it: libcollie for sm_90, collie-run, test_gpu, collie-bench, and the
# OpenBLAS and gfortran libraries the PowerSGD check needs), and NCCL and
# cudart are the machine's own (PyTorch's wheels). Logs go to $OUT.
#   bench/gpu_run.sh            (from the repository root, on the GPU machine)
set -uo pipefail
. bench/gpu_env.sh
export PYTHONPATH=$PWD/python
step() { echo; echo "=== $*"; }
step machine
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
nproc; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
ldd $B/libcollie.so.0 | grep -E "not found|nccl|cudart|crypto|blas" 
step "test_gpu, 1 rank"
$B/tests/test_gpu 2>&1 | tee $OUT/test_gpu_np1.log | tail -25
step "test_gpu, 2 ranks (NCCL_HOSTID per rank inside the test)"
COLLIE_TIMEOUT=120 $B/comm/launch/collie-run -n 2 $B/tests/test_gpu 2>&1 | tee $OUT/test_gpu_np2.log | tail -25
step "collie.torch on CUDA tensors, 2 ranks on the GPU"
COLLIE_TIMEOUT=120 $B/comm/launch/collie-run -n 2 python3 tests/python/cuda_ddp_check.py 2>&1 | tee $OUT/cuda_ddp.log | tail -12
step "collie-bench nccl, 1 rank, device memory"
timeout 120 $B/comm/launch/collie-run -n 1 $B/bench/collie-bench -D cuda -B nccl -b 8 -e 256M -f 4 -n 5 2>&1 | tee $OUT/bench_nccl_np1.txt | tail -16
step "collie-bench nccl, 2 ranks on one GPU (told apart by NCCL_HOSTID: NCCL's socket transport)"
timeout 150 $B/comm/launch/collie-run -n 2 sh -c 'NCCL_HOSTID=h$COLLIE_RANK exec '$B'/bench/collie-bench -D cuda -B nccl -b 8 -e 64M -f 8 -n 3' 2>&1 | tee $OUT/bench_nccl_np2.txt | tail -12
step "collie-bench staged through pinned memory over shm (COLLIE_CUDA_BACKEND=staged), 2 ranks, device memory"
COLLIE_CUDA_BACKEND=staged timeout 120 $B/comm/launch/collie-run -n 2 $B/bench/collie-bench -D cuda -B shm -b 8 -e 256M -f 4 -n 5 2>&1 | tee $OUT/bench_staged_np2.txt | tail -16
step "collie-bench shm with CUDA tensors to NCCL beside it (the default), 2 ranks on one GPU (NCCL_HOSTID)"
timeout 120 $B/comm/launch/collie-run -n 2 sh -c 'NCCL_HOSTID=h$COLLIE_RANK exec '$B'/bench/collie-bench -D cuda -B shm -b 8 -e 64M -f 8 -n 3' 2>&1 | tee $OUT/bench_shm_nccl_np2.txt | tail -10
step "collie-bench shm, 2 ranks, host memory (same machine)"
timeout 120 $B/comm/launch/collie-run -n 2 $B/bench/collie-bench -B shm -b 8 -e 256M -f 4 -n 5 2>&1 | tee $OUT/bench_host_np2.txt | tail -16
echo; echo "=== done"
